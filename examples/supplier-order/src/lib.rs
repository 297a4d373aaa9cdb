//! Example step: orders missing stock from a supplier.
//!
//! Input `{"sku": "WIDGET-7", "quantity": 10}`. The step reads the stock of
//! `sku` through the `inventory.read` effect (a read), and when `quantity` is
//! more than what is on hand it orders the shortage through the
//! `supplier.order` effect (a write). The order carries the business key
//! `order:{sku}:{quantity}`, so however often the run is resumed or replayed,
//! the supplier sees one operation id for it.
//!
//! Output `{"sku", "on_hand", "shortage", "ordered", "receipt"}` where
//! `receipt` is the supplier's response (or `null` when nothing was ordered).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt::Write as _;
use std::time::UNIX_EPOCH;
use stephost_guest::{Ctx, Error, bail, log};

/// The step's input.
#[derive(Debug, Deserialize)]
struct Input {
    sku: String,
    quantity: i64,
    /// When given, a person must approve the order (within this many
    /// seconds) before it is sent, and the stock is checked again after the
    /// approval: an approval of last week is not a licence for today.
    #[serde(default)]
    approval_ttl_seconds: Option<u64>,
}

/// The response of `inventory.read` (other fields are ignored).
#[derive(Debug, Deserialize)]
struct Stock {
    on_hand: i64,
}

/// The request sent to `supplier.order`.
#[derive(Debug, Serialize)]
struct OrderRequest<'a> {
    sku: &'a str,
    quantity: i64,
    requested_at_ms: u64,
    request_nonce: String,
}

/// The step's output.
#[derive(Debug, Serialize)]
struct Output {
    sku: String,
    on_hand: i64,
    shortage: i64,
    ordered: bool,
    receipt: Option<Value>,
}

fn run(ctx: &mut Ctx, input: Input) -> Result<Output, Error> {
    if input.sku.is_empty() {
        bail!("sku must not be empty");
    }
    if input.quantity < 0 {
        bail!("quantity must not be negative, got {}", input.quantity);
    }

    let mut stock: Stock =
        ctx.effect("inventory.read", &serde_json::json!({ "sku": input.sku }))?;
    if let Some(ttl) = input.approval_ttl_seconds
        && input.quantity > stock.on_hand
    {
        let decision = ctx.approval(
            &format!("order {} of {}", input.quantity - stock.on_hand, input.sku),
            &serde_json::json!({ "sku": input.sku, "quantity": input.quantity, "on_hand": stock.on_hand }),
            std::time::Duration::from_secs(ttl),
        )?;
        if !decision.approved() {
            bail!(
                "the order was not approved ({:?} by {:?})",
                decision.verdict,
                decision.by
            );
        }
        // Re-check the precondition now, not when the approval was asked.
        stock = ctx.effect("inventory.read", &serde_json::json!({ "sku": input.sku }))?;
    }
    let shortage = input.quantity - stock.on_hand;
    log::info(format_args!(
        "{}: {} wanted, {} on hand",
        input.sku, input.quantity, stock.on_hand
    ));

    let receipt = if shortage > 0 {
        let requested_at_ms = ctx
            .now()
            .duration_since(UNIX_EPOCH)
            .map_err(Error::msg)?
            .as_millis();
        let request = OrderRequest {
            sku: &input.sku,
            quantity: shortage,
            requested_at_ms: u64::try_from(requested_at_ms).map_err(Error::msg)?,
            request_nonce: hex(&ctx.random_bytes(8)),
        };
        let key = format!("order:{}:{}", input.sku, input.quantity);
        log::info(format_args!(
            "ordering {shortage} of {} (key {key})",
            input.sku
        ));
        let receipt: Value = ctx.effect_with_key("supplier.order", &key, &request)?;
        log::info(format_args!("supplier accepted the order: {receipt}"));
        Some(receipt)
    } else {
        log::info("enough stock, nothing to order");
        None
    };

    Ok(Output {
        sku: input.sku,
        on_hand: stock.on_hand,
        shortage: shortage.max(0),
        ordered: receipt.is_some(),
        receipt,
    })
}

/// Lower-case hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

stephost_guest::export_step!(run);
