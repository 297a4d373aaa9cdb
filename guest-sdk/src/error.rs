//! Errors a step deals with.

use std::fmt;

/// Why an effect call did not give a response the step can use.
///
/// The first five kinds come from the host (it has already retried what was
/// retryable); [`EffectError::Encode`] and [`EffectError::Decode`] are raised
/// in the step when the request or the response is not the JSON its Rust type
/// describes. Every variant names the effect (for a model call,
/// `models.ALIAS`) and carries a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EffectError {
    /// The receiver refused the request; retrying the same request will not help.
    Rejected {
        /// The effect's name.
        effect: String,
        /// The receiver's reason.
        message: String,
    },
    /// The effect is not granted to this step by the host configuration.
    Denied {
        /// The effect's name.
        effect: String,
        /// The host's reason.
        message: String,
    },
    /// The effect failed in a retryable way and the host's retry policy is used up.
    Exhausted {
        /// The effect's name.
        effect: String,
        /// The last failure.
        message: String,
    },
    /// The host found the request malformed: not JSON, too large, or not what
    /// the effect accepts.
    Invalid {
        /// The effect's name.
        effect: String,
        /// What is wrong with the request.
        message: String,
    },
    /// The call was not sent: it would take the run past its budget (model
    /// tokens or cost, `[limits]` in `stephost.toml`). Nothing was spent; the
    /// refusal is recorded, so a replay sees it again.
    Budget {
        /// The effect's name (`models.ALIAS` for a model call).
        effect: String,
        /// What the run has spent and what the call might have added.
        message: String,
    },
    /// The request could not be encoded as JSON; it was not sent.
    Encode {
        /// The effect's name.
        effect: String,
        /// The encoder's message.
        message: String,
    },
    /// The effect answered, but its response did not decode into the expected
    /// type. The call is recorded as answered: replay gives the same response.
    Decode {
        /// The effect's name.
        effect: String,
        /// The decoder's message.
        message: String,
    },
}

impl EffectError {
    /// The name of the effect that was called.
    pub fn effect(&self) -> &str {
        match self {
            EffectError::Rejected { effect, .. }
            | EffectError::Denied { effect, .. }
            | EffectError::Exhausted { effect, .. }
            | EffectError::Invalid { effect, .. }
            | EffectError::Budget { effect, .. }
            | EffectError::Encode { effect, .. }
            | EffectError::Decode { effect, .. } => effect,
        }
    }

    /// The message that came with the error.
    pub fn message(&self) -> &str {
        match self {
            EffectError::Rejected { message, .. }
            | EffectError::Denied { message, .. }
            | EffectError::Exhausted { message, .. }
            | EffectError::Invalid { message, .. }
            | EffectError::Budget { message, .. }
            | EffectError::Encode { message, .. }
            | EffectError::Decode { message, .. } => message,
        }
    }
}

impl fmt::Display for EffectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self {
            EffectError::Rejected { .. } => "rejected the request",
            EffectError::Denied { .. } => "is denied",
            EffectError::Exhausted { .. } => "failed and its retries are used up",
            EffectError::Invalid { .. } => "got an invalid request",
            EffectError::Budget { .. } => "was not called: it would pass the run's budget",
            EffectError::Encode { .. } => "request could not be encoded as JSON",
            EffectError::Decode { .. } => "response did not decode",
        };
        write!(f, "effect `{}` {what}: {}", self.effect(), self.message())
    }
}

impl std::error::Error for EffectError {}

/// A step's error: a message for the person reading the run.
///
/// Converts from [`EffectError`], [`serde_json::Error`], `String` and `&str`,
/// so `?` works on those in a step function; build one from anything
/// printable with [`Error::msg`] or return early with [`bail!`](crate::bail).
/// One made from an [`EffectError`] keeps it: [`Error::effect_error`] tells,
/// for example, a budget refusal from other failures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    message: String,
    effect: Option<EffectError>,
}

impl Error {
    /// An error with the given message.
    pub fn msg(message: impl fmt::Display) -> Self {
        Error {
            message: message.to_string(),
            effect: None,
        }
    }

    /// The error's message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The effect error this error was made from, if it was made from one.
    ///
    /// ```
    /// # use stephost_guest::{EffectError, Error};
    /// let e = Error::from(EffectError::Budget { effect: "models.support".into(), message: "over".into() });
    /// assert!(matches!(e.effect_error(), Some(EffectError::Budget { .. })));
    /// assert_eq!(Error::msg("plain").effect_error(), None);
    /// ```
    pub fn effect_error(&self) -> Option<&EffectError> {
        self.effect.as_ref()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl From<EffectError> for Error {
    fn from(e: EffectError) -> Self {
        Error {
            message: e.to_string(),
            effect: Some(e),
        }
    }
}

impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error::msg(format_args!("JSON: {e}"))
    }
}

impl From<String> for Error {
    fn from(message: String) -> Self {
        Error {
            message,
            effect: None,
        }
    }
}

impl From<&str> for Error {
    fn from(message: &str) -> Self {
        Error::msg(message)
    }
}
