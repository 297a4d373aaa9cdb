//! The API's errors: JSON with a stable code, what happened and how to fix
//! it. HTTP statuses follow the CLI's exit codes: bad input 400, an unknown
//! run 404, a conflict or a run claimed elsewhere 409, a ledger that cannot
//! be reached 503, anything else 500.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use stephost_core::StoreError;
use stephost_runtime::{HostError, exit};

/// An error as the API answers it.
#[derive(Debug, Clone, Serialize, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ApiError {
    #[serde(skip)]
    pub status: u16,
    /// Stable: clients branch on it (see docs/api.md).
    pub code: &'static str,
    pub message: String,
    /// What to do about it.
    pub fix: String,
}

impl ApiError {
    pub fn new(status: u16, code: &'static str, message: impl Into<String>, fix: &str) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            fix: fix.to_string(),
        }
    }

    pub fn bad_input(message: impl Into<String>) -> Self {
        Self::new(
            400,
            "bad_input",
            message,
            "correct the request as the message says; /openapi.json describes every body",
        )
    }

    pub fn unauthorized() -> Self {
        Self::new(
            401,
            "unauthorized",
            "this request needs a bearer token",
            "send `Authorization: Bearer TOKEN` with a token from STEPHOST_API_TOKENS or \
             STEPHOST_API_TOKENS_FILE",
        )
    }

    pub fn forbidden(name: &str) -> Self {
        Self::new(
            403,
            "forbidden",
            format!("token {name:?} is read-only"),
            "use a token with the operator role to submit, decide or resolve",
        )
    }

    pub fn not_found(what: impl Into<String>) -> Self {
        Self::new(
            404,
            "not_found",
            what,
            "check the path; /openapi.json lists the API",
        )
    }

    /// A body over its limit (`json_body_bytes_max`, or
    /// `module_bytes_max` for a module upload).
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(
            413,
            "too_large",
            message,
            "send a smaller body: JSON bodies are limited to json_body_bytes_max (1 MiB by \
             default); upload a large module with POST /api/modules (module_bytes_max, 64 MiB) \
             and name it by module_digest",
        )
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            500,
            "internal",
            message,
            "retry; if it persists, see the server's log",
        )
    }
}

impl From<HostError> for ApiError {
    fn from(e: HostError) -> Self {
        let message = e.to_string();
        let (status, code, fix) = match &e {
            HostError::Ledger(StoreError::UnknownRun(_)) => (
                404,
                "unknown_run",
                "check the run id; GET /api/runs lists runs",
            ),
            HostError::Ledger(StoreError::UnknownModule(_)) => (
                404,
                "unknown_module",
                "upload the module first (POST /api/modules) or send its bytes",
            ),
            HostError::Ledger(StoreError::UnknownSchedule(_)) => (
                404,
                "unknown_schedule",
                "check the name; GET /api/schedules lists schedules",
            ),
            HostError::Ledger(StoreError::ScheduleExists(_)) => (
                409,
                "schedule_exists",
                "remove the schedule first, or add it under another name",
            ),
            HostError::ForkRefused(_) => (
                409,
                "fork_refused",
                "fork from a call before the one the message names, or settle that call first",
            ),
            HostError::Ledger(StoreError::NotDecidable { .. } | StoreError::NotUnknown { .. }) => (
                409,
                "not_decidable",
                "list the approvals or unknown calls again and decide on what they show",
            ),
            HostError::Ledger(StoreError::Ended { .. }) => (
                409,
                "run_ended",
                "the run has ended and nothing about it changes any more; submit a new run to go on",
            ),
            HostError::Ledger(StoreError::RunExists { .. }) => (
                409,
                "run_exists",
                "use another run id, or submit the same module and input to get the existing run",
            ),
            HostError::Ledger(StoreError::Unavailable(_)) => (
                503,
                "unavailable",
                "the ledger cannot be reached; retry once it is back",
            ),
            HostError::Integrity(_) => (
                409,
                "integrity",
                "the stored bytes do not match their digest; see the message",
            ),
            HostError::VersionMismatch(_) => (
                409,
                "diverged",
                "the module does not match the run's recording; see the message",
            ),
            _ => match e.exit_code() {
                exit::BAD_INPUT => (400, "bad_input", "correct the request as the message says"),
                exit::CLAIMED => (
                    409,
                    "conflict",
                    "another worker or person changed the run first; read it again and retry",
                ),
                _ => (
                    500,
                    "internal",
                    "retry; if it persists, see the server's log",
                ),
            },
        };
        ApiError::new(status, code, message, fix)
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        HostError::from(e).into()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, Json(self)).into_response()
    }
}

/// A body, path or query the API cannot read: `bad_input`, with what was
/// wrong, as JSON like every other error.
macro_rules! rejection {
    ($($rejection:ty),*) => {$(
        impl From<$rejection> for ApiError {
            fn from(e: $rejection) -> Self {
                if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                    return ApiError::too_large(e.body_text());
                }
                let mut error = ApiError::bad_input(e.body_text());
                if e.status() == axum::http::StatusCode::UNSUPPORTED_MEDIA_TYPE {
                    error.fix = "send the body as JSON with `Content-Type: application/json`".into();
                }
                error
            }
        }
    )*};
}

rejection!(
    axum::extract::rejection::BytesRejection,
    axum::extract::rejection::JsonRejection,
    axum::extract::rejection::PathRejection,
    axum::extract::rejection::QueryRejection
);
