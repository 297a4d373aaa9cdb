//! Redaction: values at configured JSON pointers of a call's request and
//! response are kept in the ledger only as a marker holding their keyed
//! hash, the string `"stephost_redacted:hmac-sha256:HEX"`. A pointer's
//! segment `*` stands for every element of an array or member of an
//! object (`/messages/*/content/*/text`).
//!
//! The step sees the real values while it runs. A resumed or replayed step
//! sees the marker where a redacted response value was (the value is not
//! kept), so whatever it builds from that value holds the marker too.
//!
//! A call's request hash is of the request as kept, markers included: it
//! proves the kept text (the chain's links cover it) and gives away
//! nothing the text does not.
//!
//! Replay's divergence check still covers redacted request values: a new
//! request matches a recorded one when everything outside the markers is
//! equal, each marker stands at a pointer the configuration redacts, and
//! each value at a marker has the marker's keyed hash. A value at a marker
//! that itself holds a marker was built, in this replay, from a redacted
//! response; it cannot be compared and is accepted. A redacted response
//! value that a later request carries at a pointer that is not redacted is
//! stored there in full and diverges on replay: redact the request's
//! pointer too. A live call never sends a marker: one built after a resume
//! stops the run (`Stop::RedactedValue`).

use std::sync::Arc;

use serde_json::Value;

use crate::mac::MacKey;
use crate::outcome::Outcome;

/// What every marker starts with.
pub const MARKER: &str = "stephost_redacted:";
const SCHEME: &str = "hmac-sha256:";

/// Where a call's values are redacted, and the key their hashes are made
/// with. Clones share it.
#[derive(Clone, Debug)]
pub struct Redaction(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    request: Vec<Vec<String>>,
    response: Vec<Vec<String>>,
    key: MacKey,
}

impl Redaction {
    /// Pointers (RFC 6901, with `*` for every element) into the request and
    /// into the response; `key` makes the hashes (the operator's, so that
    /// nobody without it can test a guess against a hash). A pointer that
    /// is not one is an error.
    pub fn new(request: Vec<String>, response: Vec<String>, key: MacKey) -> Result<Self, String> {
        let parse = |pointers: Vec<String>| -> Result<Vec<Vec<String>>, String> {
            pointers.iter().map(|p| segments(p)).collect()
        };
        Ok(Redaction(Arc::new(Inner {
            request: parse(request)?,
            response: parse(response)?,
            key,
        })))
    }

    /// `request` (JSON text) as the ledger keeps it.
    pub fn request(&self, request: &str) -> String {
        self.apply(request, &self.0.request)
            .unwrap_or_else(|| request.to_string())
    }

    /// `outcome`'s JSON as the ledger keeps it: a value answered as JSON
    /// text (an effect's response, a model's answer) redacted inside.
    pub fn outcome(&self, outcome: &Outcome) -> String {
        match outcome {
            Outcome::Ok(Value::String(text)) if !self.0.response.is_empty() => {
                match self.apply(text, &self.0.response) {
                    Some(kept) => Outcome::Ok(Value::String(kept)).to_json(),
                    None => outcome.to_json(),
                }
            }
            _ => outcome.to_json(),
        }
    }

    /// Whether `new`, a request made in replay or on resume, is the request
    /// `recorded` (as the ledger keeps it, with markers): equal outside the
    /// markers, and at each marker a value with the marker's hash or one
    /// built from a redacted value (holding a marker itself).
    pub fn matches(&self, recorded: &str, new: &str) -> bool {
        let (Ok(recorded), Ok(mut new)) = (
            serde_json::from_str::<Value>(recorded),
            serde_json::from_str::<Value>(new),
        ) else {
            return false;
        };
        let mut at = Vec::new();
        markers(&recorded, &mut Vec::new(), &mut at);
        for (path, marker) in at {
            // A marker only where the configuration redacts: anywhere else
            // it would excuse any value from the comparison.
            if !self.0.request.iter().any(|pointer| covers(pointer, &path)) {
                return false;
            }
            let Some(value) = path.iter().try_fold(&mut new, |v, step| match step {
                Step::Index(i) => v.get_mut(*i),
                Step::Key(k) => v.get_mut(k.as_str()),
            }) else {
                return false;
            };
            if !value.to_string().contains(MARKER) && self.marker(value) != marker {
                return false;
            }
            *value = Value::String(marker);
        }
        recorded == new
    }

    /// `text` with the values at `pointers` replaced by markers; `None` if
    /// it is not JSON or nothing was there.
    fn apply(&self, text: &str, pointers: &[Vec<String>]) -> Option<String> {
        if pointers.is_empty() {
            return None;
        }
        let mut value: Value = serde_json::from_str(text).ok()?;
        let mut changed = false;
        for pointer in pointers {
            each_at(&mut value, pointer, &mut |at| {
                if !is_marker(at) {
                    *at = Value::String(self.marker(at));
                    changed = true;
                }
            });
        }
        changed.then(|| value.to_string())
    }

    /// The values at the request pointers of `request` (JSON text), as
    /// text: what an error's message must not repeat.
    pub fn request_values(&self, request: &str) -> Vec<String> {
        let Ok(mut value) = serde_json::from_str::<Value>(request) else {
            return Vec::new();
        };
        let mut found = Vec::new();
        for pointer in &self.0.request {
            each_at(&mut value, pointer, &mut |at| leaves(at, &mut found));
        }
        found
    }

    fn marker(&self, value: &Value) -> String {
        let mut hasher = self.0.key.start();
        // Apart from the chain's links, which the same key may sign.
        sha2::Digest::update(&mut hasher, b"stephost-redacted\0");
        sha2::Digest::update(&mut hasher, value.to_string().as_bytes());
        let mac = self.0.key.finish(hasher);
        format!("{MARKER}{SCHEME}{}", hex::encode(mac))
    }
}

/// Whether a text holds a redacted value's marker.
pub fn is_redacted(text: &str) -> bool {
    text.contains(MARKER)
}

/// What stands in a scrubbed text where a secret was.
pub const SCRUBBED: &str = "[redacted]";

/// Secrets no text the host records or sends may hold (an error's
/// message, an attempt's detail): every secret the configuration reads
/// (API keys, injected header values) and, for one call, the values its
/// request has redacted. Clones share the configured ones.
#[derive(Debug, Clone, Default)]
pub struct Scrub {
    secrets: Arc<Vec<String>>,
    /// The call's own redacted values.
    values: Vec<String>,
}

/// Secrets shorter than this are not scrubbed: they would blank out
/// ordinary words (a key is far longer).
const SCRUB_BYTES_MIN: usize = 4;

impl Scrub {
    pub fn new(secrets: impl IntoIterator<Item = String>) -> Self {
        let mut secrets: Vec<String> = secrets
            .into_iter()
            .filter(|s| s.len() >= SCRUB_BYTES_MIN)
            .collect();
        // The longest first: a secret inside another goes with it.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        secrets.dedup();
        Scrub {
            secrets: Arc::new(secrets),
            values: Vec::new(),
        }
    }

    /// These secrets and the values `redaction` redacts from `request`.
    pub fn for_call(&self, redaction: Option<&Redaction>, request: &str) -> Scrub {
        let mut values = redaction.map_or_else(Vec::new, |r| r.request_values(request));
        values.retain(|v| v.len() >= SCRUB_BYTES_MIN);
        values.sort_by_key(|s| std::cmp::Reverse(s.len()));
        Scrub {
            secrets: self.secrets.clone(),
            values,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty() && self.values.is_empty()
    }

    /// `text` with every secret replaced by [`SCRUBBED`].
    pub fn text<'t>(&self, text: &'t str) -> std::borrow::Cow<'t, str> {
        let mut out = std::borrow::Cow::Borrowed(text);
        for secret in self.values.iter().chain(self.secrets.iter()) {
            if out.contains(secret.as_str()) {
                out = std::borrow::Cow::Owned(out.replace(secret.as_str(), SCRUBBED));
            }
        }
        out
    }

    /// `outcome` with its error's message scrubbed.
    pub fn outcome(&self, outcome: Outcome) -> Outcome {
        match outcome {
            Outcome::Err(mut error) if !self.is_empty() => {
                if let std::borrow::Cow::Owned(clean) = self.text(&error.message) {
                    error.message = clean;
                }
                Outcome::Err(error)
            }
            other => other,
        }
    }
}

fn is_marker(value: &Value) -> bool {
    value.as_str().is_some_and(|s| s.starts_with(MARKER))
}

/// The scalar values in `value`, as text (a string as it is).
fn leaves(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(s) => out.push(s.clone()),
        Value::Array(items) => items.iter().for_each(|v| leaves(v, out)),
        Value::Object(members) => members.values().for_each(|v| leaves(v, out)),
        Value::Null => {}
        other => out.push(other.to_string()),
    }
}

/// A pointer's unescaped segments.
fn segments(pointer: &str) -> Result<Vec<String>, String> {
    if pointer.is_empty() {
        return Ok(Vec::new());
    }
    let Some(rest) = pointer.strip_prefix('/') else {
        return Err(format!(
            "{pointer:?} is not a JSON pointer; write it as \"/messages/0/content\""
        ));
    };
    Ok(rest
        .split('/')
        .map(|s| s.replace("~1", "/").replace("~0", "~"))
        .collect())
}

/// Calls `f` on every value at `pointer` (its `*` segments expanded).
fn each_at(value: &mut Value, pointer: &[String], f: &mut impl FnMut(&mut Value)) {
    let Some((first, rest)) = pointer.split_first() else {
        return f(value);
    };
    match value {
        Value::Array(items) if first == "*" => {
            items.iter_mut().for_each(|v| each_at(v, rest, f));
        }
        Value::Object(members) if first == "*" => {
            members.values_mut().for_each(|v| each_at(v, rest, f));
        }
        Value::Array(items) => {
            if let Some(v) = first.parse::<usize>().ok().and_then(|i| items.get_mut(i)) {
                each_at(v, rest, f);
            }
        }
        Value::Object(members) => {
            if let Some(v) = members.get_mut(first) {
                each_at(v, rest, f);
            }
        }
        _ => {}
    }
}

#[derive(Clone)]
enum Step {
    Index(usize),
    Key(String),
}

/// Whether `pointer` (with `*` for every element) names `path`.
fn covers(pointer: &[String], path: &[Step]) -> bool {
    pointer.len() == path.len()
        && pointer.iter().zip(path).all(|(segment, step)| {
            segment == "*"
                || match step {
                    Step::Index(i) => segment.parse::<usize>() == Ok(*i),
                    Step::Key(k) => segment == k,
                }
        })
}

/// The paths of the markers in `value`, with each marker.
fn markers(value: &Value, path: &mut Vec<Step>, out: &mut Vec<(Vec<Step>, String)>) {
    match value {
        Value::String(s) if s.starts_with(MARKER) => {
            out.push((path.clone(), s.clone()));
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                path.push(Step::Index(i));
                markers(v, path, out);
                path.pop();
            }
        }
        Value::Object(members) => {
            for (k, v) in members {
                path.push(Step::Key(k.clone()));
                markers(v, path, out);
                path.pop();
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redaction() -> Redaction {
        Redaction::new(
            vec!["/card/number".into(), "/messages/0/content/0/text".into()],
            vec!["/secret".into()],
            MacKey::new(b"test key"),
        )
        .unwrap()
    }

    #[test]
    fn values_at_the_pointers_are_replaced_by_a_keyed_hash_the_rest_kept() {
        let r = redaction();
        let kept = r.request(r#"{"card":{"number":"4111111111111111","exp":"12/30"},"n":1}"#);
        assert!(!kept.contains("4111111111111111"), "{kept}");
        assert!(kept.contains("12/30") && kept.contains(MARKER), "{kept}");
        // The same value, the same hash; another key, another.
        assert_eq!(
            kept,
            r.request(r#"{"card":{"number":"4111111111111111","exp":"12/30"},"n":1}"#)
        );
        let other =
            Redaction::new(vec!["/card/number".into()], vec![], MacKey::new(b"other")).unwrap();
        assert_ne!(
            kept,
            other.request(r#"{"card":{"number":"4111111111111111","exp":"12/30"},"n":1}"#)
        );
        // Nothing at a pointer, or not JSON: kept as it is.
        assert_eq!(r.request(r#"{"n":1}"#), r#"{"n":1}"#);
        assert_eq!(r.request("not json"), "not json");
    }

    #[test]
    fn a_response_is_redacted_inside_the_answer_text() {
        let r = redaction();
        let answer = Outcome::Ok(Value::String(r#"{"secret":"s3cr3t","ok":true}"#.into()));
        let kept = r.outcome(&answer);
        assert!(!kept.contains("s3cr3t"), "{kept}");
        assert!(kept.contains("ok"), "{kept}");
        let error = Outcome::error(crate::outcome::CallErrorKind::Rejected, "no");
        assert_eq!(r.outcome(&error), error.to_json());
    }

    #[test]
    fn a_star_stands_for_every_element_and_member() {
        let r = Redaction::new(
            vec!["/messages/*/content/*/text".into(), "/meta/*".into()],
            vec![],
            MacKey::new(b"k"),
        )
        .unwrap();
        let kept = r.request(
            r#"{"messages":[{"content":[{"text":"one"},{"text":"two"}]},{"content":[{"text":"three"}]}],"meta":{"a":"x","b":"y"},"n":"four"}"#,
        );
        for gone in ["one", "two", "three", "\"x\"", "\"y\""] {
            assert!(!kept.contains(gone), "{gone} in {kept}");
        }
        assert!(kept.contains("four"), "{kept}");
    }

    #[test]
    fn replay_compares_redacted_values_by_their_hash() {
        let r = redaction();
        let request = r#"{"card":{"number":"4111111111111111","exp":"12/30"},"n":1}"#;
        let recorded = r.request(request);
        assert!(r.matches(&recorded, request));
        // Another secret, or another value outside it: not the same request.
        assert!(!r.matches(
            &recorded,
            r#"{"card":{"number":"4000000000000002","exp":"12/30"},"n":1}"#
        ));
        assert!(!r.matches(
            &recorded,
            r#"{"card":{"number":"4111111111111111","exp":"12/31"},"n":1}"#
        ));
        assert!(!r.matches(&recorded, r#"{"card":{"exp":"12/30"},"n":1}"#));
        // A value built in replay from a redacted answer holds its marker:
        // it is accepted, the rest still compared.
        let built =
            format!(r#"{{"card":{{"number":"card {MARKER}{SCHEME}00","exp":"12/30"}},"n":1}}"#);
        assert!(r.matches(&recorded, &built));
        assert!(!r.matches(&recorded, &built.replace("12/30", "01/01"))); // A marker where the configuration redacts nothing excuses nothing:
        // the recording was changed, or recorded under other pointers.
        let planted = recorded.replace("\"n\":1", &format!("\"n\":\"{MARKER}{SCHEME}00\""));
        let holding = request.replace("\"n\":1", &format!("\"n\":\"x {MARKER}{SCHEME}01\""));
        assert!(!r.matches(&planted, &holding), "{planted} {holding}");
        assert!(r.matches(
            &recorded,
            &request.replace("4111111111111111", &format!("{MARKER}{SCHEME}02"))
        ));
    }

    #[test]
    fn a_scrub_clears_every_secret_and_a_calls_redacted_values_from_a_text() {
        let scrub = Scrub::new(["sk-live-123456".to_string(), "abc".to_string()]);
        assert_eq!(
            scrub.text("refused key sk-live-123456 (abc)"),
            "refused key [redacted] (abc)"
        );
        let r = redaction();
        let call = scrub.for_call(
            Some(&r),
            r#"{"card":{"number":"4111111111111111","exp":"12/30"},"n":1}"#,
        );
        assert_eq!(
            call.text("GET /cards/4111111111111111 with sk-live-123456: 404"),
            "GET /cards/[redacted] with [redacted]: 404"
        );
        let error = Outcome::error(
            crate::outcome::CallErrorKind::Rejected,
            "card 4111111111111111 declined",
        );
        assert_eq!(
            call.outcome(error),
            Outcome::error(
                crate::outcome::CallErrorKind::Rejected,
                "card [redacted] declined"
            )
        );
        // Nothing to scrub: the text as it is.
        assert!(matches!(
            Scrub::default().text("plain"),
            std::borrow::Cow::Borrowed("plain")
        ));
    }

    #[test]
    fn a_pointer_that_is_not_one_is_refused() {
        assert!(Redaction::new(vec!["card".into()], vec![], MacKey::new(b"k")).is_err());
    }
}
