//! How request and response bodies are stored: small bodies in their call's
//! row; large ones by sha256, so that identical bodies are kept once
//! however many calls carry them. A model request (`{"messages": [...],
//! ...}`) is stored message by message: a long conversation sends every
//! earlier message again with each completion, and each message is kept
//! once.
//!
//! A stored body is its text with each part replaced by a reference
//! (`\u{1}` + the part's hex sha256 + `\u{1}`), and the parts. U+0001 is
//! never split on: a body that holds it is kept whole in its row. Loading
//! puts the parts back, byte for byte: the request hash and the chain are
//! over the body as the guest made it.

use sha2::{Digest, Sha256};

use crate::error::StoreError;

/// Bodies up to this long stay in their call's row, in bytes.
pub const INLINE_BYTES_MAX: usize = 1024;

/// Messages of a model request at least this long are parts of their own,
/// in bytes.
pub const MESSAGE_BYTES_MIN: usize = 64;

const MARK: char = '\u{1}';

/// A part of a body, kept once by its digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// Hex sha256 of `body`.
    pub digest: String,
    pub body: String,
}

/// A body as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// The body, or its text with references where its parts were.
    pub text: String,
    /// Empty when `text` is the body itself.
    pub parts: Vec<Part>,
}

impl Stored {
    /// Whether `text` holds references to parts.
    pub fn is_split(&self) -> bool {
        !self.parts.is_empty()
    }
}

/// Whether `body` is stored whole in its row (no parts).
pub fn stays_whole(body: &str) -> bool {
    body.len() <= INLINE_BYTES_MAX || body.contains(MARK)
}

/// How `body` is stored.
pub fn store(body: &str) -> Stored {
    if stays_whole(body) {
        return Stored {
            text: body.to_string(),
            parts: Vec::new(),
        };
    }
    if let Some(stored) = split_messages(body) {
        return stored;
    }
    let part = part(body);
    Stored {
        text: reference(&part.digest),
        parts: vec![part],
    }
}

/// The digests of the parts a split `text` refers to, in order.
pub fn references(text: &str) -> Vec<&str> {
    let mut digests = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(MARK) {
        let after = &rest[start + 1..];
        let Some(end) = after.find(MARK) else {
            break;
        };
        digests.push(&after[..end]);
        rest = &after[end + 1..];
    }
    digests
}

/// The body `text` stands for: itself, or, if it was `split`, the text
/// with each referenced part fetched by `part` (by digest).
pub fn load(
    text: &str,
    split: bool,
    mut part: impl FnMut(&str) -> Result<Option<String>, StoreError>,
) -> Result<String, StoreError> {
    if !split {
        return Ok(text.to_string());
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(MARK) {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        let end = after.find(MARK).ok_or_else(|| {
            StoreError::Corrupt("a stored body has an unterminated part reference".into())
        })?;
        let digest = &after[..end];
        let body = part(digest)?.ok_or_else(|| {
            StoreError::Corrupt(format!("a stored body's part {digest} is missing"))
        })?;
        if hex_sha256(&body) != digest {
            return Err(StoreError::Corrupt(format!(
                "a stored body's part {digest} does not match its digest"
            )));
        }
        out.push_str(&body);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// A model request's messages as parts, found where the guest wrote them.
fn split_messages(body: &str) -> Option<Stored> {
    #[derive(serde::Deserialize)]
    struct Request<'a> {
        #[serde(borrow)]
        messages: Vec<&'a serde_json::value::RawValue>,
    }
    if !body.contains("\"messages\"") {
        return None;
    }
    let request: Request<'_> = serde_json::from_str(body).ok()?;
    let base = body.as_ptr() as usize;
    let mut text = String::with_capacity(body.len() / 4);
    let mut parts: Vec<Part> = Vec::new();
    let mut at = 0;
    for message in request.messages {
        let message = message.get();
        if message.len() < MESSAGE_BYTES_MIN {
            continue;
        }
        // A raw value borrowed from `body` is a slice of it.
        let start = message.as_ptr() as usize - base;
        if start < at || body.get(start..start + message.len()) != Some(message) {
            return None;
        }
        text.push_str(&body[at..start]);
        let part = part(message);
        text.push_str(&reference(&part.digest));
        if !parts.iter().any(|p| p.digest == part.digest) {
            parts.push(part);
        }
        at = start + message.len();
    }
    if parts.is_empty() {
        return None;
    }
    text.push_str(&body[at..]);
    Some(Stored { text, parts })
}

fn part(body: &str) -> Part {
    Part {
        digest: hex_sha256(body),
        body: body.to_string(),
    }
}

fn reference(digest: &str) -> String {
    format!("{MARK}{digest}{MARK}")
}

fn hex_sha256(body: &str) -> String {
    crate::ids::to_hex(&Sha256::digest(body.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn round_trip(body: &str, kept: &mut HashMap<String, String>) -> Stored {
        let stored = store(body);
        for part in &stored.parts {
            kept.insert(part.digest.clone(), part.body.clone());
        }
        let loaded = load(&stored.text, stored.is_split(), |d| {
            Ok(kept.get(d).cloned())
        })
        .unwrap();
        assert_eq!(loaded, body);
        stored
    }

    #[test]
    fn small_bodies_stay_whole_and_large_ones_are_kept_once_by_digest() {
        let mut kept = HashMap::new();
        let small = round_trip(r#"{"sku":"W-7"}"#, &mut kept);
        assert!(!small.is_split());
        let large = format!(r#"{{"blob":"{}"}}"#, "x".repeat(5000));
        let first = round_trip(&large, &mut kept);
        let second = round_trip(&large, &mut kept);
        assert_eq!(first, second);
        assert_eq!(first.parts.len(), 1);
        assert!(first.text.len() < 80);
        assert_eq!(kept.len(), 1);
    }

    #[test]
    fn a_conversation_keeps_each_message_once_and_reads_back_byte_for_byte() {
        let mut kept = HashMap::new();
        let message = |i: usize| {
            format!(
                r#"{{"role": "user",  "content": "turn {i}: {}"}}"#,
                "words ".repeat(40)
            )
        };
        let mut history = Vec::new();
        let (mut texts, mut bodies) = (0, 0);
        for turn in 0..20 {
            history.push(message(turn));
            let body = format!(
                "{{\"temperature\":0,\n \"messages\": [{}], \"tools\": []}}",
                history.join(", ")
            );
            let stored = round_trip(&body, &mut kept);
            assert_eq!(stored.is_split(), body.len() > INLINE_BYTES_MAX);
            texts += stored.text.len();
            bodies += body.len();
        }
        assert_eq!(kept.len(), 20, "each message once");
        let stored = texts + kept.values().map(String::len).sum::<usize>();
        assert!(
            stored * 2 < bodies,
            "{stored} bytes stored for {bodies} bytes of requests"
        );
    }

    #[test]
    fn a_missing_or_changed_part_is_corrupt() {
        let large = "y".repeat(4000);
        let stored = store(&large);
        assert!(matches!(
            load(&stored.text, true, |_| Ok(None)),
            Err(StoreError::Corrupt(_))
        ));
        assert!(matches!(
            load(&stored.text, true, |_| Ok(Some("z".repeat(4000)))),
            Err(StoreError::Corrupt(_))
        ));
    }

    #[test]
    fn a_body_holding_the_reference_mark_is_kept_whole() {
        let body = format!("{}\u{1}", "q".repeat(3000));
        let stored = store(&body);
        assert!(!stored.is_split());
        assert_eq!(load(&stored.text, false, |_| Ok(None)).unwrap(), body);
    }
}
