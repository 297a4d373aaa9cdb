//! The model endpoint behind the `llm` import: an OpenAI-compatible
//! chat-completions API over [`HttpEffect`]. Each completion is a recorded
//! `read` committed durably before the step sees it (paid for: never asked
//! twice, whatever dies after it), so neither a resume nor a replay costs
//! tokens again; the response keeps the provider's `usage`, which
//! `stephost show` sums per run.

use crate::http::HttpEffect;
use std::time::Duration;

use serde::Deserialize;
use stephost_core::CallClass;

use crate::handler::{Effect, Failure, Handler, Reply, Request};
use crate::http::Statuses;
use crate::retry::RetryPolicy;
use crate::section::{Secrets, default_llm_timeout_ms};

pub struct Llm {
    pub http: HttpEffect,
    pub model: String,
}

impl Handler for Llm {
    fn perform(&self, request: &Request<'_>) -> Result<Reply, Failure> {
        let mut body: serde_json::Value = serde_json::from_str(request.body)
            .map_err(|e| Failure::Invalid(format!("the completion request is not JSON: {e}")))?;
        let Some(object) = body.as_object_mut() else {
            return Err(Failure::Invalid(
                "the completion request must be a JSON object (with `messages`)".into(),
            ));
        };
        object.insert("model".into(), self.model.clone().into());
        let text = body.to_string();
        self.http.perform(&Request {
            body: &text,
            ..*request
        })
    }

    fn idempotent(&self) -> bool {
        true
    }

    fn paid(&self) -> bool {
        true
    }
}

/// An OpenAI-compatible chat-completions endpoint.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmConfig {
    /// e.g. `https://api.openai.com/v1/chat/completions`
    pub url: String,
    /// Put into every request as `model`.
    pub model: String,
    /// The environment variable holding the API key (sent as a bearer token).
    pub api_key_env: Option<String>,
    #[serde(default = "default_llm_timeout_ms")]
    pub timeout_ms: u64,
    #[serde(default)]
    pub retry: RetryPolicy,
}

/// The `[llm]` endpoint, its key read from the environment.
pub fn build(llm: &LlmConfig, secrets: &Secrets) -> Result<Effect, String> {
    let mut headers = Vec::new();
    if let Some(var) = &llm.api_key_env {
        let key = secrets
            .read(var)
            .map_err(|_| format!("llm.api_key_env names {var}, which is not set"))?;
        headers.push(("Authorization".to_string(), format!("Bearer {key}")));
    }
    let http = HttpEffect::new(
        "POST",
        llm.url.clone(),
        headers,
        None,
        true,
        Duration::from_millis(llm.timeout_ms),
        Statuses::default(),
    )?;
    Ok(Effect {
        class: CallClass::Read,
        retry: llm.retry.clone(),
        handler: Box::new(Llm {
            http,
            model: llm.model.clone(),
        }),
        receipt_pointer: crate::handler::RECEIPT_OPERATION_POINTER.to_string(),
        redaction: None,
    })
}

/// Total tokens reported by a recorded completion response, if any.
pub fn total_tokens(response: &str) -> Option<u64> {
    let value: serde_json::Value = serde_json::from_str(response).ok()?;
    value.get("usage")?.get("total_tokens")?.as_u64()
}
