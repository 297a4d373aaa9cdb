//! Test guest: `{"ms": N}` writes to `orders`, sleeps N ms durably, writes
//! again, and returns `{"slept_ms": N, "before": t0, "after": t1}` with the
//! recorded clock before and after the sleep. With `"wasi_sleep_ms": M`, it
//! first sleeps M ms with `std::thread::sleep` (WASI's monotonic clock and
//! poll), which is not recorded.

use std::time::Duration;

use serde_json::{Value, json};
use stephost_guest::{Ctx, Error};

fn run(ctx: &mut Ctx, input: Value) -> Result<Value, Error> {
    let ms = input["ms"].as_u64().unwrap_or(0);
    if let Some(wasi_ms) = input["wasi_sleep_ms"].as_u64() {
        std::thread::sleep(Duration::from_millis(wasi_ms));
    }
    let _: Value = ctx.effect("orders", &json!({ "phase": "before" }))?;
    let before = ctx.now_nanos();
    ctx.sleep(Duration::from_millis(ms));
    let after = ctx.now_nanos();
    let _: Value = ctx.effect("orders", &json!({ "phase": "after" }))?;
    Ok(json!({ "slept_ms": ms, "before": before, "after": after }))
}

stephost_guest::export_step!(run);
