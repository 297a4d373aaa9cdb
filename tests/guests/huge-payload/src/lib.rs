//! Test guest: `{"bytes": N}` calls the effect `echo` with
//! `{"blob": "xxx…"}` (N times `x`) and returns
//! `{"sent": N, "received": <length of the blob in the response, or null>}`.

use serde::Deserialize;
use serde_json::{Value, json};
use stephost_guest::{Ctx, Error};

#[derive(Debug, Deserialize)]
struct Input {
    bytes: usize,
}

fn run(ctx: &mut Ctx, input: Input) -> Result<Value, Error> {
    let blob = "x".repeat(input.bytes);
    let response: Value = ctx.effect("echo", &json!({ "blob": blob }))?;
    let received = response.get("blob").and_then(Value::as_str).map(str::len);
    Ok(json!({ "sent": input.bytes, "received": received }))
}

stephost_guest::export_step!(run);
