//! The model endpoint behind the `llm` import: an OpenAI-compatible
//! chat-completions API over [`HttpEffect`]. Each completion is a recorded
//! `read` committed durably before the step sees it (paid for: never asked
//! twice, whatever dies after it), so neither a resume nor a replay costs
//! tokens again; the response keeps the provider's `usage`, which
//! `stephost show` sums per run.

use super::http::HttpEffect;
use super::{Failure, Handler, Reply, Request};

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

/// Total tokens reported by a recorded completion response, if any.
pub fn total_tokens(response: &str) -> Option<u64> {
    let value: serde_json::Value = serde_json::from_str(response).ok()?;
    value.get("usage")?.get("total_tokens")?.as_u64()
}
