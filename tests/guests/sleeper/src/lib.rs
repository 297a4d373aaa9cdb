//! Test guest: `{"ms": N}` writes to `orders`, sleeps N ms durably, writes
//! again, and returns `{"slept_ms": N, "before": t0, "after": t1}` with the
//! recorded clock before and after the sleep.

use std::time::Duration;

use serde_json::{Value, json};
use stephost_guest::{Ctx, Error};

fn run(ctx: &mut Ctx, input: Value) -> Result<Value, Error> {
    let ms = input["ms"].as_u64().unwrap_or(0);
    let _: Value = ctx.effect("orders", &json!({ "phase": "before" }))?;
    let before = ctx.now_nanos();
    ctx.sleep(Duration::from_millis(ms));
    let after = ctx.now_nanos();
    let _: Value = ctx.effect("orders", &json!({ "phase": "after" }))?;
    Ok(json!({ "slept_ms": ms, "before": before, "after": after }))
}

stephost_guest::export_step!(run);
