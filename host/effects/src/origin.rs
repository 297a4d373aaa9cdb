//! An origin granted to steps' own HTTP clients (`[http."ORIGIN"]`, behind
//! `wasi:http/outgoing-handler`): one exchange per attempt, any status a
//! response. The request the ledger keeps, and this handler sends, is an
//! [`Exchange`] as JSON; the answer is a [`Answered`] as JSON.
//!
//! A write carries `Idempotency-Key` (its operation id), `Stephost-Fence`,
//! `Stephost-Payload-Sha256` (of its body), `Stephost-Run-Id` and
//! `Stephost-Operation-Id`; the origin's configured
//! headers (credentials) are added here, on the way out, so they are never
//! recorded and a step can neither set nor read them.
//!
//! A response's `set-cookie` headers are dropped before it is recorded: a
//! step never sees them. The methods an origin takes are its `methods`
//! (any but TRACE and CONNECT without them); its `classes` match paths by
//! whole segments, dot segments resolved.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::retry::RetryPolicy;
use ureq::http;

use crate::handler::{Effect, Failure, Handler, Lookup, Reply, Request, payload_sha256};
use crate::http::{check_template, classify_error, operation_headers, render_url};
use crate::section::{
    ClassName, Secrets, checked_pointer, default_receipt_pointer, default_timeout_ms, resolve_env,
};
use stephost_core::CallClass;

/// A request as the step made it: no `host` header (the URL has it), the
/// headers in the step's order, the body whole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exchange {
    pub method: String,
    pub url: String,
    pub headers: Vec<(String, String)>,
    #[serde(flatten)]
    pub body: Body,
}

/// A response as the step receives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answered {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    #[serde(flatten)]
    pub body: Body,
}

/// A body as recorded: its text when it is UTF-8, else base64.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Body {
    Text { body: String },
    Bytes { body_base64: String },
}

impl Body {
    pub fn of(bytes: Vec<u8>) -> Body {
        match String::from_utf8(bytes) {
            Ok(body) => Body::Text { body },
            Err(e) => Body::Bytes {
                body_base64: base64::engine::general_purpose::STANDARD.encode(e.as_bytes()),
            },
        }
    }

    pub fn bytes(&self) -> Result<Vec<u8>, String> {
        match self {
            Body::Text { body } => Ok(body.clone().into_bytes()),
            Body::Bytes { body_base64 } => base64::engine::general_purpose::STANDARD
                .decode(body_base64)
                .map_err(|e| format!("a recorded body is not base64: {e}")),
        }
    }
}

/// The header a write's response carries when its body was too large to
/// record: the body's size and sha256.
pub const BODY_OMITTED: &str = "x-stephost-body-omitted";

/// Whether `method` only reads, as HTTP defines it (GET, HEAD, OPTIONS).
pub fn reads(method: &str) -> bool {
    matches!(method, "GET" | "HEAD" | "OPTIONS")
}

/// A class given to some of an origin's requests, by method and path
/// prefix (`[[http."ORIGIN".classes]]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassRule {
    /// Any method when `None`.
    pub method: Option<String>,
    /// A path prefix, whole segments (`/v1/search` names `/v1/search` and
    /// `/v1/search/x`, not `/v1/searchAndDestroy`); any path when `None`.
    pub path: Option<String>,
    pub class: CallClass,
}

/// The methods an origin takes unless its configuration lists them: any
/// but TRACE (which echoes the request, injected credentials included)
/// and CONNECT (a tunnel, past the host's recording).
pub fn method_allowed(methods: Option<&[String]>, method: &str) -> bool {
    match methods {
        Some(methods) => methods.iter().any(|m| m.eq_ignore_ascii_case(method)),
        None => !method.eq_ignore_ascii_case("TRACE") && !method.eq_ignore_ascii_case("CONNECT"),
    }
}

/// A request path's segments, its query left out and its dot segments
/// (`.`, `..`, also percent-encoded) removed as a receiver resolves them.
fn segments(path: &str) -> Vec<&str> {
    let path = path.split(['?', '#']).next().unwrap_or("");
    let mut out: Vec<&str> = Vec::new();
    for segment in path.split('/').filter(|s| !s.is_empty()) {
        match segment.to_ascii_lowercase().replace("%2e", ".").as_str() {
            "." => {}
            ".." => {
                out.pop();
            }
            _ => out.push(segment),
        }
    }
    out
}

/// Whether `path` is `prefix` or below it, segment by segment.
fn under(path: &str, prefix: &str) -> bool {
    let (path, prefix) = (segments(path), segments(prefix));
    path.len() >= prefix.len() && path.iter().zip(&prefix).all(|(a, b)| a == b)
}

/// An origin's request classes: the first rule that matches, else GET,
/// HEAD and OPTIONS are reads and every other method a write.
pub fn class_of(rules: &[ClassRule], method: &str, path: &str) -> CallClass {
    rules
        .iter()
        .find(|r| {
            r.method
                .as_deref()
                .is_none_or(|m| m.eq_ignore_ascii_case(method))
                && r.path.as_deref().is_none_or(|p| under(path, p))
        })
        .map(|r| r.class)
        .unwrap_or(if reads(method) {
            CallClass::Read
        } else {
            CallClass::Write
        })
}

/// `scheme://host[:port]` of a URL, lower-cased, the scheme's default port
/// left out: how origins are granted and matched.
pub fn origin_of(url: &str) -> Option<String> {
    let uri: http::Uri = url.parse().ok()?;
    let scheme = uri.scheme_str()?.to_ascii_lowercase();
    let host = uri.host()?.to_ascii_lowercase();
    let default = match scheme.as_str() {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    Some(match uri.port_u16() {
        Some(port) if port != default => format!("{scheme}://{host}:{port}"),
        _ => format!("{scheme}://{host}"),
    })
}

/// Largest response body read, in bytes (the journal's payload limit
/// applies on top).
const RESPONSE_BYTES_MAX: u64 = 16 * 1024 * 1024;

/// A granted origin.
pub struct Origin {
    agent: ureq::Agent,
    /// Added to every request, already resolved (never recorded).
    headers: Vec<(String, String)>,
    lookup: Option<String>,
    idempotent: bool,
    lookup_not_found: Vec<u16>,
}

impl Origin {
    pub fn new(
        headers: Vec<(String, String)>,
        lookup: Option<String>,
        idempotent: bool,
        timeout: Duration,
    ) -> Result<Self, String> {
        if let Some(lookup) = &lookup {
            check_template(lookup, "lookup")?;
        }
        let config = ureq::Agent::config_builder()
            // A 4xx or 5xx is a response the step reads, not an error.
            .http_status_as_error(false)
            // The step sees a redirect and follows it itself (if granted).
            .max_redirects(0)
            .timeout_global(Some(timeout))
            .build();
        Ok(Origin {
            agent: config.into(),
            headers,
            lookup,
            idempotent,
            lookup_not_found: vec![404, 410],
        })
    }
}

impl Handler for Origin {
    fn perform(&self, request: &Request<'_>) -> Result<Reply, Failure> {
        let exchange: Exchange = serde_json::from_str(request.body)
            .map_err(|e| Failure::Invalid(format!("not an HTTP exchange: {e}")))?;
        let url = exchange.url.as_str();
        let body = exchange.body.bytes().map_err(Failure::Invalid)?;
        let mut builder = http::Request::builder()
            .method(exchange.method.as_str())
            .uri(url);
        // The host's trace context replaces the step's own, when the host
        // reports spans.
        let traced = request.trace.is_some();
        for (name, value) in &exchange.headers {
            // ureq writes its own Host and Content-Length.
            let host_writes = name.eq_ignore_ascii_case("host")
                || name.eq_ignore_ascii_case("content-length")
                || (traced
                    && (name.eq_ignore_ascii_case("traceparent")
                        || name.eq_ignore_ascii_case("tracestate")));
            if !host_writes {
                builder = builder.header(name, value);
            }
        }
        for (name, value) in &self.headers {
            builder = builder.header(name, value);
        }
        builder = operation_headers(builder, request, &body);
        let invalid = |e: http::Error| Failure::Invalid(format!("cannot build the request: {e}"));
        let result = if body.is_empty() && reads(&exchange.method) {
            self.agent.run(builder.body(()).map_err(invalid)?)
        } else {
            self.agent.run(builder.body(body).map_err(invalid)?)
        };
        let mut response = result.map_err(|e| classify_error(url, e))?;
        let status = response.status().as_u16();
        // A session cookie is a credential: never recorded, so never the
        // step's to see either (live or replayed alike).
        let headers = response
            .headers()
            .iter()
            .filter(|(k, _)| **k != http::header::SET_COOKIE)
            .map(|(k, v)| {
                (
                    k.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        let body = response
            .body_mut()
            .with_config()
            .limit(RESPONSE_BYTES_MAX)
            .read_to_vec()
            .map_err(|e| classify_error(url, e))?;
        let answered = Answered {
            status,
            headers,
            body: Body::of(body),
        };
        let text = serde_json::to_string(&answered)
            .map_err(|e| Failure::Invalid(format!("cannot record the response: {e}")))?;
        Ok(Reply {
            refusal: !(200..300).contains(&status),
            ..Reply::new(text)
        })
    }

    fn lookup(&self, request: &Request<'_>) -> Result<Lookup, Failure> {
        let Some(template) = &self.lookup else {
            return Ok(Lookup::Unsupported);
        };
        let url = render_url(template, request)?;
        let mut builder = http::Request::builder().method("GET").uri(url.as_str());
        for (name, value) in &self.headers {
            builder = builder.header(name, value);
        }
        let req = builder
            .body(())
            .map_err(|e| Failure::Invalid(format!("cannot build the lookup: {e}")))?;
        let mut response = self.agent.run(req).map_err(|e| classify_error(&url, e))?;
        let status = response.status().as_u16();
        if self.lookup_not_found.contains(&status) {
            return Ok(Lookup::NotFound);
        }
        let text = response
            .body_mut()
            .with_config()
            .limit(RESPONSE_BYTES_MAX)
            .read_to_string()
            .map_err(|e| classify_error(&url, e))?;
        if (200..300).contains(&status) {
            Ok(Lookup::Found(text))
        } else {
            Err(Failure::retryable(format!(
                "lookup {url} answered {status}"
            )))
        }
    }

    fn idempotent(&self) -> bool {
        self.idempotent
    }

    /// A write's response with its body left out, and said so in a header
    /// (`x-stephost-body-omitted: BYTES sha256=HEX`).
    fn answer_without_body(&self, answer: &str) -> Option<String> {
        let mut answered: Answered = serde_json::from_str(answer).ok()?;
        let body = answered.body.bytes().ok()?;
        answered.headers.retain(|(name, _)| {
            !name.eq_ignore_ascii_case("content-length")
                && !name.eq_ignore_ascii_case("transfer-encoding")
        });
        answered.headers.push((
            BODY_OMITTED.to_string(),
            format!("{} sha256={}", body.len(), payload_sha256(&body)),
        ));
        answered.body = Body::Text {
            body: String::new(),
        };
        serde_json::to_string(&answered).ok()
    }

    fn payload_sha256(&self, body: &str) -> String {
        serde_json::from_str::<Exchange>(body)
            .ok()
            .and_then(|e| e.body.bytes().ok())
            .map(payload_sha256)
            .unwrap_or_default()
    }
}

/// An origin granted to steps' own HTTP clients (`wasi:http`).
pub struct Granted {
    /// Its exchanges' effect (the class of each comes from `classes`).
    pub effect: Effect,
    pub classes: Vec<ClassRule>,
    /// The methods it takes (upper case); any but TRACE and CONNECT when
    /// `None` ([`method_allowed`]).
    pub methods: Option<Vec<String>>,
    /// The names of the headers the host adds (lower case): a step may not
    /// set them.
    pub headers: Vec<String>,
}

/// An origin granted to steps' own HTTP clients (`[http."ORIGIN"]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpOriginConfig {
    /// Added to every request; values may name environment variables as
    /// `${NAME}`. A step cannot set or read them, and they are never
    /// recorded.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The origin deduplicates writes by `Idempotency-Key`.
    #[serde(default)]
    pub idempotent: bool,
    /// URL answering 2xx + receipt (done) or 404 (not found) for an
    /// operation (`{operation_id}`).
    pub lookup: Option<String>,
    /// Where a lookup's receipt names the operation (a JSON pointer).
    #[serde(default = "default_receipt_pointer")]
    pub receipt_operation_pointer: String,
    /// Longest exchange, in milliseconds.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    #[serde(default)]
    pub retry: RetryPolicy,
    /// Classes by method and path prefix, the first match winning; without
    /// one GET, HEAD and OPTIONS are reads and other methods writes.
    #[serde(default)]
    pub classes: Vec<ClassRuleConfig>,
    /// The methods a step may use (and its injected headers ride on);
    /// without it any but TRACE and CONNECT.
    pub methods: Option<Vec<String>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassRuleConfig {
    pub method: Option<String>,
    /// A path prefix such as `/v1/search`.
    pub path: Option<String>,
    pub class: ClassName,
}

/// The granted origins (`[http."ORIGIN"]`), by their `scheme://host[:port]`.
pub fn grants(
    http: &BTreeMap<String, HttpOriginConfig>,
    secrets: &Secrets,
) -> Result<BTreeMap<String, Granted>, String> {
    let mut origins = BTreeMap::new();
    for (given, config) in http {
        let what = format!("http.\"{given}\"");
        let Some(origin) = origin_of(given) else {
            return Err(format!(
                "{what} is not an origin; write it as \"https://api.example.com\" or \
                 \"http://127.0.0.1:8080\""
            ));
        };
        if given
            .parse::<ureq::http::Uri>()
            .ok()
            .and_then(|u| u.path_and_query().map(|p| p.as_str() != "/"))
            .unwrap_or(false)
        {
            return Err(format!(
                "{what} has a path; an origin is scheme, host and port only ({origin})"
            ));
        }
        let receipt_pointer = checked_pointer(&config.receipt_operation_pointer, &what)?;
        let headers = config
            .headers
            .iter()
            .map(|(k, v)| Ok((k.clone(), resolve_env(v, &what, secrets)?)))
            .collect::<Result<Vec<_>, String>>()?;
        let handler = Origin::new(
            headers,
            config.lookup.clone(),
            config.idempotent,
            Duration::from_millis(config.timeout_ms),
        )
        .map_err(|e| format!("{what}: {e}"))?;
        let classes = config
            .classes
            .iter()
            .map(|r| ClassRule {
                method: r.method.as_ref().map(|m| m.to_ascii_uppercase()),
                path: r.path.clone(),
                class: r.class.class(),
            })
            .collect();
        let granted = Granted {
            effect: Effect {
                class: CallClass::Write,
                retry: config.retry.clone(),
                handler: Box::new(handler),
                receipt_pointer,
                redaction: None,
            },
            classes,
            methods: config
                .methods
                .as_ref()
                .map(|m| m.iter().map(|m| m.to_ascii_uppercase()).collect()),
            headers: config
                .headers
                .keys()
                .map(|k| k.to_ascii_lowercase())
                .collect(),
        };
        if origins.insert(origin.clone(), granted).is_some() {
            return Err(format!("{what} grants {origin} a second time"));
        }
    }
    Ok(origins)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_matched_without_default_ports_or_case() {
        assert_eq!(
            origin_of("HTTPS://API.Example.com:443/v1?q=1").as_deref(),
            Some("https://api.example.com")
        );
        assert_eq!(
            origin_of("http://127.0.0.1:8765/orders").as_deref(),
            Some("http://127.0.0.1:8765")
        );
        assert_eq!(origin_of("ftp://h/x"), None);
        assert_eq!(origin_of("/relative"), None);
    }

    #[test]
    fn a_request_class_is_its_method_unless_a_rule_says_otherwise() {
        let rules = [
            ClassRule {
                method: Some("POST".into()),
                path: Some("/v1/search".into()),
                class: CallClass::Read,
            },
            ClassRule {
                method: None,
                path: Some("/v1/trigger".into()),
                class: CallClass::Write,
            },
        ];
        assert_eq!(class_of(&rules, "POST", "/v1/search?q=x"), CallClass::Read);
        assert_eq!(class_of(&rules, "POST", "/v1/orders"), CallClass::Write);
        assert_eq!(class_of(&rules, "GET", "/v1/trigger/now"), CallClass::Write);
        assert_eq!(class_of(&rules, "GET", "/v1/orders"), CallClass::Read);
        assert_eq!(class_of(&[], "DELETE", "/"), CallClass::Write);
        assert_eq!(class_of(&[], "OPTIONS", "/"), CallClass::Read); // Whole segments, after the receiver's dot segments are resolved.
        assert_eq!(class_of(&rules, "POST", "/v1/search"), CallClass::Read);
        assert_eq!(class_of(&rules, "POST", "/v1/search/"), CallClass::Read);
        assert_eq!(class_of(&rules, "POST", "/v1/search/deep"), CallClass::Read);
        assert_eq!(
            class_of(&rules, "POST", "/v1/searchAndDestroy"),
            CallClass::Write
        );
        assert_eq!(
            class_of(&rules, "POST", "/v1/search/../orders"),
            CallClass::Write
        );
        assert_eq!(
            class_of(&rules, "POST", "/v1/search/%2E%2e/orders"),
            CallClass::Write
        );
        assert_eq!(class_of(&rules, "POST", "/v1/./search"), CallClass::Read);
    }

    #[test]
    fn an_origin_takes_any_method_but_trace_and_connect_unless_it_lists_them() {
        for method in ["GET", "POST", "DELETE", "PATCH", "PROPFIND"] {
            assert!(method_allowed(None, method), "{method}");
        }
        assert!(!method_allowed(None, "TRACE"));
        assert!(!method_allowed(None, "connect"));
        let listed = ["GET".to_string(), "TRACE".to_string()];
        assert!(method_allowed(Some(&listed), "trace"));
        assert!(!method_allowed(Some(&listed), "POST"));
    }

    #[test]
    fn a_body_is_recorded_as_text_when_it_is_utf8_and_base64_otherwise() {
        let text = Body::of(b"{\"a\":1}".to_vec());
        assert_eq!(
            serde_json::to_string(&text).unwrap(),
            r#"{"body":"{\"a\":1}"}"#
        );
        let bytes = Body::of(vec![0xff, 0x00, 0x10]);
        let json = serde_json::to_string(&bytes).unwrap();
        assert_eq!(json, r#"{"body_base64":"/wAQ"}"#);
        let back: Body = serde_json::from_str(&json).unwrap();
        assert_eq!(back.bytes().unwrap(), vec![0xff, 0x00, 0x10]);
    }
}
