//! Test guest, a child step: `{"n": N}` sleeps `sleep_ms` durably (if
//! given), writes `{"n": N}` to `orders`, and returns `{"n": N, "square":
//! N*N}`; with `"fail": true` it fails with `square N failed` instead.

use std::time::Duration;

use serde_json::{Value, json};
use stephost_guest::{Ctx, Error, bail};

fn run(ctx: &mut Ctx, input: Value) -> Result<Value, Error> {
    let n = input["n"].as_u64().unwrap_or(0);
    if let Some(ms) = input["sleep_ms"].as_u64().filter(|ms| *ms > 0) {
        ctx.sleep(Duration::from_millis(ms));
    }
    if input["fail"].as_bool() == Some(true) {
        bail!("square {n} failed");
    }
    let _: Value = ctx.effect("orders", &json!({ "n": n }))?;
    Ok(json!({ "n": n, "square": n * n }))
}

stephost_guest::export_step!(run);
