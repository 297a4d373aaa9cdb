//! OpenAI Responses (`POST /v1/responses`); docs/models.md, "Wire formats".
//!
//! Request mapping:
//! - `system` → `instructions`;
//! - a user message → an input item `{"type":"message","role":"user","content":…}` (a string for
//!   one text part, else `input_text` parts);
//! - an assistant message → in order, one `{"type":"message","role":"assistant","content":"…"}`
//!   item per text part and one `{"type":"function_call","call_id","name","arguments"}` item per
//!   tool call; server item ids (`fc_…`, `msg_…`, `rs_…`) are never sent (`store:false` forbids
//!   them) and reasoning items are not carried;
//! - each tool result → `{"type":"function_call_output","call_id","output"}` (no error flag);
//! - tools → flat `{"type":"function",name,description,parameters,strict:false}`, `strict` always
//!   explicit (left out, Responses would make the schema strict);
//! - `max_tokens` → `max_output_tokens`; `store:false` always; `stop` is refused
//!   ([`WireError::Unsupported`]): the API has no stop sequences.
//!
//! Usage: `input_tokens` already includes `input_tokens_details.cached_tokens` (and
//! `cache_write_tokens`), and `output_tokens` includes `reasoning_tokens`: taken as sent.

use super::WireError;
use super::common::{count, f32_json, json_body, json_event, merge_raw, string, texts, validated};
use super::{Progress, StreamAssembler};
use crate::api::Api;
use crate::chat::{ChatRequest, ChatResponse, Part, Role, StopReason, ToolChoice, Usage};
use crate::errors::classify_stream_error;
use crate::sse::SseEvent;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;

const API: Api = Api::OpenAiResponses;

/// Body fields the mapping owns; `raw` may not set them.
const OWNED: &[&str] = &[
    "model",
    "instructions",
    "input",
    "max_output_tokens",
    "temperature",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "store",
    "stream",
];

/// The Responses body for `req`, sent to `provider_model` with `max_tokens` as
/// `max_output_tokens`.
pub fn request_body(
    req: &ChatRequest,
    provider_model: &str,
    max_tokens: u32,
    stream: bool,
) -> Result<Value, WireError> {
    validated(API, req)?;
    if !req.stop.is_empty() {
        return Err(WireError::Unsupported {
            api: API,
            field: "stop",
            message: "the Responses API has no stop sequences; remove `stop` or use a model \
                      alias with api `openai-chat` or `anthropic-messages`"
                .into(),
        });
    }
    let mut input = Vec::new();
    for msg in &req.messages {
        match msg.role {
            Role::User => {
                let content = match texts(&msg.content).as_slice() {
                    [one] => json!(one),
                    many => Value::Array(
                        many.iter()
                            .map(|t| json!({"type": "input_text", "text": t}))
                            .collect(),
                    ),
                };
                input.push(json!({"type": "message", "role": "user", "content": content}));
            }
            Role::Assistant => {
                for part in &msg.content {
                    match part {
                        Part::Text { text } => input
                            .push(json!({"type": "message", "role": "assistant", "content": text})),
                        Part::ToolCall {
                            id,
                            name,
                            arguments,
                        } => input.push(json!({
                            "type": "function_call",
                            "call_id": id,
                            "name": name,
                            "arguments": arguments,
                        })),
                        Part::ToolResult { .. } => {}
                    }
                }
            }
            Role::Tool => {
                for part in &msg.content {
                    if let Part::ToolResult {
                        call_id, content, ..
                    } = part
                    {
                        input.push(json!({
                            "type": "function_call_output",
                            "call_id": call_id,
                            "output": content,
                        }));
                    }
                }
            }
        }
    }

    let mut body = Map::new();
    body.insert("model".into(), json!(provider_model));
    if let Some(system) = &req.system {
        body.insert("instructions".into(), json!(system));
    }
    body.insert("input".into(), Value::Array(input));
    body.insert("max_output_tokens".into(), json!(max_tokens));
    if let Some(t) = req.temperature {
        body.insert("temperature".into(), f32_json(t));
    }
    if !req.tools.is_empty() {
        let tools: Vec<Value> = req
            .tools
            .iter()
            .map(|t| {
                let mut f = Map::new();
                f.insert("type".into(), json!("function"));
                f.insert("name".into(), json!(t.name));
                if let Some(d) = &t.description {
                    f.insert("description".into(), json!(d));
                }
                let parameters = if t.parameters.is_null() {
                    json!({"type": "object", "properties": {}})
                } else {
                    t.parameters.clone()
                };
                f.insert("parameters".into(), parameters);
                f.insert("strict".into(), json!(false));
                Value::Object(f)
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
            ToolChoice::Tool { name } => json!({"type": "function", "name": name}),
        };
        body.insert("tool_choice".into(), v);
    }
    body.insert("store".into(), json!(false));
    if stream {
        body.insert("stream".into(), json!(true));
    }
    merge_raw(API, &mut body, req.raw.as_ref(), OWNED)?;
    Ok(Value::Object(body))
}

/// Responses `usage` → neutral: `input_tokens` (cached included), `cached_tokens`,
/// `cache_write_tokens`, `output_tokens` (reasoning included), `reasoning_tokens`.
fn usage(u: &Value) -> Usage {
    Usage {
        input: count(u, &["input_tokens"]),
        cached_input: count(u, &["input_tokens_details", "cached_tokens"]),
        cache_write: count(u, &["input_tokens_details", "cache_write_tokens"]),
        output: count(u, &["output_tokens"]),
        reasoning: count(u, &["output_tokens_details", "reasoning_tokens"]),
    }
}

fn malformed(message: impl Into<String>) -> WireError {
    WireError::Malformed {
        api: API,
        message: message.into(),
    }
}

/// Parses a non-streamed Responses reply. A `failed` reply is [`WireError::Provider`] (its
/// `error.code` classified), not a response.
pub fn parse_response(body: &[u8]) -> Result<ChatResponse, WireError> {
    let v = json_body(API, body)?;
    if v.get("error").is_some_and(Value::is_object) && v.get("status").is_none() {
        // An error body served with 200 by a compatible server.
        return Err(WireError::Provider(classify_stream_error(API, &v)));
    }
    from_response(&v, None)
}

/// A terminal `Response` object → neutral. `fallback_output` (items from
/// `response.output_item.done`) is used when the response's own `output` is empty.
fn from_response(
    resp: &Value,
    fallback_output: Option<&[Value]>,
) -> Result<ChatResponse, WireError> {
    let status = resp
        .get("status")
        .and_then(Value::as_str)
        .ok_or_else(|| malformed("no `status`"))?;
    if status == "failed" {
        return Err(WireError::Provider(classify_stream_error(API, resp)));
    }
    let own = resp
        .get("output")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let output = match fallback_output {
        Some(items) if own.is_empty() => items,
        _ => own,
    };
    let mut content = Vec::new();
    let mut refusal = String::new();
    for item in output {
        match item.get("type").and_then(Value::as_str) {
            Some("message") => {
                for part in item
                    .get("content")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    match part.get("type").and_then(Value::as_str) {
                        Some("output_text") => {
                            let text = string(part, "text");
                            if !text.is_empty() {
                                content.push(Part::text(text));
                            }
                        }
                        Some("refusal") => refusal.push_str(&string(part, "refusal")),
                        _ => {}
                    }
                }
            }
            Some("function_call") => content.push(Part::tool_call(
                string(item, "call_id"),
                string(item, "name"),
                string(item, "arguments"),
            )),
            // Reasoning and hosted-tool items stay in the recorded bytes only.
            _ => {}
        }
    }
    let reason = resp
        .get("incomplete_details")
        .and_then(|d| d.get("reason"))
        .and_then(Value::as_str);
    let has_calls = content.iter().any(|p| matches!(p, Part::ToolCall { .. }));
    let (stop, stop_raw) = match (status, reason) {
        ("completed", _) if has_calls => (StopReason::ToolCalls, status.to_string()),
        ("completed", _) => (StopReason::Stop, status.to_string()),
        ("incomplete", Some(r)) => (
            match r {
                "max_output_tokens" | "max_tokens" => StopReason::Length,
                "content_filter" => StopReason::ContentFilter,
                _ => StopReason::Other,
            },
            format!("incomplete/{r}"),
        ),
        ("in_progress" | "queued", _) => {
            return Err(malformed(format!(
                "the response is not finished (status `{status}`)"
            )));
        }
        (other, _) => (StopReason::Other, other.to_string()),
    };
    let usage_raw = resp.get("usage").filter(|u| u.is_object()).cloned();
    Ok(ChatResponse {
        api: API.as_str().to_string(),
        model: string(resp, "model"),
        id: string(resp, "id"),
        content,
        stop,
        stop_raw,
        refusal: (!refusal.is_empty()).then_some(refusal),
        usage: usage_raw.as_ref().map(usage).unwrap_or_default(),
        usage_raw,
        cost: None,
        charged: None,
    })
}

/// Assembles a Responses stream, dispatching on each event's JSON `type`.
///
/// `response.output_text.delta` is reported as progress; `response.output_item.done` items are
/// kept; the terminal `response.completed` or `response.incomplete` carries the whole `Response`,
/// which is authoritative (tool calls are taken from it, never from `.added`, whose `call_id` can
/// differ). An `error` event or `response.failed` is [`WireError::Provider`]; a stream without a
/// terminal event is [`WireError::Cut`].
#[derive(Debug, Default)]
pub struct Assembler {
    items_done: BTreeMap<u64, Value>,
    terminal: Option<Value>,
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
            "response.output_text.delta" => {
                if let Some(delta) = v.get("delta").and_then(Value::as_str) {
                    progress.appended.push_str(delta);
                }
            }
            "response.output_item.done" => {
                let index = v.get("output_index").and_then(Value::as_u64).unwrap_or(0);
                if let Some(item) = v.get("item") {
                    self.items_done.insert(index, item.clone());
                }
            }
            "error" | "response.failed" => {
                return Err(WireError::Provider(classify_stream_error(API, &v)));
            }
            "response.completed" | "response.incomplete" => {
                let resp = v
                    .get("response")
                    .filter(|r| r.is_object())
                    .ok_or_else(|| malformed(format!("`{ty}` without a `response`")))?;
                self.terminal = Some(resp.clone());
                progress.done = true;
            }
            _ => {}
        }
        Ok(progress)
    }

    fn finish(self: Box<Self>) -> Result<ChatResponse, WireError> {
        let Some(resp) = self.terminal else {
            return Err(WireError::Cut {
                api: API,
                expected: "response.completed or response.incomplete",
            });
        };
        let items: Vec<Value> = self.items_done.into_values().collect();
        from_response(&resp, Some(&items))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::Message;
    use crate::errors::ErrorKind;
    use crate::wire::testing::{assert_stream_assembles, fixture, weather_conversation};
    use crate::wire::{StreamDecoder, parse_stream};

    #[test]
    fn request_with_system_text_tool_calls_results_and_tools_has_the_documented_shape() {
        let mut req = weather_conversation();
        req.raw = Some(
            json!({"reasoning": {"effort": "low"}})
                .as_object()
                .unwrap()
                .clone(),
        );
        let body = request_body(&req, "gpt-5-mini", 1024, false).unwrap();
        assert_eq!(
            body,
            json!({
                "model": "gpt-5-mini",
                "instructions": "You are terse.",
                "input": [
                    {"type": "message", "role": "user", "content": "Weather in Paris and Rome?"},
                    {"type": "message", "role": "assistant", "content": "Checking both."},
                    {"type": "function_call", "call_id": "call_A", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
                    {"type": "function_call", "call_id": "call_B", "name": "get_weather", "arguments": "{\"city\":\"Rome\"}"},
                    {"type": "function_call_output", "call_id": "call_A", "output": "{\"temp_c\":18}"},
                    {"type": "function_call_output", "call_id": "call_B", "output": "city not found"}
                ],
                "max_output_tokens": 1024,
                "temperature": 0.2,
                "tools": [{
                    "type": "function",
                    "name": "get_weather",
                    "description": "Current weather for a city",
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "city": {"type": "string", "description": "City name"},
                            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
                        },
                        "required": ["city"]
                    },
                    "strict": false
                }],
                "tool_choice": "auto",
                "store": false,
                "reasoning": {"effort": "low"}
            })
        );
        // No server item ids anywhere in the input.
        for item in body["input"].as_array().unwrap() {
            assert!(item.get("id").is_none(), "{item}");
        }
    }

    #[test]
    fn stream_flag_tool_choice_and_parallel_calls() {
        let mut req = weather_conversation();
        req.tool_choice = Some(ToolChoice::Tool {
            name: "get_weather".into(),
        });
        req.parallel_tool_calls = Some(false);
        let body = request_body(&req, "m", 5, true).unwrap();
        assert_eq!(body["stream"], json!(true));
        assert_eq!(
            body["tool_choice"],
            json!({"type": "function", "name": "get_weather"})
        );
        assert_eq!(body["parallel_tool_calls"], json!(false));
        req.tool_choice = Some(ToolChoice::Required);
        assert_eq!(
            request_body(&req, "m", 5, false).unwrap()["tool_choice"],
            json!("required")
        );
        req.tool_choice = Some(ToolChoice::None);
        assert_eq!(
            request_body(&req, "m", 5, false).unwrap()["tool_choice"],
            json!("none")
        );
    }

    #[test]
    fn multi_part_user_text_uses_input_text_parts() {
        let req = ChatRequest::new(
            "default",
            vec![Message {
                role: Role::User,
                content: vec![Part::text("a"), Part::text("b")],
            }],
        );
        let body = request_body(&req, "m", 5, false).unwrap();
        assert_eq!(
            body["input"],
            json!([{"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}
            ]}])
        );
        assert!(body.get("instructions").is_none() && body.get("tools").is_none());
    }

    #[test]
    fn stop_is_refused_and_store_cannot_be_overridden() {
        let mut req = weather_conversation();
        req.stop = vec!["\n\n".into()];
        let err = request_body(&req, "m", 5, false).unwrap_err();
        assert!(
            matches!(err, WireError::Unsupported { field: "stop", .. }),
            "{err:?}"
        );
        assert_eq!(err.to_provider_error().kind, ErrorKind::Unsupported);
        let mut req = weather_conversation();
        req.raw = Some(json!({"store": true}).as_object().unwrap().clone());
        assert!(matches!(
            request_body(&req, "m", 5, false),
            Err(WireError::RawCollision { .. })
        ));
    }

    #[test]
    fn parses_text_reply() {
        let r = parse_response(&fixture(API, "text.json")).unwrap();
        assert_eq!(r.api, "openai-responses");
        assert_eq!(
            r.id,
            "resp_67ccd3a9da748190baa7f1570fe91ac604becb25c45c1d41"
        );
        assert_eq!(r.model, "gpt-4o-2024-08-06");
        assert_eq!(
            r.text(),
            "The image depicts a scenic landscape with a wooden boardwalk."
        );
        assert_eq!(
            (r.stop, r.stop_raw.as_str()),
            (StopReason::Stop, "completed")
        );
        assert_eq!(
            r.usage,
            Usage {
                input: 328,
                output: 52,
                ..Usage::default()
            }
        );
    }

    #[test]
    fn parses_tool_call_reply_using_call_id() {
        let r = parse_response(&fixture(API, "tool_call.json")).unwrap();
        assert_eq!(
            r.content,
            vec![Part::tool_call(
                "call_unLAR8MvFNptuiZK6K6HCy5k",
                "get_current_weather",
                r#"{"location":"Boston, MA","unit":"celsius"}"#
            )]
        );
        assert_eq!(
            (r.stop, r.stop_raw.as_str()),
            (StopReason::ToolCalls, "completed")
        );
        assert_eq!((r.usage.input, r.usage.output), (291, 23));
    }

    #[test]
    fn incomplete_reply_is_length_with_cached_and_reasoning_usage() {
        let r = parse_response(&fixture(API, "incomplete.json")).unwrap();
        assert_eq!(
            (r.stop, r.stop_raw.as_str()),
            (StopReason::Length, "incomplete/max_output_tokens")
        );
        assert_eq!(r.content, vec![Part::text("The weather in Paris is")]);
        assert_eq!(
            r.usage,
            Usage {
                input: 7112,
                cached_input: 3072,
                cache_write: 1024,
                output: 256,
                reasoning: 192,
            }
        );
    }

    #[test]
    fn statuses_map_to_the_neutral_set() {
        let cases = [
            (
                json!("incomplete"),
                json!({"reason": "max_tokens"}),
                StopReason::Length,
                "incomplete/max_tokens",
            ),
            (
                json!("incomplete"),
                json!({"reason": "content_filter"}),
                StopReason::ContentFilter,
                "incomplete/content_filter",
            ),
            (
                json!("incomplete"),
                json!({"reason": "other"}),
                StopReason::Other,
                "incomplete/other",
            ),
            (
                json!("incomplete"),
                Value::Null,
                StopReason::Other,
                "incomplete",
            ),
            (
                json!("cancelled"),
                Value::Null,
                StopReason::Other,
                "cancelled",
            ),
        ];
        for (status, details, stop, raw) in cases {
            let body = json!({"id": "r", "model": "m", "status": status,
                "incomplete_details": details, "output": []});
            let r = parse_response(body.to_string().as_bytes()).unwrap();
            assert_eq!((r.stop, r.stop_raw.as_str()), (stop, raw));
        }
        let body = json!({"id": "r", "status": "in_progress", "output": []});
        assert!(matches!(
            parse_response(body.to_string().as_bytes()),
            Err(WireError::Malformed { .. })
        ));
    }

    #[test]
    fn refusal_parts_go_to_refusal() {
        let body = json!({"id": "r", "model": "m", "status": "completed", "output": [
            {"type": "message", "role": "assistant", "content": [
                {"type": "refusal", "refusal": "I can't help with that."}]}]});
        let r = parse_response(body.to_string().as_bytes()).unwrap();
        assert!(r.content.is_empty());
        assert_eq!(r.refusal.as_deref(), Some("I can't help with that."));
        assert_eq!(r.stop, StopReason::Stop);
    }

    #[test]
    fn failed_reply_is_a_classified_provider_error() {
        let err = parse_response(&fixture(API, "failed.json")).unwrap_err();
        let WireError::Provider(e) = &err else {
            panic!("{err:?}")
        };
        assert_eq!(e.kind, ErrorKind::Server);
        assert!(e.retryable);
        assert_eq!(e.provider_code.as_deref(), Some("server_error"));
    }

    #[test]
    fn text_stream_reports_deltas_and_takes_the_terminal_response() {
        let bytes = fixture(API, "text.sse");
        let text = String::from_utf8(bytes.clone()).unwrap();
        let mut d = StreamDecoder::new(API);
        let appended: Vec<String> = text
            .split_inclusive("\n\n")
            .map(|ev| d.push(ev.as_bytes()).unwrap().appended)
            .filter(|a| !a.is_empty())
            .collect();
        assert_eq!(appended, vec!["Hel", "lo."]);
        assert_eq!(d.terminal(), Some("response.completed"));
        let r = d.finish().unwrap();
        assert_eq!(r.id, "resp_1");
        assert_eq!(r.content, vec![Part::text("Hello.")]);
        assert_eq!(
            r.usage,
            Usage {
                input: 7112,
                cached_input: 3072,
                cache_write: 0,
                output: 463,
                reasoning: 64,
            }
        );
        assert_stream_assembles(API, &bytes, &r);
    }

    #[test]
    fn tool_call_stream_equals_the_unstreamed_reply_and_uses_the_final_call_id() {
        let bytes = fixture(API, "tool_call.sse");
        let streamed = parse_stream(API, &bytes).unwrap();
        let whole = parse_response(&fixture(API, "tool_call_unstreamed.json")).unwrap();
        assert_eq!(streamed, whole);
        // `.added` said call_Dg6W; the terminal response says call_X2PA.
        assert_eq!(
            streamed.tool_calls(),
            vec![("call_X2PA", "weather", r#"{"location":"Rome"}"#)]
        );
        assert_eq!(streamed.text(), "Checking Rome — one moment.");
        assert_eq!(streamed.stop, StopReason::ToolCalls);
        assert_stream_assembles(API, &bytes, &whole);
    }

    #[test]
    fn terminal_response_without_output_falls_back_to_done_items() {
        let body = concat!(
            "data: {\"type\":\"response.output_item.done\",\"output_index\":0,\"item\":{\"type\":\"function_call\",\"call_id\":\"call_1\",\"name\":\"t\",\"arguments\":\"{}\"}}\n\n",
            "data: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\",\"model\":\"m\",\"status\":\"completed\",\"output\":[]}}\n\n",
        );
        let r = parse_stream(API, body.as_bytes()).unwrap();
        assert_eq!(r.tool_calls(), vec![("call_1", "t", "{}")]);
        assert_eq!(r.stop, StopReason::ToolCalls);
    }

    #[test]
    fn incomplete_event_is_terminal_with_length() {
        let body = "event: response.incomplete\ndata: {\"type\":\"response.incomplete\",\"response\":{\"id\":\"r\",\"model\":\"m\",\"status\":\"incomplete\",\"incomplete_details\":{\"reason\":\"max_output_tokens\"},\"output\":[]}}\n\n";
        let r = parse_stream(API, body.as_bytes()).unwrap();
        assert_eq!(r.stop, StopReason::Length);
    }

    #[test]
    fn truncated_stream_is_cut() {
        let text = String::from_utf8(fixture(API, "tool_call.sse")).unwrap();
        let cut = &text[..text.find("event: response.completed").unwrap()];
        let err = parse_stream(API, cut.as_bytes()).unwrap_err();
        assert_eq!(
            err,
            WireError::Cut {
                api: API,
                expected: "response.completed or response.incomplete"
            }
        );
        assert!(err.retryable());
    }

    #[test]
    fn error_events_are_provider_errors_in_both_forms() {
        // The real wire form (nested), with insufficient_quota: final.
        let err = parse_stream(API, &fixture(API, "error.sse")).unwrap_err();
        let WireError::Provider(e) = &err else {
            panic!("{err:?}")
        };
        assert_eq!((e.kind, e.retryable), (ErrorKind::Quota, false));
        // The spec's flat form, server_error: retryable.
        let flat = "event: error\ndata: {\"type\":\"error\",\"code\":\"server_error\",\"message\":\"boom\",\"param\":null,\"sequence_number\":4}\n\n";
        let err = parse_stream(API, flat.as_bytes()).unwrap_err();
        assert!(err.retryable(), "{err:?}");
        // response.failed alone.
        let failed = "data: {\"type\":\"response.failed\",\"response\":{\"id\":\"r\",\"status\":\"failed\",\"error\":{\"code\":\"rate_limit_exceeded\",\"message\":\"slow down\"}}}\n\n";
        let err = parse_stream(API, failed.as_bytes()).unwrap_err();
        assert!(
            matches!(&err, WireError::Provider(e) if e.kind == ErrorKind::RateLimited && e.retryable),
            "{err:?}"
        );
    }
}
