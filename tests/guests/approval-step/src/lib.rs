//! Test guest: the seed case of human approval. Input
//! `{"sku", "quantity", "ttl_seconds"}`: asks a person to approve ordering
//! `quantity` of `sku`; once approved, re-checks the stock (an approval of
//! last week is not a licence for today) and orders only what is still
//! missing. Output `{"verdict", "by", "note", "on_hand", "ordered"}`.

use std::time::Duration;

use serde_json::{Value, json};
use stephost_guest::{Ctx, Error};

fn run(ctx: &mut Ctx, input: Value) -> Result<Value, Error> {
    let sku = input["sku"].as_str().unwrap_or("WIDGET-7");
    let quantity = input["quantity"].as_i64().unwrap_or(1);
    let ttl = Duration::from_secs(input["ttl_seconds"].as_u64().unwrap_or(3600));
    let decision = ctx.approval(
        &format!("order {quantity} of {sku}"),
        &json!({ "sku": sku, "quantity": quantity }),
        ttl,
    )?;
    if !decision.approved() {
        return Ok(json!({
            "verdict": decision.verdict, "by": decision.by, "note": decision.note,
            "on_hand": null, "ordered": false,
        }));
    }
    // Re-check the precondition now, not when the approval was asked.
    let stock: Value = ctx.effect("inventory.read", &json!({ "sku": sku }))?;
    let on_hand = stock["on_hand"].as_i64().unwrap_or(0);
    let missing = quantity - on_hand;
    let ordered = if missing > 0 {
        let _: Value = ctx.effect_with_key(
            "orders",
            &format!("approved-order:{sku}"),
            &json!({ "sku": sku, "quantity": missing }),
        )?;
        true
    } else {
        false
    };
    Ok(json!({
        "verdict": decision.verdict, "by": decision.by, "note": decision.note,
        "on_hand": on_hand, "ordered": ordered,
    }))
}

stephost_guest::export_step!(run);
