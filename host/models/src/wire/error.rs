//! Why a body could not be built or a reply could not be read.

use crate::api::Api;
use crate::errors::{ErrorKind, ProviderError};
use crate::sse::SseError;

/// A mapping or parsing failure of one wire format.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WireError {
    /// The neutral request cannot be sent as it is (it failed `validate`, or this API cannot
    /// express it, such as tool arguments that are not a JSON object for Anthropic).
    #[error("{api}: invalid request: {message}")]
    InvalidRequest {
        /// The target API.
        api: Api,
        /// What is wrong and where.
        message: String,
    },
    /// The API has no such feature (`stop` on `openai-responses`).
    #[error("{api}: `{field}` is not supported: {message}")]
    Unsupported {
        /// The target API.
        api: Api,
        /// The neutral field.
        field: &'static str,
        /// What to do instead.
        message: String,
    },
    /// A `raw` key collides with a field the mapping owns.
    #[error(
        "{api}: raw key `{key}` collides with a field the mapping sets; use the neutral field instead"
    )]
    RawCollision {
        /// The target API.
        api: Api,
        /// The refused key.
        key: String,
    },
    /// The provider's reply is not the documented shape.
    #[error("{api}: malformed reply: {message}")]
    Malformed {
        /// The API.
        api: Api,
        /// What was expected.
        message: String,
    },
    /// The stream ended before its terminal event: a failed attempt, retryable.
    #[error("{api}: stream ended before its terminal event ({expected})")]
    Cut {
        /// The API.
        api: Api,
        /// The terminal event that never came.
        expected: &'static str,
    },
    /// The SSE framing is broken (event too large, not UTF-8).
    #[error("stream framing: {0}")]
    Sse(#[from] SseError),
    /// The provider reported an error (inside a stream, or a failed Responses reply).
    #[error("{0}")]
    Provider(ProviderError),
}

impl WireError {
    /// Whether trying the same call again may succeed.
    pub fn retryable(&self) -> bool {
        match self {
            WireError::Cut { .. } => true,
            WireError::Provider(e) => e.retryable,
            _ => false,
        }
    }

    /// The error as the host records it: request problems are final `invalid_request` or
    /// `unsupported`, a cut stream is retryable `transport`, a malformed reply is final `server`.
    pub fn to_provider_error(&self) -> ProviderError {
        let kind = match self {
            WireError::Provider(e) => return e.clone(),
            WireError::Cut { .. } => return ProviderError::transport(self.to_string()),
            WireError::InvalidRequest { .. } | WireError::RawCollision { .. } => {
                ErrorKind::InvalidRequest
            }
            WireError::Unsupported { .. } => ErrorKind::Unsupported,
            WireError::Malformed { .. } => ErrorKind::Server,
            WireError::Sse(SseError::TooLarge { .. }) => ErrorKind::TooLarge,
            WireError::Sse(SseError::Utf8 { .. }) => ErrorKind::Server,
        };
        ProviderError::local(kind, self.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_is_retryable_transport_and_request_errors_are_final() {
        let cut = WireError::Cut {
            api: Api::AnthropicMessages,
            expected: "message_stop",
        };
        assert!(cut.retryable());
        let e = cut.to_provider_error();
        assert_eq!((e.kind, e.retryable), (ErrorKind::Transport, true));
        assert!(e.message.contains("message_stop"));
        let unsupported = WireError::Unsupported {
            api: Api::OpenAiResponses,
            field: "stop",
            message: "x".into(),
        };
        assert!(!unsupported.retryable());
        assert_eq!(unsupported.to_provider_error().kind, ErrorKind::Unsupported);
        let raw = WireError::RawCollision {
            api: Api::OpenAiChat,
            key: "model".into(),
        };
        assert_eq!(raw.to_provider_error().kind, ErrorKind::InvalidRequest);
        let big = WireError::Sse(SseError::TooLarge { event_bytes_max: 1 });
        assert_eq!(big.to_provider_error().kind, ErrorKind::TooLarge);
    }
}
