//! The `http` effect kind: one request per attempt, classified for the retry
//! loop; every write carries its operation id as `Idempotency-Key`, with the
//! run id, the fencing token and the payload hash, so receivers can
//! deduplicate and refuse stale writers.

use std::time::Duration;

use ureq::http;

use super::{Failure, Handler, Lookup, Reply, Request, payload_sha256};
use stephost_core::CallClass;

/// Largest response body read, in bytes (the journal applies the payload
/// limit on top).
const RESPONSE_BYTES_MAX: u64 = 16 * 1024 * 1024;

pub struct HttpEffect {
    agent: ureq::Agent,
    method: http::Method,
    url: String,
    headers: Vec<(String, String)>,
    lookup: Option<String>,
    idempotent: bool,
}

impl HttpEffect {
    /// `headers` are already resolved (secrets taken from the environment).
    pub fn new(
        method: &str,
        url: String,
        headers: Vec<(String, String)>,
        lookup: Option<String>,
        idempotent: bool,
        timeout: Duration,
    ) -> Result<Self, String> {
        let method = http::Method::from_bytes(method.to_ascii_uppercase().as_bytes())
            .map_err(|_| format!("{method:?} is not an HTTP method"))?;
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(timeout))
            .max_redirects(0)
            .build();
        Ok(HttpEffect {
            agent: config.into(),
            method,
            url,
            headers,
            lookup,
            idempotent,
        })
    }

    fn send(
        &self,
        method: http::Method,
        url: &str,
        request: &Request<'_>,
        body: Option<&str>,
    ) -> Result<(u16, Option<Duration>, bool, String), Failure> {
        let mut builder = http::Request::builder().method(method).uri(url);
        for (name, value) in &self.headers {
            builder = builder.header(name, value);
        }
        builder = builder
            .header("Stephost-Run-Id", request.run_id)
            .header("Stephost-Operation-Id", request.operation_id);
        if request.class == CallClass::Write {
            builder = builder
                .header("Idempotency-Key", request.operation_id)
                .header("Stephost-Fence", request.fence.to_string())
                .header("Stephost-Payload-Sha256", payload_sha256(request.body));
        }
        let result = match body {
            Some(text) => {
                let req = builder
                    .header("Content-Type", "application/json")
                    .body(text.to_string())
                    .map_err(|e| Failure::Invalid(format!("cannot build the request: {e}")))?;
                self.agent.run(req)
            }
            None => {
                let req = builder
                    .body(())
                    .map_err(|e| Failure::Invalid(format!("cannot build the request: {e}")))?;
                self.agent.run(req)
            }
        };
        let mut response = result.map_err(|e| classify_error(url, e))?;
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let replayed = response
            .headers()
            .get("idempotent-replayed")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let text = response
            .body_mut()
            .with_config()
            .limit(RESPONSE_BYTES_MAX)
            .read_to_string()
            .map_err(|e| classify_error(url, e))?;
        Ok((status, retry_after, replayed, text))
    }
}

/// Turns a response body into the JSON text the guest receives.
fn as_json(text: String) -> String {
    if text.trim().is_empty() {
        return "null".to_string();
    }
    match serde_json::from_str::<serde::de::IgnoredAny>(&text) {
        Ok(_) => text,
        Err(_) => serde_json::Value::String(text).to_string(),
    }
}

fn excerpt(text: &str) -> &str {
    stephost_core::journal::truncate(text.trim(), 300)
}

fn classify_error(url: &str, e: ureq::Error) -> Failure {
    match &e {
        ureq::Error::BadUri(m) => Failure::Invalid(format!("bad URL {url}: {m}")),
        ureq::Error::Http(m) => Failure::Invalid(format!("bad request for {url}: {m}")),
        ureq::Error::RequireHttpsOnly(m) => Failure::Invalid(m.clone()),
        // The receiver answered (and so may have acted); its answer is lost.
        ureq::Error::BodyExceedsLimit(n) => {
            Failure::retryable(format!("{url}: response larger than {n} bytes"))
        }
        // The request never reached the receiver.
        ureq::Error::HostNotFound | ureq::Error::ConnectionFailed => {
            Failure::not_received(format!("{url}: {e}"))
        }
        ureq::Error::Timeout(ureq::Timeout::Resolve | ureq::Timeout::Connect) => {
            Failure::not_received(format!("{url}: {e}"))
        }
        ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            Failure::not_received(format!("{url}: {e}"))
        }
        other => Failure::retryable(format!("{url}: {other}")),
    }
}

/// Fills `{field}` from the request JSON, and `{operation_id}`, `{run_id}`;
/// values are percent-encoded.
pub fn render_url(template: &str, request: &Request<'_>) -> Result<String, Failure> {
    let body: serde_json::Value = serde_json::from_str(request.body).unwrap_or_default();
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let close = after.find('}').ok_or_else(|| {
            Failure::Invalid(format!("URL template {template:?} has an unclosed {{"))
        })?;
        let name = &after[..close];
        let value = match name {
            "operation_id" => request.operation_id.to_string(),
            "run_id" => request.run_id.to_string(),
            field => match body.get(field) {
                Some(serde_json::Value::String(s)) => s.clone(),
                Some(v @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_))) => {
                    v.to_string()
                }
                _ => {
                    return Err(Failure::Invalid(format!(
                        "the request has no string or number field {field:?} for the URL {template}"
                    )));
                }
            },
        };
        out.push_str(&percent_encode(&value));
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl Handler for HttpEffect {
    fn perform(&self, request: &Request<'_>) -> Result<Reply, Failure> {
        let url = render_url(&self.url, request)?;
        let body = match self.method {
            http::Method::GET | http::Method::HEAD | http::Method::DELETE => None,
            _ => Some(request.body),
        };
        let (status, retry_after, duplicate, text) =
            self.send(self.method.clone(), &url, request, body)?;
        match status {
            200..=299 => Ok(Reply {
                body: as_json(text),
                duplicate,
            }),
            408 | 429 | 500..=599 => Err(Failure::Retryable {
                message: format!("{url} answered {status}: {}", excerpt(&text)),
                retry_after,
                // 429 and 503 say the request was turned away; a 500, 502 or
                // 504 may come after the receiver acted.
                maybe_received: !matches!(status, 429 | 503),
            }),
            _ => Err(Failure::Rejected(format!(
                "{url} answered {status}: {}",
                excerpt(&text)
            ))),
        }
    }

    fn lookup(&self, request: &Request<'_>) -> Result<Lookup, Failure> {
        let Some(template) = &self.lookup else {
            return Ok(Lookup::Unsupported);
        };
        let url = render_url(template, request)?;
        let (status, _, _, text) = self.send(http::Method::GET, &url, request, None)?;
        match status {
            200..=299 => Ok(Lookup::Found(as_json(text))),
            404 | 410 => Ok(Lookup::NotFound),
            _ => Err(Failure::retryable(format!(
                "lookup {url} answered {status}: {}",
                excerpt(&text)
            ))),
        }
    }

    fn idempotent(&self) -> bool {
        self.idempotent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(body: &str) -> Request<'_> {
        Request {
            run_id: "run 1",
            effect: "e",
            class: CallClass::Write,
            operation_id: "abc",
            fence: 1,
            body,
        }
    }

    #[test]
    fn url_templates_take_fields_from_the_request_and_encode_them() {
        let r = request(r#"{"sku": "A B/7", "n": 3}"#);
        assert_eq!(
            render_url(
                "http://h/inv/{sku}?n={n}&op={operation_id}&run={run_id}",
                &r
            )
            .unwrap(),
            "http://h/inv/A%20B%2F7?n=3&op=abc&run=run%201"
        );
        assert!(matches!(
            render_url("http://h/{missing}", &r),
            Err(Failure::Invalid(_))
        ));
    }

    #[test]
    fn a_response_that_is_not_json_reaches_the_guest_as_a_json_string() {
        assert_eq!(as_json("{\"a\":1}".into()), "{\"a\":1}");
        assert_eq!(as_json("plain text".into()), "\"plain text\"");
        assert_eq!(as_json("".into()), "null");
    }
}
