//! Test guest: makes a promise (`{"ttl_seconds"}`, default 60), hands its
//! token to the `orders` receiver (`{"promise": ID, "token": TOKEN}`),
//! sleeps `sleep_ms` durably if given, waits for the promise, and returns
//! `{"promise": ID, "settled": {"resolved": VALUE} | {"rejected": MESSAGE}
//! | "expired"}`.

use std::time::Duration;

use serde_json::{Value, json};
use stephost_guest::{Ctx, Error, Settled};

fn run(ctx: &mut Ctx, input: Value) -> Result<Value, Error> {
    let ttl = input["ttl_seconds"].as_u64().unwrap_or(60);
    let promise = ctx.promise("payment", Duration::from_secs(ttl))?;
    let _: Value = ctx.effect(
        "orders",
        &json!({ "promise": promise.id, "token": promise.token }),
    )?;
    if let Some(ms) = input["sleep_ms"].as_u64().filter(|ms| *ms > 0) {
        ctx.sleep(Duration::from_millis(ms));
    }
    let settled = ctx.wait_promise(&promise)?;
    Ok(json!({
        "promise": promise.id,
        "settled": match &settled {
            Settled::Resolved(_) => json!({ "resolved": settled.value::<Value>()? }),
            Settled::Rejected(message) => json!({ "rejected": message }),
            Settled::Expired => json!("expired"),
        },
    }))
}

stephost_guest::export_step!(run);
