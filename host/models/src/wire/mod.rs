//! The three wire formats behind one interface.
//!
//! Each API module has the same three entry points:
//! - `request_body(req, provider_model, max_tokens, stream)`: the neutral request (validated first)
//!   mapped to the provider's JSON body; `max_tokens` is the value the host already clamped;
//! - `parse_response(body)`: a non-streamed 200 reply parsed into a [`ChatResponse`];
//! - an `Assembler` implementing [`StreamAssembler`], fed with [`SseEvent`]s.
//!
//! The functions here dispatch on [`Api`]; [`StreamDecoder`] joins the SSE parser and an assembler
//! for a host that reads raw bytes.

pub mod anthropic;
mod common;
mod error;
pub mod openai_chat;
pub mod openai_responses;

pub use error::WireError;

use crate::api::Api;
use crate::chat::{ChatRequest, ChatResponse};
use crate::sse::{SseEvent, SseParser};
use serde_json::Value;

/// What one stream event changed, for a live console.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Progress {
    /// Text the event appended to the answer (empty for most events).
    pub appended: String,
    /// The terminal event arrived: stop reading and call [`StreamAssembler::finish`].
    pub done: bool,
}

/// Assembles one streamed reply from its SSE events.
pub trait StreamAssembler: Send {
    /// Takes the next event. An in-stream error event is `Err(WireError::Provider(..))`.
    fn event(&mut self, ev: &SseEvent) -> Result<Progress, WireError>;
    /// The assembled response; [`WireError::Cut`] when the terminal event never arrived.
    fn finish(self: Box<Self>) -> Result<ChatResponse, WireError>;
}

/// Maps a neutral request to `api`'s wire body (see each module for the rules).
pub fn request_body(
    api: Api,
    req: &ChatRequest,
    provider_model: &str,
    max_tokens: u32,
    stream: bool,
) -> Result<Value, WireError> {
    match api {
        Api::OpenAiChat => openai_chat::request_body(req, provider_model, max_tokens, stream),
        Api::OpenAiResponses => {
            openai_responses::request_body(req, provider_model, max_tokens, stream)
        }
        Api::AnthropicMessages => anthropic::request_body(req, provider_model, max_tokens, stream),
    }
}

/// [`request_body`] serialised: the exact bytes to send (and to record by hash).
pub fn request_bytes(
    api: Api,
    req: &ChatRequest,
    provider_model: &str,
    max_tokens: u32,
    stream: bool,
) -> Result<Vec<u8>, WireError> {
    let body = request_body(api, req, provider_model, max_tokens, stream)?;
    Ok(serde_json::to_vec(&body).expect("a JSON value always serialises"))
}

/// Parses a non-streamed 200 reply of `api`.
pub fn parse_response(api: Api, body: &[u8]) -> Result<ChatResponse, WireError> {
    match api {
        Api::OpenAiChat => openai_chat::parse_response(body),
        Api::OpenAiResponses => openai_responses::parse_response(body),
        Api::AnthropicMessages => anthropic::parse_response(body),
    }
}

/// A fresh stream assembler for `api`.
pub fn assembler(api: Api) -> Box<dyn StreamAssembler> {
    match api {
        Api::OpenAiChat => Box::<openai_chat::Assembler>::default(),
        Api::OpenAiResponses => Box::<openai_responses::Assembler>::default(),
        Api::AnthropicMessages => Box::<anthropic::Assembler>::default(),
    }
}

/// Raw stream bytes in, progress out: an [`SseParser`] feeding a [`StreamAssembler`].
pub struct StreamDecoder {
    parser: SseParser,
    assembler: Box<dyn StreamAssembler>,
    done: bool,
    events: u64,
    terminal: Option<String>,
}

impl StreamDecoder {
    /// A decoder for `api` with the default event bound.
    pub fn new(api: Api) -> Self {
        StreamDecoder::with_parser(api, SseParser::default())
    }

    /// A decoder for `api` using `parser` (for a custom `event_bytes_max`).
    pub fn with_parser(api: Api, parser: SseParser) -> Self {
        StreamDecoder {
            parser,
            assembler: assembler(api),
            done: false,
            events: 0,
            terminal: None,
        }
    }

    /// Feeds bytes as read from the socket. After the terminal event, further bytes are ignored.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Progress, WireError> {
        let mut progress = Progress {
            appended: String::new(),
            done: self.done,
        };
        if self.done {
            return Ok(progress);
        }
        for ev in self.parser.push(bytes)? {
            self.events += 1;
            let p = self.assembler.event(&ev)?;
            progress.appended.push_str(&p.appended);
            if p.done {
                self.done = true;
                progress.done = true;
                self.terminal = Some(terminal_name(&ev));
                break;
            }
        }
        Ok(progress)
    }

    /// Events seen so far.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// The name (or data type) of the terminal event, once seen: `[DONE]`, `response.completed`, …
    pub fn terminal(&self) -> Option<&str> {
        self.terminal.as_deref()
    }

    /// Whether the terminal event arrived.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// The assembled response, or [`WireError::Cut`].
    pub fn finish(self) -> Result<ChatResponse, WireError> {
        self.assembler.finish()
    }
}

fn terminal_name(ev: &SseEvent) -> String {
    if ev.data.trim() == "[DONE]" {
        return "[DONE]".to_string();
    }
    serde_json::from_str::<Value>(&ev.data)
        .ok()
        .and_then(|v| v.get("type").and_then(Value::as_str).map(str::to_string))
        .or_else(|| ev.event.clone())
        .unwrap_or_default()
}

/// Parses a whole recorded stream body (replay, tests).
pub fn parse_stream(api: Api, bytes: &[u8]) -> Result<ChatResponse, WireError> {
    let mut decoder = StreamDecoder::new(api);
    decoder.push(bytes)?;
    decoder.finish()
}

/// Helpers shared by the wire modules' tests.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use crate::chat::{Message, Part, ToolChoice, ToolDef};
    use serde_json::json;

    /// A recorded fixture under `tests/fixtures/<api>/`.
    pub(crate) fn fixture(api: Api, name: &str) -> Vec<u8> {
        let path = format!(
            "{}/tests/fixtures/{}/{name}",
            env!("CARGO_MANIFEST_DIR"),
            api.as_str()
        );
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// A weather tool, as in the providers' own examples.
    pub(crate) fn weather_tool() -> ToolDef {
        ToolDef {
            name: "get_weather".into(),
            description: Some("Current weather for a city".into()),
            parameters: json!({
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
                },
                "required": ["city"]
            }),
        }
    }

    /// System + user text + assistant text and two tool calls + two tool results (one an
    /// error), the weather tool and `tool_choice: auto`, temperature 0.2.
    pub(crate) fn weather_conversation() -> ChatRequest {
        ChatRequest {
            system: Some("You are terse.".into()),
            tools: vec![weather_tool()],
            tool_choice: Some(ToolChoice::Auto),
            max_tokens: Some(1024),
            temperature: Some(0.2),
            ..ChatRequest::new(
                "default",
                vec![
                    Message::user("Weather in Paris and Rome?"),
                    Message::assistant(vec![
                        Part::text("Checking both."),
                        Part::tool_call("call_A", "get_weather", r#"{"city":"Paris"}"#),
                        Part::tool_call("call_B", "get_weather", r#"{"city":"Rome"}"#),
                    ]),
                    Message::tool_result("call_A", "get_weather", r#"{"temp_c":18}"#, false),
                    Message::tool_result("call_B", "get_weather", "city not found", true),
                ],
            )
        }
    }

    /// Decodes `bytes` whole, split in two at every offset, and one byte at a time; each must give
    /// `want` and report its text as progress. Every prefix that stops before the terminal event
    /// must be [`WireError::Cut`], and every prefix that includes it must give `want`.
    pub(crate) fn assert_stream_assembles(api: Api, bytes: &[u8], want: &ChatResponse) {
        for cut in 0..=bytes.len() {
            let mut d = StreamDecoder::new(api);
            let mut appended = d.push(&bytes[..cut]).unwrap().appended;
            let prefix_done = d.is_done();
            let mut prefix = StreamDecoder::new(api);
            prefix.push(&bytes[..cut]).unwrap();
            let got = prefix.finish();
            if prefix_done {
                assert_eq!(got.as_ref(), Ok(want), "prefix of {cut} bytes");
            } else {
                assert!(
                    matches!(got, Err(WireError::Cut { .. })),
                    "prefix of {cut} bytes should be cut: {got:?}"
                );
            }
            let p = d.push(&bytes[cut..]).unwrap();
            assert!(p.done, "split at {cut}: not done");
            appended.push_str(&p.appended);
            assert_eq!(appended, want.text(), "split at {cut}: progress text");
            assert_eq!(d.finish().as_ref(), Ok(want), "split at {cut}");
        }
        let mut d = StreamDecoder::new(api);
        let mut appended = String::new();
        for b in bytes {
            appended.push_str(&d.push(std::slice::from_ref(b)).unwrap().appended);
        }
        assert_eq!(appended, want.text());
        assert_eq!(d.finish().as_ref(), Ok(want), "one byte at a time");
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;
    use crate::chat::StopReason;
    use crate::errors::ErrorKind;

    #[test]
    fn dispatch_reaches_each_api() {
        let req = weather_conversation();
        for api in Api::ALL {
            let body = request_body(api, &req, "m-1", 100, false).unwrap();
            assert_eq!(body["model"], "m-1", "{api}");
            let bytes = request_bytes(api, &req, "m-1", 100, false).unwrap();
            assert_eq!(serde_json::from_slice::<Value>(&bytes).unwrap(), body);
        }
        let chat = request_body(Api::OpenAiChat, &req, "m", 100, false).unwrap();
        assert!(chat.get("messages").is_some() && chat.get("max_completion_tokens").is_some());
        let resp = request_body(Api::OpenAiResponses, &req, "m", 100, false).unwrap();
        assert!(resp.get("input").is_some() && resp.get("max_output_tokens").is_some());
        let anth = request_body(Api::AnthropicMessages, &req, "m", 100, false).unwrap();
        assert!(anth.get("messages").is_some() && anth.get("max_tokens").is_some());
    }

    #[test]
    fn request_bytes_are_canonical() {
        // Sorted keys: the same request always gives the same bytes.
        let req = weather_conversation();
        let a = request_bytes(Api::AnthropicMessages, &req, "m", 10, true).unwrap();
        let text = String::from_utf8(a.clone()).unwrap();
        assert!(
            text.starts_with(r#"{"max_tokens":10,"messages":["#),
            "{text}"
        );
        assert_eq!(
            a,
            request_bytes(Api::AnthropicMessages, &req, "m", 10, true).unwrap()
        );
    }

    #[test]
    fn parse_response_and_parse_stream_dispatch() {
        let r = parse_response(
            Api::AnthropicMessages,
            &fixture(Api::AnthropicMessages, "text.json"),
        )
        .unwrap();
        assert_eq!(r.api, "anthropic-messages");
        let r = parse_stream(Api::OpenAiChat, &fixture(Api::OpenAiChat, "text.sse")).unwrap();
        assert_eq!(
            (r.api.as_str(), r.text().as_str()),
            ("openai-chat", "Hello.")
        );
        let r = parse_stream(
            Api::OpenAiResponses,
            &fixture(Api::OpenAiResponses, "text.sse"),
        )
        .unwrap();
        assert_eq!(r.stop, StopReason::Stop);
    }

    #[test]
    fn decoder_reports_terminal_event_counts_events_and_ignores_bytes_after_the_end() {
        let cases = [
            (Api::OpenAiChat, "text.sse", "[DONE]", 6),
            (Api::OpenAiResponses, "text.sse", "response.completed", 12),
            (Api::AnthropicMessages, "text.sse", "message_stop", 8),
        ];
        for (api, name, terminal, events) in cases {
            let mut d = StreamDecoder::new(api);
            assert!(!d.is_done());
            let p = d.push(&fixture(api, name)).unwrap();
            assert!(p.done && d.is_done(), "{api}");
            assert_eq!(d.terminal(), Some(terminal), "{api}");
            assert_eq!(d.events(), events, "{api}");
            let after = d.push(b"data: {not json\n\n").unwrap();
            assert_eq!(
                after,
                Progress {
                    appended: String::new(),
                    done: true
                }
            );
            assert_eq!(d.events(), events);
            assert!(d.finish().is_ok());
        }
    }

    #[test]
    fn empty_stream_is_cut_for_every_api() {
        for api in Api::ALL {
            let err = parse_stream(api, b"").unwrap_err();
            assert!(matches!(err, WireError::Cut { .. }), "{api}: {err:?}");
            assert!(err.retryable());
            assert_eq!(err.to_provider_error().kind, ErrorKind::Transport);
        }
    }

    #[test]
    fn oversized_event_is_an_sse_error() {
        let mut d = StreamDecoder::with_parser(Api::OpenAiChat, SseParser::new(8));
        let err = d.push(b"data: 0123456789\n\n").unwrap_err();
        assert!(matches!(err, WireError::Sse(_)), "{err:?}");
        assert!(!err.retryable());
    }

    #[test]
    fn non_json_event_data_is_malformed() {
        for api in Api::ALL {
            let err = parse_stream(api, b"event: x\ndata: {oops\n\n").unwrap_err();
            assert!(matches!(err, WireError::Malformed { .. }), "{api}: {err:?}");
        }
    }
}
