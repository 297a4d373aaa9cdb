//! Test guest: places two orders (`orders`, calls #1 and #2), then sends
//! the confirmation (call #3). This build has a bug: it sends it to
//! `confirm`, an effect no configuration grants, so call #3 fails and the
//! run fails. Built with feature `fixed` (package `guest-fork-step-fixed`)
//! it sends it to `echo`: the same first two calls, a run that completes.
//! Returns `{"orders": [receipts], "confirmed": answer}`.

use serde_json::{Value, json};
use stephost_guest::{Ctx, Error};

#[cfg(not(feature = "fixed"))]
const CONFIRM: &str = "confirm";
#[cfg(feature = "fixed")]
const CONFIRM: &str = "echo";

fn run(ctx: &mut Ctx, input: Value) -> Result<Value, Error> {
    let customer = input["customer"].as_str().unwrap_or("acme");
    let mut orders = Vec::new();
    for item in ["widget", "gadget"] {
        let receipt: Value = ctx.effect("orders", &json!({"customer": customer, "item": item}))?;
        orders.push(receipt);
    }
    let confirmed: Value = ctx.effect(CONFIRM, &json!({"customer": customer, "orders": 2}))?;
    Ok(json!({"orders": orders, "confirmed": confirmed}))
}

stephost_guest::export_step!(run);
