//! `stephost-models`: the three wire formats a model alias can use, OpenAI Chat Completions
//! (`openai-chat`), OpenAI Responses (`openai-responses`) and Anthropic Messages
//! (`anthropic-messages`), over the provider-neutral chat requests and responses of
//! `stephost-contract` (re-exported here), with prices and cost.
//!
//! The crate is pure: it builds request bodies and reads reply bytes. The host owns HTTP, keys,
//! retries, timeouts and the ledger. One call goes like this:
//!
//! 1. the step's [`ChatRequest`] is recorded as [`ChatRequest::canonical_json`] (after an earlier
//!    call of the run, as [`RecordedAfter::recorded_after`]);
//! 2. [`request_body`] maps it to the provider's JSON body (after [`validate`]);
//! 3. a 200 reply is read with [`parse_response`], or, when streamed, fed to a [`StreamDecoder`]
//!    as bytes arrive ([`StreamDecoder::push`] reports appended text and the terminal event;
//!    [`StreamDecoder::finish`] gives the [`ChatResponse`]); a stream cut before its terminal event
//!    is [`WireError::Cut`], and an error event inside the stream is [`WireError::Provider`];
//! 4. any other status goes to [`classify`], which gives a [`ProviderError`] with a `retryable` flag,
//!    the `retry-after` delay and the request id; [`rate_limits`] reads the rate-limit headers;
//! 5. [`cost`] prices the [`Usage`] in whole micro-dollars.
//!
//! ```
//! use stephost_models::{Api, ChatRequest, Message, StopReason, StreamDecoder, request_bytes};
//!
//! let req = ChatRequest::new("default", vec![Message::user("Say hi.")]);
//! let body = request_bytes(Api::AnthropicMessages, &req, "claude-sonnet-4-5", 256, true)?;
//! assert!(body.starts_with(br#"{"max_tokens":256,"messages":[{"content":"Say hi.""#));
//!
//! // The reply, as it might arrive from the socket (any split works).
//! let sse = concat!(
//!     "event: message_start\n",
//!     "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"model\":\"claude-sonnet-4-5\",",
//!     "\"usage\":{\"input_tokens\":5,\"cache_read_input_tokens\":100,\"output_tokens\":1}}}\n\n",
//!     "event: content_block_start\n",
//!     "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
//!     "event: content_block_delta\n",
//!     "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi.\"}}\n\n",
//!     "event: message_delta\n",
//!     "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":3}}\n\n",
//!     "event: message_stop\n",
//!     "data: {\"type\":\"message_stop\"}\n\n",
//! );
//! let mut decoder = StreamDecoder::new(Api::AnthropicMessages);
//! let mut live = String::new();
//! for chunk in sse.as_bytes().chunks(10) {
//!     live.push_str(&decoder.push(chunk)?.appended);
//! }
//! assert!(decoder.is_done());
//! let resp = decoder.finish()?;
//! assert_eq!((live.as_str(), resp.text().as_str()), ("Hi.", "Hi."));
//! assert_eq!(resp.stop, StopReason::Stop);
//! assert_eq!((resp.usage.input, resp.usage.cached_input, resp.usage.output), (105, 100, 3));
//! # Ok::<(), stephost_models::WireError>(())
//! ```
//!
//! [`Usage`] means the same thing for every API: `input` is the whole prompt (cache reads and
//! cache writes included), `output` includes reasoning. See [`Usage`] and the `parse_response`
//! functions of each wire module for the per-provider arithmetic.

pub mod api;
pub mod chat;
pub mod errors;
pub mod sse;
pub mod wire;

pub use api::{Api, UnknownApi};
pub use chat::{
    AFTER, Charged, ChatRequest, ChatResponse, Cost, Message, Part, Prices, RecordedAfter, Role,
    StopReason, ToolChoice, ToolDef, Usage, check_redactable, cost, validate,
};
pub use errors::{
    ErrorKind, ProviderError, RateLimits, classify, classify_at, rate_limits, request_id,
};
pub use wire::{
    Progress, StreamDecoder, WireError, parse_response, parse_stream, request_body, request_bytes,
};
