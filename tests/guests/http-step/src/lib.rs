//! Test guest: `{"requests": [{"method", "url", "headers"?: [[name, value]],
//! "body"? or "body_bytes"?}]}` sends each request in turn with Rust's `wstd` client over
//! `wasi:http` and returns, for each, `{"status", "headers", "body"}` or
//! `{"error"}` (the client's error, e.g. a denied origin or a forbidden
//! header), going on with the next.

use serde::Deserialize;
use serde_json::{Value, json};
use stephost_guest::{Ctx, Error};
use wstd::http::{Body, Client, Request};

#[derive(Deserialize)]
struct Input {
    requests: Vec<Req>,
}

#[derive(Deserialize)]
struct Req {
    method: String,
    url: String,
    #[serde(default)]
    headers: Vec<(String, String)>,
    #[serde(default)]
    body: Option<String>,
    /// A body of this many bytes instead (larger than the input may be).
    #[serde(default)]
    body_bytes: Option<usize>,
}

fn run(_ctx: &mut Ctx, input: Input) -> Result<Value, Error> {
    Ok(wstd::runtime::block_on(async {
        let client = Client::new();
        let mut answers = Vec::new();
        for req in input.requests {
            answers.push(match send(&client, req).await {
                Ok(answer) => answer,
                Err(e) => json!({ "error": format!("{e:#}") }),
            });
        }
        Value::Array(answers)
    }))
}

async fn send(client: &Client, req: Req) -> Result<Value, wstd::http::Error> {
    let mut builder = Request::builder().method(req.method.as_str()).uri(&req.url);
    for (name, value) in &req.headers {
        builder = builder.header(name, value);
    }
    let body = match (req.body, req.body_bytes) {
        (_, Some(n)) => Body::from("x".repeat(n)),
        (Some(text), None) => Body::from(text),
        (None, None) => Body::empty(),
    };
    let mut response = client.send(builder.body(body)?).await?;
    let headers: Vec<(String, String)> = response
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let status = response.status().as_u16();
    let body = response.body_mut().str_contents().await?.to_string();
    Ok(json!({ "status": status, "headers": headers, "body": body }))
}

stephost_guest::export_step!(run);
