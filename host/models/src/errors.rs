//! Provider errors: classification of HTTP and in-stream errors into retryable and final kinds,
//! `retry-after` parsing, rate-limit headers and request ids (docs/models.md, "Retries and errors").
//!
//! The rule (docs/models.md, "Retries and errors"): retryable are 408, 409, 429, every 5xx (529
//! included) and in-stream overloaded/api/rate-limit errors; final are 400, 401, 402, 403, 404, 413,
//! 422 and every other 4xx, and, whatever the status, a quota or billing error (OpenAI
//! `insufficient_quota` / `billing_hard_limit_reached`, Anthropic `billing_error` or "credit balance
//! is too low") and an OpenAI "Request too large" that can never fit the per-minute budget.
//! The header `x-should-retry: true|false` overrides all of it.
//!
//! Messages never carry a key: anything shaped like one (`sk-…`, `Bearer …`) is replaced by
//! `[redacted]`, and messages are bounded to [`MESSAGE_CHARS_MAX`] characters. The host should
//! additionally replace the exact key it sent, which only it knows.

use crate::api::Api;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Longest message kept in a [`ProviderError`], in characters.
pub const MESSAGE_CHARS_MAX: usize = 2000;

/// What went wrong, normalised across providers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The request is wrong (400, 422, other 4xx).
    InvalidRequest,
    /// Bad or missing key (401).
    Auth,
    /// The key may not do this (403).
    Permission,
    /// No such model or endpoint (404).
    NotFound,
    /// The request is too large (413, context too long, per-minute budget can never fit).
    TooLarge,
    /// Out of credit or over a spend limit (final, even on a 429).
    Quota,
    /// Rate limited (429).
    RateLimited,
    /// The provider is overloaded (503, 529, `overloaded_error`).
    Overloaded,
    /// A server-side failure (500, 502, 409, other 5xx).
    Server,
    /// The provider or a gateway timed out (408, 504, `timeout_error`).
    Timeout,
    /// The connection failed or the stream was cut.
    Transport,
    /// The provider refused the content.
    ContentFilter,
    /// The request asks for something the API cannot do.
    Unsupported,
}

impl ErrorKind {
    /// The snake_case spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequest => "invalid_request",
            ErrorKind::Auth => "auth",
            ErrorKind::Permission => "permission",
            ErrorKind::NotFound => "not_found",
            ErrorKind::TooLarge => "too_large",
            ErrorKind::Quota => "quota",
            ErrorKind::RateLimited => "rate_limited",
            ErrorKind::Overloaded => "overloaded",
            ErrorKind::Server => "server",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Transport => "transport",
            ErrorKind::ContentFilter => "content_filter",
            ErrorKind::Unsupported => "unsupported",
        }
    }
}

/// A classified provider error (docs/models.md, "Retries and errors").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{} ({}{}): {message}", kind.as_str(), if *retryable { "retryable" } else { "final" }, status.map(|s| format!(", HTTP {s}")).unwrap_or_default())]
pub struct ProviderError {
    /// What went wrong.
    pub kind: ErrorKind,
    /// Whether the host may try the same call again.
    pub retryable: bool,
    /// HTTP status; `None` for an error inside a stream or a transport failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// The provider's error `type`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_type: Option<String>,
    /// The provider's error `code`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_code: Option<String>,
    /// Delay asked by `retry-after-ms` or `retry-after`.
    #[serde(
        default,
        rename = "retry_after_ms",
        skip_serializing_if = "Option::is_none",
        with = "opt_duration_ms"
    )]
    pub retry_after: Option<Duration>,
    /// The provider's request id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// Human-readable message, with anything key-shaped redacted.
    pub message: String,
}

mod opt_duration_ms {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_millis))
    }
}

impl ProviderError {
    /// A connection failure, a timeout while reading, or a stream cut before its end: retryable.
    pub fn transport(message: impl Into<String>) -> Self {
        ProviderError {
            kind: ErrorKind::Transport,
            retryable: true,
            status: None,
            provider_type: None,
            provider_code: None,
            retry_after: None,
            request_id: None,
            message: clean_message(&message.into()),
        }
    }

    /// A final error of `kind` raised before any request left (an unsupported field, for example).
    pub fn local(kind: ErrorKind, message: impl Into<String>) -> Self {
        ProviderError {
            retryable: false,
            kind,
            ..ProviderError::transport(message)
        }
    }
}

/// Rate-limit state reported by the provider's headers. Resets are durations from the response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RateLimits {
    /// Requests allowed per window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_requests: Option<u64>,
    /// Tokens allowed per window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_tokens: Option<u64>,
    /// Requests left in the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remaining_requests: Option<u64>,
    /// Tokens left in the window (Anthropic rounds to the nearest thousand).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remaining_tokens: Option<u64>,
    /// Time until the request window resets.
    #[serde(
        default,
        rename = "reset_requests_ms",
        skip_serializing_if = "Option::is_none",
        with = "opt_duration_ms"
    )]
    pub reset_requests: Option<Duration>,
    /// Time until the token window resets.
    #[serde(
        default,
        rename = "reset_tokens_ms",
        skip_serializing_if = "Option::is_none",
        with = "opt_duration_ms"
    )]
    pub reset_tokens: Option<Duration>,
}

/// The value of header `name` (case-insensitive), trimmed.
pub fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim())
}

/// The provider's request id: `x-request-id` (OpenAI) or `request-id` (Anthropic).
pub fn request_id(api: Api, headers: &[(String, String)]) -> Option<String> {
    header(headers, api.request_id_header())
        .filter(|v| !v.is_empty())
        .map(str::to_string)
}

/// Classifies an HTTP error reply, reading the system clock only for an HTTP-date `retry-after`.
pub fn classify(api: Api, status: u16, headers: &[(String, String)], body: &[u8]) -> ProviderError {
    classify_at(api, status, headers, body, SystemTime::now())
}

/// [`classify`] with the clock injected (`now` is when the reply arrived).
pub fn classify_at(
    api: Api,
    status: u16,
    headers: &[(String, String)],
    body: &[u8],
    now: SystemTime,
) -> ProviderError {
    let json: Option<Value> = serde_json::from_slice(body).ok();
    let err_obj = json.as_ref().and_then(|v| v.get("error"));
    let str_at = |v: Option<&Value>, key: &str| {
        v.and_then(|o| o.get(key))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let provider_type = str_at(err_obj, "type");
    let provider_code = str_at(err_obj, "code");
    let message = str_at(err_obj, "message")
        .or_else(|| str_at(json.as_ref(), "message"))
        .unwrap_or_else(|| {
            let text = String::from_utf8_lossy(body);
            let text = text.trim();
            if text.is_empty() {
                format!("HTTP {status} with an empty body")
            } else {
                format!("HTTP {status}: {text}")
            }
        });

    let kind = kind_of(
        api,
        status,
        provider_type.as_deref(),
        provider_code.as_deref(),
        &message,
    );
    let mut retryable = match kind {
        ErrorKind::Quota | ErrorKind::TooLarge => false,
        _ => matches!(status, 408 | 409 | 429) || status >= 500,
    };
    match header(headers, "x-should-retry") {
        Some(v) if v.eq_ignore_ascii_case("true") => retryable = true,
        Some(v) if v.eq_ignore_ascii_case("false") => retryable = false,
        _ => {}
    }
    let request_id = request_id(api, headers).or_else(|| str_at(json.as_ref(), "request_id"));
    ProviderError {
        kind,
        retryable,
        status: Some(status),
        provider_type,
        provider_code,
        retry_after: retry_after(headers, now),
        request_id,
        message: clean_message(&message),
    }
}

fn is_quota(ty: Option<&str>, code: Option<&str>, message: &str) -> bool {
    const QUOTA: [&str; 3] = [
        "insufficient_quota",
        "billing_hard_limit_reached",
        "billing_error",
    ];
    ty.is_some_and(|t| QUOTA.contains(&t))
        || code.is_some_and(|c| QUOTA.contains(&c))
        || message
            .to_ascii_lowercase()
            .contains("credit balance is too low")
}

/// OpenAI's 429 "Request too large for gpt-4o … Limit 30000, Requested 50000": can never fit.
fn is_request_too_large_for_limit(message: &str) -> bool {
    if !message.starts_with("Request too large") {
        return false;
    }
    let number_after = |label: &str| -> Option<u64> {
        let rest = &message[message.find(label)? + label.len()..];
        let digits: String = rest
            .trim_start()
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .collect();
        digits.parse().ok()
    };
    match (number_after("Limit"), number_after("Requested")) {
        (Some(limit), Some(requested)) => requested > limit,
        _ => true,
    }
}

fn kind_of(
    api: Api,
    status: u16,
    ty: Option<&str>,
    code: Option<&str>,
    message: &str,
) -> ErrorKind {
    if is_quota(ty, code, message) {
        return ErrorKind::Quota;
    }
    if api.is_openai() && status == 429 && is_request_too_large_for_limit(message) {
        return ErrorKind::TooLarge;
    }
    if matches!(code, Some("context_length_exceeded"))
        || message.starts_with("prompt is too long")
        || matches!(ty, Some("request_too_large"))
    {
        return ErrorKind::TooLarge;
    }
    if matches!(code, Some("content_filter" | "content_policy_violation")) {
        return ErrorKind::ContentFilter;
    }
    if matches!(code, Some("unsupported_parameter" | "unsupported_value")) {
        return ErrorKind::Unsupported;
    }
    if let Some(kind) = ty.and_then(kind_of_type) {
        // Anthropic's `invalid_request_error` also comes with other 4xx: the status says more.
        if !(kind == ErrorKind::InvalidRequest && status != 400) {
            return kind;
        }
    }
    match status {
        400 | 422 => ErrorKind::InvalidRequest,
        401 => ErrorKind::Auth,
        402 => ErrorKind::Quota,
        403 => ErrorKind::Permission,
        404 => ErrorKind::NotFound,
        408 => ErrorKind::Timeout,
        409 => ErrorKind::Server,
        413 => ErrorKind::TooLarge,
        429 => ErrorKind::RateLimited,
        503 | 529 => ErrorKind::Overloaded,
        504 => ErrorKind::Timeout,
        s if s >= 500 => ErrorKind::Server,
        s if s >= 400 => ErrorKind::InvalidRequest,
        _ => ErrorKind::Transport,
    }
}

/// Error `type` values of Anthropic, plus OpenAI's few distinctive ones.
fn kind_of_type(ty: &str) -> Option<ErrorKind> {
    Some(match ty {
        "invalid_request_error" => ErrorKind::InvalidRequest,
        "authentication_error" => ErrorKind::Auth,
        "permission_error" => ErrorKind::Permission,
        "not_found_error" => ErrorKind::NotFound,
        "rate_limit_error" | "rate_limit_exceeded" => ErrorKind::RateLimited,
        "overloaded_error" => ErrorKind::Overloaded,
        "api_error" | "server_error" => ErrorKind::Server,
        "timeout_error" => ErrorKind::Timeout,
        "billing_error" | "insufficient_quota" => ErrorKind::Quota,
        _ => return None,
    })
}

/// Classifies an error that arrived inside a stream (HTTP 200 already sent):
/// Anthropic `{"type":"error","error":{…}}`, OpenAI Responses `error` (flat or nested) and
/// `response.failed` (`response.error`), OpenAI Chat `{"error":{…}}`. The shapes do not overlap, so
/// `_api` is only documentation at the call site.
pub fn classify_stream_error(_api: Api, data: &Value) -> ProviderError {
    let obj = data
        .get("response")
        .and_then(|r| r.get("error"))
        .filter(|e| e.is_object())
        .or_else(|| data.get("error").filter(|e| e.is_object()))
        .unwrap_or(data);
    let s = |key: &str| obj.get(key).and_then(Value::as_str).map(str::to_string);
    let provider_type = s("type").filter(|t| t != "error");
    let provider_code = s("code");
    let message = s("message").unwrap_or_else(|| "error event in the stream".to_string());
    let ty = provider_type.as_deref();
    let code = provider_code.as_deref();
    let kind = if is_quota(ty, code, &message) {
        ErrorKind::Quota
    } else if let Some(kind) = code.and_then(kind_of_type) {
        kind
    } else if let Some(kind) = ty.and_then(kind_of_type) {
        kind
    } else if code == Some("context_length_exceeded") {
        ErrorKind::TooLarge
    } else {
        ErrorKind::Server
    };
    let retryable = matches!(
        kind,
        ErrorKind::Overloaded | ErrorKind::Server | ErrorKind::RateLimited | ErrorKind::Timeout
    );
    let request_id = data
        .get("request_id")
        .and_then(Value::as_str)
        .map(str::to_string);
    ProviderError {
        kind,
        retryable,
        status: None,
        provider_type,
        provider_code,
        retry_after: None,
        request_id,
        message: clean_message(&message),
    }
}

/// `retry-after-ms` (milliseconds, fractions allowed), else `retry-after` in seconds (fractions
/// allowed) or as an HTTP date (relative to `now`, never negative).
pub fn retry_after(headers: &[(String, String)], now: SystemTime) -> Option<Duration> {
    if let Some(ms) = header(headers, "retry-after-ms").and_then(|v| v.parse::<f64>().ok())
        && let Some(wait) = seconds(ms / 1000.0)
    {
        return Some(wait);
    }
    let value = header(headers, "retry-after")?;
    if let Ok(secs) = value.parse::<f64>() {
        return seconds(secs);
    }
    let at = parse_http_date(value)?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Rate limits from `x-ratelimit-*` (OpenAI) or `anthropic-ratelimit-*` (Anthropic) headers,
/// reading the system clock for Anthropic's RFC 3339 resets.
pub fn rate_limits(api: Api, headers: &[(String, String)]) -> RateLimits {
    rate_limits_at(api, headers, SystemTime::now())
}

/// [`rate_limits`] with the clock injected (`now` is when the reply arrived).
pub fn rate_limits_at(api: Api, headers: &[(String, String)], now: SystemTime) -> RateLimits {
    let num = |name: &str| header(headers, name).and_then(|v| v.parse::<u64>().ok());
    if api.is_openai() {
        let dur = |name: &str| header(headers, name).and_then(parse_go_duration);
        RateLimits {
            limit_requests: num("x-ratelimit-limit-requests"),
            limit_tokens: num("x-ratelimit-limit-tokens"),
            remaining_requests: num("x-ratelimit-remaining-requests"),
            remaining_tokens: num("x-ratelimit-remaining-tokens"),
            reset_requests: dur("x-ratelimit-reset-requests"),
            reset_tokens: dur("x-ratelimit-reset-tokens"),
        }
    } else {
        let reset = |name: &str| {
            let at = parse_rfc3339(header(headers, name)?)?;
            Some(at.duration_since(now).unwrap_or(Duration::ZERO))
        };
        // `tokens-*` is the most restrictive of the input and output limits; older replies send
        // only `input-tokens-*`.
        let tokens = |what: &str| {
            num(&format!("anthropic-ratelimit-tokens-{what}"))
                .or_else(|| num(&format!("anthropic-ratelimit-input-tokens-{what}")))
        };
        RateLimits {
            limit_requests: num("anthropic-ratelimit-requests-limit"),
            limit_tokens: tokens("limit"),
            remaining_requests: num("anthropic-ratelimit-requests-remaining"),
            remaining_tokens: tokens("remaining"),
            reset_requests: reset("anthropic-ratelimit-requests-reset"),
            reset_tokens: reset("anthropic-ratelimit-tokens-reset")
                .or_else(|| reset("anthropic-ratelimit-input-tokens-reset")),
        }
    }
}

/// A Go-style duration as OpenAI sends it: `12ms`, `1.2s`, `6m0s`, `1h2m3.5s`, `250us`, `0s`.
pub fn parse_go_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    if s == "0" {
        return Some(Duration::ZERO);
    }
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return None;
        }
        let value: f64 = rest[..num_len].parse().ok()?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += value * scale;
    }
    seconds(total)
}

/// A provider's number of seconds as a duration: none for one that is not
/// a number of seconds (negative, NaN), the longest duration for one too
/// large to hold (the caller bounds what it waits), never a panic.
fn seconds(secs: f64) -> Option<Duration> {
    if secs.is_nan() || secs < 0.0 {
        return None;
    }
    Some(Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn system_time(days: i64, secs_of_day: i64, nanos: u32, offset_secs: i64) -> Option<SystemTime> {
    let secs = days * 86_400 + secs_of_day - offset_secs;
    let secs = u64::try_from(secs).ok()?;
    Some(UNIX_EPOCH + Duration::new(secs, nanos))
}

/// An HTTP date in IMF-fixdate form: `Sun, 06 Nov 1994 08:49:37 GMT`.
pub fn parse_http_date(s: &str) -> Option<SystemTime> {
    let parts: Vec<&str> = s.split_whitespace().collect();
    let [_, day, month, year, time, "GMT"] = parts.as_slice() else {
        return None;
    };
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month = MONTHS.iter().position(|m| m == month)? as u32 + 1;
    let day: u32 = day.parse().ok()?;
    let year: i64 = year.parse().ok()?;
    let secs = parse_hms(time)?;
    if !(1..=31).contains(&day) {
        return None;
    }
    system_time(days_from_civil(year, month, day), secs, 0, 0)
}

fn parse_hms(s: &str) -> Option<i64> {
    let mut it = s.split(':');
    let h: i64 = it.next()?.parse().ok()?;
    let m: i64 = it.next()?.parse().ok()?;
    let sec: i64 = it.next()?.parse().ok()?;
    if it.next().is_some() || h > 23 || m > 59 || sec > 60 {
        return None;
    }
    Some(h * 3600 + m * 60 + sec)
}

/// An RFC 3339 time: `2026-08-22T10:00:07Z`, `2026-08-22T10:00:07.250+02:00`.
pub fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let s = s.trim();
    let (date, rest) = s.split_once(['T', 't', ' '])?;
    let mut d = date.split('-');
    let year: i64 = d.next()?.parse().ok()?;
    let month: u32 = d.next()?.parse().ok()?;
    let day: u32 = d.next()?.parse().ok()?;
    if d.next().is_some() || !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    let (clock, offset) = if let Some(clock) = rest.strip_suffix(['Z', 'z']) {
        (clock, 0)
    } else {
        let at = rest.rfind(['+', '-'])?;
        let (clock, off) = rest.split_at(at);
        let sign = if off.starts_with('-') { -1 } else { 1 };
        let (oh, om) = off[1..].split_once(':')?;
        let oh: i64 = oh.parse().ok()?;
        let om: i64 = om.parse().ok()?;
        (clock, sign * (oh * 3600 + om * 60))
    };
    let (hms, frac) = match clock.split_once('.') {
        Some((hms, frac)) => (hms, frac),
        None => (clock, ""),
    };
    let secs = parse_hms(hms)?;
    let nanos = if frac.is_empty() {
        0
    } else {
        if !frac.chars().all(|c| c.is_ascii_digit()) {
            return None;
        }
        let digits: String = frac.chars().chain(std::iter::repeat('0')).take(9).collect();
        digits.parse().ok()?
    };
    system_time(days_from_civil(year, month, day), secs, nanos, offset)
}

/// Replaces key-shaped words (`sk-…`, `sk_…`, the word after `Bearer`) with `[redacted]`.
pub fn redact_key_like(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut after_bearer = false;
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String, after_bearer: &mut bool| {
        if word.is_empty() {
            return;
        }
        // A sentence's closing `.` is not part of the key: keep it after `[redacted]`.
        let (core, tail) = word.split_at(word.trim_end_matches('.').len());
        let keyish = core.len() > 3 && (core.starts_with("sk-") || core.starts_with("sk_"));
        if !core.is_empty() && (keyish || *after_bearer) {
            out.push_str("[redacted]");
            out.push_str(tail);
            *after_bearer = false;
        } else {
            *after_bearer = core.eq_ignore_ascii_case("bearer");
            out.push_str(word);
        }
        word.clear();
    };
    for c in text.chars() {
        if c.is_alphanumeric() || matches!(c, '-' | '_' | '*' | '.' | '~' | '+' | '/' | '=') {
            word.push(c);
        } else {
            flush(&mut word, &mut out, &mut after_bearer);
            if !c.is_whitespace() {
                after_bearer = false;
            }
            out.push(c);
        }
    }
    flush(&mut word, &mut out, &mut after_bearer);
    out
}

fn clean_message(message: &str) -> String {
    let redacted = redact_key_like(message);
    if redacted.chars().count() <= MESSAGE_CHARS_MAX {
        return redacted;
    }
    let mut cut: String = redacted.chars().take(MESSAGE_CHARS_MAX).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    const OPENAI_RATE: &str = r#"{"error":{"message":"Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000, Used 29000, Requested 2000. Please try again in 2s.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}"#;
    const OPENAI_QUOTA: &str = r#"{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;
    const ANTHROPIC_OVERLOADED: &str = r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_011CSLsW7mFqvHHnzrKdKjAE"}"#;

    /// One row: api, status, headers, body → kind, retryable.
    #[test]
    fn classification_table() {
        use Api::*;
        use ErrorKind::*;
        type Row = (
            Api,
            u16,
            Vec<(String, String)>,
            &'static str,
            ErrorKind,
            bool,
        );
        let rows: Vec<Row> = vec![
            (
                OpenAiChat,
                400,
                vec![],
                r#"{"error":{"message":"bad","type":"invalid_request_error","param":"x","code":null}}"#,
                InvalidRequest,
                false,
            ),
            (
                OpenAiChat,
                400,
                vec![],
                r#"{"error":{"message":"Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.","type":"invalid_request_error","param":"max_tokens","code":"unsupported_parameter"}}"#,
                Unsupported,
                false,
            ),
            (
                OpenAiChat,
                400,
                vec![],
                r#"{"error":{"message":"too long","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
                TooLarge,
                false,
            ),
            (
                OpenAiChat,
                401,
                vec![],
                r#"{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#,
                Auth,
                false,
            ),
            (
                OpenAiResponses,
                403,
                vec![],
                r#"{"error":{"message":"Country, region, or territory not supported","type":"request_forbidden","param":null,"code":"unsupported_country_region_territory"}}"#,
                Permission,
                false,
            ),
            (
                OpenAiChat,
                404,
                vec![],
                r#"{"error":{"message":"The model `x` does not exist","type":"invalid_request_error","param":null,"code":"model_not_found"}}"#,
                NotFound,
                false,
            ),
            (OpenAiChat, 408, vec![], "", Timeout, true),
            (OpenAiChat, 409, vec![], "", Server, true),
            (
                AnthropicMessages,
                413,
                vec![],
                "<html>413 Request Entity Too Large</html>",
                TooLarge,
                false,
            ),
            (OpenAiChat, 422, vec![], "{}", InvalidRequest, false),
            (OpenAiChat, 429, vec![], OPENAI_RATE, RateLimited, true),
            (OpenAiResponses, 429, vec![], OPENAI_QUOTA, Quota, false),
            (
                OpenAiChat,
                429,
                vec![],
                r#"{"error":{"message":"Billing hard limit has been reached","type":"invalid_request_error","param":null,"code":"billing_hard_limit_reached"}}"#,
                Quota,
                false,
            ),
            (
                OpenAiChat,
                429,
                vec![],
                r#"{"error":{"message":"Request too large for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000, Requested 50000.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}"#,
                TooLarge,
                false,
            ),
            (
                OpenAiChat,
                500,
                vec![],
                r#"{"error":{"message":"The server had an error","type":"server_error","param":null,"code":null}}"#,
                Server,
                true,
            ),
            (
                OpenAiChat,
                502,
                vec![],
                "<html>Bad gateway</html>",
                Server,
                true,
            ),
            (OpenAiChat, 503, vec![], "", Overloaded, true),
            (OpenAiChat, 504, vec![], "", Timeout, true),
            (
                OpenAiChat,
                500,
                h(&[("x-should-retry", "false")]),
                "",
                Server,
                false,
            ),
            (
                OpenAiChat,
                400,
                h(&[("X-Should-Retry", "true")]),
                "",
                InvalidRequest,
                true,
            ),
            (
                AnthropicMessages,
                400,
                vec![],
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 205351 tokens > 200000 maximum"},"request_id":"req_011CV5J4YZo4J3KLTDZgDN7S"}"#,
                TooLarge,
                false,
            ),
            (
                AnthropicMessages,
                400,
                vec![],
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low to access the Anthropic API."}}"#,
                Quota,
                false,
            ),
            (
                AnthropicMessages,
                401,
                vec![],
                r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#,
                Auth,
                false,
            ),
            (
                AnthropicMessages,
                402,
                vec![],
                r#"{"type":"error","error":{"type":"billing_error","message":"billing"}}"#,
                Quota,
                false,
            ),
            (
                AnthropicMessages,
                403,
                vec![],
                r#"{"type":"error","error":{"type":"permission_error","message":"no"}}"#,
                Permission,
                false,
            ),
            (
                AnthropicMessages,
                404,
                vec![],
                r#"{"type":"error","error":{"type":"not_found_error","message":"model: x"}}"#,
                NotFound,
                false,
            ),
            (
                AnthropicMessages,
                429,
                vec![],
                r#"{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}}"#,
                RateLimited,
                true,
            ),
            (
                AnthropicMessages,
                500,
                vec![],
                r#"{"type":"error","error":{"type":"api_error","message":"Internal server error"}}"#,
                Server,
                true,
            ),
            (
                AnthropicMessages,
                504,
                vec![],
                r#"{"type":"error","error":{"type":"timeout_error","message":"Request timeout"}}"#,
                Timeout,
                true,
            ),
            (
                AnthropicMessages,
                529,
                vec![],
                ANTHROPIC_OVERLOADED,
                Overloaded,
                true,
            ),
            (
                AnthropicMessages,
                418,
                vec![],
                "teapot",
                InvalidRequest,
                false,
            ),
        ];
        for (api, status, headers, body, kind, retryable) in rows {
            let e = classify(api, status, &headers, body.as_bytes());
            assert_eq!(
                (e.kind, e.retryable),
                (kind, retryable),
                "{api} {status} {body}: {e:?}"
            );
            assert_eq!(e.status, Some(status));
        }
    }

    #[test]
    fn openai_quota_keeps_type_code_and_message() {
        let e = classify(
            Api::OpenAiChat,
            429,
            &h(&[("x-request-id", "req_abc"), ("retry-after", "20")]),
            OPENAI_QUOTA.as_bytes(),
        );
        assert_eq!(e.provider_type.as_deref(), Some("insufficient_quota"));
        assert_eq!(e.provider_code.as_deref(), Some("insufficient_quota"));
        assert_eq!(e.request_id.as_deref(), Some("req_abc"));
        assert!(e.message.starts_with("You exceeded your current quota"));
        assert!(!e.retryable);
        // Retry-after is still reported; the host decides not to use it.
        assert_eq!(e.retry_after, Some(Duration::from_secs(20)));
    }

    #[test]
    fn anthropic_request_id_comes_from_header_then_body() {
        let e = classify(
            Api::AnthropicMessages,
            529,
            &h(&[("request-id", "req_hdr")]),
            ANTHROPIC_OVERLOADED.as_bytes(),
        );
        assert_eq!(e.request_id.as_deref(), Some("req_hdr"));
        let e = classify(
            Api::AnthropicMessages,
            529,
            &[],
            ANTHROPIC_OVERLOADED.as_bytes(),
        );
        assert_eq!(
            e.request_id.as_deref(),
            Some("req_011CSLsW7mFqvHHnzrKdKjAE")
        );
        assert_eq!(e.provider_type.as_deref(), Some("overloaded_error"));
        assert_eq!(e.message, "Overloaded");
        assert_eq!(
            request_id(Api::OpenAiChat, &h(&[("request-id", "x")])),
            None
        );
    }

    #[test]
    fn retry_after_ms_wins_then_seconds_then_http_date() {
        let now = UNIX_EPOCH + Duration::from_secs(784_111_777); // Sun, 06 Nov 1994 08:49:37 GMT
        let both = h(&[("retry-after-ms", "50"), ("retry-after", "1")]);
        assert_eq!(retry_after(&both, now), Some(Duration::from_millis(50)));
        assert_eq!(
            retry_after(&h(&[("retry-after", "1.5")]), now),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            retry_after(&h(&[("retry-after", "Sun, 06 Nov 1994 08:49:40 GMT")]), now),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            retry_after(&h(&[("retry-after", "Sun, 06 Nov 1994 08:49:00 GMT")]), now),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after(&h(&[("retry-after", "soon")]), now), None);
        assert_eq!(retry_after(&h(&[("retry-after", "-3")]), now), None);
        assert_eq!(retry_after(&h(&[("retry-after", "NaN")]), now), None);
        // A number too large for a duration is the longest one (the host
        // bounds the wait), never a panic.
        for huge in ["1e20", "1.8446744073709552e19", "inf", "1e308"] {
            assert_eq!(
                retry_after(&h(&[("retry-after", huge)]), now),
                Some(Duration::MAX),
                "{huge}"
            );
        }
        for huge in ["1e23", "inf"] {
            assert_eq!(
                retry_after(&h(&[("retry-after-ms", huge)]), now),
                Some(Duration::MAX),
                "{huge} ms"
            );
        }
        assert_eq!(
            parse_go_duration("99999999999999999999h"),
            Some(Duration::MAX)
        );
        assert_eq!(
            retry_after(&h(&[("retry-after-ms", "nope"), ("retry-after", "2")]), now),
            Some(Duration::from_secs(2))
        );
        let e = classify_at(
            Api::OpenAiChat,
            429,
            &h(&[("Retry-After-Ms", "50")]),
            OPENAI_RATE.as_bytes(),
            now,
        );
        assert_eq!(e.retry_after, Some(Duration::from_millis(50)));
        assert_eq!(
            serde_json::to_value(&e).unwrap()["retry_after_ms"],
            json!(50)
        );
    }

    #[test]
    fn http_date_and_rfc3339_parse_to_the_right_instant() {
        assert_eq!(
            parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(UNIX_EPOCH + Duration::from_secs(784_111_777))
        );
        assert_eq!(parse_http_date("Sunday, 06-Nov-94 08:49:37 GMT"), None);
        assert_eq!(
            parse_rfc3339("1994-11-06T08:49:37Z"),
            Some(UNIX_EPOCH + Duration::from_secs(784_111_777))
        );
        assert_eq!(
            parse_rfc3339("1994-11-06T10:49:37.25+02:00"),
            Some(UNIX_EPOCH + Duration::new(784_111_777, 250_000_000))
        );
        assert_eq!(
            parse_rfc3339("2000-03-01T00:00:00Z"),
            Some(UNIX_EPOCH + Duration::from_secs(951_868_800))
        );
        assert_eq!(parse_rfc3339("2000-13-01T00:00:00Z"), None);
        assert_eq!(parse_rfc3339("yesterday"), None);
    }

    #[test]
    fn go_durations_as_openai_sends_them() {
        let ms = |v: u64| Some(Duration::from_millis(v));
        assert_eq!(parse_go_duration("12ms"), ms(12));
        assert_eq!(parse_go_duration("1.2s"), ms(1200));
        assert_eq!(parse_go_duration("6m0s"), ms(360_000));
        assert_eq!(parse_go_duration("1h2m3.5s"), ms(3_723_500));
        assert_eq!(parse_go_duration("0s"), ms(0));
        assert_eq!(parse_go_duration("250us"), Some(Duration::from_micros(250)));
        assert_eq!(parse_go_duration("20ns"), Some(Duration::from_nanos(20)));
        assert_eq!(parse_go_duration("5"), None);
        assert_eq!(parse_go_duration("s"), None);
        assert_eq!(parse_go_duration("3 days"), None);
        assert_eq!(parse_go_duration(""), None);
    }

    #[test]
    fn openai_rate_limit_headers() {
        let headers = h(&[
            ("x-ratelimit-limit-requests", "500"),
            ("x-ratelimit-limit-tokens", "30000"),
            ("x-ratelimit-remaining-requests", "499"),
            ("x-ratelimit-remaining-tokens", "29000"),
            ("x-ratelimit-reset-requests", "120ms"),
            ("x-ratelimit-reset-tokens", "6m0s"),
        ]);
        let rl = rate_limits(Api::OpenAiResponses, &headers);
        assert_eq!(
            rl,
            RateLimits {
                limit_requests: Some(500),
                limit_tokens: Some(30000),
                remaining_requests: Some(499),
                remaining_tokens: Some(29000),
                reset_requests: Some(Duration::from_millis(120)),
                reset_tokens: Some(Duration::from_secs(360)),
            }
        );
        assert_eq!(
            serde_json::to_string(&rl).unwrap(),
            r#"{"limit_requests":500,"limit_tokens":30000,"remaining_requests":499,"remaining_tokens":29000,"reset_requests_ms":120,"reset_tokens_ms":360000}"#
        );
        // Azure's -1 is not a count.
        let azure = rate_limits(
            Api::OpenAiChat,
            &h(&[("x-ratelimit-remaining-requests", "-1")]),
        );
        assert_eq!(azure, RateLimits::default());
    }

    #[test]
    fn anthropic_rate_limit_headers_use_rfc3339_resets() {
        let now = parse_rfc3339("2026-08-22T10:00:00Z").unwrap();
        let headers = h(&[
            ("anthropic-ratelimit-requests-limit", "50"),
            ("anthropic-ratelimit-requests-remaining", "49"),
            ("anthropic-ratelimit-requests-reset", "2026-08-22T10:00:01Z"),
            ("anthropic-ratelimit-input-tokens-limit", "40000"),
            ("anthropic-ratelimit-input-tokens-remaining", "39000"),
            (
                "anthropic-ratelimit-input-tokens-reset",
                "2026-08-22T10:00:06Z",
            ),
            ("anthropic-ratelimit-tokens-remaining", "47000"),
            ("anthropic-ratelimit-tokens-reset", "2026-08-22T10:00:07.5Z"),
        ]);
        let rl = rate_limits_at(Api::AnthropicMessages, &headers, now);
        assert_eq!(rl.limit_requests, Some(50));
        assert_eq!(rl.remaining_requests, Some(49));
        assert_eq!(rl.reset_requests, Some(Duration::from_secs(1)));
        assert_eq!(rl.limit_tokens, Some(40000)); // falls back to input-tokens
        assert_eq!(rl.remaining_tokens, Some(47000));
        assert_eq!(rl.reset_tokens, Some(Duration::from_millis(7500)));
        // OpenAI headers are not read for Anthropic, and the reverse.
        assert_eq!(
            rate_limits(
                Api::AnthropicMessages,
                &h(&[("x-ratelimit-remaining-requests", "3")])
            ),
            RateLimits::default()
        );
    }

    #[test]
    fn messages_never_carry_a_key() {
        let body = r#"{"error":{"message":"Incorrect API key provided: sk-proj-abc123**************wxyz. You can find your API key at https://platform.openai.com/account/api-keys.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#;
        let e = classify(Api::OpenAiChat, 401, &[], body.as_bytes());
        assert!(!e.message.contains("abc123"), "{}", e.message);
        assert!(
            e.message
                .contains("Incorrect API key provided: [redacted].")
        );
        let e = classify(
            Api::OpenAiChat,
            502,
            &[],
            b"upstream said: Authorization: Bearer sk-live-secret rejected",
        );
        assert!(!e.message.contains("secret"), "{}", e.message);
        assert_eq!(
            redact_key_like("Bearer abc.def-ghi and sk_test_1 but not skip or task-1"),
            "Bearer [redacted] and [redacted] but not skip or task-1"
        );
    }

    #[test]
    fn long_non_json_bodies_are_bounded() {
        let body = "x".repeat(10_000);
        let e = classify(Api::OpenAiChat, 502, &[], body.as_bytes());
        assert!(e.message.chars().count() <= MESSAGE_CHARS_MAX + 1);
        assert!(e.message.starts_with("HTTP 502: xxx"));
        let e = classify(Api::OpenAiChat, 503, &[], b"");
        assert_eq!(e.message, "HTTP 503 with an empty body");
    }

    #[test]
    fn stream_errors_of_each_api() {
        let cases = [
            (
                Api::AnthropicMessages,
                json!({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}),
                ErrorKind::Overloaded,
                true,
            ),
            (
                Api::AnthropicMessages,
                json!({"type":"error","error":{"type":"invalid_request_error","message":"bad"}}),
                ErrorKind::InvalidRequest,
                false,
            ),
            (
                Api::OpenAiResponses,
                json!({"type":"error","sequence_number":2,"error":{"type":"insufficient_quota","code":"insufficient_quota","message":"You exceeded your current quota","param":null}}),
                ErrorKind::Quota,
                false,
            ),
            (
                Api::OpenAiResponses,
                json!({"type":"error","code":"server_error","message":"boom","param":null,"sequence_number":4}),
                ErrorKind::Server,
                true,
            ),
            (
                Api::OpenAiResponses,
                json!({"type":"response.failed","response":{"id":"resp_1","status":"failed","error":{"code":"rate_limit_exceeded","message":"slow down"}}}),
                ErrorKind::RateLimited,
                true,
            ),
            (
                Api::OpenAiResponses,
                json!({"type":"response.failed","response":{"status":"failed","error":{"code":"insufficient_quota","message":"pay"}}}),
                ErrorKind::Quota,
                false,
            ),
            (
                Api::OpenAiChat,
                json!({"error":{"message":"The server had an error","type":"server_error","param":null,"code":null}}),
                ErrorKind::Server,
                true,
            ),
        ];
        for (api, data, kind, retryable) in cases {
            let e = classify_stream_error(api, &data);
            assert_eq!((e.kind, e.retryable), (kind, retryable), "{data}");
            assert_eq!(e.status, None);
        }
    }

    #[test]
    fn provider_error_json_shape() {
        let e = classify(
            Api::OpenAiChat,
            429,
            &h(&[("x-request-id", "req_1"), ("retry-after", "1")]),
            OPENAI_RATE.as_bytes(),
        );
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["kind"], "rate_limited");
        assert_eq!(v["retryable"], true);
        assert_eq!(v["status"], 429);
        assert_eq!(v["provider_type"], "tokens");
        assert_eq!(v["provider_code"], "rate_limit_exceeded");
        assert_eq!(v["retry_after_ms"], 1000);
        assert_eq!(v["request_id"], "req_1");
        let back: ProviderError = serde_json::from_value(v).unwrap();
        assert_eq!(back, e);
        assert!(
            e.to_string()
                .starts_with("rate_limited (retryable, HTTP 429): Rate limit reached")
        );
    }
}
