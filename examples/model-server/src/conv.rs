//! Reading a request body: which turn of the script it asks for, what the variables
//! are, and the checks a real provider makes (a bad request gets the provider's
//! `400`, so a host that builds bodies wrongly is caught).
//!
//! **Turn rule.** The turn is 1 + the number of *assistant turns* already in the
//! conversation. An assistant turn is a maximal run of consecutive assistant-side
//! entries:
//! - chat: `messages[]` with role `assistant`;
//! - responses: `input[]` items that are `function_call`, `reasoning` or a `message`
//!   with role `assistant` (a string `input` has none);
//! - anthropic: `messages[]` with role `assistant`.
//!
//! So the same conversation always gets the same answer, however often it is sent.

use std::collections::HashSet;

use serde_json::Value;

use crate::Api;

/// What the server needs from one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Conversation {
    pub model: String,
    pub stream: bool,
    /// chat: `stream_options.include_usage`.
    pub include_usage: bool,
    pub assistant_turns: usize,
    /// The text of the first user message that has text.
    pub first_user_text: String,
    /// The text of every tool result, in order.
    pub tool_results: Vec<String>,
}

/// A request the provider would refuse with `400`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Invalid {
    pub message: String,
    /// OpenAI's `param`.
    pub param: Option<String>,
}

fn invalid(message: impl Into<String>, param: impl Into<String>) -> Invalid {
    Invalid {
        message: message.into(),
        param: Some(param.into()),
    }
}

/// Plain text of a content value: a string, or the `text` of each part / block.
pub(crate) fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

pub(crate) fn read(api: Api, body: &Value) -> Result<Conversation, Invalid> {
    if !body.is_object() {
        return Err(Invalid {
            message: "the request body must be a JSON object".into(),
            param: None,
        });
    }
    let model = match body.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        _ => {
            return Err(match api {
                Api::AnthropicMessages => invalid("model: Field required", "model"),
                _ => invalid("you must provide a model parameter", "model"),
            });
        }
    };
    let stream = match body.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(invalid("'stream' must be a boolean", "stream")),
    };
    let mut conv = Conversation {
        model,
        stream,
        include_usage: false,
        assistant_turns: 0,
        first_user_text: String::new(),
        tool_results: Vec::new(),
    };
    match api {
        Api::OpenAiChat => read_chat(body, &mut conv)?,
        Api::OpenAiResponses => read_responses(body, &mut conv)?,
        Api::AnthropicMessages => read_anthropic(body, &mut conv)?,
    }
    Ok(conv)
}

fn set_first_user_text(conv: &mut Conversation, content: &Value) {
    if conv.first_user_text.is_empty() {
        conv.first_user_text = text_of(content);
    }
}

fn read_chat(body: &Value, conv: &mut Conversation) -> Result<(), Invalid> {
    if let Some(options) = body.get("stream_options").filter(|o| !o.is_null()) {
        if !conv.stream {
            return Err(invalid(
                "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                "stream_options",
            ));
        }
        conv.include_usage = options.get("include_usage") == Some(&Value::Bool(true));
    }
    let Some(messages) = body.get("messages").and_then(Value::as_array) else {
        return Err(invalid(
            "Missing required parameter: 'messages'.",
            "messages",
        ));
    };
    if messages.is_empty() {
        return Err(invalid(
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.",
            "messages",
        ));
    }
    // tool_call ids of the last assistant message not yet answered by a tool message.
    let mut pending: Vec<String> = Vec::new();
    let mut tool_may_follow = false;
    let mut previous_assistant = false;
    for (i, m) in messages.iter().enumerate() {
        let Some(role) = m.get("role").and_then(Value::as_str) else {
            return Err(invalid(
                format!("Missing required parameter: 'messages[{i}].role'."),
                format!("messages[{i}].role"),
            ));
        };
        if role != "tool" && !pending.is_empty() {
            return Err(invalid(
                format!(
                    "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: {}",
                    pending.join(", ")
                ),
                format!("messages.[{i}].role"),
            ));
        }
        match role {
            "assistant" => {
                if !previous_assistant {
                    conv.assistant_turns += 1;
                }
                pending = m
                    .get("tool_calls")
                    .and_then(Value::as_array)
                    .map(|calls| {
                        calls
                            .iter()
                            .filter_map(|c| c.get("id").and_then(Value::as_str))
                            .map(str::to_string)
                            .collect()
                    })
                    .unwrap_or_default();
                tool_may_follow = !pending.is_empty();
            }
            "tool" => {
                if !tool_may_follow {
                    return Err(invalid(
                        "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'.",
                        format!("messages.[{i}].role"),
                    ));
                }
                let id = m.get("tool_call_id").and_then(Value::as_str).unwrap_or("");
                let Some(at) = pending.iter().position(|p| p == id) else {
                    return Err(invalid(
                        format!(
                            "Invalid parameter: 'tool_call_id' of '{id}' not found in 'tool_calls' of previous message."
                        ),
                        format!("messages.[{i}].tool_call_id"),
                    ));
                };
                pending.remove(at);
                conv.tool_results
                    .push(text_of(m.get("content").unwrap_or(&Value::Null)));
            }
            "user" => {
                tool_may_follow = false;
                set_first_user_text(conv, m.get("content").unwrap_or(&Value::Null));
            }
            "system" | "developer" | "function" => tool_may_follow = false,
            other => {
                return Err(invalid(
                    format!(
                        "Invalid value: '{other}'. Supported values are: 'system', 'assistant', 'user', 'function', 'tool', and 'developer'."
                    ),
                    format!("messages[{i}].role"),
                ));
            }
        }
        previous_assistant = role == "assistant";
    }
    if !pending.is_empty() {
        return Err(invalid(
            format!(
                "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: {}",
                pending.join(", ")
            ),
            "messages",
        ));
    }
    Ok(())
}

fn read_responses(body: &Value, conv: &mut Conversation) -> Result<(), Invalid> {
    let items = match body.get("input") {
        Some(Value::String(s)) => {
            conv.first_user_text = s.clone();
            return Ok(());
        }
        Some(Value::Array(items)) => items,
        _ => {
            return Err(invalid("Missing required parameter: 'input'.", "input"));
        }
    };
    let not_stored = body.get("store") == Some(&Value::Bool(false));
    let mut calls: Vec<String> = Vec::new();
    let mut answered: HashSet<String> = HashSet::new();
    let mut previous_assistant = false;
    for (i, item) in items.iter().enumerate() {
        if not_stored && let Some(id) = item.get("id").and_then(Value::as_str) {
            return Err(invalid(
                format!(
                    "Item with id '{id}' not found. Items are not persisted when `store` is set to false. Try again with `store` set to true, or remove this item from your input."
                ),
                "input",
            ));
        }
        let role = item.get("role").and_then(Value::as_str);
        let kind = item
            .get("type")
            .and_then(Value::as_str)
            .or(role.map(|_| "message"))
            .unwrap_or("");
        let assistant_side = matches!(kind, "function_call" | "reasoning")
            || (kind == "message" && role == Some("assistant"));
        if assistant_side && !previous_assistant {
            conv.assistant_turns += 1;
        }
        previous_assistant = assistant_side;
        match kind {
            "function_call" => {
                let Some(call_id) = item.get("call_id").and_then(Value::as_str) else {
                    return Err(invalid(
                        format!("Missing required parameter: 'input[{i}].call_id'."),
                        format!("input[{i}].call_id"),
                    ));
                };
                calls.push(call_id.to_string());
            }
            "function_call_output" => {
                let call_id = item.get("call_id").and_then(Value::as_str).unwrap_or("");
                if !calls.iter().any(|c| c == call_id) {
                    return Err(invalid(
                        format!(
                            "No tool call found for function call output with call_id {call_id}."
                        ),
                        "input",
                    ));
                }
                answered.insert(call_id.to_string());
                conv.tool_results
                    .push(text_of(item.get("output").unwrap_or(&Value::Null)));
            }
            "message" if role == Some("user") => {
                set_first_user_text(conv, item.get("content").unwrap_or(&Value::Null));
            }
            _ => {}
        }
    }
    if let Some(unanswered) = calls.iter().find(|c| !answered.contains(*c)) {
        return Err(invalid(
            format!("No tool output found for function call {unanswered}."),
            "input",
        ));
    }
    Ok(())
}

fn read_anthropic(body: &Value, conv: &mut Conversation) -> Result<(), Invalid> {
    if !body.get("max_tokens").is_some_and(Value::is_u64) {
        return Err(invalid("max_tokens: Field required", "max_tokens"));
    }
    let Some(messages) = body.get("messages").and_then(Value::as_array) else {
        return Err(invalid("messages: Field required", "messages"));
    };
    // tool_use ids of the previous assistant message.
    let mut expected: Vec<String> = Vec::new();
    let mut previous_assistant = false;
    for (i, m) in messages.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        let blocks: &[Value] = m
            .get("content")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        let is_result = |b: &Value| b.get("type").and_then(Value::as_str) == Some("tool_result");
        match role {
            "assistant" => {
                if !expected.is_empty() {
                    return Err(missing_results(i, &expected));
                }
                if !previous_assistant {
                    conv.assistant_turns += 1;
                }
                expected = blocks
                    .iter()
                    .filter(|b| b.get("type").and_then(Value::as_str) == Some("tool_use"))
                    .filter_map(|b| b.get("id").and_then(Value::as_str))
                    .map(str::to_string)
                    .collect();
            }
            "user" => {
                let leading = blocks.iter().take_while(|b| is_result(b)).count();
                if let Some(j) = blocks.iter().skip(leading).position(is_result) {
                    return Err(invalid(
                        format!(
                            "messages.{i}.content.{}: `tool_result` blocks must come first in the content, before any other block.",
                            leading + j
                        ),
                        format!("messages.{i}.content"),
                    ));
                }
                let mut found = HashSet::new();
                for (j, block) in blocks[..leading].iter().enumerate() {
                    let id = block
                        .get("tool_use_id")
                        .and_then(Value::as_str)
                        .unwrap_or("");
                    if !expected.iter().any(|e| e == id) {
                        return Err(invalid(
                            format!(
                                "messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` blocks: {id}. Each `tool_result` block must have a corresponding `tool_use` block in the previous message."
                            ),
                            format!("messages.{i}.content.{j}"),
                        ));
                    }
                    found.insert(id);
                    conv.tool_results
                        .push(text_of(block.get("content").unwrap_or(&Value::Null)));
                }
                let missing: Vec<String> = expected
                    .iter()
                    .filter(|e| !found.contains(e.as_str()))
                    .cloned()
                    .collect();
                if !missing.is_empty() {
                    return Err(missing_results(i, &missing));
                }
                expected.clear();
                if leading < blocks.len() || m.get("content").is_some_and(Value::is_string) {
                    set_first_user_text(conv, m.get("content").unwrap_or(&Value::Null));
                }
            }
            _ => {
                return Err(invalid(
                    format!("messages.{i}.role: Input should be 'user' or 'assistant'"),
                    format!("messages.{i}.role"),
                ));
            }
        }
        previous_assistant = role == "assistant";
    }
    Ok(())
}

fn missing_results(i: usize, ids: &[String]) -> Invalid {
    invalid(
        format!(
            "messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately after: {}. Each `tool_use` block must have a corresponding `tool_result` block in the next message.",
            ids.join(", ")
        ),
        format!("messages.{i}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn turns(api: Api, body: Value) -> usize {
        read(api, &body).unwrap().assistant_turns
    }

    #[test]
    fn chat_turns_and_tool_pairing() {
        let body = json!({"model": "m", "messages": [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "refund order B-7"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                {"id": "c2", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "{\"amount_cents\":5}"},
            {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "ok"}]},
            {"role": "assistant", "content": "thinking"},
            {"role": "assistant", "content": "more"},
            {"role": "user", "content": "and?"}
        ]});
        let conv = read(Api::OpenAiChat, &body).unwrap();
        assert_eq!(conv.assistant_turns, 2);
        assert_eq!(conv.first_user_text, "refund order B-7");
        assert_eq!(conv.tool_results, vec!["{\"amount_cents\":5}", "ok"]);

        let missing = json!({"model": "m", "messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "tool_calls": [{"id": "c1"}, {"id": "c2"}]},
            {"role": "tool", "tool_call_id": "c1", "content": "r"},
            {"role": "user", "content": "y"}]});
        let err = read(Api::OpenAiChat, &missing).unwrap_err();
        assert!(err.message.contains("c2"), "{err:?}");
        let stray = json!({"model": "m", "messages": [
            {"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "c1", "content": "r"}]});
        assert!(read(Api::OpenAiChat, &stray).is_err());
        let opts = json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
            "stream_options": {"include_usage": true}});
        assert!(read(Api::OpenAiChat, &opts).is_err());
    }

    #[test]
    fn responses_turns_and_checks() {
        assert_eq!(
            turns(Api::OpenAiResponses, json!({"model": "m", "input": "hi"})),
            0
        );
        let body = json!({"model": "m", "store": false, "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "order C-3"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "checking"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "r1"},
            {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c2", "output": "r2"}
        ]});
        let conv = read(Api::OpenAiResponses, &body).unwrap();
        assert_eq!(conv.assistant_turns, 2);
        assert_eq!(conv.first_user_text, "order C-3");
        assert_eq!(conv.tool_results, vec!["r1", "r2"]);

        let with_id = json!({"model": "m", "store": false, "input": [
            {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "r1"}]});
        assert!(
            read(Api::OpenAiResponses, &with_id)
                .unwrap_err()
                .message
                .contains("fc_1")
        );
        let orphan = json!({"model": "m", "input": [
            {"type": "function_call_output", "call_id": "c9", "output": "r"}]});
        assert!(read(Api::OpenAiResponses, &orphan).is_err());
        let unanswered = json!({"model": "m", "input": [
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}]});
        assert!(read(Api::OpenAiResponses, &unanswered).is_err());
    }

    #[test]
    fn anthropic_turns_and_checks() {
        let body = json!({"model": "m", "max_tokens": 10, "messages": [
            {"role": "user", "content": "order D-4 for $3"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "ok"},
                {"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "r1"},
                {"type": "text", "text": "go on"}]}
        ]});
        let conv = read(Api::AnthropicMessages, &body).unwrap();
        assert_eq!(conv.assistant_turns, 1);
        assert_eq!(conv.first_user_text, "order D-4 for $3");
        assert_eq!(conv.tool_results, vec!["r1"]);

        let mut no_max = body.clone();
        no_max.as_object_mut().unwrap().remove("max_tokens");
        assert!(read(Api::AnthropicMessages, &no_max).is_err());
        let text_first = json!({"model": "m", "max_tokens": 10, "messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
            {"role": "user", "content": [
                {"type": "text", "text": "here"},
                {"type": "tool_result", "tool_use_id": "t1", "content": "r1"}]}]});
        assert!(read(Api::AnthropicMessages, &text_first).is_err());
        let missing = json!({"model": "m", "max_tokens": 10, "messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
            {"role": "user", "content": "no result"}]});
        assert!(
            read(Api::AnthropicMessages, &missing)
                .unwrap_err()
                .message
                .contains("t1")
        );
        let system_role = json!({"model": "m", "max_tokens": 10, "messages": [
            {"role": "system", "content": "x"}]});
        assert!(read(Api::AnthropicMessages, &system_role).is_err());
    }
}
