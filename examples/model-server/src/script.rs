//! The script: what the model answers at each turn of a conversation, and which
//! faults it serves first.
//!
//! A script is JSON:
//!
//! ```json
//! {
//!   "description": "optional",
//!   "turns": [
//!     {"tool_calls": [{"name": "lookup_order", "arguments": {"order_id": "${order_id}"}}],
//!      "usage": {"input_tokens": 120, "cached_input_tokens": 0, "output_tokens": 18},
//!      "faults": [{"kind": "status", "status": 429, "retry_after": 1, "times": 2}]},
//!     {"text": "Done."}
//!   ]
//! }
//! ```
//!
//! Turn *k* (1-based) answers a conversation that already holds *k - 1* assistant
//! turns (see `conv.rs`). Strings in `text` and in tool-call `arguments` may use the
//! variables `${order_id}`, `${amount_cents}` and `${amount}` (see `Vars`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The built-in script: the refund agent story (3 turns).
pub const DEFAULT_SCRIPT: &str = include_str!("default_script.json");

/// A whole script.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    /// Free text, shown on start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Turn 1 first.
    pub turns: Vec<Turn>,
}

/// What the model answers at one turn.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Turn {
    /// Assistant text (sent before the tool calls when both are given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Tool calls, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// Why the answer ends; default `tool_calls` when there are tool calls, else `stop`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish: Option<Finish>,
    /// Token counts; estimated from the sizes (bytes / 4) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Served, in order, to the first requests that reach this turn (per API); then
    /// the turn answers normally.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub faults: Vec<Fault>,
    /// Streams: write the SSE bytes in pieces of this many bytes (splitting events,
    /// even inside a UTF-8 character) instead of one write per event. A large value
    /// puts several events in one write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sse_write_bytes: Option<usize>,
    /// Streams: pause this long between two writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sse_gap_ms: Option<u64>,
    /// OpenAI Chat: leave the usage chunk out of a stream even when the
    /// client asked for it (as some compatible servers do).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub omit_usage: bool,
}

/// One tool call the model makes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCall {
    /// The call id; default `call_t<turn>_<i>` (OpenAI) or `toolu_t<turn>_<i>` (Anthropic).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub name: String,
    /// The arguments: a JSON object (serialized compactly for OpenAI), or a JSON
    /// string sent verbatim as the arguments text (it need not be valid JSON).
    #[serde(default = "empty_object")]
    pub arguments: Value,
}

fn empty_object() -> Value {
    Value::Object(Default::default())
}

/// Why an answer ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Finish {
    /// chat `stop`, responses `completed`, anthropic `end_turn`.
    Stop,
    /// chat `length`, responses `incomplete` (`max_output_tokens`), anthropic `max_tokens`.
    Length,
    /// chat `tool_calls`, responses `completed`, anthropic `tool_use`.
    ToolCalls,
    /// chat `content_filter`, responses `incomplete` (`content_filter`), anthropic `refusal`.
    ContentFilter,
}

/// Token counts in one neutral shape, mapped to each provider's spelling.
/// `input_tokens` is the whole prompt, cached reads and cache writes included (as
/// OpenAI counts it); Anthropic's `input_tokens` is sent as
/// `input_tokens - cached_input_tokens - cache_write_tokens`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Usage {
    pub input_tokens: u64,
    #[serde(default)]
    pub cached_input_tokens: u64,
    #[serde(default)]
    pub cache_write_tokens: u64,
    pub output_tokens: u64,
    /// Part of `output_tokens`.
    #[serde(default)]
    pub reasoning_tokens: u64,
}

/// A misbehaviour served instead of one answer. `times` (default 1) repeats it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Fault {
    /// An error status with the provider's error body. The body is chosen from the
    /// status (429 rate limit, 529 overloaded, 5xx server error, ...);
    /// `error_type`, `code` and `message` override its fields (e.g. a 429
    /// `insufficient_quota`).
    Status {
        status: u16,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        times: Option<u32>,
        /// `retry-after: N` (seconds).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_after: Option<u64>,
        /// `retry-after-ms: N`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_after_ms: Option<u64>,
        /// `x-should-retry: true|false`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        should_retry: Option<bool>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error_type: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        code: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    /// The answer is cut before its end: a stream stops after `after_events` SSE
    /// events (default: half of them; never its terminal event); a non-streamed body
    /// stops halfway through its `Content-Length`. Then the connection is closed,
    /// without the last chunk, or, with `clean`, after a proper end of the chunked
    /// body (the stream just lacks its terminal event).
    Cut {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        times: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after_events: Option<usize>,
        #[serde(default)]
        clean: bool,
    },
    /// Streams: after `after_events` events (default half), the provider's in-stream
    /// error (anthropic `event: error` overloaded_error; chat a `data:` with an
    /// `error` object; responses `error` then `response.failed`), then the body ends
    /// properly. A non-streamed request gets the equivalent status instead (529 on
    /// anthropic, 500 on OpenAI).
    StreamError {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        times: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after_events: Option<usize>,
    },
    /// Close the connection without any response.
    Drop {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        times: Option<u32>,
    },
}

impl Fault {
    /// How many requests this fault is served to.
    pub fn times(&self) -> u32 {
        let times = match self {
            Fault::Status { times, .. }
            | Fault::Cut { times, .. }
            | Fault::StreamError { times, .. }
            | Fault::Drop { times } => *times,
        };
        times.unwrap_or(1)
    }
}

impl Script {
    /// The built-in refund agent script.
    pub fn default_refund() -> Script {
        Script::from_json(DEFAULT_SCRIPT).expect("the built-in script is valid")
    }

    /// Parses and checks a script.
    pub fn from_json(text: &str) -> Result<Script, String> {
        let script: Script = serde_json::from_str(text).map_err(|e| e.to_string())?;
        script.check()?;
        Ok(script)
    }

    fn check(&self) -> Result<(), String> {
        if self.turns.is_empty() {
            return Err("a script needs at least one turn".into());
        }
        for (i, turn) in self.turns.iter().enumerate() {
            let at = format!("turn {}", i + 1);
            if turn.text.is_none() && turn.tool_calls.is_empty() {
                return Err(format!("{at}: give `text`, `tool_calls` or both"));
            }
            for call in &turn.tool_calls {
                if call.name.is_empty() {
                    return Err(format!("{at}: a tool call without a name"));
                }
                if !(call.arguments.is_object() || call.arguments.is_string()) {
                    return Err(format!(
                        "{at}: tool call {}: `arguments` must be a JSON object or a string",
                        call.name
                    ));
                }
            }
            if let Some(u) = turn.usage {
                if u.cached_input_tokens + u.cache_write_tokens > u.input_tokens {
                    return Err(format!(
                        "{at}: usage: cached_input_tokens + cache_write_tokens exceed input_tokens (which includes them)"
                    ));
                }
                if u.reasoning_tokens > u.output_tokens {
                    return Err(format!(
                        "{at}: usage: reasoning_tokens exceed output_tokens (which includes them)"
                    ));
                }
            }
            for fault in &turn.faults {
                if let Fault::Status { status, .. } = fault
                    && !(400..=599).contains(status)
                {
                    return Err(format!("{at}: fault status {status} is not 4xx or 5xx"));
                }
                if fault.times() == 0 {
                    return Err(format!("{at}: fault with `times: 0`"));
                }
            }
            if turn.sse_write_bytes == Some(0) {
                return Err(format!("{at}: sse_write_bytes must be at least 1"));
            }
        }
        Ok(())
    }

    /// The faults of turn `index` (0-based), each repeated `times`.
    pub(crate) fn fault_at(&self, index: usize, attempt: u32) -> Option<&Fault> {
        let mut left = attempt;
        for fault in &self.turns.get(index)?.faults {
            if left < fault.times() {
                return Some(fault);
            }
            left -= fault.times();
        }
        None
    }
}

/// Values taken from the conversation for `${...}` in a script:
/// - `order_id`: the first word like `A-1001` (letters, `-`, digits) in the first
///   user message; `A-1001` if there is none.
/// - `amount_cents`: the `amount_cents` integer of the first tool result that is a
///   JSON object with one; else the first `$12.34`-style amount in the first user
///   message; else 4999.
/// - `amount`: `amount_cents` as dollars (`49.99`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Vars {
    pub order_id: String,
    pub amount_cents: i64,
}

pub(crate) const DEFAULT_ORDER_ID: &str = "A-1001";
pub(crate) const DEFAULT_AMOUNT_CENTS: i64 = 4999;

impl Vars {
    pub fn from_conversation(first_user_text: &str, tool_results: &[String]) -> Vars {
        let order_id = first_user_text
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .find(|w| looks_like_order_id(w))
            .unwrap_or(DEFAULT_ORDER_ID)
            .to_string();
        let from_tools = tool_results.iter().find_map(|r| {
            serde_json::from_str::<Value>(r)
                .ok()?
                .get("amount_cents")?
                .as_i64()
        });
        let amount_cents = from_tools
            .or_else(|| dollars_in(first_user_text))
            .unwrap_or(DEFAULT_AMOUNT_CENTS);
        Vars {
            order_id,
            amount_cents,
        }
    }

    fn get(&self, name: &str) -> Option<Value> {
        match name {
            "order_id" => Some(Value::String(self.order_id.clone())),
            "amount_cents" => Some(Value::from(self.amount_cents)),
            "amount" => Some(Value::String(format!(
                "{}{}.{:02}",
                if self.amount_cents < 0 { "-" } else { "" },
                self.amount_cents.unsigned_abs() / 100,
                self.amount_cents.unsigned_abs() % 100
            ))),
            _ => None,
        }
    }

    /// Replaces every `${name}` of a known variable in `s`; unknown ones stay.
    pub fn subst_str(&self, s: &str) -> String {
        let mut out = String::with_capacity(s.len());
        let mut rest = s;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            match after
                .find('}')
                .and_then(|end| Some((end, self.get(&after[..end])?)))
            {
                Some((end, value)) => {
                    match value {
                        Value::String(v) => out.push_str(&v),
                        other => out.push_str(&other.to_string()),
                    }
                    rest = &after[end + 1..];
                }
                None => {
                    out.push_str("${");
                    rest = after;
                }
            }
        }
        out.push_str(rest);
        out
    }

    /// Substitutes in every string of `v`; a string that is exactly `${amount_cents}`
    /// becomes a number.
    pub fn subst_value(&self, v: &Value) -> Value {
        match v {
            Value::String(s) => {
                if let Some(name) = s.strip_prefix("${").and_then(|r| r.strip_suffix('}'))
                    && let Some(value) = self.get(name)
                {
                    return value;
                }
                Value::String(self.subst_str(s))
            }
            Value::Array(items) => {
                Value::Array(items.iter().map(|i| self.subst_value(i)).collect())
            }
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| (k.clone(), self.subst_value(v)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
}

fn looks_like_order_id(w: &str) -> bool {
    let Some((letters, digits)) = w.split_once('-') else {
        return false;
    };
    !letters.is_empty()
        && letters.chars().all(|c| c.is_ascii_alphabetic())
        && !digits.is_empty()
        && digits.chars().all(|c| c.is_ascii_digit())
}

/// The first `$D`, `$D.C` or `$D.CC` in `s`, in cents.
fn dollars_in(s: &str) -> Option<i64> {
    s.match_indices('$').find_map(|(i, _)| {
        let rest = &s[i + 1..];
        let whole_len = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if whole_len == 0 {
            return None;
        }
        let whole: i64 = rest[..whole_len].parse().ok()?;
        let mut cents = 0;
        if let Some(frac) = rest[whole_len..].strip_prefix('.') {
            let digits: String = frac.chars().take_while(|c| c.is_ascii_digit()).collect();
            cents = match digits.len() {
                0 => 0,
                1 => digits.parse::<i64>().ok()? * 10,
                _ => digits[..2].parse().ok()?,
            };
        }
        whole.checked_mul(100)?.checked_add(cents)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn default_script_parses() {
        let s = Script::default_refund();
        assert_eq!(s.turns.len(), 3);
        assert_eq!(s.turns[0].tool_calls[0].name, "lookup_order");
        assert_eq!(s.turns[1].tool_calls[0].name, "refund");
        assert!(s.turns[2].text.is_some());
    }

    #[test]
    fn vars_come_from_the_conversation() {
        let v = Vars::from_conversation("Please refund order B-2002 ($12.5), thanks", &[]);
        assert_eq!(v.order_id, "B-2002");
        assert_eq!(v.amount_cents, 1250);
        let v = Vars::from_conversation(
            "refund order B-2002 ($12.50)",
            &[
                "not json".into(),
                r#"{"order_id":"B-2002","amount_cents":777}"#.into(),
            ],
        );
        assert_eq!(v.amount_cents, 777);
        let v = Vars::from_conversation("hello", &[]);
        assert_eq!(v.order_id, DEFAULT_ORDER_ID);
        assert_eq!(v.amount_cents, DEFAULT_AMOUNT_CENTS);
        assert_eq!(dollars_in("costs $3 or $4.99"), Some(300));
        assert_eq!(dollars_in("$ 5"), None);
    }

    #[test]
    fn substitution() {
        let v = Vars {
            order_id: "A-1".into(),
            amount_cents: 1205,
        };
        assert_eq!(
            v.subst_str("Refunded $${amount} for ${order_id} ${nope} ${"),
            "Refunded $12.05 for A-1 ${nope} ${"
        );
        assert_eq!(
            v.subst_value(&json!({"id": "${order_id}", "cents": "${amount_cents}", "n": [1, "x${amount_cents}"]})),
            json!({"id": "A-1", "cents": 1205, "n": [1, "x1205"]})
        );
    }

    #[test]
    fn faults_repeat_then_stop() {
        let s = Script::from_json(
            r#"{"turns":[{"text":"hi","faults":[
                {"kind":"status","status":429,"retry_after":1,"times":2},
                {"kind":"cut"}]}]}"#,
        )
        .unwrap();
        assert!(matches!(
            s.fault_at(0, 0),
            Some(Fault::Status { status: 429, .. })
        ));
        assert!(matches!(
            s.fault_at(0, 1),
            Some(Fault::Status { status: 429, .. })
        ));
        assert!(matches!(s.fault_at(0, 2), Some(Fault::Cut { .. })));
        assert_eq!(s.fault_at(0, 3), None);
        assert_eq!(s.fault_at(1, 0), None);
    }

    #[test]
    fn bad_scripts_are_refused() {
        for bad in [
            r#"{"turns":[]}"#,
            r#"{"turns":[{}]}"#,
            r#"{"turns":[{"text":"x","bogus":1}]}"#,
            r#"{"turns":[{"text":"x","faults":[{"kind":"status","status":200}]}]}"#,
            r#"{"turns":[{"text":"x","faults":[{"kind":"cut","bogus":1}]}]}"#,
            r#"{"turns":[{"text":"x","usage":{"input_tokens":1,"cached_input_tokens":2,"output_tokens":1}}]}"#,
            r#"{"turns":[{"tool_calls":[{"name":"f","arguments":[1]}]}]}"#,
        ] {
            assert!(Script::from_json(bad).is_err(), "accepted {bad}");
        }
    }
}
