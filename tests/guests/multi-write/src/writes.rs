//! The calls shared by the `multi-write` and `divergent` test guests.

use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};
use stephost_guest::{Ctx, Error, log};

/// The input: how many writes, to which effect, and how many clock reads
/// before each (none by default).
#[derive(Debug, Deserialize)]
pub struct Input {
    count: u32,
    #[serde(default = "default_effect")]
    effect: String,
    #[serde(default)]
    observes: u32,
}

fn default_effect() -> String {
    "orders".to_owned()
}

/// For each `i` in `0..count`: reads the clock `observes` times, reads it
/// once more, draws a random number and writes `{"i", "at", "nonce"}` to the
/// effect without a key. Then reads the clock and draws once more, and reads
/// the WASI wall clock. So with `k` observes, write `i` (0-based) is call
/// `(k + 3) * (i + 1)` and the whole run makes `(k + 3) * count + 3` calls.
///
/// When `diverge_at` is `Some(i)`, write `i` adds `"divergent": true` to its
/// request.
///
/// Output: `receipts` (the responses, in order), `sum` (the wrapping sum of
/// every clock and random value the step saw: it depends on all of them),
/// `wasi_now_ms` (std's `SystemTime::now`, i.e. the WASI wall clock) and
/// `map_order` (the iteration order of a `HashMap` with std's default,
/// randomly seeded hasher: it depends on WASI `insecure-seed`).
pub fn run(ctx: &mut Ctx, input: Input, diverge_at: Option<u32>) -> Result<Value, Error> {
    let mut receipts = Vec::new();
    let mut sum = 0u64;
    for i in 0..input.count {
        for _ in 0..input.observes {
            sum = sum.wrapping_add(ctx.now_nanos());
        }
        let at = ctx.now_nanos();
        let nonce = ctx.random_u64();
        let mut request = json!({ "i": i, "at": at, "nonce": nonce });
        if diverge_at == Some(i) {
            request["divergent"] = json!(true);
        }
        let receipt: Value = ctx.effect(&input.effect, &request)?;
        log::info(format_args!("write {i} to {} done", input.effect));
        // Printed output is recorded too (level "stderr"), once.
        eprintln!("guest stderr: write {i} sent");
        receipts.push(receipt);
        sum = sum.wrapping_add(at).wrapping_add(nonce);
    }
    sum = sum
        .wrapping_add(ctx.now_nanos())
        .wrapping_add(ctx.random_u64());

    let wasi_now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(Error::msg)?
        .as_millis();
    let map: HashMap<String, usize> = (0..16).map(|n| (format!("k{n}"), n)).collect();
    let map_order: Vec<&str> = map.keys().map(String::as_str).collect();

    Ok(json!({
        "receipts": receipts,
        "sum": sum,
        "wasi_now_ms": u64::try_from(wasi_now_ms).map_err(Error::msg)?,
        "map_order": map_order.join(","),
    }))
}
