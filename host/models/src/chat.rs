//! What the host adds to the neutral chat shape (`stephost-contract`): a
//! model's prices and what an answer costs, which of a request's fields a
//! redaction may name, and the form the ledger keeps a request in after an
//! earlier one of the same run.

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use stephost_contract::chat::*;

/// Prices of a model in USD per million tokens (`[models.NAME.prices]`).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Prices {
    /// Uncached input tokens.
    pub input_per_mtok: f64,
    /// Input tokens read from the cache.
    pub cached_input_per_mtok: f64,
    /// Input tokens written to the cache.
    pub cache_write_per_mtok: f64,
    /// Output tokens, reasoning included.
    pub output_per_mtok: f64,
}

impl Prices {
    /// Refuses negative, infinite or NaN prices (a configuration error).
    pub fn validate(&self) -> Result<(), String> {
        for (name, value) in [
            ("input_per_mtok", self.input_per_mtok),
            ("cached_input_per_mtok", self.cached_input_per_mtok),
            ("cache_write_per_mtok", self.cache_write_per_mtok),
            ("output_per_mtok", self.output_per_mtok),
        ] {
            if !value.is_finite() || value < 0.0 {
                return Err(format!(
                    "price `{name}` must be a finite number >= 0 (USD per million tokens), got {value}"
                ));
            }
        }
        Ok(())
    }
}

/// The free-text fields of a chat request that a redaction may name
/// (`[redact."models.ALIAS"] request`), `*` standing for every index.
pub const REDACTABLE_REQUEST: &[&str] = &[
    "/system",
    "/messages/*/content/*/text",
    "/messages/*/content/*/arguments",
    "/messages/*/content/*/content",
];

/// The free-text fields of a chat response a redaction may name.
pub const REDACTABLE_RESPONSE: &[&str] = &["/content/*/text", "/content/*/arguments", "/refusal"];

/// Checks that a redaction's `pointer` names free text of a chat request
/// (or of a response): a marker anywhere else (a part's `type`, a whole
/// message) would leave a replayed step a request or an answer it cannot
/// read.
pub fn check_redactable(pointer: &str, response: bool) -> Result<(), String> {
    let allowed = if response {
        REDACTABLE_RESPONSE
    } else {
        REDACTABLE_REQUEST
    };
    let segments: Vec<&str> = pointer.split('/').collect();
    let fits = |pattern: &&str| {
        let pattern: Vec<&str> = pattern.split('/').collect();
        pattern.len() == segments.len()
            && pattern
                .iter()
                .zip(&segments)
                .all(|(p, s)| p == s || (*p == "*" && (*s == "*" || s.parse::<usize>().is_ok())))
    };
    if allowed.iter().any(fits) {
        return Ok(());
    }
    Err(format!(
        "{pointer:?} does not name a text field of a chat {}; name one of {} (`*` or an index \
         for each list)",
        if response { "response" } else { "request" },
        allowed.join(", ")
    ))
}

/// Pico-dollars in one micro-dollar; prices are held as whole pico-dollars per token.
const PICO_PER_MICRO: u128 = 1_000_000;

fn part_micro_usd(tokens: u64, per_mtok: f64) -> u64 {
    // A price in USD/Mtok is micro-dollars per token; in pico-dollars per token it is a whole
    // number for every price with at most 6 decimals. `as` saturates: negative or NaN gives 0.
    let pico_per_token = (per_mtok * 1e6).round() as u128;
    let pico = u128::from(tokens) * pico_per_token;
    let micro = (pico + PICO_PER_MICRO / 2) / PICO_PER_MICRO;
    u64::try_from(micro).unwrap_or(u64::MAX)
}

/// The cost of `usage` at `prices`: cached and cache-write tokens at their own rates (and not again
/// at the input rate), reasoning tokens as output.
pub fn cost(usage: &Usage, prices: &Prices) -> Cost {
    let uncached = usage
        .input
        .saturating_sub(usage.cached_input)
        .saturating_sub(usage.cache_write);
    let input = part_micro_usd(uncached, prices.input_per_mtok);
    let cached = part_micro_usd(usage.cached_input, prices.cached_input_per_mtok);
    let write = part_micro_usd(usage.cache_write, prices.cache_write_per_mtok);
    let output = part_micro_usd(usage.output, prices.output_per_mtok);
    Cost {
        micro_usd: input
            .saturating_add(cached)
            .saturating_add(write)
            .saturating_add(output),
        input_micro_usd: input,
        cached_input_micro_usd: cached,
        cache_write_micro_usd: write,
        output_micro_usd: output,
    }
}

/// The key of the reference that [`RecordedAfter::recorded_after`] puts in a
/// request recorded after an earlier one.
pub const AFTER: &str = "stephost_after";

/// A request as the ledger keeps it after an earlier one of its run.
pub trait RecordedAfter {
    /// This request as the ledger keeps it when `previous` (recorded at
    /// call `previous_seq` of the same run, and answered with `answer`) came
    /// before it (see the implementation for [`ChatRequest`]).
    fn recorded_after(
        &self,
        previous: &ChatRequest,
        answer: Option<&Message>,
        previous_seq: u64,
    ) -> Option<String>;
}

impl RecordedAfter for ChatRequest {
    /// This request as the ledger keeps it when `previous` (recorded at
    /// call `previous_seq` of the same run, and answered with `answer`) came
    /// before it: the messages the two share at their start are left out,
    /// then the answer if it comes next (an agent's loop adds it), and
    /// `system` and `tools` when they are the same; `"stephost_after":
    /// {"seq", "messages", "answer", "same"}` says what was left out. An
    /// agent re-sends its whole conversation every turn; recorded this way
    /// each message is kept once. `None` when nothing is shared (the request
    /// is kept whole).
    ///
    /// The form is a function of its arguments alone, so a replay that
    /// makes the same calls makes the same text, and a request that differs
    /// anywhere (in a shared part too, since `previous` and `answer` were
    /// compared when they were replayed) makes another.
    fn recorded_after(
        &self,
        previous: &ChatRequest,
        answer: Option<&Message>,
        previous_seq: u64,
    ) -> Option<String> {
        let shared = self
            .messages
            .iter()
            .zip(&previous.messages)
            .take_while(|(a, b)| a == b)
            .count();
        let answered = shared == previous.messages.len()
            && answer.is_some()
            && self.messages.get(shared) == answer;
        let mut same = Vec::new();
        if self.system.is_some() && self.system == previous.system {
            same.push("system");
        }
        if !self.tools.is_empty() && self.tools == previous.tools {
            same.push("tools");
        }
        if shared == 0 && !answered && same.is_empty() {
            return None;
        }
        let Ok(Value::Object(mut fields)) = serde_json::to_value(self) else {
            return None;
        };
        for field in &same {
            fields.remove(*field);
        }
        if let Some(Value::Array(messages)) = fields.get_mut("messages") {
            messages.drain(..shared + usize::from(answered));
        }
        fields.insert(
            AFTER.to_string(),
            serde_json::json!({
                "seq": previous_seq,
                "messages": shared,
                "answer": answered,
                "same": same,
            }),
        );
        Some(Value::Object(fields).to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stephost_contract::fixtures::weather_request;

    #[test]
    fn a_redaction_names_text_fields_only() {
        for ok in [
            "/system",
            "/messages/*/content/*/text",
            "/messages/0/content/2/arguments",
        ] {
            assert!(check_redactable(ok, false).is_ok(), "{ok}");
        }
        for bad in [
            "/messages",
            "/messages/*/content",
            "/messages/*/content/*/type",
            "/model",
        ] {
            assert!(check_redactable(bad, false).is_err(), "{bad}");
        }
        assert!(check_redactable("/content/0/text", true).is_ok());
        assert!(check_redactable("/content", true).is_err());
        assert!(check_redactable("/usage/input", true).is_err());
    }

    #[test]
    fn cost_prices_cached_and_cache_write_tokens_at_their_own_rates_only() {
        // 10 000 input of which 4 000 cached and 1 000 written; 2 000 output of which 500 reasoning.
        let usage = Usage {
            input: 10_000,
            cached_input: 4_000,
            cache_write: 1_000,
            output: 2_000,
            reasoning: 500,
        };
        let prices = Prices {
            input_per_mtok: 3.0,
            cached_input_per_mtok: 0.3,
            cache_write_per_mtok: 3.75,
            output_per_mtok: 15.0,
        };
        let c = cost(&usage, &prices);
        assert_eq!(c.input_micro_usd, 5_000 * 3); // 15 000 µ$
        assert_eq!(c.cached_input_micro_usd, 1_200); // 4 000 × 0.3
        assert_eq!(c.cache_write_micro_usd, 3_750); // 1 000 × 3.75
        assert_eq!(c.output_micro_usd, 30_000); // 2 000 × 15, reasoning included once
        assert_eq!(c.micro_usd, 15_000 + 1_200 + 3_750 + 30_000);
        assert_eq!(
            serde_json::to_string(&c).unwrap(),
            r#"{"micro_usd":49950,"input_micro_usd":15000,"cached_input_micro_usd":1200,"cache_write_micro_usd":3750,"output_micro_usd":30000}"#
        );
    }

    #[test]
    fn cost_rounds_each_part_half_up_and_is_exact_for_decimal_prices() {
        let prices = Prices {
            input_per_mtok: 0.075,
            cached_input_per_mtok: 0.0,
            cache_write_per_mtok: 0.0,
            output_per_mtok: 0.3,
        };
        // 0.1 would be 0.30000000000000004 in naive float sums; pico-dollar integers stay exact.
        let c = cost(
            &Usage {
                input: 1_000_000,
                output: 3,
                ..Usage::default()
            },
            &prices,
        );
        assert_eq!(c.input_micro_usd, 75_000);
        assert_eq!(c.output_micro_usd, 1); // 0.9 µ$ rounds to 1
        let half = cost(
            &Usage {
                input: 20,
                ..Usage::default()
            },
            &prices,
        ); // 1.5 µ$
        assert_eq!(half.micro_usd, 2);
        assert_eq!(cost(&Usage::default(), &prices), Cost::default());
    }

    #[test]
    fn cost_never_overflows_or_goes_negative() {
        let usage = Usage {
            input: 5,
            cached_input: 10, // inconsistent provider numbers: uncached saturates at 0
            cache_write: 0,
            output: u64::MAX,
            reasoning: 0,
        };
        let c = cost(
            &usage,
            &Prices {
                input_per_mtok: 1.0,
                cached_input_per_mtok: 1.0,
                cache_write_per_mtok: 1.0,
                output_per_mtok: 1000.0,
            },
        );
        assert_eq!(c.input_micro_usd, 0);
        assert_eq!(c.cached_input_micro_usd, 10);
        assert_eq!(c.output_micro_usd, u64::MAX);
        assert_eq!(c.micro_usd, u64::MAX);
    }

    #[test]
    fn prices_validate_refuses_negative_and_nan() {
        assert!(Prices::default().validate().is_ok());
        let bad = Prices {
            output_per_mtok: -1.0,
            ..Prices::default()
        };
        assert!(bad.validate().unwrap_err().contains("output_per_mtok"));
        let nan = Prices {
            input_per_mtok: f64::NAN,
            ..Prices::default()
        };
        assert!(nan.validate().is_err());
    }

    #[test]
    fn a_request_after_another_keeps_only_what_is_new() {
        let first = weather_request();
        let answer = Message::assistant(vec![Part::text("18 degrees.")]);
        let mut next = first.clone();
        next.messages.push(answer.clone());
        next.messages.push(Message::user("And in Rome?"));
        let kept = next.recorded_after(&first, Some(&answer), 7).unwrap();
        let value: Value = serde_json::from_str(&kept).unwrap();
        assert_eq!(value[AFTER]["seq"], 7);
        assert_eq!(value[AFTER]["messages"], 3);
        assert_eq!(value[AFTER]["answer"], true);
        assert_eq!(value[AFTER]["same"], serde_json::json!(["system", "tools"]));
        assert_eq!(value["messages"].as_array().unwrap().len(), 1);
        assert!(value.get("system").is_none() && value.get("tools").is_none());
        assert!(!kept.contains("Weather in Paris?"), "{kept}");
        assert!(!kept.contains("18 degrees."), "{kept}");
        // The same arguments, the same text; a change in a shared message
        // or in the answer, another.
        assert_eq!(next.recorded_after(&first, Some(&answer), 7).unwrap(), kept);
        let mut edited = next.clone();
        edited.messages[0] = Message::user("Weather in Lyon?");
        assert_ne!(
            edited.recorded_after(&first, Some(&answer), 7).unwrap(),
            kept
        );
        let other_answer = Message::assistant(vec![Part::text("19 degrees.")]);
        let with_other = next.recorded_after(&first, Some(&other_answer), 7).unwrap();
        assert_ne!(with_other, kept);
        assert!(with_other.contains("18 degrees."), "{with_other}");
        // Nothing shared: kept whole.
        let other = ChatRequest::new("default", vec![Message::user("Hi.")]);
        assert_eq!(other.recorded_after(&first, None, 7), None);
    }
}
