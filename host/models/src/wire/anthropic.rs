//! Anthropic Messages (`POST /v1/messages`); docs/models.md, "Wire formats".
//!
//! Request mapping:
//! - `system` → top-level `system` (a string);
//! - user and tool messages → `user` messages, assistant messages → `assistant` messages;
//!   consecutive messages of the same wire role are joined into one (the API would join them
//!   anyway), so the results of one assistant turn form **one** user message, with every
//!   `tool_result` block first and any text after them;
//! - a tool call → `{"type":"tool_use",id,name,input}`, `input` being the arguments parsed as JSON
//!   (arguments that are not a JSON object are refused, [`WireError::InvalidRequest`]);
//! - a tool result → `{"type":"tool_result",tool_use_id,content}`, plus `is_error:true` when set;
//! - a user message that is exactly one text part keeps `content` as a string; otherwise blocks;
//! - tools → `{name,description,input_schema}` (`input_schema` defaults to an empty object schema);
//! - tool choice → `{"type":"auto"|"none"|"any"}` or `{"type":"tool",name}`;
//!   `parallel_tool_calls:false` → `disable_parallel_tool_use:true` on it;
//! - `max_tokens` (required by the API) → `max_tokens`; `stop` → `stop_sequences`.
//!
//! Usage: Anthropic's `input_tokens` **excludes** cache reads and cache writes, so the neutral
//! `input` is `input_tokens + cache_read_input_tokens + cache_creation_input_tokens`;
//! `cached_input` is `cache_read_input_tokens`, `cache_write` is `cache_creation_input_tokens`,
//! `output` is `output_tokens` (thinking included) and `reasoning` is
//! `output_tokens_details.thinking_tokens`.
//!
//! Tool-call `arguments` are the provider's text byte for byte: the raw `input` JSON of a
//! non-streamed reply, the concatenated `partial_json` of a stream.

use super::WireError;
use super::common::{count, f32_json, json_body, json_event, merge_raw, string, validated};
use super::{Progress, StreamAssembler};
use crate::api::Api;
use crate::chat::{ChatRequest, ChatResponse, Part, Role, StopReason, ToolChoice, Usage};
use crate::errors::classify_stream_error;
use crate::sse::SseEvent;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;

const API: Api = Api::AnthropicMessages;

/// Body fields the mapping owns; `raw` may not set them.
const OWNED: &[&str] = &[
    "model",
    "system",
    "messages",
    "max_tokens",
    "temperature",
    "stop_sequences",
    "tools",
    "tool_choice",
    "stream",
];

/// The Messages body for `req`, sent to `provider_model` with `max_tokens`.
pub fn request_body(
    req: &ChatRequest,
    provider_model: &str,
    max_tokens: u32,
    stream: bool,
) -> Result<Value, WireError> {
    validated(API, req)?;
    // (wire role, blocks), consecutive same roles joined.
    let mut turns: Vec<(&str, Vec<Value>)> = Vec::new();
    for msg in &req.messages {
        let role = match msg.role {
            Role::User | Role::Tool => "user",
            Role::Assistant => "assistant",
        };
        let mut blocks = Vec::new();
        for part in &msg.content {
            blocks.push(match part {
                Part::Text { text } => json!({"type": "text", "text": text}),
                Part::ToolCall {
                    id,
                    name,
                    arguments,
                } => {
                    let input: Value = serde_json::from_str(arguments)
                        .ok()
                        .filter(Value::is_object)
                        .ok_or_else(|| WireError::InvalidRequest {
                            api: API,
                            message: format!(
                                "arguments of tool call `{id}` are not a JSON object, which \
                                 Anthropic's `tool_use.input` must be"
                            ),
                        })?;
                    json!({"type": "tool_use", "id": id, "name": name, "input": input})
                }
                Part::ToolResult {
                    call_id,
                    content,
                    is_error,
                    ..
                } => {
                    let mut b = Map::new();
                    b.insert("type".into(), json!("tool_result"));
                    b.insert("tool_use_id".into(), json!(call_id));
                    b.insert("content".into(), json!(content));
                    if *is_error {
                        b.insert("is_error".into(), json!(true));
                    }
                    Value::Object(b)
                }
            });
        }
        match turns.last_mut() {
            Some((last, prev)) if *last == role => prev.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    }
    let messages: Vec<Value> = turns
        .into_iter()
        .map(|(role, mut blocks)| {
            // Tool results first, then text (a stable sort keeps each group's order). `validate`
            // already makes every result precede the next user text; this keeps the API's rule
            // true whatever the merge produced.
            blocks.sort_by_key(|b| b["type"] != "tool_result");
            let content = match blocks.as_slice() {
                [one] if role == "user" && one["type"] == "text" => one["text"].clone(),
                _ => Value::Array(blocks),
            };
            json!({"role": role, "content": content})
        })
        .collect();

    let mut body = Map::new();
    body.insert("model".into(), json!(provider_model));
    body.insert("max_tokens".into(), json!(max_tokens));
    if let Some(system) = &req.system {
        body.insert("system".into(), json!(system));
    }
    body.insert("messages".into(), Value::Array(messages));
    if let Some(t) = req.temperature {
        body.insert("temperature".into(), f32_json(t));
    }
    if !req.stop.is_empty() {
        body.insert("stop_sequences".into(), json!(req.stop));
    }
    if !req.tools.is_empty() {
        let tools: Vec<Value> = req
            .tools
            .iter()
            .map(|t| {
                let mut f = Map::new();
                f.insert("name".into(), json!(t.name));
                if let Some(d) = &t.description {
                    f.insert("description".into(), json!(d));
                }
                let schema = if t.parameters.is_null() {
                    json!({"type": "object", "properties": {}})
                } else {
                    t.parameters.clone()
                };
                f.insert("input_schema".into(), schema);
                Value::Object(f)
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    let no_parallel = req.parallel_tool_calls == Some(false) && !req.tools.is_empty();
    let choice = match &req.tool_choice {
        Some(ToolChoice::Auto) => Some(json!({"type": "auto"})),
        Some(ToolChoice::None) => Some(json!({"type": "none"})),
        Some(ToolChoice::Required) => Some(json!({"type": "any"})),
        Some(ToolChoice::Tool { name }) => Some(json!({"type": "tool", "name": name})),
        None if no_parallel => Some(json!({"type": "auto"})),
        None => None,
    };
    if let Some(mut choice) = choice {
        // `none` takes no flag: no calls at all.
        if no_parallel && choice["type"] != "none" {
            choice["disable_parallel_tool_use"] = json!(true);
        }
        body.insert("tool_choice".into(), choice);
    }
    if stream {
        body.insert("stream".into(), json!(true));
    }
    merge_raw(API, &mut body, req.raw.as_ref(), OWNED)?;
    Ok(Value::Object(body))
}

/// `stop_reason` → neutral: `end_turn`, `stop_sequence` → stop; `max_tokens`,
/// `model_context_window_exceeded` → length; `tool_use` → tool calls; `refusal` → content filter;
/// `pause_turn` and anything else → other.
fn stop_reason(raw: &str) -> StopReason {
    match raw {
        "end_turn" | "stop_sequence" => StopReason::Stop,
        "max_tokens" | "model_context_window_exceeded" => StopReason::Length,
        "tool_use" => StopReason::ToolCalls,
        "refusal" => StopReason::ContentFilter,
        _ => StopReason::Other,
    }
}

/// Anthropic `usage` → neutral; `input` adds the cache reads and writes that `input_tokens`
/// leaves out.
fn usage(u: &Value) -> Usage {
    let cached_input = count(u, &["cache_read_input_tokens"]);
    let cache_write = count(u, &["cache_creation_input_tokens"]);
    Usage {
        input: count(u, &["input_tokens"])
            .saturating_add(cached_input)
            .saturating_add(cache_write),
        cached_input,
        cache_write,
        output: count(u, &["output_tokens"]),
        reasoning: count(u, &["output_tokens_details", "thinking_tokens"]),
    }
}

fn malformed(message: impl Into<String>) -> WireError {
    WireError::Malformed {
        api: API,
        message: message.into(),
    }
}

/// The fields of a content block read with its `input` kept as raw text.
#[derive(Deserialize)]
struct RawBlock<'a> {
    #[serde(rename = "type", default)]
    ty: String,
    #[serde(default)]
    text: String,
    #[serde(default)]
    id: String,
    #[serde(default)]
    name: String,
    #[serde(borrow, default)]
    input: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct RawContent<'a> {
    #[serde(borrow, default)]
    content: Vec<RawBlock<'a>>,
}

/// Parses a non-streamed Messages reply.
pub fn parse_response(body: &[u8]) -> Result<ChatResponse, WireError> {
    let v = json_body(API, body)?;
    if v.get("type").and_then(Value::as_str) == Some("error") {
        return Err(WireError::Provider(classify_stream_error(API, &v)));
    }
    let raw: RawContent<'_> = serde_json::from_slice(body)
        .map_err(|e| malformed(format!("`content` is not a list of blocks: {e}")))?;
    let mut content = Vec::new();
    for block in raw.content {
        match block.ty.as_str() {
            "text" if !block.text.is_empty() => content.push(Part::text(block.text)),
            "tool_use" => {
                let arguments = block.input.map_or("{}", RawValue::get);
                content.push(Part::tool_call(block.id, block.name, arguments));
            }
            // Thinking and server-tool blocks stay in the recorded bytes only.
            _ => {}
        }
    }
    let stop_raw = string(&v, "stop_reason");
    let usage_raw = v.get("usage").filter(|u| u.is_object()).cloned();
    Ok(ChatResponse {
        api: API.as_str().to_string(),
        model: string(&v, "model"),
        id: string(&v, "id"),
        content,
        stop: stop_reason(&stop_raw),
        stop_raw,
        refusal: None,
        usage: usage_raw.as_ref().map(usage).unwrap_or_default(),
        usage_raw,
        cost: None,
        charged: None,
    })
}

/// One content block being streamed.
#[derive(Debug)]
enum Block {
    Text(String),
    ToolUse {
        id: String,
        name: String,
        /// The `input` of `content_block_start` (usually `{}`), used when no delta comes.
        start_input: String,
        partial_json: String,
    },
    /// Thinking, server tools and unknown block types: kept out of the response.
    Other,
}

#[derive(Deserialize)]
struct BlockStart<'a> {
    #[serde(default)]
    index: u64,
    #[serde(borrow)]
    content_block: RawBlock<'a>,
}

/// Assembles a Messages stream, like the SDK's `accumulate_event`.
///
/// `message_start` gives the id, model and first usage; `content_block_start` opens a block at
/// its `index`; `text_delta` appends text (reported as progress), `input_json_delta` appends to
/// the tool call's arguments (checked as JSON at `content_block_stop`); `message_delta` sets the
/// stop reason and overwrites the usage fields it carries (they are cumulative); `message_stop`
/// ends the message. `ping` and unknown events are ignored. An `error` event (such as
/// `overloaded_error`) is [`WireError::Provider`], retryable when the error type is; a stream
/// without `message_stop` is [`WireError::Cut`].
#[derive(Debug, Default)]
pub struct Assembler {
    id: String,
    model: String,
    blocks: BTreeMap<u64, Block>,
    stop_reason: Option<String>,
    usage: Option<Map<String, Value>>,
    done: bool,
}

impl Assembler {
    fn merge_usage(&mut self, u: Option<&Value>) {
        let Some(Value::Object(fields)) = u else {
            return;
        };
        let snapshot = self.usage.get_or_insert_with(Map::new);
        for (k, v) in fields {
            if !v.is_null() {
                snapshot.insert(k.clone(), v.clone());
            }
        }
    }
}

fn check_arguments(index: u64, block: &Block) -> Result<(), WireError> {
    if let Block::ToolUse {
        id, partial_json, ..
    } = block
        && !partial_json.is_empty()
        && serde_json::from_str::<Value>(partial_json).is_err()
    {
        return Err(malformed(format!(
            "tool_use block {index} (`{id}`): the streamed input is not JSON"
        )));
    }
    Ok(())
}

impl StreamAssembler for Assembler {
    fn event(&mut self, ev: &SseEvent) -> Result<Progress, WireError> {
        let mut progress = Progress::default();
        let v = json_event(API, &ev.data)?;
        let ty = v
            .get("type")
            .and_then(Value::as_str)
            .or(ev.event.as_deref())
            .unwrap_or_default();
        match ty {
            "message_start" => {
                let msg = v
                    .get("message")
                    .ok_or_else(|| malformed("`message_start` without a `message`"))?;
                self.id = string(msg, "id");
                self.model = string(msg, "model");
                self.merge_usage(msg.get("usage"));
            }
            "content_block_start" => {
                let start: BlockStart<'_> = serde_json::from_str(&ev.data)
                    .map_err(|e| malformed(format!("bad `content_block_start`: {e}")))?;
                let b = start.content_block;
                let block = match b.ty.as_str() {
                    "text" => {
                        progress.appended.push_str(&b.text);
                        Block::Text(b.text)
                    }
                    "tool_use" => Block::ToolUse {
                        id: b.id,
                        name: b.name,
                        start_input: b.input.map_or("{}", RawValue::get).to_string(),
                        partial_json: String::new(),
                    },
                    _ => Block::Other,
                };
                self.blocks.insert(start.index, block);
            }
            "content_block_delta" => {
                let index = v.get("index").and_then(Value::as_u64).unwrap_or(0);
                let delta = v.get("delta").unwrap_or(&Value::Null);
                match (
                    delta.get("type").and_then(Value::as_str),
                    self.blocks.get_mut(&index),
                ) {
                    (Some("text_delta"), Some(Block::Text(text))) => {
                        let piece = delta.get("text").and_then(Value::as_str).unwrap_or("");
                        text.push_str(piece);
                        progress.appended.push_str(piece);
                    }
                    (Some("input_json_delta"), Some(Block::ToolUse { partial_json, .. })) => {
                        partial_json.push_str(
                            delta
                                .get("partial_json")
                                .and_then(Value::as_str)
                                .unwrap_or(""),
                        );
                    }
                    (Some("text_delta" | "input_json_delta"), None) => {
                        return Err(malformed(format!(
                            "`content_block_delta` for block {index}, which never started"
                        )));
                    }
                    _ => {}
                }
            }
            "content_block_stop" => {
                let index = v.get("index").and_then(Value::as_u64).unwrap_or(0);
                if let Some(block) = self.blocks.get(&index) {
                    check_arguments(index, block)?;
                }
            }
            "message_delta" => {
                if let Some(reason) = v
                    .get("delta")
                    .and_then(|d| d.get("stop_reason"))
                    .and_then(Value::as_str)
                {
                    self.stop_reason = Some(reason.to_string());
                }
                self.merge_usage(v.get("usage"));
            }
            "message_stop" => {
                self.done = true;
                progress.done = true;
            }
            "error" => return Err(WireError::Provider(classify_stream_error(API, &v))),
            _ => {} // ping, and event types added later
        }
        Ok(progress)
    }

    fn finish(self: Box<Self>) -> Result<ChatResponse, WireError> {
        let me = *self;
        if !me.done {
            return Err(WireError::Cut {
                api: API,
                expected: "message_stop",
            });
        }
        let mut content = Vec::new();
        for (index, block) in me.blocks {
            check_arguments(index, &block)?;
            match block {
                Block::Text(text) if !text.is_empty() => content.push(Part::text(text)),
                Block::ToolUse {
                    id,
                    name,
                    start_input,
                    partial_json,
                } => {
                    let arguments = if partial_json.is_empty() {
                        start_input
                    } else {
                        partial_json
                    };
                    content.push(Part::ToolCall {
                        id,
                        name,
                        arguments,
                    });
                }
                _ => {}
            }
        }
        let stop_raw = me.stop_reason.unwrap_or_default();
        let usage_raw = me.usage.map(Value::Object);
        Ok(ChatResponse {
            api: API.as_str().to_string(),
            model: me.model,
            id: me.id,
            content,
            stop: stop_reason(&stop_raw),
            stop_raw,
            refusal: None,
            usage: usage_raw.as_ref().map(usage).unwrap_or_default(),
            usage_raw,
            cost: None,
            charged: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::{Message, ToolDef};
    use crate::errors::ErrorKind;
    use crate::wire::testing::{assert_stream_assembles, fixture, weather_conversation};
    use crate::wire::{StreamDecoder, parse_stream};

    #[test]
    fn request_with_system_text_tool_calls_results_and_tools_has_the_documented_shape() {
        let mut req = weather_conversation();
        req.stop = vec!["\n\nHuman:".into()];
        req.raw = Some(json!({"top_k": 5}).as_object().unwrap().clone());
        let body = request_body(&req, "claude-sonnet-4-5", 1024, false).unwrap();
        assert_eq!(
            body,
            json!({
                "model": "claude-sonnet-4-5",
                "max_tokens": 1024,
                "system": "You are terse.",
                "messages": [
                    {"role": "user", "content": "Weather in Paris and Rome?"},
                    {"role": "assistant", "content": [
                        {"type": "text", "text": "Checking both."},
                        {"type": "tool_use", "id": "call_A", "name": "get_weather", "input": {"city": "Paris"}},
                        {"type": "tool_use", "id": "call_B", "name": "get_weather", "input": {"city": "Rome"}}
                    ]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "call_A", "content": "{\"temp_c\":18}"},
                        {"type": "tool_result", "tool_use_id": "call_B", "content": "city not found", "is_error": true}
                    ]}
                ],
                "temperature": 0.2,
                "stop_sequences": ["\n\nHuman:"],
                "tools": [{
                    "name": "get_weather",
                    "description": "Current weather for a city",
                    "input_schema": {
                        "type": "object",
                        "properties": {
                            "city": {"type": "string", "description": "City name"},
                            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
                        },
                        "required": ["city"]
                    }
                }],
                "tool_choice": {"type": "auto"},
                "top_k": 5
            })
        );
    }

    #[test]
    fn tool_results_come_first_in_one_user_message_followed_by_text() {
        let mut req = weather_conversation();
        req.messages.push(Message::user("And tomorrow?"));
        let body = request_body(&req, "m", 5, false).unwrap();
        let messages = body["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 3, "{body}");
        let last = &messages[2];
        assert_eq!(last["role"], "user");
        let types: Vec<&str> = last["content"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["type"].as_str().unwrap())
            .collect();
        assert_eq!(types, ["tool_result", "tool_result", "text"]);
    }

    #[test]
    fn tool_choice_spellings_and_disable_parallel_tool_use() {
        let mut req = weather_conversation();
        let cases = [
            (ToolChoice::Auto, json!({"type": "auto"})),
            (ToolChoice::None, json!({"type": "none"})),
            (ToolChoice::Required, json!({"type": "any"})),
            (
                ToolChoice::Tool {
                    name: "get_weather".into(),
                },
                json!({"type": "tool", "name": "get_weather"}),
            ),
        ];
        for (choice, want) in cases.clone() {
            req.tool_choice = Some(choice);
            assert_eq!(
                request_body(&req, "m", 5, false).unwrap()["tool_choice"],
                want
            );
        }
        req.parallel_tool_calls = Some(false);
        for (choice, mut want) in cases {
            if want["type"] != "none" {
                want["disable_parallel_tool_use"] = json!(true);
            }
            req.tool_choice = Some(choice);
            assert_eq!(
                request_body(&req, "m", 5, false).unwrap()["tool_choice"],
                want
            );
        }
        req.tool_choice = None;
        assert_eq!(
            request_body(&req, "m", 5, true).unwrap()["tool_choice"],
            json!({"type": "auto", "disable_parallel_tool_use": true})
        );
        assert_eq!(
            request_body(&req, "m", 5, true).unwrap()["stream"],
            json!(true)
        );
    }

    #[test]
    fn tool_without_parameters_gets_an_empty_object_schema() {
        let mut req = weather_conversation();
        req.tools = vec![ToolDef {
            name: "get_weather".into(),
            description: None,
            parameters: Value::Null,
        }];
        let body = request_body(&req, "m", 5, false).unwrap();
        assert_eq!(
            body["tools"],
            json!([{"name": "get_weather", "input_schema": {"type": "object", "properties": {}}}])
        );
    }

    #[test]
    fn arguments_that_are_not_an_object_are_refused() {
        let mut req = weather_conversation();
        req.messages[1].content[1] = Part::tool_call("call_A", "get_weather", "[1,2]");
        let err = request_body(&req, "m", 5, false).unwrap_err();
        assert!(
            matches!(&err, WireError::InvalidRequest { message, .. } if message.contains("call_A")),
            "{err:?}"
        );
        let mut req = weather_conversation();
        req.raw = Some(json!({"system": "x"}).as_object().unwrap().clone());
        assert!(matches!(
            request_body(&req, "m", 5, false),
            Err(WireError::RawCollision { .. })
        ));
    }

    #[test]
    fn parses_text_reply() {
        let r = parse_response(&fixture(API, "text.json")).unwrap();
        assert_eq!(r.api, "anthropic-messages");
        assert_eq!(r.id, "msg_01VdEjxAP5ahtHKrrRdNBteQ");
        assert_eq!(r.model, "claude-sonnet-4-5-20250929");
        assert_eq!(r.text(), "Hello! I'm doing well, thanks for asking.");
        assert_eq!(
            (r.stop, r.stop_raw.as_str()),
            (StopReason::Stop, "end_turn")
        );
        assert_eq!(
            r.usage,
            Usage {
                input: 12,
                output: 29,
                ..Usage::default()
            }
        );
        assert_eq!(r.usage_raw.as_ref().unwrap()["service_tier"], "standard");
    }

    #[test]
    fn parses_tool_use_reply() {
        let r = parse_response(&fixture(API, "tool_use.json")).unwrap();
        assert_eq!(
            r.content,
            vec![
                Part::text("Okay, I will update the current issue list:"),
                Part::tool_call("toolu_01LRmxn9vGM1d2DZSDBowdZ1", "updateIssueList", "{}"),
            ]
        );
        assert_eq!(
            (r.stop, r.stop_raw.as_str()),
            (StopReason::ToolCalls, "tool_use")
        );
    }

    #[test]
    fn tool_input_is_kept_byte_for_byte() {
        let body = br#"{"id":"msg_1","model":"m","content":[{"type":"tool_use","id":"toolu_1","name":"t","input":{"z": 1,  "a": [true]}}],"stop_reason":"tool_use","usage":{"input_tokens":1,"output_tokens":1}}"#;
        let r = parse_response(body).unwrap();
        assert_eq!(
            r.tool_calls(),
            vec![("toolu_1", "t", r#"{"z": 1,  "a": [true]}"#)]
        );
    }

    #[test]
    fn cache_reads_and_writes_are_added_to_input_and_thinking_is_reasoning() {
        let r = parse_response(&fixture(API, "cached_thinking.json")).unwrap();
        assert_eq!(
            r.usage,
            Usage {
                input: 21 + 1800 + 188,
                cached_input: 1800,
                cache_write: 188,
                output: 120,
                reasoning: 95,
            }
        );
        // The thinking block is not part of the answer.
        assert_eq!(r.content, vec![Part::text("It is 18 °C in Paris.")]);
        assert_eq!(
            (r.stop, r.stop_raw.as_str()),
            (StopReason::Length, "max_tokens")
        );
    }

    #[test]
    fn stop_reasons_map_to_the_neutral_set() {
        let cases = [
            ("end_turn", StopReason::Stop),
            ("stop_sequence", StopReason::Stop),
            ("max_tokens", StopReason::Length),
            ("model_context_window_exceeded", StopReason::Length),
            ("tool_use", StopReason::ToolCalls),
            ("refusal", StopReason::ContentFilter),
            ("pause_turn", StopReason::Other),
            ("brand_new", StopReason::Other),
        ];
        for (raw, stop) in cases {
            let body = json!({"id": "m", "model": "m", "content": [], "stop_reason": raw,
                "usage": {"input_tokens": 1, "output_tokens": 1}});
            let r = parse_response(body.to_string().as_bytes()).unwrap();
            assert_eq!((r.stop, r.stop_raw.as_str()), (stop, raw));
        }
    }

    #[test]
    fn error_body_is_a_provider_error() {
        let err = parse_response(
            br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_1"}"#,
        )
        .unwrap_err();
        assert!(
            matches!(&err, WireError::Provider(e) if e.kind == ErrorKind::Overloaded && e.retryable),
            "{err:?}"
        );
    }

    #[test]
    fn text_stream_reports_deltas_and_takes_final_usage() {
        let bytes = fixture(API, "text.sse");
        let text = String::from_utf8(bytes.clone()).unwrap();
        let mut d = StreamDecoder::new(API);
        let appended: Vec<String> = text
            .split_inclusive("\n\n")
            .map(|ev| d.push(ev.as_bytes()).unwrap().appended)
            .filter(|a| !a.is_empty())
            .collect();
        assert_eq!(appended, vec!["Hello", "! How can I help?"]);
        let r = d.finish().unwrap();
        assert_eq!(r.id, "msg_01QC4g3HwBThD4BaNtBckFDJ");
        assert_eq!(r.text(), "Hello! How can I help?");
        assert_eq!(
            (r.stop, r.stop_raw.as_str()),
            (StopReason::Stop, "end_turn")
        );
        // output_tokens is message_delta's cumulative 30, not message_start's 1.
        assert_eq!(
            r.usage,
            Usage {
                input: 12,
                output: 30,
                ..Usage::default()
            }
        );
        assert_stream_assembles(API, &bytes, &r);
    }

    #[test]
    fn tool_use_stream_equals_the_unstreamed_reply() {
        let bytes = fixture(API, "tool_use.sse");
        let streamed = parse_stream(API, &bytes).unwrap();
        let whole = parse_response(&fixture(API, "tool_use_unstreamed.json")).unwrap();
        assert_eq!(streamed, whole);
        assert_eq!(
            streamed.tool_calls(),
            vec![(
                "toolu_01KFbKqPYSuAKujiL6mTfzYA",
                "get_weather",
                r#"{"city": "Paris"}"#
            )]
        );
        assert_eq!(streamed.text(), "Checking Paris — one moment.");
        assert_eq!(
            streamed.usage,
            Usage {
                input: 565 + 1024,
                cached_input: 1024,
                cache_write: 0,
                output: 47,
                reasoning: 0,
            }
        );
        assert_stream_assembles(API, &bytes, &whole);
    }

    #[test]
    fn tool_use_without_deltas_has_empty_object_arguments() {
        let body = concat!(
            "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"model\":\"m\",\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n",
            "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"updateIssueList\",\"input\":{}}}\n\n",
            "data: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
            "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":9}}\n\n",
            "data: {\"type\":\"message_stop\"}\n\n",
        );
        let r = parse_stream(API, body.as_bytes()).unwrap();
        assert_eq!(r.tool_calls(), vec![("toolu_1", "updateIssueList", "{}")]);
    }

    #[test]
    fn broken_streamed_tool_input_is_malformed() {
        let body = concat!(
            "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"model\":\"m\"}}\n\n",
            "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"t\",\"input\":{}}}\n\n",
            "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"a\\\":\"}}\n\n",
            "data: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
        );
        let err = parse_stream(API, body.as_bytes()).unwrap_err();
        assert!(matches!(err, WireError::Malformed { .. }), "{err:?}");
    }

    #[test]
    fn truncated_stream_is_cut() {
        let text = String::from_utf8(fixture(API, "tool_use.sse")).unwrap();
        let cut = &text[..text.find("event: message_stop").unwrap()];
        let err = parse_stream(API, cut.as_bytes()).unwrap_err();
        assert_eq!(
            err,
            WireError::Cut {
                api: API,
                expected: "message_stop"
            }
        );
        assert!(err.retryable());
    }

    #[test]
    fn overloaded_error_in_the_stream_is_retryable() {
        let mut d = StreamDecoder::new(API);
        let err = d.push(&fixture(API, "overloaded.sse")).unwrap_err();
        let WireError::Provider(e) = &err else {
            panic!("{err:?}")
        };
        assert_eq!(
            (e.kind, e.retryable, e.status),
            (ErrorKind::Overloaded, true, None)
        );
        assert_eq!(e.provider_type.as_deref(), Some("overloaded_error"));
        assert_eq!(
            e.request_id.as_deref(),
            Some("req_011CSLsW7mFqvHHnzrKdKjAE")
        );
        assert!(err.retryable());
        assert_eq!(err.to_provider_error(), e.clone());
    }
}
