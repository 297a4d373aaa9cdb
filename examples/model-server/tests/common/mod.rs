//! Starting the `model-server` binary and talking to it with ureq 3 (the client
//! stephost uses). The SSE parsing and answer assembly here follow the providers'
//! documented shapes and are written without the server's code.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

pub const CHAT: &str = "/v1/chat/completions";
pub const RESPONSES: &str = "/v1/responses";
pub const MESSAGES: &str = "/v1/messages";

/// A running `model-server` process, killed on drop.
pub struct Server {
    child: Child,
    pub url: String,
    /// The key sent by [`Server::post`] (`--key` when given).
    pub key: String,
}

impl Server {
    /// Starts the binary with `args` (plus `--quiet`) and reads its address from the
    /// `model-server: listening on http://…` line on stdout.
    pub fn start(args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_model-server"))
            .args(args)
            .arg("--quiet")
            .env_remove("MODEL_SERVER_KEY")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start model-server");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("model-server: listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_string();
        assert!(url.starts_with("http://127.0.0.1:"), "{url}");
        let key = args
            .iter()
            .position(|a| *a == "--key")
            .map(|i| args[i + 1].to_string())
            .unwrap_or_else(|| "sk-test".into());
        Server { child, url, key }
    }

    /// Starts it with a script written to a temporary file.
    pub fn with_script(script: &Value, args: &[&str]) -> Server {
        let dir = std::env::temp_dir().join(format!(
            "model-server-test-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("script.json");
        std::fs::write(&path, script.to_string()).unwrap();
        let mut all = vec!["--script", path.to_str().unwrap()];
        all.extend_from_slice(args);
        let server = Server::start(&all);
        let _ = std::fs::remove_dir_all(&dir);
        server
    }

    /// POSTs `body` to `path` with the provider's auth headers.
    pub fn post(&self, path: &str, body: &Value) -> Reply {
        let headers: Vec<(&str, String)> = if path == MESSAGES {
            vec![
                ("x-api-key", self.key.clone()),
                ("anthropic-version", "2023-06-01".into()),
            ]
        } else {
            vec![("authorization", format!("Bearer {}", self.key))]
        };
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        self.post_with(path, body, &headers)
    }

    /// POSTs `body` with exactly these headers (plus content-type).
    pub fn post_with(&self, path: &str, body: &Value, headers: &[(&str, &str)]) -> Reply {
        let mut req = agent()
            .post(format!("{}{path}", self.url))
            .header("content-type", "application/json");
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        reply(req.send(body.to_string()))
    }

    pub fn get(&self, path: &str) -> Value {
        let mut resp = agent().get(format!("{}{path}", self.url)).call().unwrap();
        serde_json::from_str(&resp.body_mut().read_to_string().unwrap()).unwrap()
    }

    pub fn report(&self) -> Value {
        self.get("/requests")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn agent() -> ureq::Agent {
    ureq::Agent::new_with_config(
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(20)))
            .build(),
    )
}

/// A response read to its end (or to the error that ended it).
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    /// Lowercased names.
    pub headers: HashMap<String, String>,
    pub body: String,
    /// Set when reading the body failed (e.g. the connection was cut).
    pub read_error: Option<String>,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }

    pub fn events(&self) -> Vec<Event> {
        sse(&self.body)
    }
}

pub fn reply(resp: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Reply {
    let mut resp = resp.expect("request failed");
    let status = resp.status().as_u16();
    let headers = resp
        .headers()
        .iter()
        .map(|(n, v)| (n.as_str().to_string(), v.to_str().unwrap().to_string()))
        .collect();
    let mut bytes = Vec::new();
    let read_error = resp
        .body_mut()
        .as_reader()
        .read_to_end(&mut bytes)
        .err()
        .map(|e| e.to_string());
    Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
        read_error,
    }
}

/// One SSE event: its `event:` name (if any) and its `data:` (lines joined by `\n`).
#[derive(Debug, Clone)]
pub struct Event {
    pub name: Option<String>,
    pub data: String,
}

impl Event {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.data).unwrap_or_else(|e| panic!("bad data ({e}): {}", self.data))
    }
}

/// The WHATWG rules: a blank line dispatches, `:` starts a comment, one space after
/// the colon is dropped.
pub fn sse(text: &str) -> Vec<Event> {
    let mut events = Vec::new();
    let mut name = None;
    let mut data: Vec<String> = Vec::new();
    for line in text.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() {
            if !data.is_empty() {
                events.push(Event {
                    name: name.take(),
                    data: data.join("\n"),
                });
                data.clear();
            }
            name = None;
            continue;
        }
        if line.starts_with(':') {
            continue;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => name = Some(value.to_string()),
            "data" => data.push(value.to_string()),
            _ => {}
        }
    }
    events
}

/// What one model answer says, whatever the API.
#[derive(Debug, Clone, PartialEq)]
pub struct Got {
    pub text: Option<String>,
    /// (id, name, arguments text)
    pub calls: Vec<(String, String, String)>,
    /// The provider's own finish string.
    pub finish: String,
    pub usage: Value,
}

impl Got {
    pub fn args(&self, i: usize) -> Value {
        serde_json::from_str(&self.calls[i].2).unwrap()
    }
}

pub fn is_u64(v: &Value) -> bool {
    v.as_u64().is_some()
}

/// Checks a whole Chat Completions body and reads it.
pub fn chat_whole(v: &Value) -> Got {
    assert_eq!(v["object"], "chat.completion", "{v}");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert!(is_u64(&v["created"]) && v["model"].is_string());
    let choice = &v["choices"][0];
    assert_eq!(choice["index"], 0);
    let message = &choice["message"];
    assert_eq!(message["role"], "assistant");
    assert!(message.get("content").is_some() && message.get("refusal").is_some());
    let calls = message["tool_calls"]
        .as_array()
        .map(|calls| {
            calls
                .iter()
                .map(|c| {
                    assert_eq!(c["type"], "function");
                    (
                        c["id"].as_str().unwrap().to_string(),
                        c["function"]["name"].as_str().unwrap().to_string(),
                        c["function"]["arguments"].as_str().unwrap().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let u = &v["usage"];
    assert!(is_u64(&u["prompt_tokens"]) && is_u64(&u["completion_tokens"]));
    assert_eq!(
        u["total_tokens"].as_u64().unwrap(),
        u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap()
    );
    assert!(is_u64(&u["prompt_tokens_details"]["cached_tokens"]));
    assert!(is_u64(&u["completion_tokens_details"]["reasoning_tokens"]));
    Got {
        text: message["content"].as_str().map(str::to_string),
        calls,
        finish: choice["finish_reason"].as_str().unwrap().to_string(),
        usage: u.clone(),
    }
}

/// Checks a Chat Completions stream and assembles it as a client does.
pub fn chat_stream(events: &[Event], include_usage: bool) -> Got {
    assert!(
        events.iter().all(|e| e.name.is_none()),
        "chat sends data: only"
    );
    assert_eq!(events.last().unwrap().data, "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(Event::json).collect();
    let mut text: Option<String> = None;
    let mut calls: Vec<(String, String, String)> = Vec::new();
    let mut finish = None;
    let mut usage = Value::Null;
    for (i, chunk) in chunks.iter().enumerate() {
        assert_eq!(chunk["object"], "chat.completion.chunk");
        if include_usage {
            assert!(chunk.get("usage").is_some(), "every chunk has usage");
        } else {
            assert!(
                chunk.get("usage").is_none(),
                "no usage without include_usage"
            );
        }
        let choices = chunk["choices"].as_array().unwrap();
        if choices.is_empty() {
            assert!(
                include_usage && i == chunks.len() - 1,
                "the usage chunk is last"
            );
            usage = chunk["usage"].clone();
            continue;
        }
        if include_usage {
            assert!(chunk["usage"].is_null());
        }
        let delta = &choices[0]["delta"];
        if let Some(piece) = delta["content"].as_str() {
            text.get_or_insert_with(String::new).push_str(piece);
        }
        for tc in delta["tool_calls"].as_array().into_iter().flatten() {
            let index = tc["index"].as_u64().unwrap() as usize;
            if calls.len() <= index {
                calls.resize(index + 1, Default::default());
            }
            if let Some(id) = tc["id"].as_str() {
                calls[index].0 = id.to_string();
            }
            if let Some(name) = tc["function"]["name"].as_str() {
                calls[index].1 = name.to_string();
            }
            if let Some(args) = tc["function"]["arguments"].as_str() {
                calls[index].2.push_str(args);
            }
        }
        if let Some(f) = choices[0]["finish_reason"].as_str() {
            finish = Some(f.to_string());
        }
    }
    if include_usage {
        assert!(
            is_u64(&usage["prompt_tokens"])
                && is_u64(&usage["prompt_tokens_details"]["cached_tokens"])
        );
    }
    Got {
        text,
        calls,
        finish: finish.expect("a finish_reason"),
        usage,
    }
}

/// Checks a whole Responses object and reads it.
pub fn responses_whole(v: &Value) -> Got {
    assert_eq!(v["object"], "response", "{v}");
    assert!(v["id"].as_str().unwrap().starts_with("resp_"));
    let mut text = None;
    let mut calls = Vec::new();
    for item in v["output"].as_array().unwrap() {
        match item["type"].as_str().unwrap() {
            "message" => {
                assert_eq!(item["role"], "assistant");
                for part in item["content"].as_array().unwrap() {
                    assert_eq!(part["type"], "output_text");
                    text.get_or_insert_with(String::new)
                        .push_str(part["text"].as_str().unwrap());
                }
            }
            "function_call" => {
                assert!(item["id"].as_str().unwrap().starts_with("fc_"));
                calls.push((
                    item["call_id"].as_str().unwrap().to_string(),
                    item["name"].as_str().unwrap().to_string(),
                    item["arguments"].as_str().unwrap().to_string(),
                ));
            }
            other => panic!("unexpected item {other}"),
        }
    }
    let u = &v["usage"];
    assert!(is_u64(&u["input_tokens"]) && is_u64(&u["output_tokens"]));
    assert!(is_u64(&u["input_tokens_details"]["cached_tokens"]));
    assert!(is_u64(&u["output_tokens_details"]["reasoning_tokens"]));
    assert_eq!(
        u["total_tokens"].as_u64().unwrap(),
        u["input_tokens"].as_u64().unwrap() + u["output_tokens"].as_u64().unwrap()
    );
    let status = v["status"].as_str().unwrap();
    let finish = match status {
        "incomplete" => format!(
            "incomplete/{}",
            v["incomplete_details"]["reason"].as_str().unwrap()
        ),
        s => s.to_string(),
    };
    Got {
        text,
        calls,
        finish,
        usage: u.clone(),
    }
}

/// Checks a Responses stream (names, sequence numbers, deltas against the terminal
/// response) and reads it from its terminal event.
pub fn responses_stream(events: &[Event]) -> Got {
    let mut deltas: HashMap<String, String> = HashMap::new();
    let mut args: HashMap<String, String> = HashMap::new();
    for (i, e) in events.iter().enumerate() {
        let v = e.json();
        assert_eq!(
            e.name.as_deref(),
            v["type"].as_str(),
            "event: names the type"
        );
        assert_eq!(v["sequence_number"], i, "sequence numbers count up");
        match v["type"].as_str().unwrap() {
            "response.output_text.delta" => deltas
                .entry(v["item_id"].as_str().unwrap().into())
                .or_default()
                .push_str(v["delta"].as_str().unwrap()),
            "response.output_text.done" => {
                assert_eq!(
                    deltas[v["item_id"].as_str().unwrap()],
                    v["text"].as_str().unwrap()
                )
            }
            "response.function_call_arguments.delta" => args
                .entry(v["item_id"].as_str().unwrap().into())
                .or_default()
                .push_str(v["delta"].as_str().unwrap()),
            "response.function_call_arguments.done" => assert_eq!(
                args[v["item_id"].as_str().unwrap()],
                v["arguments"].as_str().unwrap()
            ),
            _ => {}
        }
    }
    assert_eq!(events[0].name.as_deref(), Some("response.created"));
    let last = events.last().unwrap().json();
    let terminal = last["type"].as_str().unwrap();
    assert!(
        terminal == "response.completed" || terminal == "response.incomplete",
        "{terminal}"
    );
    responses_whole(&last["response"])
}

/// Checks a whole Anthropic message and reads it.
pub fn anthropic_whole(v: &Value) -> Got {
    assert_eq!(v["type"], "message", "{v}");
    assert_eq!(v["role"], "assistant");
    assert!(v["id"].as_str().unwrap().starts_with("msg_"));
    let mut text = None;
    let mut calls = Vec::new();
    for block in v["content"].as_array().unwrap() {
        match block["type"].as_str().unwrap() {
            "text" => text
                .get_or_insert_with(String::new)
                .push_str(block["text"].as_str().unwrap()),
            "tool_use" => {
                assert!(block["input"].is_object());
                calls.push((
                    block["id"].as_str().unwrap().to_string(),
                    block["name"].as_str().unwrap().to_string(),
                    block["input"].to_string(),
                ))
            }
            other => panic!("unexpected block {other}"),
        }
    }
    let u = &v["usage"];
    for field in [
        "input_tokens",
        "output_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
    ] {
        assert!(is_u64(&u[field]), "usage.{field}: {u}");
    }
    Got {
        text,
        calls,
        finish: v["stop_reason"].as_str().unwrap().to_string(),
        usage: u.clone(),
    }
}

/// Checks an Anthropic stream and assembles it as the SDK's `accumulate_event` does.
pub fn anthropic_stream(events: &[Event]) -> Got {
    for e in events {
        assert_eq!(
            e.name.as_deref(),
            e.json()["type"].as_str(),
            "event: names the type"
        );
    }
    assert_eq!(events[0].name.as_deref(), Some("message_start"));
    assert_eq!(events.last().unwrap().name.as_deref(), Some("message_stop"));
    assert!(events.iter().any(|e| e.name.as_deref() == Some("ping")));
    let mut message = events[0].json()["message"].clone();
    assert!(message["stop_reason"].is_null());
    let mut json_bufs: HashMap<u64, String> = HashMap::new();
    for e in &events[1..] {
        let v = e.json();
        match v["type"].as_str().unwrap() {
            "content_block_start" => {
                let index = v["index"].as_u64().unwrap();
                assert_eq!(index as usize, message["content"].as_array().unwrap().len());
                message["content"]
                    .as_array_mut()
                    .unwrap()
                    .push(v["content_block"].clone());
            }
            "content_block_delta" => {
                let index = v["index"].as_u64().unwrap();
                let block = &mut message["content"][index as usize];
                match v["delta"]["type"].as_str().unwrap() {
                    "text_delta" => {
                        let text = format!(
                            "{}{}",
                            block["text"].as_str().unwrap(),
                            v["delta"]["text"].as_str().unwrap()
                        );
                        block["text"] = text.into();
                    }
                    "input_json_delta" => json_bufs
                        .entry(index)
                        .or_default()
                        .push_str(v["delta"]["partial_json"].as_str().unwrap()),
                    other => panic!("unexpected delta {other}"),
                }
            }
            "content_block_stop" => {
                let index = v["index"].as_u64().unwrap();
                if let Some(buf) = json_bufs.remove(&index) {
                    let input = if buf.is_empty() {
                        json!({})
                    } else {
                        serde_json::from_str(&buf).unwrap()
                    };
                    message["content"][index as usize]["input"] = input;
                }
            }
            "message_delta" => {
                message["stop_reason"] = v["delta"]["stop_reason"].clone();
                for (k, val) in v["usage"].as_object().unwrap() {
                    if !val.is_null() {
                        message["usage"][k] = val.clone();
                    }
                }
            }
            "ping" | "message_stop" => {}
            other => panic!("unexpected event {other}"),
        }
    }
    anthropic_whole(&message)
}

/// Checks and reads an answer of `path`, whole or streamed.
pub fn read_answer(path: &str, r: &Reply, stream: bool) -> Got {
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.read_error.is_none(), "{:?}", r.read_error);
    if stream {
        assert_eq!(
            r.header("content-type"),
            Some("text/event-stream; charset=utf-8")
        );
    } else {
        assert_eq!(r.header("content-type"), Some("application/json"));
    }
    match (path, stream) {
        (CHAT, false) => chat_whole(&r.json()),
        (CHAT, true) => chat_stream(&r.events(), true),
        (RESPONSES, false) => responses_whole(&r.json()),
        (RESPONSES, true) => responses_stream(&r.events()),
        (MESSAGES, false) => anthropic_whole(&r.json()),
        (MESSAGES, true) => anthropic_stream(&r.events()),
        _ => unreachable!(),
    }
}

/// A conversation in one API's request shape, grown turn by turn as an agent does.
pub struct Conversation {
    pub path: &'static str,
    pub items: Vec<Value>,
}

impl Conversation {
    pub fn new(path: &'static str, user: &str) -> Conversation {
        let items = match path {
            CHAT => vec![
                json!({"role": "system", "content": "You are a refund agent."}),
                json!({"role": "user", "content": user}),
            ],
            RESPONSES => vec![json!({"type": "message", "role": "user", "content": user})],
            _ => vec![json!({"role": "user", "content": user})],
        };
        Conversation { path, items }
    }

    /// The request body.
    pub fn body(&self, stream: bool) -> Value {
        match self.path {
            CHAT => {
                let mut b =
                    json!({"model": "gpt-4.1-mini", "messages": self.items, "stream": stream});
                if stream {
                    b["stream_options"] = json!({"include_usage": true});
                }
                b
            }
            RESPONSES => json!({
                "model": "gpt-5-mini", "instructions": "You are a refund agent.",
                "input": self.items, "store": false, "stream": stream
            }),
            _ => json!({
                "model": "claude-sonnet-4-5", "system": "You are a refund agent.",
                "max_tokens": 1024, "messages": self.items, "stream": stream
            }),
        }
    }

    /// Appends the model's answer and the results of its tool calls.
    pub fn push(&mut self, got: &Got, results: &[Value]) {
        match self.path {
            CHAT => {
                let mut m = json!({"role": "assistant", "content": got.text});
                if !got.calls.is_empty() {
                    m["tool_calls"] = got
                        .calls
                        .iter()
                        .map(|(id, name, args)| {
                            json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}})
                        })
                        .collect();
                }
                self.items.push(m);
                for ((id, _, _), result) in got.calls.iter().zip(results) {
                    self.items.push(
                        json!({"role": "tool", "tool_call_id": id, "content": result.to_string()}),
                    );
                }
            }
            RESPONSES => {
                if let Some(text) = &got.text {
                    self.items
                        .push(json!({"type": "message", "role": "assistant",
                        "content": [{"type": "output_text", "text": text}]}));
                }
                for (id, name, args) in &got.calls {
                    self.items.push(json!({"type": "function_call", "call_id": id, "name": name, "arguments": args}));
                }
                for ((id, _, _), result) in got.calls.iter().zip(results) {
                    self.items.push(json!({"type": "function_call_output", "call_id": id, "output": result.to_string()}));
                }
            }
            _ => {
                let mut content = Vec::new();
                if let Some(text) = &got.text {
                    content.push(json!({"type": "text", "text": text}));
                }
                for (id, name, args) in &got.calls {
                    content.push(json!({"type": "tool_use", "id": id, "name": name,
                        "input": serde_json::from_str::<Value>(args).unwrap()}));
                }
                self.items
                    .push(json!({"role": "assistant", "content": content}));
                if !got.calls.is_empty() {
                    let results: Vec<Value> = got
                        .calls
                        .iter()
                        .zip(results)
                        .map(|((id, _, _), r)| json!({"type": "tool_result", "tool_use_id": id, "content": r.to_string()}))
                        .collect();
                    self.items.push(json!({"role": "user", "content": results}));
                }
            }
        }
    }
}
