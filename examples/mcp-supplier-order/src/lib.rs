//! Example step: orders missing stock through a supplier's MCP server.
//!
//! Input `{"sku": "WIDGET-7", "quantity": 10}`. The step reads the server's
//! tool list (`supplier.tools`, as an agent would before offering the tools
//! to a model), checks the stock with the `check_stock` tool
//! (`supplier.stock`, a read by the tool's annotations) and, when
//! `quantity` is more than what is on hand, orders the shortage with the
//! `place_order` tool (`supplier.order`, a write, keyed by
//! `order:{sku}:{quantity}` so the supplier sees one operation id for it
//! however often the run is resumed).
//!
//! Output `{"server", "tools", "sku", "on_hand", "shortage", "ordered",
//! "order"}`: the server's name and version, the names of its tools, and
//! the supplier's order (or `null` when nothing was ordered).

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use stephost_guest::{Ctx, Error, bail, log};

#[derive(Debug, Deserialize)]
struct Input {
    sku: String,
    quantity: i64,
}

/// What `tools/list` answers (other fields are ignored).
#[derive(Debug, Deserialize)]
struct Listed {
    server: Value,
    tools: Vec<ToolEntry>,
}

#[derive(Debug, Deserialize)]
struct ToolEntry {
    name: String,
}

/// What a tool call answers: the tool's structured result, beside its
/// content (other fields are ignored).
#[derive(Debug, Deserialize)]
struct ToolResult<T> {
    #[serde(rename = "structuredContent")]
    structured: T,
}

#[derive(Debug, Deserialize)]
struct Stock {
    on_hand: i64,
}

#[derive(Debug, Serialize)]
struct Output {
    server: Value,
    tools: Vec<String>,
    sku: String,
    on_hand: i64,
    shortage: i64,
    ordered: bool,
    order: Option<Value>,
}

fn run(ctx: &mut Ctx, input: Input) -> Result<Output, Error> {
    if input.sku.is_empty() {
        bail!("sku must not be empty");
    }
    let listed: Listed = ctx.effect("supplier.tools", &json!({}))?;
    let tools: Vec<String> = listed.tools.into_iter().map(|t| t.name).collect();
    for needed in ["check_stock", "place_order"] {
        if !tools.iter().any(|t| t == needed) {
            bail!("the supplier's server offers no {needed} tool (it has {tools:?})");
        }
    }
    let stock: ToolResult<Stock> = ctx.effect("supplier.stock", &json!({ "sku": input.sku }))?;
    let on_hand = stock.structured.on_hand;
    let shortage = input.quantity - on_hand;
    log::info(format_args!(
        "{}: {} wanted, {on_hand} on hand",
        input.sku, input.quantity
    ));
    let order = if shortage > 0 {
        let key = format!("order:{}:{}", input.sku, input.quantity);
        let placed: ToolResult<Value> = ctx.effect_with_key(
            "supplier.order",
            &key,
            &json!({ "sku": input.sku, "quantity": shortage }),
        )?;
        log::info(format_args!("the supplier placed {}", placed.structured));
        Some(placed.structured)
    } else {
        None
    };
    Ok(Output {
        server: listed.server,
        tools,
        sku: input.sku,
        on_hand,
        shortage: shortage.max(0),
        ordered: order.is_some(),
        order,
    })
}

stephost_guest::export_step!(run);
