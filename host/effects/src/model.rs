//! A model named in `stephost.toml` (`[models.NAME]`): the neutral chat
//! request a step sends is translated to the provider's wire format
//! (`stephost-models`), sent, and its answer translated back, with usage
//! normalised and priced. A model call is a `read` whose answer is paid for:
//! committed durably before the step sees it, never asked twice. The host
//! is the one retry owner: what the provider says may pass (408, 409, 429,
//! 5xx, 529, an overloaded stream) is retried under the model's retry
//! policy, honouring `retry-after-ms` / `retry-after`; the rest is final.

use std::sync::Arc;
use std::time::{Duration, Instant};

use stephost_models::{Api, ChatRequest, Prices};

use crate::flow::Flow;
use crate::handler::{Effect, Failure, Handler, Reply, Request};
use crate::retry::RetryPolicy;
use crate::section::{Secrets, default_llm_timeout_ms};
use crate::services::ModelProgress;
use serde::Deserialize;
use std::collections::BTreeMap;
use stephost_core::CallClass;

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
    /// The longest pause a provider's answer may impose on every run of
    /// the model (its retry policy's `deadline_ms`): a `retry-after` or a
    /// rate-limit reset past it is held to it.
    pause_max: Duration,
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
        pause_max: Duration,
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
            pause_max,
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
        tokens_of(body_bytes) + u64::from(max_tokens)
    }

    /// What `input` and `output` tokens cost at this model's prices, as the
    /// host estimated them.
    fn estimated(&self, input: u64, output: u64) -> stephost_models::Charged {
        let usage = stephost_models::Usage {
            input,
            output,
            ..Default::default()
        };
        stephost_models::Charged {
            tokens: usage.total(),
            micro_usd: stephost_models::cost(&usage, &self.prices).micro_usd,
            estimated: true,
        }
    }

    /// Holds back every call of the model for `wait` (what a provider
    /// asked), never longer than `pause_max`.
    fn pause(&self, flows: Option<&dyn stephost_core::flow::Flows>, wait: Duration) {
        self.flow.pause(flows, wait.min(self.pause_max));
    }

    /// How long a call of `request` (its whole JSON, `body_bytes` long)
    /// would wait now for the model's rate limits or a provider's pause, in
    /// ms, if at all.
    pub fn expected_wait(
        &self,
        services: &crate::services::Services,
        request: &ChatRequest,
        body_bytes: usize,
    ) -> Option<i64> {
        let tokens = Self::estimate(body_bytes, self.max_tokens_of(request));
        self.flow.expected_wait(services.flows.as_deref(), tokens)
    }

    /// The most a call of `input_bytes` with `max_tokens` can cost, in
    /// micro-USD: every token priced as output (the dearest).
    pub fn worst_cost_micro_usd(&self, input_bytes: usize, max_tokens: u32) -> u64 {
        // About four bytes a token; the input is priced as output too.
        let tokens = (input_bytes / 4) as f64 + f64::from(max_tokens);
        (tokens * self.prices.output_per_mtok).ceil() as u64
    }

    /// Sends `body`, the whole exchange (the answer read to its end
    /// included) bounded by `deadline`. An error says whether the request
    /// may have reached the provider.
    fn send(&self, body: Vec<u8>, deadline: Option<Instant>) -> Result<Answered, (String, bool)> {
        let url = format!("{}{}", self.url, self.api.path());
        let mut request = self
            .agent
            .post(&url)
            .header("content-type", "application/json");
        for (name, value) in &self.headers {
            request = request.header(name.as_str(), value.as_str());
        }
        if let Some(deadline) = deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            request = request
                .config()
                .timeout_global(Some(left.max(Duration::from_millis(1))))
                .build();
        }
        let response = request.send(&body[..]).map_err(|e| {
            let reached = matches!(
                e,
                ureq::Error::Timeout(
                    ureq::Timeout::Global
                        | ureq::Timeout::PerCall
                        | ureq::Timeout::RecvResponse
                        | ureq::Timeout::RecvBody
                )
            );
            (format!("{url}: {e}"), reached)
        })?;
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
        let input_tokens = tokens_of(request.body.len());
        let flows = request.services.flows.as_deref();
        let mut admitted = self
            .flow
            .admit(
                request.services.flows.clone(),
                Self::estimate(request.body.len(), max_tokens),
                request.deadline,
                &mut |why| {
                    if let Some(sink) = &request.services.stream_sink {
                        (sink.0)(request.run_id, request.seq, ModelProgress::Waiting(why));
                    }
                },
            )
            .map_err(|why| Failure::not_received(format!("model {}: {why}", self.alias)))?;
        // The wait may have been long, the worker frozen meanwhile: a
        // worker that no longer holds the run sends nothing.
        if let Some(Err(why)) = request.control.map(|c| c.holds()) {
            return Err(Failure::not_received(format!(
                "model {}: {why}; not sent",
                self.alias
            )));
        }
        let Answered {
            status,
            headers,
            streamed,
            body: answer,
        } = self
            .send(body, request.deadline)
            .map_err(|(message, reached)| {
                // Sent and not answered in time: the provider may have
                // worked on it (and billed its input).
                if reached {
                    request.spend.add(self.estimated(input_tokens, 0));
                }
                // The request may not have arrived; a model call is a read,
                // so asking again is safe.
                Failure::retryable(format!("model {}: {message}", self.alias))
            })?;
        let limits = stephost_models::rate_limits(self.api, &headers);
        // Nothing left until a reset: every run sharing the model waits.
        for (left, reset) in [
            (limits.remaining_requests, limits.reset_requests),
            (limits.remaining_tokens, limits.reset_tokens),
        ] {
            if let (Some(0), Some(reset)) = (left, reset) {
                self.pause(flows, reset);
            }
        }
        if (200..300).contains(&status) {
            let mut response = if streamed {
                // The text that came since the sink was last told goes to
                // it, if any, at most every STREAM_EVERY, with where it
                // begins in the answer (in characters).
                let mut unsent = String::new();
                let mut offset = 0;
                let mut told: Option<std::time::Instant> = None;
                let mut output_bytes = 0;
                let read = self.read_stream(answer, &mut |piece| {
                    output_bytes += piece.len();
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
                    unsent.push_str(piece);
                    if !unsent.is_empty() && told.is_none_or(|at| at.elapsed() >= STREAM_EVERY) {
                        let text = unsent.as_str();
                        (sink.0)(
                            request.run_id,
                            request.seq,
                            ModelProgress::Text { offset, text },
                        );
                        offset += text.chars().count();
                        unsent.clear();
                        told = Some(std::time::Instant::now());
                    }
                });
                // A stream cut after it began was worked on, and billed.
                read.inspect_err(|_| {
                    request
                        .spend
                        .add(self.estimated(input_tokens, tokens_of(output_bytes)));
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
            // What the budget charges: the provider's count, else the
            // host's estimate of the input and of the answer it got.
            let own = match (&response.usage_raw, &response.cost) {
                (Some(_), Some(cost)) => stephost_models::Charged {
                    tokens: response.usage.total(),
                    micro_usd: cost.micro_usd,
                    estimated: false,
                },
                _ => self.estimated(input_tokens, tokens_of(answer_bytes(&response))),
            };
            request.spend.add(own);
            response.charged = Some(request.spend.total());
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
            self.pause(flows, wait);
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

/// A model a step may call by its alias: the effect the journal performs,
/// and the model it is, for the budget's arithmetic.
pub struct ModelEffect {
    pub effect: Effect,
    pub model: Arc<Model>,
}

/// A model a step calls by its alias (`[models.NAME]`). Changing the
/// provider behind an alias is a change here, not in the step: runs record
/// the provider-neutral request, so old runs replay whichever API serves it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// `openai-chat`, `openai-responses` or `anthropic-messages`.
    pub api: String,
    /// The provider's base URL, before `/v1/...` (e.g.
    /// `https://api.openai.com`, `https://api.anthropic.com`).
    pub url: String,
    /// The provider's model id (e.g. `gpt-4.1-mini`,
    /// `claude-sonnet-4-5`).
    pub model: String,
    /// The environment variable holding the API key: sent as a bearer
    /// token (OpenAI) or `x-api-key` (Anthropic), never recorded, never in
    /// a log or an error.
    pub key_env: Option<String>,
    /// Extra headers sent with every request (e.g. `anthropic-version`;
    /// Anthropic's is sent as `2023-06-01` unless given here).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// USD per million tokens, for each call's cost and the run's budget.
    #[serde(default)]
    pub prices: stephost_models::Prices,
    /// The ceiling every call's `max_tokens` is clamped to, and the value
    /// of a call that sets none, in tokens.
    #[serde(default = "default_model_max_tokens")]
    pub max_tokens: u32,
    /// One attempt's bound, in milliseconds.
    #[serde(default = "default_llm_timeout_ms")]
    pub timeout_ms: u64,
    #[serde(default = "default_model_retry")]
    pub retry: RetryPolicy,
    /// Calls of this model in flight at once, shared by every process on
    /// the ledger (none: unbounded).
    pub concurrency_max: Option<u32>,
    /// Requests a minute, shared by every process on the ledger (none:
    /// unbounded).
    pub requests_per_minute: Option<u32>,
    /// Tokens a minute (input and output), shared by every process on the
    /// ledger (none: unbounded).
    pub tokens_per_minute: Option<u64>,
}

fn default_model_max_tokens() -> u32 {
    4096
}

/// A provider's 429s and 529s pass within seconds to a minute: more
/// attempts, over a longer deadline, than an effect's default.
fn default_model_retry() -> RetryPolicy {
    RetryPolicy {
        attempts_max: 6,
        backoff_first_ms: 500,
        backoff_max_ms: 20_000,
        deadline_ms: 120_000,
        ..RetryPolicy::default()
    }
}

/// A model by its alias (`[models.NAME]`), its key read from the environment.
pub fn build(alias: &str, config: &ModelConfig, secrets: &Secrets) -> Result<ModelEffect, String> {
    let what = format!("models.{alias}");
    let api: stephost_models::Api = config.api.parse().map_err(|e| format!("{what}.api: {e}"))?;
    config
        .prices
        .validate()
        .map_err(|e| format!("{what}.prices: {e}"))?;
    if config.max_tokens == 0 {
        return Err(format!("{what}.max_tokens must be at least 1"));
    }
    if config.concurrency_max == Some(0) {
        return Err(format!(
            "{what}.concurrency_max must be at least 1 (leave it out for no bound)"
        ));
    }
    if config.requests_per_minute == Some(0) || config.tokens_per_minute == Some(0) {
        return Err(format!(
            "{what}.requests_per_minute and tokens_per_minute must be at least 1 (leave them out \
             for no bound)"
        ));
    }
    let mut headers: Vec<(String, String)> = Vec::new();
    if let Some(var) = &config.key_env {
        let key = secrets
            .read(var)
            .map_err(|_| format!("{what}.key_env names {var}, which is not set"))?;
        match api {
            stephost_models::Api::AnthropicMessages => headers.push(("x-api-key".into(), key)),
            _ => headers.push(("authorization".into(), format!("Bearer {key}"))),
        }
    }
    if api == stephost_models::Api::AnthropicMessages
        && !config
            .headers
            .keys()
            .any(|h| h.eq_ignore_ascii_case("anthropic-version"))
    {
        headers.push(("anthropic-version".into(), "2023-06-01".into()));
    }
    headers.extend(config.headers.iter().map(|(k, v)| (k.clone(), v.clone())));
    let model = std::sync::Arc::new(Model::new(
        alias.to_string(),
        api,
        config.url.clone(),
        config.model.clone(),
        headers,
        config.prices,
        config.max_tokens,
        Duration::from_millis(config.timeout_ms),
        Duration::from_millis(config.retry.deadline_ms),
        stephost_core::flow::FlowCaps {
            concurrency_max: config.concurrency_max,
            requests_per_minute: config.requests_per_minute,
            tokens_per_minute: config.tokens_per_minute,
        },
    ));
    Ok(ModelEffect {
        effect: Effect {
            class: CallClass::Read,
            retry: config.retry.clone(),
            handler: Box::new(model.clone()),
            receipt_pointer: crate::handler::RECEIPT_OPERATION_POINTER.to_string(),
            redaction: None,
        },
        model,
    })
}

/// About how many tokens `bytes` of text hold (four bytes a token).
fn tokens_of(bytes: usize) -> u64 {
    (bytes / 4) as u64
}

/// The bytes of an answer's text and tool calls.
fn answer_bytes(response: &stephost_models::ChatResponse) -> usize {
    response
        .content
        .iter()
        .map(|part| match part {
            stephost_models::Part::Text { text } => text.len(),
            other => serde_json::to_string(other).map_or(0, |t| t.len()),
        })
        .sum()
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
