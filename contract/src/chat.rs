//! The provider-neutral chat shape: what a step sends, what it gets back, and what the ledger records.
//!
//! The JSON form of these types is recorded in the ledger and hashed, so it is kept canonical:
//! - fields are written in struct order;
//! - an `Option` field that is `None` is left out, a `Vec` is always written (possibly `[]`);
//! - the only maps are `serde_json::Map`, which is a `BTreeMap` (sorted keys) as long as serde_json's
//!   `preserve_order` feature stays off.
//!
//! [`Usage`] means the same for every provider: `input` includes cached and cache-write tokens,
//! `output` includes reasoning tokens.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};

/// A provider-neutral chat request, as the step sends it and the ledger records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatRequest {
    /// Model alias from `stephost.toml` (`[models.NAME]`), not the provider's model id
    /// (the host fills it from the call's alias; a step may leave it out).
    #[serde(default)]
    pub model: String,
    /// System prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// The conversation, oldest first.
    pub messages: Vec<Message>,
    /// Tools the model may call.
    #[serde(default)]
    pub tools: Vec<ToolDef>,
    /// How the model should pick tools; provider default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
    /// Output token limit asked by the step (the host clamps it to the model's ceiling).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Stop sequences (refused by `openai-responses`, which has none).
    #[serde(default)]
    pub stop: Vec<String>,
    /// `Some(false)` forbids several tool calls in one turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    /// Provider-specific fields, shallow-merged into the wire body after mapping.
    /// A key that the mapping owns (for example `model` or `messages`) is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw: Option<Map<String, Value>>,
}

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The person (or the step) talking to the model: text parts.
    User,
    /// The model: text and tool-call parts.
    Assistant,
    /// Results of the assistant's tool calls: tool-result parts.
    Tool,
}

/// One message of the conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Message {
    /// Author.
    pub role: Role,
    /// Parts, in order.
    pub content: Vec<Part>,
}

impl Message {
    /// A user message holding one text part.
    pub fn user(text: impl Into<String>) -> Self {
        Message {
            role: Role::User,
            content: vec![Part::text(text)],
        }
    }

    /// An assistant message holding the given parts (for example a response's `content`).
    pub fn assistant(content: Vec<Part>) -> Self {
        Message {
            role: Role::Assistant,
            content,
        }
    }

    /// A tool message answering one call.
    pub fn tool_result(
        call_id: impl Into<String>,
        name: impl Into<String>,
        content: impl Into<String>,
        is_error: bool,
    ) -> Self {
        Message {
            role: Role::Tool,
            content: vec![Part::ToolResult {
                call_id: call_id.into(),
                name: name.into(),
                content: content.into(),
                is_error,
            }],
        }
    }
}

/// A piece of a message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Part {
    /// Plain text.
    Text {
        /// The text.
        text: String,
    },
    /// A call of a tool by the model.
    ToolCall {
        /// The provider's call id (`call_…`, `toolu_…`).
        id: String,
        /// Tool name.
        name: String,
        /// Arguments as JSON text, byte for byte as the model wrote them.
        arguments: String,
    },
    /// The answer to a tool call.
    ToolResult {
        /// The `id` of the call answered.
        call_id: String,
        /// The name of the tool called.
        name: String,
        /// The result, as text (often JSON).
        content: String,
        /// Whether the tool failed.
        #[serde(default)]
        is_error: bool,
    },
}

impl Part {
    /// A text part.
    pub fn text(text: impl Into<String>) -> Self {
        Part::Text { text: text.into() }
    }

    /// A tool-call part.
    pub fn tool_call(
        id: impl Into<String>,
        name: impl Into<String>,
        arguments: impl Into<String>,
    ) -> Self {
        Part::ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
        }
    }
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolDef {
    /// Name (`a-z A-Z 0-9 _ -`, at most 64 characters for OpenAI).
    pub name: String,
    /// What the tool does, for the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// JSON Schema of the arguments (an object schema); `null` for no parameters.
    #[serde(default)]
    pub parameters: Value,
}

/// How the model should choose tools.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ToolChoice {
    /// The model decides.
    Auto,
    /// No tool calls.
    None,
    /// At least one tool call.
    Required,
    /// This tool must be called.
    Tool {
        /// The tool's name.
        name: String,
    },
}

/// Why the model stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// A natural end or a stop sequence.
    Stop,
    /// The output token limit (or the context window) was reached.
    Length,
    /// The model wants tool results.
    ToolCalls,
    /// The provider filtered or refused the output.
    ContentFilter,
    /// Anything else (`pause_turn`, `cancelled`, unknown values).
    Other,
}

/// The assistant's answer, normalised across providers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatResponse {
    /// The wire API that served it (`openai-chat`, `openai-responses`, `anthropic-messages`).
    pub api: String,
    /// The provider's model id, as it reported it.
    pub model: String,
    /// The provider's response id (`chatcmpl-…`, `resp_…`, `msg_…`).
    pub id: String,
    /// Text and tool-call parts, in the provider's order.
    pub content: Vec<Part>,
    /// Why the model stopped, normalised.
    pub stop: StopReason,
    /// The provider's own stop value (`finish_reason`, `stop_reason`, or `status[/reason]`).
    pub stop_raw: String,
    /// A refusal the provider sent apart from the content (OpenAI `refusal`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<String>,
    /// Token counts, normalised (see [`Usage`]); all 0 when the provider reported none.
    pub usage: Usage,
    /// The provider's own `usage` object, as sent (for an Anthropic stream: `message_start`'s
    /// usage updated by `message_delta`'s). Absent when the provider reported no usage at all,
    /// such as a chat stream without its final usage chunk, so "absent" is not mistaken for 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_raw: Option<Value>,
    /// Cost, filled in by the host from the model's price table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<Cost>,
    /// What the host's model budget charged for the call, as the ledger
    /// keeps it: this answer's usage (estimated where the provider reported
    /// none) and what earlier attempts of the call may have cost. The host
    /// takes it out before the step sees the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub charged: Option<Charged>,
}

/// Tokens and cost a run's model budget charges for one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Charged {
    pub tokens: u64,
    pub micro_usd: u64,
    /// Some of it is the host's estimate (about four bytes a token): the
    /// provider reported no usage, or an attempt failed after it began.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub estimated: bool,
}

impl Charged {
    pub fn plus(self, other: Charged) -> Charged {
        Charged {
            tokens: self.tokens.saturating_add(other.tokens),
            micro_usd: self.micro_usd.saturating_add(other.micro_usd),
            estimated: self.estimated || other.estimated,
        }
    }
}

impl ChatResponse {
    /// The concatenated text parts.
    pub fn text(&self) -> String {
        self.content
            .iter()
            .filter_map(|p| match p {
                Part::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }

    /// The tool calls, as `(id, name, arguments)`.
    pub fn tool_calls(&self) -> Vec<(&str, &str, &str)> {
        self.content
            .iter()
            .filter_map(|p| match p {
                Part::ToolCall {
                    id,
                    name,
                    arguments,
                } => Some((id.as_str(), name.as_str(), arguments.as_str())),
                _ => None,
            })
            .collect()
    }
}

/// Token counts, normalised (docs/models.md, "Usage and cost") so that each field means the same for every API.
///
/// `input` is the **whole prompt**, cache reads and cache writes included (OpenAI's convention);
/// `cached_input` and `cache_write` are parts of it. `output` includes `reasoning`.
///
/// | field | `openai-chat` | `openai-responses` | `anthropic-messages` |
/// |---|---|---|---|
/// | `input` | `prompt_tokens` | `input_tokens` | `input_tokens + cache_read_input_tokens + cache_creation_input_tokens` |
/// | `cached_input` | `prompt_tokens_details.cached_tokens` | `input_tokens_details.cached_tokens` | `cache_read_input_tokens` |
/// | `cache_write` | `prompt_tokens_details.cache_write_tokens` | `input_tokens_details.cache_write_tokens` | `cache_creation_input_tokens` |
/// | `output` | `completion_tokens` | `output_tokens` | `output_tokens` (the last `message_delta` value when streamed) |
/// | `reasoning` | `completion_tokens_details.reasoning_tokens` | `output_tokens_details.reasoning_tokens` | `output_tokens_details.thinking_tokens` |
///
/// A missing field counts 0; whether the provider sent usage at all is
/// [`ChatResponse::usage_raw`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Usage {
    /// All prompt tokens, cached reads and cache writes included.
    pub input: u64,
    /// Prompt tokens read from the provider's cache (a part of `input`).
    pub cached_input: u64,
    /// Prompt tokens written to the provider's cache (a part of `input`).
    pub cache_write: u64,
    /// All output tokens, reasoning included.
    pub output: u64,
    /// Reasoning or thinking tokens (a part of `output`).
    pub reasoning: u64,
}

impl Usage {
    /// `input + output`.
    pub fn total(&self) -> u64 {
        self.input.saturating_add(self.output)
    }
}

///
/// USD per million tokens is the same number as micro-dollars per token, so each part is
/// `tokens × price`, rounded half up to a whole micro-dollar. `micro_usd` is the sum of the parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cost {
    /// Total.
    pub micro_usd: u64,
    /// Uncached input tokens (`input - cached_input - cache_write`).
    pub input_micro_usd: u64,
    /// Cached input tokens.
    pub cached_input_micro_usd: u64,
    /// Cache-write tokens.
    pub cache_write_micro_usd: u64,
    /// Output tokens (reasoning included).
    pub output_micro_usd: u64,
}

impl ChatRequest {
    /// A request with no system prompt, tools or limits.
    pub fn new(model: impl Into<String>, messages: Vec<Message>) -> Self {
        ChatRequest {
            model: model.into(),
            system: None,
            messages,
            tools: Vec::new(),
            tool_choice: None,
            max_tokens: None,
            temperature: None,
            stop: Vec::new(),
            parallel_tool_calls: None,
            raw: None,
        }
    }

    /// The canonical JSON text recorded in the ledger.
    pub fn canonical_json(&self) -> String {
        serde_json::to_string(self).expect("a ChatRequest always serialises")
    }
}

///
/// Rules: a model alias and at least one message; every message has parts, and only the parts its
/// role may hold (user: text; assistant: text and tool calls; tool: tool results); tool names and
/// call ids non-empty; call ids unique; arguments valid JSON; every tool result answers an earlier,
/// still unanswered call of the same name, and every call is answered before the next user or
/// assistant message (all three providers refuse a dangling call); tool names unique; a forced tool
/// exists; `tool_choice` `required`/`tool` needs tools; temperature finite and >= 0; stop sequences
/// and `max_tokens` non-empty / non-zero.
pub fn validate(req: &ChatRequest) -> Result<(), String> {
    if req.model.trim().is_empty() {
        return Err("`model` (the alias from stephost.toml) is empty".into());
    }
    if req.messages.is_empty() {
        return Err("`messages` is empty".into());
    }
    if req.max_tokens == Some(0) {
        return Err("`max_tokens` is 0".into());
    }
    if let Some(t) = req.temperature
        && (!t.is_finite() || t < 0.0)
    {
        return Err(format!("`temperature` must be finite and >= 0, got {t}"));
    }
    if req.stop.iter().any(String::is_empty) {
        return Err("a stop sequence is empty".into());
    }
    let mut tool_names = BTreeSet::new();
    for tool in &req.tools {
        if tool.name.is_empty() {
            return Err("a tool has an empty name".into());
        }
        if !tool_names.insert(tool.name.as_str()) {
            return Err(format!("tool `{}` is defined twice", tool.name));
        }
        if !(tool.parameters.is_object() || tool.parameters.is_null()) {
            return Err(format!(
                "tool `{}`: `parameters` must be a JSON Schema object or null",
                tool.name
            ));
        }
    }
    match &req.tool_choice {
        Some(ToolChoice::Required) if req.tools.is_empty() => {
            return Err("`tool_choice` is `required` but no tools are defined".into());
        }
        Some(ToolChoice::Tool { name }) if !tool_names.contains(name.as_str()) => {
            return Err(format!(
                "`tool_choice` names tool `{name}`, which is not defined"
            ));
        }
        _ => {}
    }

    // call id -> (name, answered)
    let mut calls: BTreeMap<&str, (&str, bool)> = BTreeMap::new();
    // calls of the last assistant message still waiting for a result
    let mut pending: Vec<&str> = Vec::new();
    for (i, msg) in req.messages.iter().enumerate() {
        let at = format!("messages[{i}]");
        if msg.content.is_empty() {
            return Err(format!("{at} has no content"));
        }
        if msg.role != Role::Tool
            && let Some(id) = pending.first()
        {
            return Err(format!(
                "{at}: tool call `{id}` has no result before this {:?} message",
                msg.role
            ));
        }
        for (j, part) in msg.content.iter().enumerate() {
            let at = format!("{at}.content[{j}]");
            match (msg.role, part) {
                (Role::User | Role::Assistant, Part::Text { .. }) => {}
                (
                    Role::Assistant,
                    Part::ToolCall {
                        id,
                        name,
                        arguments,
                    },
                ) => {
                    if id.is_empty() {
                        return Err(format!("{at}: tool call id is empty"));
                    }
                    if name.is_empty() {
                        return Err(format!("{at}: tool call `{id}` has an empty name"));
                    }
                    if let Err(e) = serde_json::from_str::<Value>(arguments) {
                        return Err(format!(
                            "{at}: arguments of tool call `{id}` are not valid JSON: {e}"
                        ));
                    }
                    if calls.insert(id, (name, false)).is_some() {
                        return Err(format!("{at}: tool call id `{id}` is used twice"));
                    }
                    pending.push(id);
                }
                (
                    Role::Tool,
                    Part::ToolResult {
                        call_id,
                        name,
                        content: _,
                        is_error: _,
                    },
                ) => {
                    let Some((call_name, answered)) = calls.get_mut(call_id.as_str()) else {
                        return Err(format!(
                            "{at}: tool result answers `{call_id}`, which no earlier tool call has"
                        ));
                    };
                    if *answered {
                        return Err(format!("{at}: tool call `{call_id}` is answered twice"));
                    }
                    if *call_name != name {
                        return Err(format!(
                            "{at}: tool result for `{call_id}` names `{name}`, the call named `{call_name}`"
                        ));
                    }
                    *answered = true;
                    pending.retain(|p| *p != call_id);
                }
                (role, part) => {
                    let kind = match part {
                        Part::Text { .. } => "text",
                        Part::ToolCall { .. } => "tool_call",
                        Part::ToolResult { .. } => "tool_result",
                    };
                    return Err(format!(
                        "{at}: a {role:?} message cannot hold a {kind} part"
                    ));
                }
            }
        }
    }
    if let Some(id) = pending.first() {
        return Err(format!(
            "tool call `{id}` has no result at the end of the conversation"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::weather_request;
    use serde_json::json;

    #[test]
    fn request_json_is_canonical_and_skips_absent_options() {
        let req = weather_request();
        let text = req.canonical_json();
        assert_eq!(
            text,
            concat!(
                r#"{"model":"default","system":"You are terse.","messages":["#,
                r#"{"role":"user","content":[{"type":"text","text":"Weather in Paris?"}]},"#,
                r#"{"role":"assistant","content":[{"type":"text","text":"Checking."},"#,
                r#"{"type":"tool_call","id":"call_A","name":"get_weather","arguments":"{\"city\":\"Paris\"}"}]},"#,
                r#"{"role":"tool","content":[{"type":"tool_result","call_id":"call_A","name":"get_weather","content":"{\"temp_c\":18}","is_error":false}]}],"#,
                r#""tools":[{"name":"get_weather","description":"Current weather for a city","#,
                r#""parameters":{"properties":{"city":{"type":"string"}},"required":["city"],"type":"object"}}],"#,
                r#""stop":[]}"#
            )
        );
        let back: ChatRequest = serde_json::from_str(&text).unwrap();
        assert_eq!(back, req);
        assert_eq!(back.canonical_json(), text);
    }

    #[test]
    fn serde_json_preserve_order_is_off() {
        // Cargo unifies features: one crate in the build enabling serde_json's `preserve_order`
        // would silently make `raw` and tool schemas keep insertion order, changing the hash.
        let v: Value = serde_json::from_str(r#"{"b":1,"a":{"d":1,"c":2}}"#).unwrap();
        assert_eq!(
            v.to_string(),
            r#"{"a":{"c":2,"d":1},"b":1}"#,
            "serde_json `preserve_order` is enabled somewhere in this build: request JSON is no longer canonical"
        );
    }

    #[test]
    fn request_json_with_every_option_round_trips() {
        let mut raw = Map::new();
        raw.insert("seed".into(), json!(1));
        let req = ChatRequest {
            tool_choice: Some(ToolChoice::Tool {
                name: "get_weather".into(),
            }),
            max_tokens: Some(1024),
            temperature: Some(0.2),
            stop: vec!["\n\n".into()],
            parallel_tool_calls: Some(false),
            raw: Some(raw),
            ..weather_request()
        };
        let text = req.canonical_json();
        assert!(text.contains(r#""tool_choice":{"type":"tool","name":"get_weather"},"max_tokens":1024,"temperature":0.2,"stop":["\n\n"],"parallel_tool_calls":false,"raw":{"seed":1}}"#), "{text}");
        assert_eq!(serde_json::from_str::<ChatRequest>(&text).unwrap(), req);
    }

    #[test]
    fn request_json_with_unknown_field_is_refused() {
        let err = serde_json::from_str::<ChatRequest>(r#"{"model":"m","messages":[],"n":2}"#)
            .unwrap_err();
        assert!(err.to_string().contains("unknown field `n`"), "{err}");
    }

    #[test]
    fn tool_result_is_error_defaults_to_false() {
        let part: Part = serde_json::from_str(
            r#"{"type":"tool_result","call_id":"c","name":"n","content":"x"}"#,
        )
        .unwrap();
        assert_eq!(
            part,
            Part::ToolResult {
                call_id: "c".into(),
                name: "n".into(),
                content: "x".into(),
                is_error: false
            }
        );
    }

    #[test]
    fn tool_choice_and_stop_reason_spellings() {
        assert_eq!(
            serde_json::to_string(&[
                ToolChoice::Auto,
                ToolChoice::None,
                ToolChoice::Required,
                ToolChoice::Tool { name: "x".into() }
            ])
            .unwrap(),
            r#"[{"type":"auto"},{"type":"none"},{"type":"required"},{"type":"tool","name":"x"}]"#
        );
        assert_eq!(
            serde_json::to_string(&[
                StopReason::Stop,
                StopReason::Length,
                StopReason::ToolCalls,
                StopReason::ContentFilter,
                StopReason::Other
            ])
            .unwrap(),
            r#"["stop","length","tool_calls","content_filter","other"]"#
        );
    }

    #[test]
    fn response_json_skips_absent_cost_and_refusal() {
        let resp = ChatResponse {
            api: "anthropic-messages".into(),
            model: "claude-sonnet-4-5-20250929".into(),
            id: "msg_1".into(),
            content: vec![Part::text("Hi")],
            stop: StopReason::Stop,
            stop_raw: "end_turn".into(),
            refusal: None,
            usage: Usage {
                input: 12,
                output: 3,
                ..Usage::default()
            },
            usage_raw: None,
            cost: None,
            charged: None,
        };
        assert_eq!(
            serde_json::to_string(&resp).unwrap(),
            r#"{"api":"anthropic-messages","model":"claude-sonnet-4-5-20250929","id":"msg_1","content":[{"type":"text","text":"Hi"}],"stop":"stop","stop_raw":"end_turn","usage":{"input":12,"cached_input":0,"cache_write":0,"output":3,"reasoning":0}}"#
        );
        assert_eq!(resp.text(), "Hi");
        assert!(resp.tool_calls().is_empty());
    }

    #[test]
    fn valid_conversation_with_tool_round_trip_passes() {
        assert_eq!(validate(&weather_request()), Ok(()));
    }

    fn invalid(req: ChatRequest, needle: &str) {
        let err = validate(&req).unwrap_err();
        assert!(err.contains(needle), "`{err}` should contain `{needle}`");
    }

    #[test]
    fn validate_refuses_bad_requests() {
        let base = weather_request();
        invalid(
            ChatRequest {
                model: " ".into(),
                ..base.clone()
            },
            "`model`",
        );
        invalid(
            ChatRequest {
                messages: vec![],
                ..base.clone()
            },
            "`messages` is empty",
        );
        invalid(
            ChatRequest {
                max_tokens: Some(0),
                ..base.clone()
            },
            "`max_tokens` is 0",
        );
        invalid(
            ChatRequest {
                temperature: Some(f32::NAN),
                ..base.clone()
            },
            "temperature",
        );
        invalid(
            ChatRequest {
                stop: vec![String::new()],
                ..base.clone()
            },
            "stop sequence is empty",
        );
        let mut twice = base.clone();
        twice.tools.push(twice.tools[0].clone());
        invalid(twice, "defined twice");
        let mut unnamed = base.clone();
        unnamed.tools[0].name.clear();
        invalid(unnamed, "empty name");
        let mut bad_schema = base.clone();
        bad_schema.tools[0].parameters = json!("string");
        invalid(bad_schema, "JSON Schema object");
        invalid(
            ChatRequest {
                tool_choice: Some(ToolChoice::Tool {
                    name: "nope".into(),
                }),
                ..base.clone()
            },
            "not defined",
        );
        invalid(
            ChatRequest {
                tools: vec![],
                tool_choice: Some(ToolChoice::Required),
                messages: vec![Message::user("hi")],
                ..base.clone()
            },
            "no tools are defined",
        );
    }

    #[test]
    fn validate_refuses_broken_tool_plumbing() {
        let base = weather_request();
        let with = |messages: Vec<Message>| ChatRequest {
            messages,
            ..base.clone()
        };
        let call = |id: &str, args: &str| {
            Message::assistant(vec![Part::tool_call(id, "get_weather", args)])
        };
        let result = |id: &str, name: &str| Message::tool_result(id, name, "{}", false);
        invalid(
            with(vec![Message::user("x"), call("c1", "{bad")]),
            "not valid JSON",
        );
        invalid(
            with(vec![Message::user("x"), call("", "{}")]),
            "id is empty",
        );
        invalid(
            with(vec![
                Message::user("x"),
                call("c1", "{}"),
                result("c1", "get_weather"),
                call("c1", "{}"),
                result("c1", "get_weather"),
            ]),
            "used twice",
        );
        invalid(
            with(vec![Message::user("x"), result("c9", "get_weather")]),
            "no earlier tool call",
        );
        invalid(
            with(vec![
                Message::user("x"),
                call("c1", "{}"),
                result("c1", "get_weather"),
                result("c1", "get_weather"),
            ]),
            "answered twice",
        );
        invalid(
            with(vec![
                Message::user("x"),
                call("c1", "{}"),
                result("c1", "other"),
            ]),
            "the call named `get_weather`",
        );
        invalid(
            with(vec![
                Message::user("x"),
                call("c1", "{}"),
                Message::user("y"),
            ]),
            "has no result before",
        );
        invalid(
            with(vec![Message::user("x"), call("c1", "{}")]),
            "at the end of the conversation",
        );
        invalid(
            with(vec![Message {
                role: Role::User,
                content: vec![],
            }]),
            "has no content",
        );
        invalid(
            with(vec![Message {
                role: Role::User,
                content: vec![Part::tool_call("c", "get_weather", "{}")],
            }]),
            "a User message cannot hold a tool_call part",
        );
        invalid(
            with(vec![Message {
                role: Role::Tool,
                content: vec![Part::text("x")],
            }]),
            "a Tool message cannot hold a text part",
        );
    }
}
