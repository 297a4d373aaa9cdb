//! The `http` effect kind: one request per attempt, classified for the retry
//! loop; every write carries its operation id as `Idempotency-Key`, with the
//! run id, the fencing token and the payload hash, so receivers can
//! deduplicate and refuse stale writers.

use std::time::Duration;

use ureq::http;

use crate::handler::{Failure, Handler, Lookup, Reply, Request, payload_sha256};
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
    statuses: Statuses,
}

/// What a receiver's statuses mean, as the effect declares them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statuses {
    /// Retryable statuses (408, 429, 5xx) that say the request was turned
    /// away before it could act (default 429 and 503).
    pub not_received: Vec<u16>,
    /// Refusals (4xx) that are final even after an earlier attempt may have
    /// acted (default none: after such an attempt, a 409 "still in
    /// progress" or any other refusal leaves the call in doubt).
    pub final_refusals: Vec<u16>,
    /// Lookup statuses that say the receiver has no record of the
    /// operation (default 404 and 410).
    pub lookup_not_found: Vec<u16>,
}

impl Default for Statuses {
    fn default() -> Self {
        Statuses {
            not_received: vec![429, 503],
            final_refusals: Vec::new(),
            lookup_not_found: vec![404, 410],
        }
    }
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
        statuses: Statuses,
    ) -> Result<Self, String> {
        let method = http::Method::from_bytes(method.to_ascii_uppercase().as_bytes())
            .map_err(|_| format!("{method:?} is not an HTTP method"))?;
        check_template(&url, "url")?;
        if let Some(lookup) = &lookup {
            check_template(lookup, "lookup")?;
        }
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
            statuses,
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
        builder = operation_headers(builder, request, request.body);
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
            .and_then(|v| retry_after(v, std::time::SystemTime::now()));
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

/// The headers that carry a call's operation to its receiver: its run and
/// operation id, and for a write `Idempotency-Key`, its fencing token and
/// the sha256 of `payload` (what is sent).
pub(super) fn operation_headers(
    builder: http::request::Builder,
    request: &Request<'_>,
    payload: impl AsRef<[u8]>,
) -> http::request::Builder {
    let mut builder = builder
        .header("Stephost-Run-Id", request.run_id)
        .header("Stephost-Operation-Id", request.operation_id);
    if let Some((traceparent, tracestate)) = request.trace_context() {
        builder = builder.header("traceparent", traceparent);
        if let Some(state) = tracestate {
            builder = builder.header("tracestate", state);
        }
    }
    if request.class != CallClass::Write {
        return builder;
    }
    let builder = builder
        .header("Idempotency-Key", request.operation_id)
        .header("Stephost-Payload-Sha256", payload_sha256(payload));
    if stephost_core::crash::broken("skip-fence") {
        return builder;
    }
    builder.header("Stephost-Fence", request.fence.to_string())
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

pub(super) fn classify_error(url: &str, e: ureq::Error) -> Failure {
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

/// A `Retry-After` value: seconds, or an HTTP date (a date in the past is
/// no wait). The retry loop caps it at the effect's deadline.
pub fn retry_after(value: &str, now: std::time::SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = http_date(value)?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// An IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), the form RFC 9110
/// requires senders to use.
fn http_date(value: &str) -> Option<std::time::SystemTime> {
    let mut parts = value.split_whitespace();
    let (_weekday, day, month, year, time, zone) = (
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next()?,
    );
    if zone != "GMT" || parts.next().is_some() {
        return None;
    }
    let day: u64 = day.parse().ok()?;
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .iter()
    .position(|m| *m == month)? as u64
        + 1;
    let year: u64 = year.parse().ok()?;
    let mut hms = time.split(':').map(|n| n.parse::<u64>().ok());
    let (h, m, sec) = (hms.next()??, hms.next()??, hms.next()??);
    if !(1..=31).contains(&day) || !(1970..=9999).contains(&year) || h > 23 || m > 59 || sec > 60 {
        return None;
    }
    // Days since 1970-01-01 of a proleptic Gregorian date.
    let (y, mo) = if month <= 2 {
        (year - 1, month + 12)
    } else {
        (year, month)
    };
    let days = 365 * y + y / 4 - y / 100 + y / 400 + (153 * (mo - 3) + 2) / 5 + day - 719_469;
    let secs = days * 86_400 + h * 3_600 + m * 60 + sec;
    std::time::UNIX_EPOCH.checked_add(Duration::from_secs(secs))
}

/// Refuses a template with a placeholder in its scheme, host or port: a
/// guest's value must never choose where the effect's credentials go.
pub(super) fn check_template(template: &str, what: &str) -> Result<(), String> {
    let authority_end = template
        .find("://")
        .map(|at| {
            let rest = &template[at + 3..];
            at + 3 + rest.find(['/', '?', '#']).unwrap_or(rest.len())
        })
        .ok_or_else(|| format!("{what} {template:?} is not an absolute http(s) URL"))?;
    if template[..authority_end].contains('{') {
        return Err(format!(
            "{what} {template:?} has a placeholder in its scheme, host or port; only the path \
             and the query may take values from the request"
        ));
    }
    Ok(())
}

/// Fills `{field}` from the request JSON, and `{operation_id}`, `{run_id}`;
/// each value is percent-encoded as one path segment or query value (dots
/// included, so `..` cannot walk the receiver's paths).
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
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'~') {
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
        let message = || format!("{url} answered {status}: {}", excerpt(&text));
        match status {
            200..=299 => Ok(Reply {
                duplicate,
                ..Reply::new(as_json(text))
            }),
            408 | 429 | 500..=599 => Err(Failure::Retryable {
                message: message(),
                retry_after,
                // By default 429 and 503 say the request was turned away; a
                // 500, 502 or 504 may come after the receiver acted.
                maybe_received: !self.statuses.not_received.contains(&status),
            }),
            _ if self.statuses.final_refusals.contains(&status) => {
                Err(Failure::Rejected(message()))
            }
            _ => Err(Failure::Refused(message())),
        }
    }

    fn lookup(&self, request: &Request<'_>) -> Result<Lookup, Failure> {
        let Some(template) = &self.lookup else {
            return Ok(Lookup::Unsupported);
        };
        let url = render_url(template, request)?;
        let (status, _, _, text) = self.send(http::Method::GET, &url, request, None)?;
        match status {
            _ if self.statuses.lookup_not_found.contains(&status) => Ok(Lookup::NotFound),
            // Checked by the caller: only a receipt naming this operation
            // proves it happened.
            200..=299 => Ok(Lookup::Found(as_json(text))),
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
        crate::handler::test_request("run 1", "e", "abc", 1, body)
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
    fn dot_segments_are_encoded_and_the_host_takes_no_placeholder() {
        let r = request(r#"{"sku": "..", "dir": "."}"#);
        assert_eq!(
            render_url("http://h/inv/{sku}/{dir}/x", &r).unwrap(),
            "http://h/inv/%2E%2E/%2E/x"
        );
        for bad in [
            "http://{sku}.example/x",
            "http://h:{port}/x",
            "{scheme}://h/x",
            "http://user@{sku}/x",
        ] {
            assert!(check_template(bad, "url").is_err(), "{bad}");
        }
        assert!(check_template("http://h:8080/a/{sku}?q={n}", "url").is_ok());
    }

    #[test]
    fn retry_after_takes_seconds_or_a_date_and_never_overflows() {
        let now = std::time::UNIX_EPOCH + Duration::from_secs(784_111_777);
        assert_eq!(retry_after(" 120 ", now), Some(Duration::from_secs(120)));
        assert_eq!(
            retry_after("18446744073709551615", now),
            Some(Duration::from_secs(u64::MAX))
        );
        // Sun, 06 Nov 1994 08:49:37 GMT is 784111777 s after the epoch.
        assert_eq!(
            retry_after("Sun, 06 Nov 1994 08:50:37 GMT", now),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            retry_after("Sun, 06 Nov 1994 08:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after("soon", now), None);
        assert_eq!(retry_after("Sun, 06 Foo 1994 08:00:00 GMT", now), None);
    }

    #[test]
    fn a_response_that_is_not_json_reaches_the_guest_as_a_json_string() {
        assert_eq!(as_json("{\"a\":1}".into()), "{\"a\":1}");
        assert_eq!(as_json("plain text".into()), "\"plain text\"");
        assert_eq!(as_json("".into()), "null");
    }
}
