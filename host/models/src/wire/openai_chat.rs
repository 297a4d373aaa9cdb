//! OpenAI Chat Completions (`POST /v1/chat/completions`); docs/models.md, "Wire formats".
//!
//! Request mapping:
//! - `system` → a first `{"role":"system"}` message;
//! - a user message → `{"role":"user","content":…}` (a string for one text part, else text parts);
//! - an assistant message → `content` (string, text parts, or `null` when it only calls tools) and
//!   `tool_calls[]` with `arguments` sent byte for byte;
//! - each tool result → its own `{"role":"tool","tool_call_id","content"}` message (Chat has no
//!   error flag: an error result is sent as its text);
//! - tools → `{"type":"function","function":{name,description,parameters,strict:false}}`;
//! - `max_tokens` → `max_completion_tokens`; `stop` → `stop` (array); `parallel_tool_calls` is sent
//!   only with tools; `stream` → `stream:true` and `stream_options.include_usage:true`.
//!
//! Usage: `prompt_tokens` already includes `prompt_tokens_details.cached_tokens` (and
//! `cache_write_tokens`), and `completion_tokens` includes `reasoning_tokens`, so every count is
//! taken as sent.

use super::WireError;
use super::common::{count, f32_json, json_body, json_event, merge_raw, string, texts, validated};
use super::{Progress, StreamAssembler};
use crate::api::Api;
use crate::chat::{ChatRequest, ChatResponse, Part, Role, StopReason, ToolChoice, Usage};
use crate::errors::classify_stream_error;
use crate::sse::SseEvent;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;

const API: Api = Api::OpenAiChat;

/// Body fields the mapping owns; `raw` may not set them.
const OWNED: &[&str] = &[
    "model",
    "messages",
    "max_completion_tokens",
    "temperature",
    "stop",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "stream",
    "stream_options",
];

/// The Chat Completions body for `req`, sent to `provider_model` with `max_tokens` as
/// `max_completion_tokens`.
pub fn request_body(
    req: &ChatRequest,
    provider_model: &str,
    max_tokens: u32,
    stream: bool,
) -> Result<Value, WireError> {
    validated(API, req)?;
    let mut messages = Vec::new();
    if let Some(system) = &req.system {
        messages.push(json!({"role": "system", "content": system}));
    }
    for msg in &req.messages {
        match msg.role {
            Role::User => {
                messages.push(json!({"role": "user", "content": text_content(&msg.content)}))
            }
            Role::Assistant => {
                let calls: Vec<Value> = msg
                    .content
                    .iter()
                    .filter_map(|p| match p {
                        Part::ToolCall {
                            id,
                            name,
                            arguments,
                        } => Some(json!({
                            "id": id,
                            "type": "function",
                            "function": {"name": name, "arguments": arguments},
                        })),
                        _ => None,
                    })
                    .collect();
                let mut m = Map::new();
                m.insert("role".into(), json!("assistant"));
                m.insert("content".into(), text_content(&msg.content));
                if !calls.is_empty() {
                    m.insert("tool_calls".into(), Value::Array(calls));
                }
                messages.push(Value::Object(m));
            }
            Role::Tool => {
                for part in &msg.content {
                    if let Part::ToolResult {
                        call_id, content, ..
                    } = part
                    {
                        messages.push(json!({
                            "role": "tool",
                            "tool_call_id": call_id,
                            "content": content,
                        }));
                    }
                }
            }
        }
    }

    let mut body = Map::new();
    body.insert("model".into(), json!(provider_model));
    body.insert("messages".into(), Value::Array(messages));
    body.insert("max_completion_tokens".into(), json!(max_tokens));
    if let Some(t) = req.temperature {
        body.insert("temperature".into(), f32_json(t));
    }
    if !req.stop.is_empty() {
        body.insert("stop".into(), json!(req.stop));
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
                if !t.parameters.is_null() {
                    f.insert("parameters".into(), t.parameters.clone());
                }
                f.insert("strict".into(), json!(false));
                json!({"type": "function", "function": f})
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
        if let Some(p) = req.parallel_tool_calls {
            body.insert("parallel_tool_calls".into(), json!(p));
        }
    }
    if let Some(choice) = &req.tool_choice {
        let v = match choice {
            ToolChoice::Auto => json!("auto"),
            ToolChoice::None => json!("none"),
            ToolChoice::Required => json!("required"),
            ToolChoice::Tool { name } => json!({"type": "function", "function": {"name": name}}),
        };
        body.insert("tool_choice".into(), v);
    }
    if stream {
        body.insert("stream".into(), json!(true));
        body.insert("stream_options".into(), json!({"include_usage": true}));
    }
    merge_raw(API, &mut body, req.raw.as_ref(), OWNED)?;
    Ok(Value::Object(body))
}

/// The `content` of a user or assistant message: one text part as a string, several as text
/// parts, none as `null`.
fn text_content(parts: &[Part]) -> Value {
    match texts(parts).as_slice() {
        [] => Value::Null,
        [one] => json!(one),
        many => Value::Array(
            many.iter()
                .map(|t| json!({"type": "text", "text": t}))
                .collect(),
        ),
    }
}

/// `finish_reason` → neutral: `stop`; `length`; `tool_calls` and `function_call`;
/// `content_filter`; anything else or null is `other`.
fn stop_reason(raw: &str) -> StopReason {
    match raw {
        "stop" => StopReason::Stop,
        "length" => StopReason::Length,
        "tool_calls" | "function_call" => StopReason::ToolCalls,
        "content_filter" => StopReason::ContentFilter,
        _ => StopReason::Other,
    }
}

/// Chat `usage` → neutral: `prompt_tokens` (cached tokens included), `cached_tokens`,
/// `cache_write_tokens`, `completion_tokens` (reasoning included), `reasoning_tokens`.
fn usage(u: &Value) -> Usage {
    Usage {
        input: count(u, &["prompt_tokens"]),
        cached_input: count(u, &["prompt_tokens_details", "cached_tokens"]),
        cache_write: count(u, &["prompt_tokens_details", "cache_write_tokens"]),
        output: count(u, &["completion_tokens"]),
        reasoning: count(u, &["completion_tokens_details", "reasoning_tokens"]),
    }
}

/// The usage object, if the reply has one (not `null`).
fn usage_raw(v: &Value) -> Option<Value> {
    v.get("usage").filter(|u| u.is_object()).cloned()
}

/// Parses a non-streamed Chat Completions reply (`choices[0]` only).
pub fn parse_response(body: &[u8]) -> Result<ChatResponse, WireError> {
    let v = json_body(API, body)?;
    if v.get("error").is_some_and(Value::is_object) && v.get("choices").is_none() {
        return Err(WireError::Provider(classify_stream_error(API, &v)));
    }
    let choice = v
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .ok_or_else(|| malformed("no `choices[0]`"))?;
    let message = choice
        .get("message")
        .filter(|m| m.is_object())
        .ok_or_else(|| malformed("no `choices[0].message`"))?;
    let mut content = Vec::new();
    match message.get("content") {
        Some(Value::String(text)) if !text.is_empty() => content.push(Part::text(text)),
        Some(Value::Array(parts)) => {
            let text: String = parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect();
            if !text.is_empty() {
                content.push(Part::text(text));
            }
        }
        _ => {}
    }
    for (i, call) in message
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let function = call
            .get("function")
            .ok_or_else(|| malformed(&format!("tool_calls[{i}] has no `function`")))?;
        content.push(Part::tool_call(
            string(call, "id"),
            string(function, "name"),
            string(function, "arguments"),
        ));
    }
    let finish = choice
        .get("finish_reason")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let refusal = message
        .get("refusal")
        .and_then(Value::as_str)
        .filter(|r| !r.is_empty())
        .map(str::to_string);
    let usage_raw = usage_raw(&v);
    Ok(ChatResponse {
        api: API.as_str().to_string(),
        model: string(&v, "model"),
        id: string(&v, "id"),
        content,
        stop: stop_reason(finish),
        stop_raw: finish.to_string(),
        refusal,
        usage: usage_raw.as_ref().map(usage).unwrap_or_default(),
        usage_raw,
        cost: None,
        charged: None,
    })
}

fn malformed(message: &str) -> WireError {
    WireError::Malformed {
        api: API,
        message: message.to_string(),
    }
}

/// One tool call being streamed, keyed by its `index`.
#[derive(Debug, Default)]
struct CallSlot {
    id: String,
    name: String,
    arguments: String,
}

/// Assembles a Chat Completions stream: `data:`-only chunks ending with
/// `data: [DONE]`.
///
/// Text deltas of `choices[0]` are concatenated, tool-call fragments are accumulated by `index`
/// (`id` and `name` from the first fragment, `arguments` concatenated), `finish_reason` is the
/// non-null one, usage comes from the chunk with `choices: []`. Complete only when `[DONE]` arrives
/// after a `finish_reason`; anything less is [`WireError::Cut`]. A chunk with an `error` object is
/// [`WireError::Provider`].
#[derive(Debug, Default)]
pub struct Assembler {
    id: String,
    model: String,
    text: String,
    refusal: String,
    calls: BTreeMap<u64, CallSlot>,
    finish: Option<String>,
    usage: Option<Value>,
    done: bool,
}

impl StreamAssembler for Assembler {
    fn event(&mut self, ev: &SseEvent) -> Result<Progress, WireError> {
        let mut progress = Progress::default();
        if ev.data.trim() == "[DONE]" {
            self.done = true;
            progress.done = true;
            return Ok(progress);
        }
        let v = json_event(API, &ev.data)?;
        if v.get("error").is_some_and(|e| !e.is_null()) {
            return Err(WireError::Provider(classify_stream_error(API, &v)));
        }
        if self.id.is_empty() {
            self.id = string(&v, "id");
        }
        if self.model.is_empty() {
            self.model = string(&v, "model");
        }
        if let Some(u) = usage_raw(&v) {
            self.usage = Some(u);
        }
        let choices = v.get("choices").and_then(Value::as_array);
        for choice in choices.into_iter().flatten() {
            if choice.get("index").and_then(Value::as_u64).unwrap_or(0) != 0 {
                continue;
            }
            if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
                self.finish = Some(reason.to_string());
            }
            let Some(delta) = choice.get("delta") else {
                continue;
            };
            if let Some(text) = delta.get("content").and_then(Value::as_str) {
                self.text.push_str(text);
                progress.appended.push_str(text);
            }
            if let Some(refusal) = delta.get("refusal").and_then(Value::as_str) {
                self.refusal.push_str(refusal);
            }
            for (i, frag) in delta
                .get("tool_calls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .enumerate()
            {
                let index = frag
                    .get("index")
                    .and_then(Value::as_u64)
                    .ok_or_else(|| malformed(&format!("tool call fragment {i} has no `index`")))?;
                let slot = self.calls.entry(index).or_default();
                if let Some(id) = frag.get("id").and_then(Value::as_str) {
                    slot.id = id.to_string();
                }
                if let Some(f) = frag.get("function") {
                    if let Some(name) = f.get("name").and_then(Value::as_str) {
                        slot.name = name.to_string();
                    }
                    if let Some(args) = f.get("arguments").and_then(Value::as_str) {
                        slot.arguments.push_str(args);
                    }
                }
            }
        }
        Ok(progress)
    }

    fn finish(self: Box<Self>) -> Result<ChatResponse, WireError> {
        let me = *self;
        let (true, Some(finish)) = (me.done, me.finish) else {
            return Err(WireError::Cut {
                api: API,
                expected: "a finish_reason, then data: [DONE]",
            });
        };
        let mut content = Vec::new();
        if !me.text.is_empty() {
            content.push(Part::text(me.text));
        }
        for slot in me.calls.into_values() {
            content.push(Part::ToolCall {
                id: slot.id,
                name: slot.name,
                arguments: slot.arguments,
            });
        }
        Ok(ChatResponse {
            api: API.as_str().to_string(),
            model: me.model,
            id: me.id,
            content,
            stop: stop_reason(&finish),
            stop_raw: finish,
            refusal: (!me.refusal.is_empty()).then_some(me.refusal),
            usage: me.usage.as_ref().map(usage).unwrap_or_default(),
            usage_raw: me.usage,
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

    fn weather_schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
            },
            "required": ["city"]
        })
    }

    #[test]
    fn request_with_system_text_tool_calls_results_and_tools_has_the_documented_shape() {
        let mut req = weather_conversation();
        req.stop = vec!["\n\n".into()];
        req.raw = Some(json!({"seed": 1}).as_object().unwrap().clone());
        let body = request_body(&req, "gpt-4.1-mini", 1024, false).unwrap();
        assert_eq!(
            body,
            json!({
                "model": "gpt-4.1-mini",
                "messages": [
                    {"role": "system", "content": "You are terse."},
                    {"role": "user", "content": "Weather in Paris and Rome?"},
                    {"role": "assistant", "content": "Checking both.", "tool_calls": [
                        {"id": "call_A", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                        {"id": "call_B", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Rome\"}"}}
                    ]},
                    {"role": "tool", "tool_call_id": "call_A", "content": "{\"temp_c\":18}"},
                    {"role": "tool", "tool_call_id": "call_B", "content": "city not found"}
                ],
                "max_completion_tokens": 1024,
                "temperature": 0.2,
                "stop": ["\n\n"],
                "tools": [{
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "description": "Current weather for a city",
                        "parameters": weather_schema(),
                        "strict": false
                    }
                }],
                "tool_choice": "auto",
                "seed": 1
            })
        );
    }

    #[test]
    fn stream_flag_asks_for_the_usage_chunk() {
        let body = request_body(&weather_conversation(), "m", 5, true).unwrap();
        assert_eq!(body["stream"], json!(true));
        assert_eq!(body["stream_options"], json!({"include_usage": true}));
        let body = request_body(&weather_conversation(), "m", 5, false).unwrap();
        assert!(body.get("stream").is_none() && body.get("stream_options").is_none());
    }

    #[test]
    fn tool_choice_spellings_and_parallel_tool_calls() {
        let mut req = weather_conversation();
        let cases = [
            (ToolChoice::Auto, json!("auto")),
            (ToolChoice::None, json!("none")),
            (ToolChoice::Required, json!("required")),
            (
                ToolChoice::Tool {
                    name: "get_weather".into(),
                },
                json!({"type": "function", "function": {"name": "get_weather"}}),
            ),
        ];
        for (choice, want) in cases {
            req.tool_choice = Some(choice);
            assert_eq!(
                request_body(&req, "m", 5, false).unwrap()["tool_choice"],
                want
            );
        }
        req.parallel_tool_calls = Some(false);
        assert_eq!(
            request_body(&req, "m", 5, false).unwrap()["parallel_tool_calls"],
            json!(false)
        );
    }

    #[test]
    fn no_tools_means_no_tool_fields_and_tool_only_assistant_content_is_null() {
        let mut req = ChatRequest::new(
            "default",
            vec![
                Message {
                    role: Role::User,
                    content: vec![Part::text("a"), Part::text("b")],
                },
                Message::assistant(vec![Part::tool_call("c1", "t", "{}")]),
                Message::tool_result("c1", "t", "ok", false),
            ],
        );
        req.parallel_tool_calls = Some(false);
        let body = request_body(&req, "m", 5, false).unwrap();
        for key in [
            "tools",
            "tool_choice",
            "parallel_tool_calls",
            "temperature",
            "stop",
        ] {
            assert!(body.get(key).is_none(), "{key}: {body}");
        }
        assert_eq!(
            body["messages"],
            json!([
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "t", "arguments": "{}"}}
                ]},
                {"role": "tool", "tool_call_id": "c1", "content": "ok"}
            ])
        );
    }

    #[test]
    fn tool_without_parameters_leaves_them_out() {
        let mut req = weather_conversation();
        req.tools = vec![ToolDef {
            name: "get_weather".into(),
            description: None,
            parameters: Value::Null,
        }];
        let body = request_body(&req, "m", 5, false).unwrap();
        assert_eq!(
            body["tools"],
            json!([{"type": "function", "function": {"name": "get_weather", "strict": false}}])
        );
    }

    #[test]
    fn raw_keys_the_mapping_owns_are_refused() {
        for key in [
            "messages",
            "stream",
            "stream_options",
            "max_completion_tokens",
            "tools",
        ] {
            let mut req = weather_conversation();
            req.raw = Some(json!({key: 1}).as_object().unwrap().clone());
            assert_eq!(
                request_body(&req, "m", 5, false),
                Err(WireError::RawCollision {
                    api: API,
                    key: key.into()
                })
            );
        }
    }

    #[test]
    fn invalid_requests_are_refused_before_mapping() {
        let mut req = weather_conversation();
        req.messages.pop();
        let err = request_body(&req, "m", 5, false).unwrap_err();
        assert!(
            matches!(&err, WireError::InvalidRequest { message, .. } if message.contains("call_B")),
            "{err:?}"
        );
    }

    #[test]
    fn parses_text_reply() {
        let r = parse_response(&fixture(API, "text.json")).unwrap();
        assert_eq!(r.api, "openai-chat");
        assert_eq!(r.id, "chatcmpl-D8Z5f52zQqikDBEKQMQoYcWMcWPeU");
        assert_eq!(r.model, "gpt-4.1-nano-2025-04-14");
        assert_eq!(r.content, vec![Part::text("Hi.")]);
        assert_eq!((r.stop, r.stop_raw.as_str()), (StopReason::Stop, "stop"));
        assert_eq!(r.refusal, None);
        assert_eq!(
            r.usage,
            Usage {
                input: 16,
                output: 363,
                ..Usage::default()
            }
        );
        assert_eq!(r.usage_raw.as_ref().unwrap()["total_tokens"], json!(379));
    }

    #[test]
    fn parses_tool_call_reply_keeping_arguments_byte_for_byte() {
        let r = parse_response(&fixture(API, "tool_calls.json")).unwrap();
        assert_eq!(
            r.content,
            vec![Part::tool_call(
                "call_abc123",
                "get_current_weather",
                "{\n\"location\": \"Boston, MA\"\n}"
            )]
        );
        assert_eq!(
            (r.stop, r.stop_raw.as_str()),
            (StopReason::ToolCalls, "tool_calls")
        );
        assert_eq!(r.usage.input, 82);
        assert_eq!(r.usage.output, 17);
    }

    #[test]
    fn cached_prompt_tokens_stay_inside_input_and_reasoning_inside_output() {
        let r = parse_response(&fixture(API, "cached_reasoning.json")).unwrap();
        assert_eq!(
            r.usage,
            Usage {
                input: 2006,
                cached_input: 1920,
                cache_write: 0,
                output: 300,
                reasoning: 256,
            }
        );
        assert_eq!(
            (r.stop, r.stop_raw.as_str()),
            (StopReason::Length, "length")
        );
    }

    #[test]
    fn finish_reasons_map_to_the_neutral_set() {
        let cases = [
            (json!("stop"), StopReason::Stop, "stop"),
            (json!("length"), StopReason::Length, "length"),
            (json!("tool_calls"), StopReason::ToolCalls, "tool_calls"),
            (
                json!("function_call"),
                StopReason::ToolCalls,
                "function_call",
            ),
            (
                json!("content_filter"),
                StopReason::ContentFilter,
                "content_filter",
            ),
            (json!("something_new"), StopReason::Other, "something_new"),
            (Value::Null, StopReason::Other, ""),
        ];
        for (finish, stop, raw) in cases {
            let body = json!({"id": "c", "model": "m", "choices": [{"index": 0,
                "message": {"role": "assistant", "content": "x"}, "finish_reason": finish}]});
            let r = parse_response(body.to_string().as_bytes()).unwrap();
            assert_eq!((r.stop, r.stop_raw.as_str()), (stop, raw), "{finish}");
        }
    }

    #[test]
    fn refusal_is_kept_apart_from_content() {
        let body = json!({"id": "c", "model": "m", "choices": [{"index": 0, "message": {
            "role": "assistant", "content": null, "refusal": "I can't help with that."},
            "finish_reason": "stop"}], "usage": null});
        let r = parse_response(body.to_string().as_bytes()).unwrap();
        assert!(r.content.is_empty());
        assert_eq!(r.refusal.as_deref(), Some("I can't help with that."));
        assert_eq!((r.usage, r.usage_raw), (Usage::default(), None));
    }

    #[test]
    fn malformed_replies_are_errors() {
        for body in [&b"not json"[..], b"[]", br#"{"id":"c","choices":[]}"#] {
            let err = parse_response(body).unwrap_err();
            assert!(matches!(err, WireError::Malformed { .. }), "{err:?}");
        }
        let err = parse_response(
            br#"{"error":{"message":"The server had an error","type":"server_error","param":null,"code":null}}"#,
        )
        .unwrap_err();
        assert!(
            matches!(&err, WireError::Provider(e) if e.kind == ErrorKind::Server && e.retryable)
        );
    }

    #[test]
    fn text_stream_reports_deltas_and_assembles() {
        let bytes = fixture(API, "text.sse");
        let text = String::from_utf8(bytes.clone()).unwrap();
        let mut d = StreamDecoder::new(API);
        let mut seen = Vec::new();
        for chunk in text.split_inclusive("\n\n") {
            let p = d.push(chunk.as_bytes()).unwrap();
            seen.push((p.appended, p.done));
        }
        let s = |t: &str, done: bool| (t.to_string(), done);
        assert_eq!(
            seen,
            vec![
                s("", false),
                s("Hel", false),
                s("lo.", false),
                s("", false),
                s("", false),
                s("", true)
            ]
        );
        let r = d.finish().unwrap();
        assert_eq!(r.id, "chatcmpl-D8Z5");
        assert_eq!(r.content, vec![Part::text("Hello.")]);
        assert_eq!(r.stop, StopReason::Stop);
        assert_eq!(r.usage.input, 16);
        assert_eq!(r.usage.output, 300);
        assert_stream_assembles(API, &bytes, &r);
    }

    #[test]
    fn tool_call_stream_equals_the_unstreamed_reply() {
        let streamed = parse_stream(API, &fixture(API, "tool_calls.sse")).unwrap();
        let whole = parse_response(&fixture(API, "tool_calls_unstreamed.json")).unwrap();
        assert_eq!(streamed, whole);
        assert_eq!(
            streamed.tool_calls(),
            vec![("call_O17U", "test-tool", r#"{"value":"Sparkle Day"}"#)]
        );
        assert_eq!(streamed.stop, StopReason::ToolCalls);
        assert_eq!(streamed.usage.total(), 70);
        assert_stream_assembles(API, &fixture(API, "tool_calls.sse"), &whole);
    }

    #[test]
    fn parallel_tool_call_fragments_accumulate_by_index() {
        let chunks = [
            r#"{"id":"c","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"Both: "}}]}"#,
            r#"{"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_A","type":"function","function":{"name":"get_weather","arguments":""}}]}}]}"#,
            r#"{"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_B","type":"function","function":{"name":"get_weather","arguments":"{\"city\":"}}]}}]}"#,
            r#"{"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":\"Paris\"}"}}]}}]}"#,
            r#"{"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"\"Rome\"}"}}]}}]}"#,
            r#"{"id":"c","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
            "[DONE]",
        ];
        let body: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
        let r = parse_stream(API, body.as_bytes()).unwrap();
        assert_eq!(
            r.content,
            vec![
                Part::text("Both: "),
                Part::tool_call("call_A", "get_weather", r#"{"city":"Paris"}"#),
                Part::tool_call("call_B", "get_weather", r#"{"city":"Rome"}"#),
            ]
        );
        // No usage chunk: usage is absent, not a real zero.
        assert_eq!((r.usage, r.usage_raw), (Usage::default(), None));
    }

    #[test]
    fn truncated_streams_are_cut() {
        let bytes = fixture(API, "tool_calls.sse");
        let text = String::from_utf8(bytes).unwrap();
        let without_done = text.replace("data: [DONE]\n\n", "");
        let err = parse_stream(API, without_done.as_bytes()).unwrap_err();
        assert!(matches!(err, WireError::Cut { .. }), "{err:?}");
        assert!(err.retryable());
        // `[DONE]` with no finish_reason before it is not a complete answer either.
        let body = "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: [DONE]\n\n";
        let mut d = StreamDecoder::new(API);
        assert!(d.push(body.as_bytes()).unwrap().done);
        assert!(matches!(d.finish(), Err(WireError::Cut { .. })));
    }

    #[test]
    fn error_chunk_in_the_stream_is_a_provider_error() {
        let body = concat!(
            "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n",
            "data: {\"error\":{\"message\":\"The server had an error while processing your request.\",\"type\":\"server_error\",\"param\":null,\"code\":null}}\n\n",
        );
        let mut d = StreamDecoder::new(API);
        let err = d.push(body.as_bytes()).unwrap_err();
        let WireError::Provider(e) = &err else {
            panic!("{err:?}")
        };
        assert_eq!(
            (e.kind, e.retryable, e.status),
            (ErrorKind::Server, true, None)
        );
        assert!(err.retryable());
    }
}
