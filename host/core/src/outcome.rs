//! The guest-visible result of a call, as the ledger stores it:
//! `{"ok": value}` or `{"err": {"kind": ..., "message": ...}}`.

use serde::{Deserialize, Serialize};

use crate::records::CallState;

/// The kinds of `call-error` the guest can tell apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallErrorKind {
    Rejected,
    Denied,
    Exhausted,
    Invalid,
    /// Not sent: it would take the run past its budget (model tokens or
    /// cost). Nothing was spent.
    Budget,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallErrorRecord {
    pub kind: CallErrorKind,
    pub message: String,
    /// What the call's attempts may have cost though it failed (a model's
    /// stream cut after it began): a run's model budget charges it, live
    /// and replayed alike. Absent when nothing was spent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spent: Option<Spent>,
}

/// Model tokens and their cost, as a run's model budget counts them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spent {
    pub tokens: u64,
    pub micro_usd: u64,
}

impl Spent {
    pub fn is_zero(&self) -> bool {
        self.tokens == 0 && self.micro_usd == 0
    }

    pub fn plus(self, other: Spent) -> Spent {
        Spent {
            tokens: self.tokens.saturating_add(other.tokens),
            micro_usd: self.micro_usd.saturating_add(other.micro_usd),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Ok(serde_json::Value),
    Err(CallErrorRecord),
}

impl Outcome {
    pub fn error(kind: CallErrorKind, message: impl Into<String>) -> Self {
        Outcome::Err(CallErrorRecord {
            kind,
            message: message.into(),
            spent: None,
        })
    }

    /// The state of a call that ends with this outcome.
    pub fn state(&self) -> CallState {
        match self {
            Outcome::Ok(_) => CallState::Succeeded,
            Outcome::Err(_) => CallState::Failed,
        }
    }

    /// About the bytes this outcome records: a string or an error message
    /// by its length, an integer (a clock or random reading, on every call)
    /// as `{"ok":N}` counted without serializing it, anything else
    /// serialized.
    pub fn recorded_bytes(&self) -> u64 {
        use serde_json::Value;
        match self {
            Outcome::Ok(Value::String(s)) => s.len() as u64,
            Outcome::Ok(Value::Null) => 0,
            Outcome::Ok(Value::Number(n)) if n.is_u64() || n.is_i64() => {
                let digits = |mut v: u64| {
                    let mut d = 1;
                    while v >= 10 {
                        v /= 10;
                        d += 1;
                    }
                    d
                };
                let len = match (n.as_u64(), n.as_i64()) {
                    (Some(u), _) => digits(u),
                    (None, Some(i)) => 1 + digits(i.unsigned_abs()),
                    _ => unreachable!("an integer"),
                };
                len + 7
            }
            Outcome::Err(e) => e.message.len() as u64,
            other => other.to_json().len() as u64,
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "null".to_string())
    }

    /// Reads a recorded outcome.
    pub fn parse(text: &str) -> Result<Self, serde_json::Error> {
        if let Some(outcome) = plain_ok(text) {
            return Ok(outcome);
        }
        serde_json::from_str(text)
    }
}

/// The outcome `{"ok":N}` (an integer) or `{"ok":"text"}` (no escapes)
/// without the general JSON parser: what a replay feeds back most (clock,
/// random, plain text), about a tenth of a replayed call's time. Anything
/// else, or anything JSON would read differently (a leading zero, an
/// escape), is `None` and goes through `serde_json`.
fn plain_ok(text: &str) -> Option<Outcome> {
    let value = text.strip_prefix("{\"ok\":")?.strip_suffix('}')?;
    if let Some(inner) = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
        if inner.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20) {
            return None;
        }
        return Some(Outcome::Ok(serde_json::Value::String(inner.to_string())));
    }
    let digits = value.strip_prefix('-').unwrap_or(value);
    let plain = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && !(digits.starts_with('0') && (digits.len() > 1 || value.starts_with('-')));
    if !plain {
        return None;
    }
    let number = if value.starts_with('-') {
        serde_json::Number::from(value.parse::<i64>().ok()?)
    } else {
        serde_json::Number::from(value.parse::<u64>().ok()?)
    };
    Some(Outcome::Ok(serde_json::Value::Number(number)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_outcomes_read_as_json_reads_them_and_others_are_left_to_it() {
        let plain = [
            r#"{"ok":0}"#,
            r#"{"ok":1795985808953228779}"#,
            r#"{"ok":18446744073709551615}"#,
            r#"{"ok":-42}"#,
            r#"{"ok":-9223372036854775808}"#,
            r#"{"ok":"R-ae21fed48dfa"}"#,
            r#"{"ok":""}"#,
            r#"{"ok":"é ✓"}"#,
        ];
        for text in plain {
            let json: Outcome = serde_json::from_str(text).unwrap();
            assert_eq!(plain_ok(text), Some(json), "{text}");
        }
        let others = [
            r#"{"ok":18446744073709551616}"#,
            r#"{"ok":-9223372036854775809}"#,
            r#"{"ok":-0}"#,
            r#"{"ok":007}"#,
            r#"{"ok":1.5}"#,
            r#"{"ok":1e3}"#,
            r#"{"ok":"a\"b"}"#,
            r#"{"ok":"a\nb"}"#,
            r#"{"ok":"a"b"}"#,
            r#"{"ok":null}"#,
            r#"{"ok":{"i":0}}"#,
            r#"{"ok": 1}"#,
            r#"{"err":{"kind":"rejected","message":"no"}}"#,
            r#"{"ok":}"#,
            r#"{"ok":-}"#,
            "null",
        ];
        for text in others {
            assert_eq!(plain_ok(text), None, "{text}");
        }
    }
}
