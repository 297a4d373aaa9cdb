//! The crate as the host uses it, through the root re-exports only: build the bytes to send,
//! decode a streamed 200 read in arbitrary chunks, classify failed attempts (the scripted model
//! server's replies, docs/models.md "The scripted model server"), and price the usage.

use serde_json::{Value, json};
use std::time::Duration;
use stephost_models::{
    Api, ChatRequest, ErrorKind, Prices, StopReason, StreamDecoder, ToolChoice, Usage, WireError,
    classify, cost, parse_response, parse_stream, rate_limits, request_bytes,
};

fn fixture(api: Api, name: &str) -> Vec<u8> {
    let path = format!(
        "{}/tests/fixtures/{}/{name}",
        env!("CARGO_MANIFEST_DIR"),
        api.as_str()
    );
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn request() -> ChatRequest {
    ChatRequest {
        tool_choice: Some(ToolChoice::Auto),
        ..stephost_contract::fixtures::weather_request()
    }
}

#[test]
fn the_recorded_request_is_canonical_and_hash_stable() {
    let req = request();
    let json = req.canonical_json();
    let back: ChatRequest = serde_json::from_str(&json).unwrap();
    assert_eq!(back.canonical_json(), json);
    assert_eq!(back.canonical_json(), req.canonical_json());
    // Key order in `parameters` does not change what is recorded (and
    // hashed): maps are sorted.
    let mut reordered = req.clone();
    reordered.tools[0].parameters = serde_json::from_str(
        r#"{"required": ["city"], "properties": {"city": {"type": "string"}}, "type": "object"}"#,
    )
    .unwrap();
    assert_eq!(reordered.canonical_json(), req.canonical_json());
}

#[test]
fn wire_bodies_carry_the_checks_the_scripted_server_makes() {
    let req = request();
    let body = |api| -> Value {
        serde_json::from_slice(&request_bytes(api, &req, "model-x", 4096, true).unwrap()).unwrap()
    };
    let chat = body(Api::OpenAiChat);
    assert_eq!(chat["stream_options"]["include_usage"], true);
    let responses = body(Api::OpenAiResponses);
    assert_eq!(responses["store"], false);
    assert_eq!(responses["tools"][0]["strict"], false);
    assert!(
        responses["input"]
            .as_array()
            .unwrap()
            .iter()
            .all(|item| item.get("id").is_none())
    );
    let anthropic = body(Api::AnthropicMessages);
    assert_eq!(anthropic["max_tokens"], 4096);
    assert_eq!(
        anthropic["messages"][2]["content"][0]["type"],
        "tool_result"
    );
}

#[test]
fn streams_split_anywhere_assemble_like_the_whole_body() {
    let cases = [
        (
            Api::OpenAiChat,
            "tool_calls.sse",
            "tool_calls_unstreamed.json",
        ),
        (
            Api::OpenAiResponses,
            "tool_call.sse",
            "tool_call_unstreamed.json",
        ),
        (
            Api::AnthropicMessages,
            "tool_use.sse",
            "tool_use_unstreamed.json",
        ),
    ];
    for (api, sse, json) in cases {
        let bytes = fixture(api, sse);
        let want = parse_response(api, &fixture(api, json)).unwrap();
        for size in [1, 2, 3, 7, 64, 1000] {
            let mut d = StreamDecoder::new(api);
            let mut text = String::new();
            for chunk in bytes.chunks(size) {
                text.push_str(&d.push(chunk).unwrap().appended);
            }
            assert!(d.is_done(), "{api} chunks of {size}");
            assert_eq!(text, want.text(), "{api} chunks of {size}");
            assert_eq!(d.finish().unwrap(), want, "{api} chunks of {size}");
        }
        assert_eq!(want.stop, StopReason::ToolCalls, "{api}");
    }
}

#[test]
fn a_cut_stream_or_an_in_stream_overload_is_a_retryable_attempt() {
    for (api, sse, terminal) in [
        (Api::OpenAiChat, "text.sse", "data: [DONE]"),
        (
            Api::OpenAiResponses,
            "text.sse",
            "event: response.completed",
        ),
        (Api::AnthropicMessages, "text.sse", "event: message_stop"),
    ] {
        let text = String::from_utf8(fixture(api, sse)).unwrap();
        let cut = &text[..text.find(terminal).unwrap()];
        let err = parse_stream(api, cut.as_bytes()).unwrap_err();
        assert!(matches!(err, WireError::Cut { .. }), "{api}: {err:?}");
        let recorded = err.to_provider_error();
        assert_eq!(
            (recorded.kind, recorded.retryable),
            (ErrorKind::Transport, true)
        );
    }
    let err = parse_stream(
        Api::AnthropicMessages,
        &fixture(Api::AnthropicMessages, "overloaded.sse"),
    )
    .unwrap_err();
    let e = err.to_provider_error();
    assert_eq!((e.kind, e.retryable), (ErrorKind::Overloaded, true));
}

/// The status table of the brief: retryable 408, 409, 429, 5xx, 529; final 400, 401, 403, 404,
/// 413, quota and spend limits (even on 429).
#[test]
fn http_errors_are_classified_retryable_or_final() {
    use ErrorKind::*;
    let openai_rate = r#"{"error":{"message":"Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000, Used 29000, Requested 2000. Please try again in 2s.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}"#;
    let openai_quota = r#"{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;
    let overloaded = r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_test"}"#;
    let rows: [(Api, u16, &str, ErrorKind, bool); 16] = [
        (
            Api::OpenAiChat,
            400,
            r#"{"error":{"message":"bad","type":"invalid_request_error","param":null,"code":null}}"#,
            InvalidRequest,
            false,
        ),
        (
            Api::AnthropicMessages,
            400,
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"bad"}}"#,
            InvalidRequest,
            false,
        ),
        (
            Api::OpenAiChat,
            401,
            r#"{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#,
            Auth,
            false,
        ),
        (
            Api::AnthropicMessages,
            401,
            r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#,
            Auth,
            false,
        ),
        (
            Api::AnthropicMessages,
            403,
            r#"{"type":"error","error":{"type":"permission_error","message":"no"}}"#,
            Permission,
            false,
        ),
        (
            Api::OpenAiResponses,
            404,
            r#"{"error":{"message":"The model `x` does not exist","type":"invalid_request_error","param":null,"code":"model_not_found"}}"#,
            NotFound,
            false,
        ),
        (Api::OpenAiChat, 408, "", Timeout, true),
        (Api::AnthropicMessages, 409, "", Server, true),
        (
            Api::AnthropicMessages,
            413,
            "<html>413 Request Entity Too Large</html>",
            TooLarge,
            false,
        ),
        (Api::OpenAiChat, 429, openai_rate, RateLimited, true),
        (Api::OpenAiResponses, 429, openai_quota, Quota, false),
        (
            Api::OpenAiChat,
            429,
            r#"{"error":{"message":"Billing hard limit has been reached","type":"invalid_request_error","param":null,"code":"billing_hard_limit_reached"}}"#,
            Quota,
            false,
        ),
        (
            Api::AnthropicMessages,
            500,
            r#"{"type":"error","error":{"type":"api_error","message":"Internal server error"}}"#,
            Server,
            true,
        ),
        (
            Api::OpenAiChat,
            502,
            "<html>Bad gateway</html>",
            Server,
            true,
        ),
        (Api::OpenAiChat, 503, "", Overloaded, true),
        (Api::AnthropicMessages, 529, overloaded, Overloaded, true),
    ];
    for (api, status, body, kind, retryable) in rows {
        let e = classify(api, status, &[], body.as_bytes());
        assert_eq!(
            (e.kind, e.retryable),
            (kind, retryable),
            "{api} {status} {body}"
        );
        assert_eq!(e.status, Some(status));
    }
    // x-should-retry: false on a 500 is final.
    let e = classify(
        Api::OpenAiChat,
        500,
        &h(&[("x-should-retry", "false")]),
        b"",
    );
    assert!(!e.retryable);
}

#[test]
fn retry_after_ms_beats_retry_after_seconds_and_request_ids_are_kept() {
    let rate = br#"{"error":{"message":"Rate limit reached","type":"tokens","param":null,"code":"rate_limit_exceeded"}}"#;
    let e = classify(
        Api::OpenAiChat,
        429,
        &h(&[("retry-after", "1"), ("x-request-id", "req_test_1")]),
        rate,
    );
    assert_eq!(e.retry_after, Some(Duration::from_secs(1)));
    assert_eq!(e.request_id.as_deref(), Some("req_test_1"));
    let e = classify(
        Api::OpenAiChat,
        429,
        &h(&[("retry-after-ms", "50"), ("retry-after", "1")]),
        rate,
    );
    assert_eq!(e.retry_after, Some(Duration::from_millis(50)));
    let e = classify(
        Api::AnthropicMessages,
        529,
        &h(&[("request-id", "req_test_2"), ("retry-after", "2")]),
        br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
    );
    assert_eq!(e.request_id.as_deref(), Some("req_test_2"));
    assert_eq!(e.retry_after, Some(Duration::from_secs(2)));
    assert_eq!(
        serde_json::to_value(&e).unwrap(),
        json!({"kind": "overloaded", "retryable": true, "status": 529, "provider_type": "overloaded_error",
               "retry_after_ms": 2000, "request_id": "req_test_2", "message": "Overloaded"})
    );
}

#[test]
fn rate_limit_headers_of_both_providers() {
    let rl = rate_limits(
        Api::OpenAiChat,
        &h(&[
            ("x-ratelimit-limit-requests", "500"),
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "1.2s"),
        ]),
    );
    assert_eq!(rl.limit_requests, Some(500));
    assert_eq!(rl.remaining_requests, Some(0));
    assert_eq!(rl.reset_requests, Some(Duration::from_millis(1200)));
    let rl = rate_limits(
        Api::AnthropicMessages,
        &h(&[
            ("anthropic-ratelimit-requests-limit", "50"),
            ("anthropic-ratelimit-tokens-remaining", "47000"),
        ]),
    );
    assert_eq!(
        (rl.limit_requests, rl.remaining_tokens),
        (Some(50), Some(47000))
    );
}

#[test]
fn the_same_answer_costs_the_same_from_every_provider() {
    // 2 000 prompt tokens of which 1 500 cached, 100 output tokens: OpenAI counts the cached
    // tokens inside its prompt count, Anthropic apart from it. Neutral usage is equal.
    let openai = parse_response(
        Api::OpenAiChat,
        br#"{"id":"c","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"x"},"finish_reason":"stop"}],
            "usage":{"prompt_tokens":2000,"completion_tokens":100,"total_tokens":2100,"prompt_tokens_details":{"cached_tokens":1500}}}"#,
    )
    .unwrap();
    let anthropic = parse_response(
        Api::AnthropicMessages,
        br#"{"id":"m","model":"m","content":[{"type":"text","text":"x"}],"stop_reason":"end_turn",
            "usage":{"input_tokens":500,"cache_read_input_tokens":1500,"cache_creation_input_tokens":0,"output_tokens":100}}"#,
    )
    .unwrap();
    let want = Usage {
        input: 2000,
        cached_input: 1500,
        cache_write: 0,
        output: 100,
        reasoning: 0,
    };
    assert_eq!(openai.usage, want);
    assert_eq!(anthropic.usage, want);
    let prices = Prices {
        input_per_mtok: 3.0,
        cached_input_per_mtok: 0.3,
        cache_write_per_mtok: 3.75,
        output_per_mtok: 15.0,
    };
    let c = cost(&want, &prices);
    // 500 × 3 + 1 500 × 0.3 + 100 × 15 micro-dollars.
    assert_eq!(c.micro_usd, 1_500 + 450 + 1_500);
}
