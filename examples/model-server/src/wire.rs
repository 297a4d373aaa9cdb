//! The three wire formats, written from the providers' documented shapes (see
//! docs/models.md, "Wire formats", and the providers' API references), independently of the host's own adapters: answers
//! (whole and as SSE events), error bodies and response headers.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::Api;
use crate::script::{Finish, Usage};

/// One tool call of an answer, ids and arguments resolved.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Call {
    pub id: String,
    pub name: String,
    /// The arguments text (OpenAI `arguments`, Anthropic `partial_json` pieces).
    pub arguments: String,
    /// The arguments as a value (Anthropic `input`).
    pub input: Value,
}

/// What the model answers, resolved for one request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Answer {
    pub text: Option<String>,
    pub calls: Vec<Call>,
    pub finish: Finish,
    pub usage: Usage,
}

/// Per-request values that go into an answer.
pub(crate) struct Ctx<'a> {
    /// The request number (1 for the first), used in response ids.
    pub n: u64,
    pub model: &'a str,
    /// Unix seconds.
    pub created: u64,
    /// The request body, for the fields a Responses object echoes.
    pub request: &'a Value,
}

pub(crate) fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

fn sse_data(v: &Value) -> String {
    format!("data: {v}\n\n")
}

fn sse_event(name: &str, v: &Value) -> String {
    format!("event: {name}\ndata: {v}\n\n")
}

/// Text deltas: the text split before each space ("Refunded", " $49.99", ...).
pub(crate) fn text_pieces(s: &str) -> Vec<&str> {
    let mut pieces = Vec::new();
    let mut start = 0;
    let mut previous = None;
    for (i, c) in s.char_indices() {
        if i > 0 && c == ' ' && previous != Some(' ') {
            pieces.push(&s[start..i]);
            start = i;
        }
        previous = Some(c);
    }
    if start < s.len() {
        pieces.push(&s[start..]);
    }
    pieces
}

/// Argument deltas: pieces of at most 12 bytes, cut on character boundaries.
pub(crate) fn argument_pieces(s: &str) -> Vec<&str> {
    let mut pieces = Vec::new();
    let mut start = 0;
    while start < s.len() {
        let mut end = (start + 12).min(s.len());
        while !s.is_char_boundary(end) {
            end += 1;
        }
        pieces.push(&s[start..end]);
        start = end;
    }
    pieces
}

// ---------------------------------------------------------------- openai-chat

fn chat_finish(f: Finish) -> &'static str {
    match f {
        Finish::Stop => "stop",
        Finish::Length => "length",
        Finish::ToolCalls => "tool_calls",
        Finish::ContentFilter => "content_filter",
    }
}

fn chat_usage(u: &Usage) -> Value {
    let mut prompt_details = json!({"cached_tokens": u.cached_input_tokens, "audio_tokens": 0});
    if u.cache_write_tokens > 0 {
        prompt_details["cache_write_tokens"] = u.cache_write_tokens.into();
    }
    json!({
        "prompt_tokens": u.input_tokens,
        "completion_tokens": u.output_tokens,
        "total_tokens": u.input_tokens + u.output_tokens,
        "prompt_tokens_details": prompt_details,
        "completion_tokens_details": {
            "reasoning_tokens": u.reasoning_tokens,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0
        }
    })
}

pub(crate) fn chat_body(a: &Answer, c: &Ctx) -> Value {
    let mut message = json!({
        "role": "assistant",
        "content": a.text,
        "refusal": null,
        "annotations": []
    });
    if !a.calls.is_empty() {
        message["tool_calls"] = a
            .calls
            .iter()
            .map(|call| {
                json!({
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments}
                })
            })
            .collect();
    }
    json!({
        "id": format!("chatcmpl-test-{}", c.n),
        "object": "chat.completion",
        "created": c.created,
        "model": c.model,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": chat_finish(a.finish)
        }],
        "usage": chat_usage(&a.usage),
        "service_tier": "default",
        "system_fingerprint": "fp_scripted"
    })
}

/// `data:` events only; with `include_usage`, every chunk has `"usage": null` and a
/// last chunk with `"choices": []` carries the usage; then `data: [DONE]`.
pub(crate) fn chat_events(a: &Answer, c: &Ctx, include_usage: bool) -> Vec<String> {
    let chunk = |delta: Value, finish: Option<&str>| {
        let mut v = json!({
            "id": format!("chatcmpl-test-{}", c.n),
            "object": "chat.completion.chunk",
            "created": c.created,
            "model": c.model,
            "service_tier": "default",
            "system_fingerprint": "fp_scripted",
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]
        });
        if include_usage {
            v["usage"] = Value::Null;
        }
        sse_data(&v)
    };
    let mut events = vec![chunk(
        json!({
            "role": "assistant",
            "content": if a.text.is_some() { json!("") } else { Value::Null },
            "refusal": null
        }),
        None,
    )];
    if let Some(text) = &a.text {
        for piece in text_pieces(text) {
            events.push(chunk(json!({"content": piece}), None));
        }
    }
    for (index, call) in a.calls.iter().enumerate() {
        events.push(chunk(
            json!({"tool_calls": [{
                "index": index,
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": ""}
            }]}),
            None,
        ));
        for piece in argument_pieces(&call.arguments) {
            events.push(chunk(
                json!({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}),
                None,
            ));
        }
    }
    events.push(chunk(json!({}), Some(chat_finish(a.finish))));
    if include_usage {
        events.push(sse_data(&json!({
            "id": format!("chatcmpl-test-{}", c.n),
            "object": "chat.completion.chunk",
            "created": c.created,
            "model": c.model,
            "service_tier": "default",
            "system_fingerprint": "fp_scripted",
            "choices": [],
            "usage": chat_usage(&a.usage)
        })));
    }
    events.push("data: [DONE]\n\n".into());
    events
}

/// An error inside a chat stream: a `data:` whose JSON has an `error` object.
pub(crate) fn chat_stream_error() -> Vec<String> {
    vec![sse_data(&json!({"error": {
        "message": "The server had an error while processing your request. Sorry about that!",
        "type": "server_error",
        "param": null,
        "code": null
    }}))]
}

// ----------------------------------------------------------- openai-responses

fn responses_usage(u: &Usage) -> Value {
    let mut input_details = json!({"cached_tokens": u.cached_input_tokens});
    if u.cache_write_tokens > 0 {
        input_details["cache_write_tokens"] = u.cache_write_tokens.into();
    }
    json!({
        "input_tokens": u.input_tokens,
        "input_tokens_details": input_details,
        "output_tokens": u.output_tokens,
        "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
        "total_tokens": u.input_tokens + u.output_tokens
    })
}

/// `completed`, or `incomplete` with its reason.
fn responses_status(f: Finish) -> (&'static str, Option<&'static str>) {
    match f {
        Finish::Stop | Finish::ToolCalls => ("completed", None),
        Finish::Length => ("incomplete", Some("max_output_tokens")),
        Finish::ContentFilter => ("incomplete", Some("content_filter")),
    }
}

fn message_item_id(c: &Ctx) -> String {
    format!("msg_test_{}", c.n)
}

fn function_item_id(c: &Ctx, i: usize) -> String {
    format!("fc_test_{}_{i}", c.n)
}

fn output_text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

fn message_item(a: &Answer, c: &Ctx, text: &str) -> Value {
    let status = match responses_status(a.finish).0 {
        "completed" => "completed",
        _ => "incomplete",
    };
    json!({
        "id": message_item_id(c),
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [output_text_part(text)]
    })
}

fn function_item(c: &Ctx, i: usize, call: &Call, arguments: &str, status: &str) -> Value {
    json!({
        "id": function_item_id(c, i),
        "type": "function_call",
        "status": status,
        "arguments": arguments,
        "call_id": call.id,
        "name": call.name
    })
}

fn responses_output(a: &Answer, c: &Ctx) -> Vec<Value> {
    let mut output = Vec::new();
    if let Some(text) = &a.text {
        output.push(message_item(a, c, text));
    }
    for (i, call) in a.calls.iter().enumerate() {
        output.push(function_item(c, i, call, &call.arguments, "completed"));
    }
    output
}

/// A `Response` object. `status` is `in_progress`, `completed`, `incomplete` or `failed`.
fn response_object(
    c: &Ctx,
    status: &str,
    reason: Option<&str>,
    output: Vec<Value>,
    usage: Value,
) -> Value {
    let r = c.request;
    let echo = |name: &str, default: Value| r.get(name).cloned().unwrap_or(default);
    json!({
        "id": format!("resp_test_{}", c.n),
        "object": "response",
        "created_at": c.created,
        "status": status,
        "background": false,
        "completed_at": if status == "completed" { json!(c.created) } else { Value::Null },
        "error": null,
        "incomplete_details": reason.map(|reason| json!({"reason": reason})),
        "instructions": echo("instructions", Value::Null),
        "max_output_tokens": echo("max_output_tokens", Value::Null),
        "model": c.model,
        "output": output,
        "parallel_tool_calls": echo("parallel_tool_calls", json!(true)),
        "previous_response_id": null,
        "reasoning": {"effort": null, "summary": null},
        "service_tier": "default",
        "store": echo("store", json!(true)),
        "temperature": echo("temperature", json!(1.0)),
        "text": {"format": {"type": "text"}},
        "tool_choice": echo("tool_choice", json!("auto")),
        "tools": echo("tools", json!([])),
        "top_p": echo("top_p", json!(1.0)),
        "truncation": "disabled",
        "usage": usage,
        "user": null,
        "metadata": echo("metadata", json!({}))
    })
}

pub(crate) fn responses_body(a: &Answer, c: &Ctx) -> Value {
    let (status, reason) = responses_status(a.finish);
    response_object(
        c,
        status,
        reason,
        responses_output(a, c),
        responses_usage(&a.usage),
    )
}

/// `event:` + `data:` events, each with `sequence_number`, ending with
/// `response.completed` (or `response.incomplete`).
pub(crate) fn responses_events(a: &Answer, c: &Ctx) -> Vec<String> {
    let mut events = Vec::new();
    let mut push = |mut v: Value| {
        v["sequence_number"] = events.len().into();
        let name = v["type"].as_str().unwrap_or_default().to_string();
        events.push(sse_event(&name, &v));
    };
    let started = response_object(c, "in_progress", None, Vec::new(), Value::Null);
    push(json!({"type": "response.created", "response": started}));
    push(json!({"type": "response.in_progress", "response": started}));
    let mut output_index = 0;
    if let Some(text) = &a.text {
        let item_id = message_item_id(c);
        push(json!({
            "type": "response.output_item.added",
            "output_index": output_index,
            "item": {"id": item_id, "type": "message", "status": "in_progress", "role": "assistant", "content": []}
        }));
        push(json!({
            "type": "response.content_part.added",
            "item_id": item_id, "output_index": output_index, "content_index": 0,
            "part": output_text_part("")
        }));
        for piece in text_pieces(text) {
            push(json!({
                "type": "response.output_text.delta",
                "item_id": item_id, "output_index": output_index, "content_index": 0,
                "delta": piece, "logprobs": []
            }));
        }
        push(json!({
            "type": "response.output_text.done",
            "item_id": item_id, "output_index": output_index, "content_index": 0,
            "text": text, "logprobs": []
        }));
        push(json!({
            "type": "response.content_part.done",
            "item_id": item_id, "output_index": output_index, "content_index": 0,
            "part": output_text_part(text)
        }));
        push(json!({
            "type": "response.output_item.done",
            "output_index": output_index,
            "item": message_item(a, c, text)
        }));
        output_index += 1;
    }
    for (i, call) in a.calls.iter().enumerate() {
        let item_id = function_item_id(c, i);
        push(json!({
            "type": "response.output_item.added",
            "output_index": output_index,
            "item": function_item(c, i, call, "", "in_progress")
        }));
        for piece in argument_pieces(&call.arguments) {
            push(json!({
                "type": "response.function_call_arguments.delta",
                "item_id": item_id, "output_index": output_index, "delta": piece
            }));
        }
        push(json!({
            "type": "response.function_call_arguments.done",
            "item_id": item_id, "output_index": output_index,
            "name": call.name, "arguments": call.arguments
        }));
        push(json!({
            "type": "response.output_item.done",
            "output_index": output_index,
            "item": function_item(c, i, call, &call.arguments, "completed")
        }));
        output_index += 1;
    }
    let (status, _) = responses_status(a.finish);
    let terminal = if status == "completed" {
        "response.completed"
    } else {
        "response.incomplete"
    };
    push(json!({"type": terminal, "response": responses_body(a, c)}));
    events
}

/// An error inside a Responses stream (the nested wire form), then
/// `response.failed`; `seq` is the next sequence number.
pub(crate) fn responses_stream_error(c: &Ctx, seq: usize) -> Vec<String> {
    let message = "The server had an error while processing your request. Sorry about that!";
    let error = json!({
        "type": "error",
        "sequence_number": seq,
        "error": {"type": "server_error", "code": "server_error", "message": message, "param": null}
    });
    let mut failed = response_object(c, "failed", None, Vec::new(), Value::Null);
    failed["error"] = json!({"code": "server_error", "message": message});
    let failed = json!({"type": "response.failed", "sequence_number": seq + 1, "response": failed});
    vec![
        sse_event("error", &error),
        sse_event("response.failed", &failed),
    ]
}

// --------------------------------------------------------- anthropic-messages

fn anthropic_stop(f: Finish) -> &'static str {
    match f {
        Finish::Stop => "end_turn",
        Finish::Length => "max_tokens",
        Finish::ToolCalls => "tool_use",
        Finish::ContentFilter => "refusal",
    }
}

/// Anthropic's `input_tokens` leaves out the cached reads and cache writes.
fn anthropic_usage(u: &Usage, output_tokens: u64) -> Value {
    json!({
        "input_tokens": u.input_tokens.saturating_sub(u.cached_input_tokens + u.cache_write_tokens),
        "cache_creation_input_tokens": u.cache_write_tokens,
        "cache_read_input_tokens": u.cached_input_tokens,
        "cache_creation": {"ephemeral_5m_input_tokens": u.cache_write_tokens, "ephemeral_1h_input_tokens": 0},
        "output_tokens": output_tokens,
        "service_tier": "standard"
    })
}

fn anthropic_message(c: &Ctx, content: Vec<Value>, stop: Option<&str>, usage: Value) -> Value {
    json!({
        "model": c.model,
        "id": format!("msg_test_{}", c.n),
        "type": "message",
        "role": "assistant",
        "content": content,
        "stop_reason": stop,
        "stop_sequence": null,
        "usage": usage,
    })
}

pub(crate) fn anthropic_body(a: &Answer, c: &Ctx) -> Value {
    let mut content = Vec::new();
    if let Some(text) = &a.text {
        content.push(json!({"type": "text", "text": text}));
    }
    for call in &a.calls {
        content.push(
            json!({"type": "tool_use", "id": call.id, "name": call.name, "input": call.input}),
        );
    }
    anthropic_message(
        c,
        content,
        Some(anthropic_stop(a.finish)),
        anthropic_usage(&a.usage, a.usage.output_tokens),
    )
}

/// `event:` + `data:` events: `message_start`, blocks (a `ping` after the first
/// block starts), `message_delta` with the cumulative usage, `message_stop`.
pub(crate) fn anthropic_events(a: &Answer, c: &Ctx) -> Vec<String> {
    let mut events = Vec::new();
    let mut push = |v: Value| {
        let name = v["type"].as_str().unwrap_or_default().to_string();
        events.push(sse_event(&name, &v));
    };
    push(json!({
        "type": "message_start",
        "message": anthropic_message(c, Vec::new(), None, anthropic_usage(&a.usage, 1))
    }));
    let mut index = 0;
    if let Some(text) = &a.text {
        push(
            json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}),
        );
        push(json!({"type": "ping"}));
        for piece in text_pieces(text) {
            push(json!({
                "type": "content_block_delta", "index": index,
                "delta": {"type": "text_delta", "text": piece}
            }));
        }
        push(json!({"type": "content_block_stop", "index": index}));
        index += 1;
    }
    for call in &a.calls {
        push(json!({
            "type": "content_block_start", "index": index,
            "content_block": {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
        }));
        if index == 0 {
            push(json!({"type": "ping"}));
        }
        push(json!({
            "type": "content_block_delta", "index": index,
            "delta": {"type": "input_json_delta", "partial_json": ""}
        }));
        for piece in argument_pieces(&call.arguments) {
            push(json!({
                "type": "content_block_delta", "index": index,
                "delta": {"type": "input_json_delta", "partial_json": piece}
            }));
        }
        push(json!({"type": "content_block_stop", "index": index}));
        index += 1;
    }
    push(json!({
        "type": "message_delta",
        "delta": {"stop_reason": anthropic_stop(a.finish), "stop_sequence": null},
        "usage": anthropic_usage(&a.usage, a.usage.output_tokens)
    }));
    push(json!({"type": "message_stop"}));
    events
}

/// `event: error` inside an Anthropic stream.
pub(crate) fn anthropic_stream_error(request_id: &str) -> Vec<String> {
    vec![sse_event(
        "error",
        &json!({
            "type": "error",
            "error": {"type": "overloaded_error", "message": "Overloaded"},
            "request_id": request_id
        }),
    )]
}

// --------------------------------------------------------------------- errors

/// OpenAI's error body.
pub(crate) fn openai_error(
    message: &str,
    kind: &str,
    param: Option<&str>,
    code: Option<&str>,
) -> Value {
    json!({"error": {"message": message, "type": kind, "param": param, "code": code}})
}

/// Anthropic's error body.
pub(crate) fn anthropic_error(kind: &str, message: &str, request_id: &str) -> Value {
    json!({"type": "error", "error": {"type": kind, "message": message}, "request_id": request_id})
}

/// Overrides of a scripted error body.
#[derive(Default)]
pub(crate) struct ErrorOverride<'a> {
    pub error_type: Option<&'a str>,
    pub code: Option<&'a str>,
    pub message: Option<&'a str>,
}

/// The provider's error body for `status`, as real servers word it.
pub(crate) fn status_error(
    api: Api,
    status: u16,
    model: &str,
    request_id: &str,
    o: &ErrorOverride,
) -> Value {
    match api {
        Api::AnthropicMessages => {
            let (kind, message) = match status {
                400 => ("invalid_request_error", "Invalid request".to_string()),
                401 => ("authentication_error", "invalid x-api-key".into()),
                402 => (
                    "billing_error",
                    "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits.".into(),
                ),
                403 => (
                    "permission_error",
                    "Your API key does not have permission to use the specified resource.".into(),
                ),
                404 => ("not_found_error", format!("model: {model}")),
                413 => (
                    "request_too_large",
                    "Request exceeds the maximum allowed number of bytes.".into(),
                ),
                429 => (
                    "rate_limit_error",
                    "This request would exceed the rate limit for your organization of 50,000 input tokens per minute. Please reduce the prompt length or the maximum tokens requested, or try again later.".into(),
                ),
                504 => ("timeout_error", "Request timed out".into()),
                529 => ("overloaded_error", "Overloaded".into()),
                s if s >= 500 => ("api_error", "Internal server error".into()),
                _ => ("invalid_request_error", "Invalid request".into()),
            };
            anthropic_error(
                o.error_type.unwrap_or(kind),
                o.message.unwrap_or(&message),
                request_id,
            )
        }
        Api::OpenAiChat | Api::OpenAiResponses => {
            let (kind, code, message) = match (status, o.error_type) {
                (_, Some("insufficient_quota")) => (
                    "insufficient_quota",
                    Some("insufficient_quota"),
                    "You exceeded your current quota, please check your plan and billing details. For more information on this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors.".to_string(),
                ),
                (401, _) => (
                    "invalid_request_error",
                    Some("invalid_api_key"),
                    "Incorrect API key provided. You can find your API key at https://platform.openai.com/account/api-keys.".into(),
                ),
                (403, _) => (
                    "request_forbidden",
                    Some("unsupported_country_region_territory"),
                    "Country, region, or territory not supported".into(),
                ),
                (404, _) => (
                    "invalid_request_error",
                    Some("model_not_found"),
                    format!("The model `{model}` does not exist or you do not have access to it."),
                ),
                (429, _) => (
                    "tokens",
                    Some("rate_limit_exceeded"),
                    format!(
                        "Rate limit reached for {model} in organization org-test on tokens per min (TPM): Limit 30000, Used 29000, Requested 2000. Please try again in 2s. Visit https://platform.openai.com/account/rate-limits to learn more."
                    ),
                ),
                (503, _) => (
                    "server_error",
                    None,
                    "The server is overloaded or not ready yet.".into(),
                ),
                (s, _) if s >= 500 => (
                    "server_error",
                    None,
                    "The server had an error while processing your request. Sorry about that!".into(),
                ),
                _ => ("invalid_request_error", None, "Invalid request.".into()),
            };
            openai_error(
                o.message.unwrap_or(&message),
                o.error_type.unwrap_or(kind),
                None,
                o.code.or(code),
            )
        }
    }
}

// -------------------------------------------------------------------- headers

/// Request id and rate-limit headers, as each provider sends them on every
/// response. `exhausted` (a 429) reports nothing remaining.
pub(crate) fn provider_headers(
    api: Api,
    request_id: &str,
    exhausted: bool,
    reset_in: Duration,
) -> Vec<(String, String)> {
    let h = |n: &str, v: String| (n.to_string(), v);
    match api {
        Api::OpenAiChat | Api::OpenAiResponses => vec![
            h("x-request-id", request_id.into()),
            h("openai-organization", "org-test".into()),
            h("openai-processing-ms", "1".into()),
            h("openai-version", "2020-10-01".into()),
            h("x-ratelimit-limit-requests", "500".into()),
            h("x-ratelimit-limit-tokens", "30000".into()),
            h(
                "x-ratelimit-remaining-requests",
                if exhausted { "0" } else { "499" }.into(),
            ),
            h(
                "x-ratelimit-remaining-tokens",
                if exhausted { "0" } else { "29000" }.into(),
            ),
            h(
                "x-ratelimit-reset-requests",
                go_duration(reset_in.max(Duration::from_millis(120))),
            ),
            h(
                "x-ratelimit-reset-tokens",
                go_duration(reset_in.max(Duration::from_secs(2))),
            ),
        ],
        Api::AnthropicMessages => {
            let reset = rfc3339(unix_now() + reset_in.max(Duration::from_secs(1)));
            let mut headers = vec![
                h("request-id", request_id.into()),
                h(
                    "anthropic-organization-id",
                    "00000000-0000-4000-8000-000000000000".into(),
                ),
            ];
            for (kind, limit) in [
                ("requests", 50u64),
                ("tokens", 90000),
                ("input-tokens", 50000),
                ("output-tokens", 40000),
            ] {
                let remaining = if exhausted { 0 } else { limit - limit / 50 };
                headers.push(h(
                    &format!("anthropic-ratelimit-{kind}-limit"),
                    limit.to_string(),
                ));
                headers.push(h(
                    &format!("anthropic-ratelimit-{kind}-remaining"),
                    remaining.to_string(),
                ));
                headers.push(h(
                    &format!("anthropic-ratelimit-{kind}-reset"),
                    reset.clone(),
                ));
            }
            headers
        }
    }
}

/// A duration as OpenAI's reset headers spell it: `120ms`, `2s`, `1.5s`, `1m30s`.
fn go_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (m, s) = (ms / 60_000, ms % 60_000);
    let mut secs = format!("{}.{:03}", s / 1000, s % 1000);
    while secs.ends_with('0') {
        secs.pop();
    }
    let secs = format!("{}s", secs.trim_end_matches('.'));
    if m == 0 { secs } else { format!("{m}m{secs}") }
}

/// `2026-08-21T10:00:00Z` for a time since the Unix epoch.
pub(crate) fn rfc3339(since_epoch: Duration) -> String {
    let secs = since_epoch.as_secs();
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces() {
        assert_eq!(text_pieces("Hi there  you"), vec!["Hi", " there", "  you"]);
        assert!(text_pieces("").is_empty());
        let s = "{\"a\":\"é—é—é—é—\"}";
        let p = argument_pieces(s);
        assert_eq!(p.concat(), s);
        assert!(p.iter().all(|x| x.len() <= 14));
    }

    #[test]
    fn times() {
        assert_eq!(rfc3339(Duration::from_secs(0)), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339(Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00Z"
        );
        assert_eq!(
            rfc3339(Duration::from_secs(1_771_000_000)),
            "2026-02-13T16:26:40Z"
        );
        assert_eq!(go_duration(Duration::from_millis(120)), "120ms");
        assert_eq!(go_duration(Duration::from_secs(2)), "2s");
        assert_eq!(go_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(go_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(go_duration(Duration::from_secs(120)), "2m0s");
    }
}
