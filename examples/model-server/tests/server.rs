//! The `model-server` binary over real sockets, driven by ureq 3.

mod common;

use std::time::{Duration, Instant};

use common::{
    CHAT, Conversation, MESSAGES, RESPONSES, Server, chat_stream, read_answer, responses_stream,
};
use serde_json::{Value, json};

const APIS: [&str; 3] = [CHAT, RESPONSES, MESSAGES];
const SUMMARY: &str =
    "Refunded $25.99 for order B-2002 — the customer will see it in 5–10 business days.";

/// The tool results the refund agent's tools would return.
fn lookup_result() -> Value {
    json!({"order_id": "B-2002", "amount_cents": 2599, "status": "delivered"})
}

fn refund_result() -> Value {
    json!({"refund_id": "R-1", "status": "refunded"})
}

/// Runs the default refund story over one API: lookup_order, refund, summary.
fn refund_story(server: &Server, path: &'static str, stream: bool) {
    let mut conv = Conversation::new(
        path,
        "Please refund order B-2002, the customer was charged twice.",
    );

    let first = read_answer(path, &server.post(path, &conv.body(stream)), stream);
    assert_eq!(first.calls.len(), 1, "{first:?}");
    assert_eq!(first.calls[0].1, "lookup_order");
    assert_eq!(first.args(0), json!({"order_id": "B-2002"}));
    conv.push(&first, &[lookup_result()]);

    let second = read_answer(path, &server.post(path, &conv.body(stream)), stream);
    assert_eq!(second.calls[0].1, "refund");
    assert_eq!(
        second.args(0),
        json!({"order_id": "B-2002", "amount_cents": 2599}),
        "the amount comes from the lookup result"
    );
    assert_ne!(
        first.calls[0].0, second.calls[0].0,
        "call ids differ per turn"
    );
    conv.push(&second, &[refund_result()]);

    let third = read_answer(path, &server.post(path, &conv.body(stream)), stream);
    assert_eq!(third.text.as_deref(), Some(SUMMARY));
    assert!(third.calls.is_empty());

    let finishes: Vec<&str> = [&first, &second, &third]
        .iter()
        .map(|g| g.finish.as_str())
        .collect();
    let expected = match path {
        CHAT => ["tool_calls", "tool_calls", "stop"],
        RESPONSES => ["completed", "completed", "completed"],
        _ => ["tool_use", "tool_use", "end_turn"],
    };
    assert_eq!(finishes, expected);

    // The scripted usage of turn 2 (486 in, 384 of them cached, 27 out), in each spelling.
    let u = &second.usage;
    match path {
        CHAT => {
            assert_eq!(u["prompt_tokens"], 486);
            assert_eq!(u["prompt_tokens_details"]["cached_tokens"], 384);
            assert_eq!(u["completion_tokens"], 27);
            assert_eq!(u["total_tokens"], 513);
        }
        RESPONSES => {
            assert_eq!(u["input_tokens"], 486);
            assert_eq!(u["input_tokens_details"]["cached_tokens"], 384);
            assert_eq!(u["output_tokens"], 27);
            assert_eq!(u["output_tokens_details"]["reasoning_tokens"], 0);
        }
        _ => {
            assert_eq!(
                u["input_tokens"], 102,
                "anthropic input_tokens exclude cache reads"
            );
            assert_eq!(u["cache_read_input_tokens"], 384);
            assert_eq!(u["cache_creation_input_tokens"], 0);
            assert_eq!(u["output_tokens"], 27);
        }
    }
}

#[test]
fn refund_story_over_each_api_whole_and_streamed() {
    let server = Server::start(&[]);
    for path in APIS {
        refund_story(&server, path, false);
        refund_story(&server, path, true);
    }
    let report = server.report();
    for path in APIS {
        assert_eq!(report["counts"][path], 6, "{}", report["counts"]);
    }
}

#[test]
fn streams_split_across_writes_still_assemble() {
    // 3-byte writes split events and the UTF-8 of "—" and "–"; a large size puts
    // every event in one write.
    for size in ["3", "100000"] {
        let server = Server::start(&["--sse-write-bytes", size]);
        for path in APIS {
            refund_story(&server, path, true);
        }
    }
}

#[test]
fn request_ids_and_rate_limit_headers() {
    let server = Server::start(&[]);
    for path in APIS {
        for stream in [false, true] {
            let r = server.post(path, &Conversation::new(path, "order A-1").body(stream));
            assert_eq!(r.status, 200, "{}", r.body);
            if path == MESSAGES {
                assert!(r.header("request-id").unwrap().starts_with("req_"));
                for h in [
                    "anthropic-ratelimit-requests-limit",
                    "anthropic-ratelimit-requests-remaining",
                    "anthropic-ratelimit-tokens-remaining",
                ] {
                    assert!(r.header(h).unwrap().parse::<u64>().is_ok(), "{h}");
                }
                let reset = r.header("anthropic-ratelimit-requests-reset").unwrap();
                assert!(
                    reset.len() == 20 && reset.ends_with('Z'),
                    "RFC 3339: {reset}"
                );
            } else {
                assert!(r.header("x-request-id").unwrap().starts_with("req_"));
                for h in ["x-ratelimit-limit-requests", "x-ratelimit-remaining-tokens"] {
                    assert!(r.header(h).unwrap().parse::<u64>().is_ok(), "{h}");
                }
                assert!(r.header("x-ratelimit-reset-requests").is_some());
            }
        }
    }
}

#[test]
fn chat_usage_chunk_only_with_include_usage() {
    let server = Server::start(&[]);
    let mut body = Conversation::new(CHAT, "order A-1").body(true);
    body.as_object_mut().unwrap().remove("stream_options");
    let r = server.post(CHAT, &body);
    assert_eq!(r.status, 200);
    let got = chat_stream(&r.events(), false);
    assert!(got.usage.is_null());
    assert_eq!(got.finish, "tool_calls");
}

#[test]
fn same_conversation_gets_the_same_answer() {
    let server = Server::start(&[]);
    for path in APIS {
        let mut conv = Conversation::new(path, "refund order C-3 please");
        let first = read_answer(path, &server.post(path, &conv.body(false)), false);
        conv.push(&first, &[json!({"amount_cents": 100})]);
        // A resumed agent resends the same conversation: same turn, same answer.
        let a = read_answer(path, &server.post(path, &conv.body(false)), false);
        let b = read_answer(path, &server.post(path, &conv.body(true)), true);
        assert_eq!(a.calls, b.calls);
        assert_eq!(a.args(0), json!({"order_id": "C-3", "amount_cents": 100}));
    }
    let turns: Vec<u64> = server.report()["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["turn"].as_u64().unwrap())
        .collect();
    assert_eq!(turns, [1, 2, 2].repeat(3));
}

#[test]
fn a_conversation_past_the_script_is_refused() {
    let script = json!({"turns": [{"text": "only turn"}]});
    let server = Server::with_script(&script, &[]);
    let mut conv = Conversation::new(CHAT, "hi");
    let got = read_answer(CHAT, &server.post(CHAT, &conv.body(false)), false);
    assert_eq!(got.text.as_deref(), Some("only turn"));
    assert_eq!(got.finish, "stop");
    conv.push(&got, &[]);
    conv.items.push(json!({"role": "user", "content": "and?"}));
    let r = server.post(CHAT, &conv.body(false));
    assert_eq!(r.status, 400);
    let message = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(message.contains("no scripted turn 2"), "{message}");
}

fn faulty_script() -> Value {
    json!({"turns": [{
        "text": "Hello — après the faults.",
        "usage": {"input_tokens": 10, "output_tokens": 5},
        "faults": [
            {"kind": "status", "status": 429, "retry_after": 1, "times": 2},
            {"kind": "status", "status": 429, "retry_after_ms": 50}
        ]
    }]})
}

#[test]
fn rate_limits_are_served_the_scripted_number_of_times_then_success() {
    let server = Server::with_script(&faulty_script(), &[]);
    for path in APIS {
        let body = Conversation::new(path, "hi").body(false);
        for attempt in 0..3 {
            let r = server.post(path, &body);
            assert_eq!(r.status, 429, "{path} attempt {attempt}");
            if attempt < 2 {
                assert_eq!(r.header("retry-after"), Some("1"));
                assert_eq!(r.header("retry-after-ms"), None);
            } else {
                assert_eq!(r.header("retry-after-ms"), Some("50"));
                assert_eq!(r.header("retry-after"), None);
            }
            let e = r.json();
            if path == MESSAGES {
                assert_eq!(e["type"], "error");
                assert_eq!(e["error"]["type"], "rate_limit_error");
                assert_eq!(e["request_id"], r.header("request-id").unwrap());
                assert_eq!(
                    r.header("anthropic-ratelimit-requests-remaining"),
                    Some("0")
                );
            } else {
                assert_eq!(e["error"]["code"], "rate_limit_exceeded");
                assert_eq!(e["error"]["type"], "tokens");
                assert!(e["error"]["param"].is_null());
                assert!(
                    e["error"]["message"]
                        .as_str()
                        .unwrap()
                        .starts_with("Rate limit reached")
                );
                assert_eq!(r.header("x-ratelimit-remaining-requests"), Some("0"));
            }
        }
        // Faults are counted per API and turn: this API's fourth try succeeds.
        let got = read_answer(path, &server.post(path, &body), false);
        assert_eq!(got.text.as_deref(), Some("Hello — après the faults."));
        let streamed = Conversation::new(path, "hi").body(true);
        let again = read_answer(path, &server.post(path, &streamed), true);
        assert_eq!(again.text, got.text);
    }
    let report = server.report();
    let statuses: Vec<u64> = report["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, [429, 429, 429, 200, 200].repeat(3));
    assert_eq!(report["requests"][0]["fault"]["kind"], "status");
    assert_eq!(report["requests"][0]["fault"]["retry_after"], 1);
    assert!(report["requests"][3]["fault"].is_null());

    // POST /reset forgets the requests and the faults served.
    let reset: Value = serde_json::from_str(
        &common::agent()
            .post(format!("{}/reset", server.url))
            .send("")
            .unwrap()
            .body_mut()
            .read_to_string()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(reset["reset"], true);
    assert_eq!(server.report()["requests_total"], 0);
    assert_eq!(
        server
            .post(CHAT, &Conversation::new(CHAT, "hi").body(false))
            .status,
        429
    );
}

#[test]
fn overloaded_server_errors_and_quota() {
    let script = json!({"turns": [{"text": "ok", "faults": [
        {"kind": "status", "status": 529, "retry_after": 2},
        {"kind": "status", "status": 500, "should_retry": false},
        {"kind": "status", "status": 503},
        {"kind": "status", "status": 429, "error_type": "insufficient_quota"}
    ]}]});
    let server = Server::with_script(&script, &[]);

    let body = Conversation::new(MESSAGES, "hi").body(false);
    let r = server.post(MESSAGES, &body);
    assert_eq!(r.status, 529);
    assert_eq!(r.header("retry-after"), Some("2"));
    assert_eq!(
        r.json()["error"],
        json!({"type": "overloaded_error", "message": "Overloaded"})
    );
    let r = server.post(MESSAGES, &body);
    assert_eq!(r.status, 500);
    assert_eq!(r.header("x-should-retry"), Some("false"));
    assert_eq!(r.json()["error"]["type"], "api_error");
    assert_eq!(server.post(MESSAGES, &body).status, 503);
    let r = server.post(MESSAGES, &body);
    assert_eq!(
        (r.status, r.json()["error"]["type"].clone()),
        (429, json!("insufficient_quota"))
    );
    assert_eq!(server.post(MESSAGES, &body).status, 200);

    let body = Conversation::new(CHAT, "hi").body(false);
    assert_eq!(server.post(CHAT, &body).status, 529);
    let r = server.post(CHAT, &body);
    assert_eq!(r.status, 500);
    assert_eq!(r.json()["error"]["type"], "server_error");
    assert_eq!(server.post(CHAT, &body).status, 503);
    let r = server.post(CHAT, &body);
    assert_eq!(r.status, 429);
    assert_eq!(r.json()["error"]["code"], "insufficient_quota");
    assert_eq!(r.json()["error"]["type"], "insufficient_quota");
}

#[test]
fn cut_streams_and_in_stream_errors() {
    let script = json!({"turns": [{
        "text": "A long enough answer to cut somewhere in the middle of it.",
        "faults": [
            {"kind": "cut", "after_events": 3},
            {"kind": "cut", "clean": true},
            {"kind": "stream_error", "after_events": 4},
            {"kind": "drop"}
        ]
    }]});
    let server = Server::with_script(&script, &[]);
    for path in APIS {
        let body = Conversation::new(path, "hi").body(true);

        // Cut: three events, then the connection closes without the last chunk.
        let r = server.post(path, &body);
        assert_eq!(r.status, 200);
        assert!(r.read_error.is_some(), "{path}: the body read fails");
        assert_eq!(r.events().len(), 3, "{path}: {}", r.body);

        // Clean cut: the HTTP body ends properly, the SSE stream lacks its end.
        let r = server.post(path, &body);
        assert!(r.read_error.is_none(), "{:?}", r.read_error);
        let events = r.events();
        let last = events.last().unwrap();
        match path {
            CHAT => assert!(events.iter().all(|e| e.data != "[DONE]")),
            RESPONSES => assert!(!last.data.contains("response.completed")),
            _ => assert!(
                events
                    .iter()
                    .all(|e| e.name.as_deref() != Some("message_stop"))
            ),
        }

        // In-stream error after four events.
        let r = server.post(path, &body);
        assert!(r.read_error.is_none());
        let events = r.events();
        match path {
            CHAT => {
                assert_eq!(events.len(), 5);
                assert_eq!(events[4].json()["error"]["type"], "server_error");
            }
            RESPONSES => {
                assert_eq!(events.len(), 6);
                assert_eq!(events[4].name.as_deref(), Some("error"));
                assert_eq!(events[4].json()["sequence_number"], 4);
                assert_eq!(events[4].json()["error"]["code"], "server_error");
                let failed = events[5].json();
                assert_eq!(failed["type"], "response.failed");
                assert_eq!(failed["sequence_number"], 5);
                assert_eq!(failed["response"]["status"], "failed");
            }
            _ => {
                assert_eq!(events.len(), 5);
                assert_eq!(events[4].name.as_deref(), Some("error"));
                assert_eq!(
                    events[4].json()["error"],
                    json!({"type": "overloaded_error", "message": "Overloaded"})
                );
            }
        }

        // Drop: no response at all.
        let resp = common::agent()
            .post(format!("{}{path}", server.url))
            .header("anthropic-version", "2023-06-01")
            .send(body.to_string());
        assert!(resp.is_err(), "{path}: dropped without a response");

        // Then the full stream.
        let got = read_answer(path, &server.post(path, &body), true);
        assert!(got.text.unwrap().starts_with("A long enough answer"));
    }
}

#[test]
fn a_cut_whole_body_fails_to_read_and_stream_error_becomes_a_status() {
    let script = json!({"turns": [{"text": "whole", "faults": [
        {"kind": "cut"}, {"kind": "stream_error"}
    ]}]});
    let server = Server::with_script(&script, &[]);
    for path in APIS {
        let body = Conversation::new(path, "hi").body(false);
        let r = server.post(path, &body);
        assert_eq!(r.status, 200);
        assert!(
            r.read_error.is_some(),
            "{path}: body shorter than Content-Length"
        );
        let r = server.post(path, &body);
        assert_eq!(r.status, if path == MESSAGES { 529 } else { 500 });
        assert_eq!(
            read_answer(path, &server.post(path, &body), false)
                .text
                .as_deref(),
            Some("whole")
        );
    }
}

#[test]
fn finish_length_in_each_spelling() {
    let script = json!({"turns": [{"text": "cut short", "finish": "length"}]});
    let server = Server::with_script(&script, &[]);
    let expect = |path: &str| match path {
        CHAT => "length",
        RESPONSES => "incomplete/max_output_tokens",
        _ => "max_tokens",
    };
    for path in APIS {
        for stream in [false, true] {
            let got = read_answer(
                path,
                &server.post(path, &Conversation::new(path, "x").body(stream)),
                stream,
            );
            assert_eq!(got.finish, expect(path), "{path} stream={stream}");
        }
    }
    let r = server.post(RESPONSES, &Conversation::new(RESPONSES, "x").body(true));
    let events = r.events();
    assert_eq!(
        events.last().unwrap().name.as_deref(),
        Some("response.incomplete")
    );
    responses_stream(&events);
}

#[test]
fn auth_is_checked_when_a_key_is_set() {
    let server = Server::start(&["--key", "sk-secret-123"]);
    let chat = Conversation::new(CHAT, "hi").body(false);
    let messages = Conversation::new(MESSAGES, "hi").body(false);

    let r = server.post_with(CHAT, &chat, &[]);
    assert_eq!(r.status, 401);
    let e = r.json();
    assert_eq!(e["error"]["type"], "invalid_request_error");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("didn't provide an API key")
    );
    let r = server.post_with(CHAT, &chat, &[("authorization", "Bearer sk-wrong")]);
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    assert!(r.header("x-request-id").is_some());
    let r = server.post_with(
        RESPONSES,
        &Conversation::new(RESPONSES, "hi").body(false),
        &[("authorization", "sk-secret-123")],
    );
    assert_eq!(r.status, 401, "the Bearer scheme is required");
    assert_eq!(server.post(CHAT, &chat).status, 200);
    assert_eq!(
        server
            .post(RESPONSES, &Conversation::new(RESPONSES, "hi").body(false))
            .status,
        200
    );

    let r = server.post_with(MESSAGES, &messages, &[("anthropic-version", "2023-06-01")]);
    assert_eq!(r.status, 401);
    let e = r.json();
    assert_eq!(e["type"], "error");
    assert_eq!(e["error"]["type"], "authentication_error");
    assert_eq!(e["request_id"], r.header("request-id").unwrap());
    let r = server.post_with(
        MESSAGES,
        &messages,
        &[
            ("x-api-key", "sk-wrong"),
            ("anthropic-version", "2023-06-01"),
        ],
    );
    assert_eq!(r.status, 401);
    let r = server.post_with(
        MESSAGES,
        &messages,
        &[
            ("authorization", "Bearer sk-secret-123"),
            ("anthropic-version", "2023-06-01"),
        ],
    );
    assert_eq!(r.status, 401, "anthropic wants x-api-key");
    let r = server.post_with(MESSAGES, &messages, &[("x-api-key", "sk-secret-123")]);
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    assert!(r.body.contains("anthropic-version"));
    assert_eq!(server.post(MESSAGES, &messages).status, 200);

    let report = server.report();
    let auth: Vec<&str> = report["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["auth"].as_str().unwrap())
        .collect();
    assert_eq!(
        auth,
        [
            "missing", "wrong", "missing", "ok", "ok", "missing", "wrong", "missing", "ok", "ok"
        ]
    );
    // Failed auth uses up no turn and no fault; the key never shows in the report.
    assert!(report["requests"][0]["turn"].is_null());
    let text = report.to_string();
    assert!(!text.contains("sk-secret-123"), "the key is redacted");
    assert!(text.contains("[redacted]"));
    assert_eq!(
        report["requests"][9]["headers"]["anthropic-version"],
        "2023-06-01"
    );
}

#[test]
fn without_a_key_any_or_no_key_is_accepted() {
    let server = Server::start(&[]);
    let r = server.post_with(CHAT, &Conversation::new(CHAT, "hi").body(false), &[]);
    assert_eq!(r.status, 200);
    let r = server.post_with(
        MESSAGES,
        &Conversation::new(MESSAGES, "hi").body(false),
        &[("anthropic-version", "2023-06-01")],
    );
    assert_eq!(r.status, 200);
    assert_eq!(server.report()["requests"][0]["auth"], "unchecked");
}

#[test]
fn bad_requests_get_the_providers_400() {
    let server = Server::start(&[]);
    // Anthropic requires max_tokens.
    let mut body = Conversation::new(MESSAGES, "hi").body(false);
    body.as_object_mut().unwrap().remove("max_tokens");
    let r = server.post(MESSAGES, &body);
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    assert!(r.body.contains("max_tokens"));

    // Anthropic: tool_result blocks must come first.
    let body = json!({"model": "m", "max_tokens": 5, "messages": [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "text", "text": "here"},
            {"type": "tool_result", "tool_use_id": "t1", "content": "r"}]}]});
    assert_eq!(server.post(MESSAGES, &body).status, 400);

    // Chat: every tool call needs a tool message.
    let body = json!({"model": "m", "messages": [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "user", "content": "y"}]});
    let r = server.post(CHAT, &body);
    assert_eq!(r.status, 400);
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("call_1")
    );

    // Responses with store:false: no server item ids in the input.
    let body = json!({"model": "m", "store": false, "input": [
        {"type": "message", "role": "user", "content": "x"},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "r"}]});
    let r = server.post(RESPONSES, &body);
    assert_eq!(r.status, 400);
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("store")
    );

    // Not JSON; no model; an unknown path; a GET.
    let r = common::reply(
        common::agent()
            .post(format!("{}{CHAT}", server.url))
            .send("{not json"),
    );
    assert_eq!(r.status, 400);
    assert_eq!(
        server
            .post(
                CHAT,
                &json!({"messages": [{"role": "user", "content": "x"}]})
            )
            .status,
        400
    );
    assert_eq!(server.post("/v1/embeddings", &json!({})).status, 404);
    let r = common::reply(common::agent().get(format!("{}{CHAT}", server.url)).call());
    assert_eq!(r.status, 405);

    let report = server.report();
    assert_eq!(report["counts"][CHAT], 4);
    assert!(
        report["requests"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["turn"].is_null())
    );
}

#[test]
fn report_counts_and_max_in_flight() {
    let server = Server::start(&["--hold-ms", "500"]);
    // One at a time: never more than one in flight.
    for path in [CHAT, MESSAGES] {
        let r = server.post(path, &Conversation::new(path, "order A-1").body(false));
        assert_eq!(r.status, 200);
    }
    let report = server.report();
    assert_eq!(report["max_in_flight"], 1);
    assert_eq!(report["in_flight"], 0);
    let first = &report["requests"][0];
    let held = first["finished_ms"].as_u64().unwrap() - first["arrived_ms"].as_u64().unwrap();
    assert!(held >= 500, "held {held} ms");
    assert_eq!(first["body"]["messages"][1]["content"], "order A-1");
    assert_eq!(first["request_id"], "req_test_1");
    assert_eq!(first["api"], "openai-chat");
    assert_eq!(first["stream"], false);

    // Three at once: they overlap.
    let start = Instant::now();
    std::thread::scope(|s| {
        for path in APIS {
            let server = &server;
            s.spawn(move || {
                let r = server.post(path, &Conversation::new(path, "order A-1").body(true));
                assert_eq!(r.status, 200);
            });
        }
    });
    assert!(
        start.elapsed() < Duration::from_millis(1400),
        "served concurrently"
    );
    let report = server.report();
    assert_eq!(report["max_in_flight"], 3);
    assert_eq!(report["requests_total"], 5);
    assert_eq!(
        report["counts"],
        json!({CHAT: 2, RESPONSES: 1, MESSAGES: 2})
    );
    let overlapping = report["requests"].as_array().unwrap()[2..]
        .iter()
        .filter(|r| r["in_flight_at_arrival"].as_u64().unwrap() > 1)
        .count();
    assert!(overlapping >= 1);
}

#[test]
fn print_script_and_bad_scripts() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_model-server"))
        .arg("--print-script")
        .output()
        .unwrap();
    assert!(out.status.success());
    let script: Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = script["turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["tool_calls"][0]["name"].as_str().unwrap_or("text"))
        .collect();
    assert_eq!(names, ["lookup_order", "refund", "text"]);
    assert_eq!(Server::start(&[]).get("/script"), script, "GET /script");

    let path = std::env::temp_dir().join(format!("model-server-bad-{}.json", std::process::id()));
    std::fs::write(&path, r#"{"turns": [{"txt": "typo"}]}"#).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_model-server"))
        .args(["--script", path.to_str().unwrap()])
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("txt"));
}

#[test]
fn a_scripted_turn_with_text_and_two_tool_calls() {
    let script = json!({"turns": [{
        "text": "Checking both.",
        "tool_calls": [
            {"name": "get_weather", "arguments": {"city": "Paris"}},
            {"id": "my_id", "name": "get_weather", "arguments": "{\"city\": \"Ro"}
        ],
        "usage": {"input_tokens": 100, "cached_input_tokens": 40, "cache_write_tokens": 10, "output_tokens": 20, "reasoning_tokens": 5}
    }]});
    let server = Server::with_script(&script, &[]);
    for path in APIS {
        for stream in [false, true] {
            let r = server.post(path, &Conversation::new(path, "weather?").body(stream));
            if path == MESSAGES {
                // Invalid JSON arguments cannot be an Anthropic `input` object whole;
                // streamed, they arrive verbatim as partial_json.
                if stream {
                    let events = r.events();
                    let partial: String = events
                        .iter()
                        .map(|e| e.json())
                        .filter(|v| v["delta"]["type"] == "input_json_delta" && v["index"] == 2)
                        .map(|v| v["delta"]["partial_json"].as_str().unwrap().to_string())
                        .collect();
                    assert_eq!(partial, "{\"city\": \"Ro");
                    let usage = events[0].json()["message"]["usage"].clone();
                    assert_eq!(usage["input_tokens"], 50);
                    assert_eq!(usage["cache_read_input_tokens"], 40);
                    assert_eq!(usage["cache_creation_input_tokens"], 10);
                } else {
                    let v = r.json();
                    assert_eq!(v["content"][1]["input"], json!({"city": "Paris"}));
                    assert_eq!(v["content"][2]["id"], "my_id");
                    assert_eq!(v["stop_reason"], "tool_use");
                }
                continue;
            }
            let got = read_answer(path, &r, stream);
            assert_eq!(got.text.as_deref(), Some("Checking both."));
            assert_eq!(got.calls.len(), 2);
            assert_eq!(got.calls[0].0, "call_t1_0");
            assert_eq!(got.calls[1].0, "my_id");
            assert_eq!(got.calls[1].2, "{\"city\": \"Ro", "sent verbatim");
            if path == CHAT {
                assert_eq!(
                    got.usage["completion_tokens_details"]["reasoning_tokens"],
                    5
                );
                assert_eq!(got.usage["prompt_tokens_details"]["cache_write_tokens"], 10);
            } else {
                assert_eq!(got.usage["output_tokens_details"]["reasoning_tokens"], 5);
                assert_eq!(got.usage["input_tokens_details"]["cache_write_tokens"], 10);
            }
        }
    }
}

/// Sends one request on a raw socket with `Connection: close`; the raw response.
fn raw_exchange(server: &Server, path: &str, body: &Value) -> Vec<u8> {
    use std::io::{Read, Write};
    let addr = server.url.strip_prefix("http://").unwrap();
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    let body = body.to_string();
    write!(
        conn,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nanthropic-version: 2023-06-01\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = Vec::new();
    conn.read_to_end(&mut out).unwrap();
    out
}

/// The chunks of a chunked body, and whether it ended with the last chunk.
fn chunks(raw: &[u8]) -> (Vec<Vec<u8>>, bool) {
    let head_end = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let head = String::from_utf8_lossy(&raw[..head_end]).to_ascii_lowercase();
    assert!(head.contains("transfer-encoding: chunked"), "{head}");
    let mut rest = &raw[head_end..];
    let mut out = Vec::new();
    loop {
        let Some(line_end) = rest.windows(2).position(|w| w == b"\r\n") else {
            return (out, false);
        };
        let size =
            usize::from_str_radix(std::str::from_utf8(&rest[..line_end]).unwrap(), 16).unwrap();
        if size == 0 {
            return (out, true);
        }
        let data = &rest[line_end + 2..];
        if data.len() < size + 2 {
            return (out, false);
        }
        out.push(data[..size].to_vec());
        rest = &data[size + 2..];
    }
}

#[test]
fn sse_writes_on_the_wire() {
    // Default: one chunk per event.
    let server = Server::start(&[]);
    let body = Conversation::new(MESSAGES, "refund order B-2002").body(true);
    let (pieces, complete) = chunks(&raw_exchange(&server, MESSAGES, &body));
    assert!(complete);
    assert!(pieces.len() > 5);
    for piece in &pieces {
        let text = std::str::from_utf8(piece).unwrap();
        assert!(
            text.starts_with("event: ") && text.ends_with("\n\n"),
            "{text:?}"
        );
        assert_eq!(text.matches("\n\n").count(), 1, "one event per write");
    }

    // 3-byte writes: events split, and some write ends inside a UTF-8 character.
    let script = json!({"turns": [{"text": "a—b–c—d"}]});
    let server = Server::with_script(&script, &["--sse-write-bytes", "3"]);
    for path in APIS {
        let body = Conversation::new(path, "hi").body(true);
        let (pieces, complete) = chunks(&raw_exchange(&server, path, &body));
        assert!(complete);
        assert!(pieces[..pieces.len() - 1].iter().all(|p| p.len() == 3));
        assert!(
            pieces.iter().any(|p| std::str::from_utf8(p).is_err()),
            "{path}: a write splits a character"
        );
        let whole = String::from_utf8(pieces.concat()).unwrap();
        let events = common::sse(&whole);
        assert!(events.len() > 3);
    }

    // A large size: every event in one write.
    let server = Server::with_script(&script, &["--sse-write-bytes", "1000000"]);
    let (pieces, complete) = chunks(&raw_exchange(
        &server,
        CHAT,
        &Conversation::new(CHAT, "hi").body(true),
    ));
    assert!(complete);
    assert_eq!(pieces.len(), 1);
    assert!(String::from_utf8_lossy(&pieces[0]).ends_with("data: [DONE]\n\n"));

    // An abrupt cut: no last chunk.
    let cut = json!({"turns": [{"text": "x y z", "faults": [{"kind": "cut", "after_events": 2}]}]});
    let server = Server::with_script(&cut, &[]);
    let (pieces, complete) = chunks(&raw_exchange(
        &server,
        CHAT,
        &Conversation::new(CHAT, "hi").body(true),
    ));
    assert!(!complete);
    assert_eq!(pieces.len(), 2);
}
