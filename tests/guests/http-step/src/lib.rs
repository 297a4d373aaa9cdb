//! Test guest: `{"requests": [{"method", "url", "headers"?: [[name, value]],
//! "body"? or "body_bytes"?}]}` sends each request in turn with Rust's `wstd` client over
//! `wasi:http` and returns, for each, `{"status", "headers", "body"}` or
//! `{"error"}` (the client's error, e.g. a denied origin or a forbidden
//! header), going on with the next.
//!
//! Hostile modes, over the raw `wasi:http` bindings: `{"hold": {"url",
//! "bodies": N, "bytes": M}}` opens N POST requests to `url` and writes M
//! bytes into each body without ever finishing one; `{"stall": {"url"}}`
//! sends a POST whose body it writes 64 bytes of and never finishes, then
//! blocks on the response.

use serde::Deserialize;
use serde_json::{Value, json};
use stephost_guest::{Ctx, Error};
use wstd::http::{Body, Client, Request};

#[derive(Deserialize)]
struct Input {
    #[serde(default)]
    requests: Vec<Req>,
    #[serde(default)]
    hold: Option<Hold>,
    #[serde(default)]
    stall: Option<Stall>,
}

#[derive(Deserialize)]
struct Hold {
    url: String,
    bodies: usize,
    bytes: usize,
}

#[derive(Deserialize)]
struct Stall {
    url: String,
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
    if let Some(hold) = input.hold {
        return raw::hold(&hold.url, hold.bodies, hold.bytes).map_err(Error::from);
    }
    if let Some(stall) = input.stall {
        return raw::stall(&stall.url).map_err(Error::from);
    }
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

/// Requests made with the raw `wasi:http` bindings.
mod raw {
    use serde_json::{Value, json};
    use wasip2::http::outgoing_handler;
    use wasip2::http::types::{Fields, Method, OutgoingBody, OutgoingRequest, Scheme};

    /// A POST request to `url` (`http://host:port/path`) and its body.
    fn post(url: &str) -> Result<(OutgoingRequest, OutgoingBody), String> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| format!("not an http URL: {url}"))?;
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let request = OutgoingRequest::new(Fields::new());
        request.set_method(&Method::Post).map_err(|()| "method")?;
        request
            .set_scheme(Some(&Scheme::Http))
            .map_err(|()| "scheme")?;
        request
            .set_authority(Some(authority))
            .map_err(|()| "authority")?;
        let path = if path.is_empty() { "/" } else { path };
        request
            .set_path_with_query(Some(path))
            .map_err(|()| "path")?;
        let body = request.body().map_err(|()| "body")?;
        Ok((request, body))
    }

    /// Writes `bytes` bytes into `body`, 4 KiB at a time, waiting as told.
    fn write(body: &OutgoingBody, bytes: usize) -> Result<(), String> {
        let stream = body.write().map_err(|()| "the body's stream")?;
        let chunk = [b'x'; 4096];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(chunk.len());
            stream
                .blocking_write_and_flush(&chunk[..n])
                .map_err(|e| format!("writing the body: {e:?}"))?;
            left -= n;
        }
        Ok(())
    }

    pub fn hold(url: &str, bodies: usize, bytes: usize) -> Result<Value, String> {
        let mut open = Vec::new();
        for _ in 0..bodies {
            let (request, body) = post(url)?;
            write(&body, bytes)?;
            open.push((request, body));
        }
        Ok(json!({"held": open.len()}))
    }

    pub fn stall(url: &str) -> Result<Value, String> {
        let (request, body) = post(url)?;
        write(&body, 64)?;
        let future =
            outgoing_handler::handle(request, None).map_err(|e| format!("handle: {e:?}"))?;
        future.subscribe().block();
        let answer = future.get();
        drop(body);
        Ok(json!({"answer": format!("{answer:?}")}))
    }
}

stephost_guest::export_step!(run);
