//! A scripted model server: a small, real HTTP/1.1 server on 127.0.0.1 that speaks
//! three model APIs, for stephost's end-to-end tests and the refund agent example.
//!
//! - `POST /v1/chat/completions` (OpenAI Chat Completions),
//! - `POST /v1/responses` (OpenAI Responses),
//! - `POST /v1/messages` (Anthropic Messages),
//!
//! each whole or streamed (`"stream": true`, SSE), with tool calls, finish reasons,
//! usage, request ids and rate-limit headers. What the model answers comes from a
//! [`Script`]: turn *k* answers a conversation that already holds *k - 1*
//! assistant turns, so a resent conversation gets the same answer. A turn can first
//! serve [`Fault`]s (429 with `retry-after`, 5xx, 529, a cut stream, ...).
//!
//! Control endpoints: `GET /requests` (the report: counts per path, requests in
//! flight at most, every request's headers and body), `POST /reset` (forget all
//! requests and fault progress), `GET /script`.
//!
//! It is written from the providers' documented wire formats, independently of
//! stephost's own adapters, so that it can catch their mistakes.

mod conv;
pub mod script;
mod wire;

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use receiver_http::{Conn, Request, Response, Server, Service, StreamWriter};
use serde_json::{Value, json};

use conv::Conversation;
use script::Vars;
pub use script::{Fault, Finish, Script, ToolCall, Turn, Usage};
use wire::{Answer, Call, Ctx, ErrorOverride};

/// Largest request body accepted (larger ones get `413`).
pub const MAX_BODY_BYTES: usize = 32 << 20;

/// One of the three model APIs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Api {
    /// `POST /v1/chat/completions`
    OpenAiChat,
    /// `POST /v1/responses`
    OpenAiResponses,
    /// `POST /v1/messages`
    AnthropicMessages,
}

impl Api {
    pub const ALL: [Api; 3] = [
        Api::OpenAiChat,
        Api::OpenAiResponses,
        Api::AnthropicMessages,
    ];

    /// `openai-chat`, `openai-responses` or `anthropic-messages`.
    pub fn name(self) -> &'static str {
        match self {
            Api::OpenAiChat => "openai-chat",
            Api::OpenAiResponses => "openai-responses",
            Api::AnthropicMessages => "anthropic-messages",
        }
    }

    /// Its request path.
    pub fn path(self) -> &'static str {
        match self {
            Api::OpenAiChat => "/v1/chat/completions",
            Api::OpenAiResponses => "/v1/responses",
            Api::AnthropicMessages => "/v1/messages",
        }
    }

    fn from_path(path: &str) -> Option<Api> {
        Api::ALL.into_iter().find(|a| a.path() == path)
    }
}

/// How to start a [`ModelServer`].
#[derive(Debug, Clone)]
pub struct Config {
    /// Address to listen on; port 0 picks a free one.
    pub listen: String,
    pub script: Script,
    /// The API key every request must carry (`Authorization: Bearer KEY` for
    /// OpenAI, `x-api-key: KEY` for Anthropic); `None` accepts any key, or none.
    pub key: Option<String>,
    /// Hold every model response this long before writing it (the request counts
    /// as in flight meanwhile), so that overlapping requests are observable.
    pub hold: Duration,
    /// Streams: write SSE bytes in pieces of this size instead of one write per
    /// event (a turn's `sse_write_bytes` wins).
    pub sse_write_bytes: Option<usize>,
    /// Streams: pause between two writes (a turn's `sse_gap_ms` wins).
    pub sse_gap: Duration,
    /// Print every request and its outcome on stderr.
    pub log: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:0".into(),
            script: Script::default_refund(),
            key: None,
            hold: Duration::ZERO,
            sse_write_bytes: None,
            sse_gap: Duration::ZERO,
            log: false,
        }
    }
}

/// One request as the server saw it.
#[derive(Debug, Clone)]
struct Record {
    n: u64,
    method: String,
    path: String,
    api: Option<Api>,
    arrived: Duration,
    finished: Option<Duration>,
    in_flight_at_arrival: usize,
    status: Option<u16>,
    stream: Option<bool>,
    turn: Option<usize>,
    fault: Option<Fault>,
    request_id: Option<String>,
    auth: Option<&'static str>,
    outcome: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Record {
    fn to_json(&self) -> Value {
        let mut headers = serde_json::Map::new();
        for (name, value) in &self.headers {
            let value = if matches!(name.as_str(), "authorization" | "x-api-key") {
                "[redacted]".to_string()
            } else {
                value.clone()
            };
            match headers.get_mut(name) {
                Some(Value::String(existing)) => {
                    existing.push_str(", ");
                    existing.push_str(&value);
                }
                _ => {
                    headers.insert(name.clone(), Value::String(value));
                }
            }
        }
        let body = serde_json::from_slice::<Value>(&self.body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&self.body).into_owned()));
        json!({
            "n": self.n,
            "method": self.method,
            "path": self.path,
            "api": self.api.map(Api::name),
            "arrived_ms": self.arrived.as_millis() as u64,
            "finished_ms": self.finished.map(|f| f.as_millis() as u64),
            "in_flight_at_arrival": self.in_flight_at_arrival,
            "status": self.status,
            "stream": self.stream,
            "turn": self.turn,
            "fault": self.fault,
            "request_id": self.request_id,
            "auth": self.auth,
            "outcome": self.outcome,
            "headers": headers,
            "body": body,
        })
    }
}

#[derive(Default)]
struct State {
    records: Vec<Record>,
    in_flight: usize,
    max_in_flight: usize,
    /// Requests that reached each (api, turn index): which fault comes next.
    attempts: HashMap<(Api, usize), u32>,
    /// Bumped by each reset, so that a request in flight across a reset does not
    /// touch the records made after it.
    generation: u64,
    /// The last request number given (never reset: request ids stay unique).
    last_n: u64,
}

/// Where a request's record is.
#[derive(Debug, Clone, Copy)]
struct Slot {
    generation: u64,
    index: usize,
    /// The request number (1 for the first).
    n: u64,
}

struct Shared {
    state: Mutex<State>,
    script: Script,
    key: Option<String>,
    hold: Duration,
    sse_write_bytes: Option<usize>,
    sse_gap: Duration,
    log: bool,
    started: Instant,
}

/// How a response is written.
enum Plan {
    Reply(Response),
    /// An SSE body: the head, then the events, written per event or in pieces of
    /// `write_bytes`, with `gap` between writes; `finish` ends the chunked body
    /// properly, otherwise the connection is closed without its last chunk.
    Stream {
        head: Response,
        events: Vec<String>,
        finish: bool,
        write_bytes: Option<usize>,
        gap: Duration,
    },
    /// The head with the full `Content-Length`, half the body, then close.
    Truncated(Response),
    /// Close without a response.
    Drop,
}

impl Plan {
    fn status(&self) -> Option<u16> {
        match self {
            Plan::Reply(r) | Plan::Truncated(r) => Some(r.status),
            Plan::Stream { head, .. } => Some(head.status),
            Plan::Drop => None,
        }
    }
}

/// A running server. Dropping it (or calling [`ModelServer::stop`]) stops accepting,
/// closes open connections and joins its threads.
pub struct ModelServer {
    shared: Arc<Shared>,
    server: Server,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking connection thread must not take the test's view of the state with it.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl ModelServer {
    /// Starts on `127.0.0.1:0` with the built-in refund agent script.
    pub fn start() -> io::Result<ModelServer> {
        ModelServer::start_with(Config::default())
    }

    /// Starts with a full configuration.
    pub fn start_with(config: Config) -> io::Result<ModelServer> {
        let listener = TcpListener::bind(&config.listen)?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            script: config.script,
            key: config.key.filter(|k| !k.is_empty()),
            hold: config.hold,
            sse_write_bytes: config.sse_write_bytes.filter(|&n| n > 0),
            sse_gap: config.sse_gap,
            log: config.log,
            started: Instant::now(),
        });
        let server = Server::start(listener, "model-server", MAX_BODY_BYTES, shared.clone())?;
        Ok(ModelServer { shared, server })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// `http://HOST:PORT` (a wildcard listen address becomes loopback).
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// The script being served.
    pub fn script(&self) -> &Script {
        &self.shared.script
    }

    /// The report that `GET /requests` returns.
    pub fn report(&self) -> Value {
        self.shared.report()
    }

    /// Forgets every request and the faults already served (`POST /reset`).
    pub fn reset(&self) {
        self.shared.reset();
    }

    /// Stops the server: no new connections, open ones are shut down, threads joined.
    pub fn stop(self) {
        self.server.stop();
    }
}

impl Service for Shared {
    fn serve(&self, req: Request, conn: &mut Conn<'_>) -> bool {
        let keep_alive = req.keep_alive() && !conn.stopping();
        if let Some(resp) = self.control(&req) {
            return conn.reply(&resp, keep_alive);
        }
        let slot = self.arrive(&req);
        let plan = self.handle(&req, slot);
        if !self.hold.is_zero() {
            std::thread::sleep(self.hold);
        }
        let reusable = write_plan(conn.stream(), &plan, req.minor, keep_alive);
        self.depart(slot);
        reusable
    }

    fn reject(&self, status: u16, message: &str) -> Response {
        let body = wire::openai_error(message, "invalid_request_error", None, None);
        Response::json(status, &body)
    }

    fn log(&self, line: std::fmt::Arguments<'_>) {
        self.log_line(line);
    }
}

/// Writes the plan; whether the connection can serve another request.
fn write_plan<W: Write>(w: &mut W, plan: &Plan, minor: u8, keep_alive: bool) -> bool {
    match plan {
        Plan::Reply(resp) => {
            receiver_http::message::write_response(w, resp, keep_alive).is_ok() && keep_alive
        }
        Plan::Truncated(resp) => {
            let _ = receiver_http::message::write_truncated(w, resp, resp.body.len() / 2);
            false
        }
        Plan::Drop => false,
        Plan::Stream {
            head,
            events,
            finish,
            write_bytes,
            gap,
        } => {
            let Ok(mut out) = StreamWriter::start(w, head, minor, keep_alive) else {
                return false;
            };
            let joined: Vec<u8>;
            let pieces: Vec<&[u8]> = match write_bytes {
                Some(size) => {
                    joined = events.concat().into_bytes();
                    joined.chunks(*size).collect()
                }
                None => events.iter().map(|e| e.as_bytes()).collect(),
            };
            for (i, piece) in pieces.iter().enumerate() {
                if i > 0 && !gap.is_zero() {
                    std::thread::sleep(*gap);
                }
                if out.send(piece).is_err() {
                    return false;
                }
            }
            if !finish {
                return false;
            }
            let reusable = keep_alive && out.reusable();
            out.finish().is_ok() && reusable
        }
    }
}

/// The path part of a request target (no query, no fragment).
fn path_of(target: &str) -> &str {
    target.split(['?', '#']).next().unwrap_or("")
}

/// What the model answers at `turn` (1-based), for this API and these variables.
fn build_answer(
    turn: &Turn,
    turn_no: usize,
    api: Api,
    vars: &Vars,
    request_bytes: usize,
) -> Answer {
    let text = turn.text.as_ref().map(|t| vars.subst_str(t));
    let calls: Vec<Call> = turn
        .tool_calls
        .iter()
        .enumerate()
        .map(|(i, call)| {
            let id = call.id.clone().unwrap_or_else(|| match api {
                Api::AnthropicMessages => format!("toolu_t{turn_no}_{i}"),
                _ => format!("call_t{turn_no}_{i}"),
            });
            let (arguments, input) = match &call.arguments {
                Value::String(s) => {
                    let s = vars.subst_str(s);
                    let input =
                        serde_json::from_str(&s).unwrap_or_else(|_| Value::String(s.clone()));
                    (s, input)
                }
                v => {
                    let v = vars.subst_value(v);
                    (v.to_string(), v)
                }
            };
            Call {
                id,
                name: call.name.clone(),
                arguments,
                input,
            }
        })
        .collect();
    let finish = turn.finish.unwrap_or(if calls.is_empty() {
        Finish::Stop
    } else {
        Finish::ToolCalls
    });
    let usage = turn.usage.unwrap_or_else(|| {
        let out_bytes = text.as_ref().map_or(0, String::len)
            + calls
                .iter()
                .map(|c| c.name.len() + c.arguments.len())
                .sum::<usize>();
        Usage {
            input_tokens: (request_bytes as u64 / 4).max(1),
            output_tokens: (out_bytes as u64 / 4).max(1),
            ..Usage::default()
        }
    });
    Answer {
        text,
        calls,
        finish,
        usage,
    }
}

fn describe(answer: &Answer) -> String {
    let mut parts = Vec::new();
    if let Some(text) = &answer.text {
        let short: String = text.chars().take(60).collect();
        parts.push(format!("text {short:?}"));
    }
    for call in &answer.calls {
        parts.push(format!("{}({})", call.name, call.arguments));
    }
    parts.join(" + ")
}

impl Shared {
    fn log_line(&self, args: std::fmt::Arguments<'_>) {
        if self.log {
            eprintln!("model-server: {args}");
        }
    }

    fn since_start(&self) -> Duration {
        self.started.elapsed()
    }

    /// `GET /requests`, `POST /reset`, `GET /script`; `None` for any other request.
    fn control(&self, req: &Request) -> Option<Response> {
        let resp = match (req.method.as_str(), path_of(&req.target)) {
            ("GET", "/requests") => Response::json(200, &self.report()),
            ("POST", "/reset") => {
                self.reset();
                Response::json(200, &json!({"reset": true}))
            }
            ("GET", "/script") => Response::json(
                200,
                &serde_json::to_value(&self.script).unwrap_or(Value::Null),
            ),
            _ => return None,
        };
        Some(resp)
    }

    fn report(&self) -> Value {
        let state = lock(&self.state);
        let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
        for r in &state.records {
            *counts.entry(path_of(&r.path)).or_default() += 1;
        }
        json!({
            "requests_total": state.records.len(),
            "counts": counts,
            "in_flight": state.in_flight,
            "max_in_flight": state.max_in_flight,
            "requests": state.records.iter().map(Record::to_json).collect::<Vec<_>>(),
        })
    }

    fn reset(&self) {
        let mut state = lock(&self.state);
        *state = State {
            in_flight: state.in_flight,
            max_in_flight: state.in_flight,
            generation: state.generation + 1,
            last_n: state.last_n,
            ..State::default()
        };
    }

    /// Records the request's arrival.
    fn arrive(&self, req: &Request) -> Slot {
        let mut state = lock(&self.state);
        state.in_flight += 1;
        state.max_in_flight = state.max_in_flight.max(state.in_flight);
        state.last_n += 1;
        let slot = Slot {
            generation: state.generation,
            index: state.records.len(),
            n: state.last_n,
        };
        let record = Record {
            n: slot.n,
            method: req.method.clone(),
            path: req.target.clone(),
            api: Api::from_path(path_of(&req.target)),
            arrived: self.since_start(),
            finished: None,
            in_flight_at_arrival: state.in_flight,
            status: None,
            stream: None,
            turn: None,
            fault: None,
            request_id: None,
            auth: None,
            outcome: String::new(),
            headers: req.headers.clone(),
            body: req.body.clone(),
        };
        state.records.push(record);
        slot
    }

    /// Records that the response is written (or the connection dropped).
    fn depart(&self, slot: Slot) {
        let finished = self.since_start();
        let line = {
            let mut state = lock(&self.state);
            state.in_flight = state.in_flight.saturating_sub(1);
            // A reset meanwhile has removed the record.
            let current = state.generation == slot.generation;
            state
                .records
                .get_mut(slot.index)
                .filter(|_| current)
                .map(|r| {
                    r.finished = Some(finished);
                    let status = r
                        .status
                        .map_or("no response".to_string(), |s| s.to_string());
                    let turn = r.turn.map_or(String::new(), |t| format!(" turn {t}"));
                    let stream = if r.stream == Some(true) {
                        " stream"
                    } else {
                        ""
                    };
                    format!(
                        "#{} {} {}{turn}{stream} -> {status} {}",
                        r.n, r.method, r.path, r.outcome
                    )
                })
        };
        if let Some(line) = line {
            self.log_line(format_args!("{line}"));
        }
    }

    fn update(&self, slot: Slot, f: impl FnOnce(&mut Record)) {
        let mut state = lock(&self.state);
        if state.generation == slot.generation
            && let Some(r) = state.records.get_mut(slot.index)
        {
            f(r);
        }
    }

    fn handle(&self, req: &Request, slot: Slot) -> Plan {
        let (plan, outcome) = self.plan(req, slot);
        let status = plan.status();
        self.update(slot, |r| {
            r.status = status;
            r.outcome = outcome;
        });
        plan
    }

    fn plan(&self, req: &Request, slot: Slot) -> (Plan, String) {
        let path = path_of(&req.target);
        let Some(api) = Api::from_path(path) else {
            let message = format!("Invalid URL ({} {})", req.method, path);
            let body = wire::openai_error(&message, "invalid_request_error", None, None);
            return (Plan::Reply(Response::json(404, &body)), message);
        };
        let n = slot.n;
        let request_id = format!("req_test_{n}");
        self.update(slot, |r| r.request_id = Some(request_id.clone()));
        let reply = |status: u16, body: &Value| {
            let mut resp = Response::json(status, body);
            resp.headers.extend(wire::provider_headers(
                api,
                &request_id,
                status == 429,
                Duration::ZERO,
            ));
            resp
        };
        let invalid = |status: u16, message: &str, param: Option<&str>| {
            let body = match api {
                Api::AnthropicMessages => {
                    let kind = if status == 405 {
                        "not_found_error"
                    } else {
                        "invalid_request_error"
                    };
                    wire::anthropic_error(kind, message, &request_id)
                }
                _ => wire::openai_error(message, "invalid_request_error", param, None),
            };
            (
                Plan::Reply(reply(status, &body)),
                format!("error: {message}"),
            )
        };

        if req.method != "POST" {
            let (plan, outcome) = invalid(405, &format!("Method {} not allowed", req.method), None);
            let plan = match plan {
                Plan::Reply(r) => Plan::Reply(r.with_header("allow", "POST")),
                other => other,
            };
            return (plan, outcome);
        }

        // Authentication.
        let auth = self.check_auth(api, req);
        self.update(slot, |r| r.auth = Some(auth));
        if matches!(auth, "missing" | "wrong") {
            let body = match (api, auth) {
                (Api::AnthropicMessages, "missing") => wire::anthropic_error(
                    "authentication_error",
                    "x-api-key header is required",
                    &request_id,
                ),
                (Api::AnthropicMessages, _) => {
                    wire::anthropic_error("authentication_error", "invalid x-api-key", &request_id)
                }
                (_, "missing") => wire::openai_error(
                    "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY), or as the password field (with blank username) if you're accessing the API from your browser and are prompted for a username. You can obtain an API key from https://platform.openai.com/account/api-keys.",
                    "invalid_request_error",
                    None,
                    None,
                ),
                _ => wire::openai_error(
                    "Incorrect API key provided. You can find your API key at https://platform.openai.com/account/api-keys.",
                    "invalid_request_error",
                    None,
                    Some("invalid_api_key"),
                ),
            };
            return (Plan::Reply(reply(401, &body)), format!("auth {auth}"));
        }
        if api == Api::AnthropicMessages && req.header("anthropic-version").is_none() {
            return invalid(400, "anthropic-version: header is required", None);
        }

        // The body and the conversation.
        let body: Value = match serde_json::from_slice(&req.body) {
            Ok(v) => v,
            Err(e) => {
                return invalid(
                    400,
                    &format!("We could not parse the JSON body of your request: {e}"),
                    None,
                );
            }
        };
        let conv: Conversation = match conv::read(api, &body) {
            Ok(c) => c,
            Err(e) => return invalid(400, &e.message, e.param.as_deref()),
        };
        self.update(slot, |r| r.stream = Some(conv.stream));
        let turn_index = conv.assistant_turns;
        let Some(turn) = self.script.turns.get(turn_index) else {
            return invalid(
                400,
                &format!(
                    "model-server: no scripted turn {}: the script has {} turn(s) and this conversation already holds {turn_index} assistant turn(s)",
                    turn_index + 1,
                    self.script.turns.len()
                ),
                Some("messages"),
            );
        };
        let attempt = {
            let mut state = lock(&self.state);
            let counter = state.attempts.entry((api, turn_index)).or_default();
            *counter += 1;
            *counter - 1
        };
        let fault = self.script.fault_at(turn_index, attempt).cloned();
        self.update(slot, |r| {
            r.turn = Some(turn_index + 1);
            r.fault = fault.clone();
        });

        let vars = Vars::from_conversation(&conv.first_user_text, &conv.tool_results);
        let answer = build_answer(turn, turn_index + 1, api, &vars, req.body.len());
        let created = wire::unix_now().as_secs();
        let ctx = Ctx {
            n,
            model: &conv.model,
            created,
            request: &body,
        };
        let events = || match api {
            Api::OpenAiChat => {
                wire::chat_events(&answer, &ctx, conv.include_usage && !turn.omit_usage)
            }
            Api::OpenAiResponses => wire::responses_events(&answer, &ctx),
            Api::AnthropicMessages => wire::anthropic_events(&answer, &ctx),
        };
        let whole = || {
            let body = match api {
                Api::OpenAiChat => wire::chat_body(&answer, &ctx),
                Api::OpenAiResponses => wire::responses_body(&answer, &ctx),
                Api::AnthropicMessages => wire::anthropic_body(&answer, &ctx),
            };
            reply(200, &body)
        };
        let stream = |events: Vec<String>, finish: bool| {
            let mut head = reply(200, &Value::Null);
            head.headers.retain(|(n, _)| n != "content-type");
            head.headers.insert(
                0,
                (
                    "content-type".into(),
                    "text/event-stream; charset=utf-8".into(),
                ),
            );
            head.headers
                .push(("cache-control".into(), "no-cache".into()));
            Plan::Stream {
                head,
                events,
                finish,
                write_bytes: turn.sse_write_bytes.or(self.sse_write_bytes),
                gap: turn.sse_gap_ms.map_or(self.sse_gap, Duration::from_millis),
            }
        };
        // Where a cut or an in-stream error comes: never after the terminal event.
        let cut_point = |after: Option<usize>, len: usize| after.unwrap_or(len / 2).min(len - 1);

        match &fault {
            None => {
                let outcome = describe(&answer);
                if conv.stream {
                    (stream(events(), true), outcome)
                } else {
                    (Plan::Reply(whole()), outcome)
                }
            }
            Some(Fault::Status {
                status,
                retry_after,
                retry_after_ms,
                should_retry,
                error_type,
                code,
                message,
                ..
            }) => {
                let overrides = ErrorOverride {
                    error_type: error_type.as_deref(),
                    code: code.as_deref(),
                    message: message.as_deref(),
                };
                let body = wire::status_error(api, *status, &conv.model, &request_id, &overrides);
                let reset_in = retry_after_ms
                    .map(Duration::from_millis)
                    .or(retry_after.map(Duration::from_secs))
                    .unwrap_or_default();
                let mut resp = Response::json(*status, &body);
                resp.headers.extend(wire::provider_headers(
                    api,
                    &request_id,
                    *status == 429,
                    reset_in,
                ));
                if let Some(s) = retry_after {
                    resp = resp.with_header("retry-after", s.to_string());
                }
                if let Some(ms) = retry_after_ms {
                    resp = resp.with_header("retry-after-ms", ms.to_string());
                }
                if let Some(b) = should_retry {
                    resp = resp.with_header("x-should-retry", b.to_string());
                }
                (
                    Plan::Reply(resp),
                    format!("scripted fault: status {status}"),
                )
            }
            Some(Fault::Drop { .. }) => (Plan::Drop, "scripted fault: dropped".into()),
            Some(Fault::Cut {
                after_events,
                clean,
                ..
            }) => {
                if conv.stream {
                    let mut events = events();
                    let at = cut_point(*after_events, events.len());
                    events.truncate(at);
                    let how = if *clean {
                        "clean end"
                    } else {
                        "connection closed"
                    };
                    (
                        stream(events, *clean),
                        format!("scripted fault: stream cut after {at} events, {how}"),
                    )
                } else {
                    (
                        Plan::Truncated(whole()),
                        "scripted fault: body cut halfway".into(),
                    )
                }
            }
            Some(Fault::StreamError { after_events, .. }) => {
                if conv.stream {
                    let mut events = events();
                    let at = cut_point(*after_events, events.len());
                    events.truncate(at);
                    events.extend(match api {
                        Api::OpenAiChat => wire::chat_stream_error(),
                        Api::OpenAiResponses => wire::responses_stream_error(&ctx, at),
                        Api::AnthropicMessages => wire::anthropic_stream_error(&request_id),
                    });
                    (
                        stream(events, true),
                        format!("scripted fault: error event after {at} events"),
                    )
                } else {
                    let status = if api == Api::AnthropicMessages {
                        529
                    } else {
                        500
                    };
                    let body = wire::status_error(
                        api,
                        status,
                        &conv.model,
                        &request_id,
                        &ErrorOverride::default(),
                    );
                    (
                        Plan::Reply(reply(status, &body)),
                        format!("scripted fault: stream_error as status {status}"),
                    )
                }
            }
        }
    }

    /// `ok` (the expected key), `unchecked` (no key configured), `missing` or `wrong`.
    fn check_auth(&self, api: Api, req: &Request) -> &'static str {
        let Some(expected) = &self.key else {
            return "unchecked";
        };
        let presented = match api {
            Api::AnthropicMessages => req.header("x-api-key"),
            Api::OpenAiChat | Api::OpenAiResponses => req.header("authorization").and_then(|v| {
                let (scheme, token) = v.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            }),
        };
        match presented {
            None => "missing",
            Some(k) if k == expected => "ok",
            Some(_) => "wrong",
        }
    }
}
