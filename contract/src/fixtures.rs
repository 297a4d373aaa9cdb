//! Requests the tests of the contract and of the host share (feature
//! `fixtures`).

use serde_json::json;

use crate::chat::{ChatRequest, Message, Part, ToolDef};

/// A chat after one tool call: a system prompt, a `get_weather` tool, the
/// user's question, the assistant's call and its result.
pub fn weather_request() -> ChatRequest {
    ChatRequest {
        system: Some("You are terse.".into()),
        tools: vec![ToolDef {
            name: "get_weather".into(),
            description: Some("Current weather for a city".into()),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
        }],
        ..ChatRequest::new(
            "default",
            vec![
                Message::user("Weather in Paris?"),
                Message::assistant(vec![
                    Part::text("Checking."),
                    Part::tool_call("call_A", "get_weather", r#"{"city":"Paris"}"#),
                ]),
                Message::tool_result("call_A", "get_weather", r#"{"temp_c":18}"#, false),
            ],
        )
    }
}
