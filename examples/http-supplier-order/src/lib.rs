//! Example step: orders missing stock from a supplier with Rust's own HTTP
//! client (`wstd`, over `wasi:http`) instead of `effects.call`.
//!
//! Input `{"sku": "WIDGET-7", "quantity": 10, "supplier":
//! "http://127.0.0.1:8080"}` (`supplier` defaults to that). The step reads
//! the stock with `GET /inventory/{sku}` and orders the shortage with
//! `POST /orders`. The host journals each exchange: the GET is a read, the
//! POST a write, recorded as started before it leaves and sent with its
//! operation id as `Idempotency-Key`, so a resumed run never orders twice and
//! a replay makes no request. The origin must be granted in stephost.toml.
//!
//! Output `{"sku", "on_hand", "shortage", "ordered", "receipt"}`.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use stephost_guest::{Ctx, Error, bail, log};
use wstd::http::{Body, Client, Request};

#[derive(Debug, Deserialize)]
struct Input {
    sku: String,
    quantity: i64,
    #[serde(default = "default_supplier")]
    supplier: String,
}

fn default_supplier() -> String {
    "http://127.0.0.1:8080".to_string()
}

#[derive(Debug, Deserialize)]
struct Stock {
    on_hand: i64,
}

#[derive(Debug, Serialize)]
struct Output {
    sku: String,
    on_hand: i64,
    shortage: i64,
    ordered: bool,
    receipt: Option<Value>,
}

fn run(_ctx: &mut Ctx, input: Input) -> Result<Output, Error> {
    if input.sku.is_empty() {
        bail!("sku must not be empty");
    }
    wstd::runtime::block_on(order(input)).map_err(|e| Error::msg(format!("{e:#}")))
}

async fn order(input: Input) -> Result<Output, wstd::http::Error> {
    let client = Client::new();
    let url = format!("{}/inventory/{}", input.supplier, input.sku);
    let mut response = client.send(Request::get(&url).body(Body::empty())?).await?;
    if !response.status().is_success() {
        return Err(wstd::http::Error::msg(format!(
            "GET {url} answered {}",
            response.status()
        )));
    }
    let stock: Stock = response.body_mut().json().await?;
    let shortage = input.quantity - stock.on_hand;
    log::info(format_args!(
        "{}: {} wanted, {} on hand",
        input.sku, input.quantity, stock.on_hand
    ));
    let receipt = if shortage > 0 {
        let url = format!("{}/orders", input.supplier);
        let request = Request::post(&url)
            .header("content-type", "application/json")
            .body(Body::from_json(
                &json!({ "sku": input.sku, "quantity": shortage }),
            )?)?;
        let mut response = client.send(request).await?;
        let status = response.status();
        if !status.is_success() {
            let text = response.body_mut().str_contents().await.unwrap_or_default();
            return Err(wstd::http::Error::msg(format!(
                "POST {url} answered {status}: {text}"
            )));
        }
        let receipt: Value = response.body_mut().json().await?;
        log::info(format_args!("the supplier accepted the order: {receipt}"));
        Some(receipt)
    } else {
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

stephost_guest::export_step!(run);
