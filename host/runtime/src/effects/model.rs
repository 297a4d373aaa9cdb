//! A model named in `stephost.toml` (`[models.NAME]`): the neutral chat
//! request a step sends is translated to the provider's wire format
//! (`stephost-models`), sent, and its answer translated back, with usage
//! normalised and priced. A model call is a `read` whose answer is paid for:
//! committed durably before the step sees it, never asked twice. The host
//! is the one retry owner: what the provider says may pass (408, 409, 429,
//! 5xx, 529, an overloaded stream) is retried under the model's retry
//! policy, honouring `retry-after-ms` / `retry-after`; the rest is final.

use std::sync::Arc;
use std::time::Duration;

use stephost_models::{Api, ChatRequest, Prices};

use super::flow::Flow;
use super::{Failure, Handler, Reply, Request};
use crate::options::ModelProgress;

/// Largest model answer read, in bytes.
const RESPONSE_BYTES_MAX: u64 = 16 * 1024 * 1024;

/// How often a streaming answer's text so far is told to the stream sink.
const STREAM_EVERY: Duration = Duration::from_millis(200);

pub struct Model {
    pub alias: String,
    pub api: Api,
    /// The provider's base URL (before `/v1/...`).
    pub url: String,
    /// The provider's model id.
    pub model: String,
    /// Authentication and extra headers, resolved (secrets read from the
    /// environment once; never recorded).
    headers: Vec<(String, String)>,
    pub prices: Prices,
    /// The ceiling every call's `max_tokens` is clamped to (and the value
    /// of a call that sets none).
    pub max_tokens: u32,
    agent: ureq::Agent,
    /// Its flow control (see [`super::flow`]).
    flow: Arc<Flow>,
}

impl Model {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        alias: String,
        api: Api,
        url: String,
        model: String,
        headers: Vec<(String, String)>,
        prices: Prices,
        max_tokens: u32,
        timeout: Duration,
        limits: stephost_core::flow::FlowCaps,
    ) -> Model {
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            // To connect, for the answer to begin, and for each piece of a
            // streamed answer: a long generation that keeps coming is not
            // cut, one that stalls is.
            .timeout_connect(Some(timeout))
            .timeout_recv_response(Some(timeout))
            .timeout_per_read(Some(timeout))
            .max_redirects(0)
            .build();
        let flow = Flow::shared(&format!("{alias}\n{url}\n{model}"), limits);
        Model {
            alias,
            api,
            url: url.trim_end_matches('/').to_string(),
            model,
            headers,
            prices,
            max_tokens,
            agent: config.into(),
            flow,
        }
    }

    /// The `max_tokens` a call of `request` is sent with: its own, clamped
    /// to the model's ceiling.
    pub fn max_tokens_of(&self, request: &ChatRequest) -> u32 {
        request
            .max_tokens
            .map_or(self.max_tokens, |n| n.min(self.max_tokens))
    }

    /// The tokens a call may spend: its input (about four bytes a token,
    /// `body_bytes` of request) and its `max_tokens`.
    fn estimate(body_bytes: usize, max_tokens: u32) -> u64 {
        (body_bytes / 4) as u64 + u64::from(max_tokens)
    }

    /// How long a call of `request` (its whole JSON, `body_bytes` long)
    /// would wait now for the model's rate limits or a provider's pause, in
    /// ms, if at all.
    pub fn expected_wait(
        &self,
        services: &crate::options::Services,
        request: &ChatRequest,
        body_bytes: usize,
    ) -> Option<i64> {
        let tokens = Self::estimate(body_bytes, self.max_tokens_of(request));
        self.flow.expected_wait(services.flows.as_deref(), tokens)
    }

    /// The most a call with `max_tokens` can cost, in micro-USD: every
    /// token priced as output (the dearest).
    pub fn worst_cost_micro_usd(&self, input_bytes: usize, max_tokens: u32) -> u64 {
        // About four bytes a token; the input is priced as output too.
        let tokens = (input_bytes / 4) as f64 + f64::from(max_tokens);
        (tokens * self.prices.output_per_mtok).ceil() as u64
    }

    fn send(&self, body: Vec<u8>) -> Result<Answered, String> {
        let url = format!("{}{}", self.url, self.api.path());
        let mut request = self
            .agent
            .post(&url)
            .header("content-type", "application/json");
        for (name, value) in &self.headers {
            request = request.header(name.as_str(), value.as_str());
        }
        let response = request.send(&body[..]).map_err(|e| format!("{url}: {e}"))?;
        let status = response.status().as_u16();
        let headers: Vec<(String, String)> = response
            .headers()
            .iter()
            .filter_map(|(name, value)| {
                Some((name.as_str().to_string(), value.to_str().ok()?.to_string()))
            })
            .collect();
        let streamed = headers.iter().any(|(name, value)| {
            name.eq_ignore_ascii_case("content-type") && value.starts_with("text/event-stream")
        });
        Ok(Answered {
            status,
            headers,
            streamed,
            body: response.into_body(),
        })
    }

    /// A provider's answer read whole.
    fn read_whole(&self, body: ureq::Body) -> Result<Vec<u8>, Failure> {
        let mut body = body;
        body.with_config()
            .limit(RESPONSE_BYTES_MAX)
            .read_to_vec()
            .map_err(|e| {
                Failure::retryable(format!("model {}: reading the answer: {e}", self.alias))
            })
    }

    /// A streamed answer, assembled as it arrives; `appended` is told each
    /// piece of text. A stream that breaks or ends before its last event is
    /// a failed attempt (retryable: a model call is a read).
    fn read_stream(
        &self,
        body: ureq::Body,
        appended: &mut dyn FnMut(&str),
    ) -> Result<stephost_models::ChatResponse, Failure> {
        let wire = |e: stephost_models::WireError| {
            let message = format!("model {}: {e}", self.alias);
            if e.retryable() {
                Failure::retryable(message)
            } else {
                Failure::Rejected(message)
            }
        };
        let mut body = body;
        let mut reader = body.with_config().limit(RESPONSE_BYTES_MAX).reader();
        let mut decoder = stephost_models::StreamDecoder::new(self.api);
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = std::io::Read::read(&mut reader, &mut buf).map_err(|e| {
                Failure::retryable(format!(
                    "model {}: the answer's stream broke after {} events: {e}",
                    self.alias,
                    decoder.events()
                ))
            })?;
            if n == 0 {
                break;
            }
            let progress = decoder.push(&buf[..n]).map_err(wire)?;
            if !progress.appended.is_empty() {
                appended(&progress.appended);
            }
            if progress.done {
                break;
            }
        }
        decoder.finish().map_err(wire)
    }
}

/// A provider's answer as it began.
struct Answered {
    status: u16,
    headers: Vec<(String, String)>,
    /// Server-sent events (`text/event-stream`).
    streamed: bool,
    body: ureq::Body,
}

impl Handler for Model {
    fn perform(&self, request: &Request<'_>) -> Result<Reply, Failure> {
        let chat: ChatRequest = serde_json::from_str(request.body)
            .map_err(|e| Failure::Invalid(format!("the chat request is not one: {e}")))?;
        let max_tokens = self.max_tokens_of(&chat);
        let body = stephost_models::request_bytes(self.api, &chat, &self.model, max_tokens, true)
            .map_err(|e| Failure::Invalid(format!("model {}: {e}", self.alias)))?;
        // What the call may spend: its input (about four bytes a token) and
        // its max_tokens.
        let flows = request.services.flows.as_deref();
        let mut admitted = self.flow.admit(
            request.services.flows.clone(),
            Self::estimate(request.body.len(), max_tokens),
            &mut |why| {
                if let Some(sink) = &request.services.stream_sink {
                    (sink.0)(request.run_id, request.seq, ModelProgress::Waiting(why));
                }
            },
        );
        let Answered {
            status,
            headers,
            streamed,
            body: answer,
        } = self.send(body).map_err(|message| {
            // The request may not have arrived; a model call is a read, so
            // asking again is safe.
            Failure::retryable(format!("model {}: {message}", self.alias))
        })?;
        let limits = stephost_models::rate_limits(self.api, &headers);
        // Nothing left until a reset: every run sharing the model waits.
        for (left, reset) in [
            (limits.remaining_requests, limits.reset_requests),
            (limits.remaining_tokens, limits.reset_tokens),
        ] {
            if let (Some(0), Some(reset)) = (left, reset) {
                self.flow.pause(flows, reset);
            }
        }
        if (200..300).contains(&status) {
            let mut response = if streamed {
                // The text so far goes to the sink, if any, at most every
                // STREAM_EVERY.
                let mut so_far = String::new();
                let mut told: Option<std::time::Instant> = None;
                self.read_stream(answer, &mut |piece| {
                    // A model whose values are redacted shows none of its
                    // answer while it streams in.
                    let Some(sink) = request
                        .services
                        .stream_sink
                        .as_ref()
                        .filter(|_| !request.redacted)
                    else {
                        return;
                    };
                    so_far.push_str(piece);
                    if told.is_none_or(|at| at.elapsed() >= STREAM_EVERY) {
                        (sink.0)(request.run_id, request.seq, ModelProgress::Text(&so_far));
                        told = Some(std::time::Instant::now());
                    }
                })?
            } else {
                let answer = self.read_whole(answer)?;
                stephost_models::parse_response(self.api, &answer).map_err(|e| {
                    let retryable = e.retryable();
                    let message = format!("model {}: {e}", self.alias);
                    if retryable {
                        Failure::retryable(message)
                    } else {
                        Failure::Rejected(message)
                    }
                })?
            };
            admitted.settle(response.usage.input + response.usage.output);
            response.cost = Some(stephost_models::cost(&response.usage, &self.prices));
            let text = serde_json::to_string(&response).map_err(|e| {
                Failure::Invalid(format!(
                    "model {}: the answer cannot be kept: {e}",
                    self.alias
                ))
            })?;
            let request_id = stephost_models::request_id(self.api, &headers);
            let detail = format!(
                "{}{}",
                request_id.map_or_else(String::new, |id| format!("request id {id}")),
                describe(&limits)
            );
            return Ok(Reply {
                detail: (!detail.is_empty()).then(|| detail.trim().to_string()),
                ..Reply::new(text)
            });
        }
        let answer = self.read_whole(answer)?;
        let error = stephost_models::classify(self.api, status, &headers, &answer);
        if let Some(wait) = error.retry_after.filter(|_| status == 429) {
            // Asked to slow down: so is every run sharing the model (paused
            // before this call's slot is given up, so that no call waiting
            // for it slips out first).
            self.flow.pause(flows, wait);
        }
        drop(admitted);
        let message = format!(
            "model {} answered {status}{}{}: {}",
            self.alias,
            error
                .request_id
                .as_deref()
                .map(|id| format!(" (request id {id})"))
                .unwrap_or_default(),
            describe(&limits),
            error.message
        );
        if error.retryable {
            Err(Failure::Retryable {
                message,
                retry_after: error.retry_after,
                maybe_received: false,
            })
        } else {
            Err(Failure::Rejected(message))
        }
    }

    /// Asking a model again cannot act twice: it is a read.
    fn idempotent(&self) -> bool {
        true
    }

    fn paid(&self) -> bool {
        true
    }
}

/// The rate-limit headers of an answer, as recorded with a failed attempt.
fn describe(limits: &stephost_models::RateLimits) -> String {
    let mut parts = Vec::new();
    if let Some(n) = limits.remaining_requests {
        parts.push(format!("requests left {n}"));
    }
    if let Some(n) = limits.remaining_tokens {
        parts.push(format!("tokens left {n}"));
    }
    if let Some(d) = limits.reset_requests.or(limits.reset_tokens) {
        parts.push(format!("resets in {} ms", d.as_millis()));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(" [{}]", parts.join(", "))
    }
}
