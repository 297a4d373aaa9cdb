//! `POST /api/promises/{token}`: another system completes a promise a run
//! made ([`stephost_core::promises`]). The token alone authorizes it (it is
//! a capability the run handed out, as a webhook's URL is), so the route
//! takes no bearer token; completions are limited to
//! `promise_completions_per_second_max` a second for the whole server, so
//! that no caller can try tokens at speed.

use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use stephost_core::promises::{self, Completed, Completion, PromiseError, PromiseState};

use crate::app::App;
use crate::errors::ApiError;

/// A completion: `resolve` with a JSON value, or `reject` with a message.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompleteBody {
    #[serde(default)]
    pub resolve: Option<serde_json::Value>,
    #[serde(default)]
    pub reject: Option<String>,
    /// Who completes it (kept with it); `webhook` if not given.
    #[serde(default)]
    pub by: Option<String>,
}

/// What a completion did.
#[derive(Debug, Serialize)]
pub struct CompleteAnswer {
    pub run_id: String,
    /// The promise's id in its run.
    pub promise: u64,
    /// `completed`, or `again`: it had been completed the same way.
    pub result: Completed,
    pub state: PromiseState,
}

/// Completions a second across the server: a window of one second.
#[derive(Default)]
pub struct Pace {
    window: Mutex<(i64, usize)>,
}

impl Pace {
    /// Whether one more completion fits in this second's `max`.
    fn admit(&self, max: usize) -> bool {
        let second = stephost_core::clock::now_ms() / 1000;
        let mut window = self.window.lock().unwrap_or_else(|p| p.into_inner());
        if window.0 != second {
            *window = (second, 0);
        }
        window.1 += 1;
        window.1 <= max
    }
}

pub async fn complete(
    State(app): State<Arc<App>>,
    path: Result<Path<String>, PathRejection>,
    body: Result<Json<CompleteBody>, JsonRejection>,
) -> Result<Json<CompleteAnswer>, ApiError> {
    if !app
        .promise_pace
        .admit(app.settings.promise_completions_per_second_max)
    {
        return Err(ApiError::new(
            429,
            "too_many_completions",
            format!(
                "more than promise_completions_per_second_max = {} promise completions this second",
                app.settings.promise_completions_per_second_max
            ),
            "retry after a second",
        ));
    }
    let (Path(token), Json(body)) = (path?, body?);
    let (state, value) = match (body.resolve, body.reject) {
        (Some(value), None) if !value.is_null() => (PromiseState::Resolved, value.to_string()),
        (None, Some(message)) => (PromiseState::Rejected, message),
        _ => {
            return Err(ApiError::bad_input(
                "a completion is {\"resolve\": VALUE} (any JSON but null) or {\"reject\": \
                 \"MESSAGE\"}, with an optional \"by\"",
            ));
        }
    };
    let completion = Completion {
        state,
        value,
        by: body.by.unwrap_or_else(|| "webhook".to_string()),
        at_ms: stephost_core::clock::now_ms(),
    };
    let signer = app.signer.clone();
    app.with_store(move |store| {
        let named = promises::verify(&signer, &token);
        let result = promises::complete(store, &signer, &token, &completion).map_err(refused)?;
        let (run_id, promise) = named.expect("a completed promise's token names it");
        Ok(Json(CompleteAnswer {
            run_id,
            promise,
            result,
            state: completion.state,
        }))
    })
    .await
}

/// A refused completion as the API answers it.
fn refused(e: PromiseError) -> ApiError {
    let message = e.to_string();
    match e {
        // No token is one this server can check: none names a promise here.
        PromiseError::NoKey => ApiError::new(
            404,
            "not_found",
            message,
            "start the server with the operator's key (STEPHOST_CHAIN_KEY_FILE)",
        ),
        PromiseError::NotFound => ApiError::not_found(message),
        PromiseError::Expired(_) => ApiError::new(
            409,
            "promise_expired",
            message,
            "the run has gone on without it; nothing is changed",
        ),
        PromiseError::Conflict(_) => ApiError::new(
            409,
            "promise_completed",
            message,
            "the first completion stands; send the same one again to check it",
        ),
        PromiseError::Store(e) => e.into(),
    }
}
