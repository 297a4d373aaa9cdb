//! Promises: a step waits for another system, which completes the promise
//! with a token the step hands it (the host's `promises` import,
//! stephost:step@0.3.0).

use std::time::{Duration, SystemTime};

use crate::bindings::stephost::step::promises;
use crate::ctx::effect_error;
use crate::{Ctx, EffectError};

/// A promise [`Ctx::promise`] made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Promise {
    /// Its id in the run, for [`Ctx::wait_promise`].
    pub id: u64,
    /// What completes it (`POST /api/promises/{token}` or `stephost
    /// complete TOKEN`): a secret whoever holds can use. Send it in a field
    /// the effect's `[redact]` covers, so the ledger keeps only its hash.
    pub token: String,
    /// When it expires.
    pub expires_at: SystemTime,
}

/// How a promise ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// Completed with this JSON value.
    Resolved(String),
    /// Rejected with this message.
    Rejected(String),
    /// Not completed before it expired.
    Expired,
}

impl Settled {
    /// A resolved promise's value, decoded; `None` if it was rejected or
    /// expired.
    ///
    /// # Errors
    /// A value that does not decode as `T`.
    pub fn value<T: serde::de::DeserializeOwned>(&self) -> Result<Option<T>, EffectError> {
        match self {
            Settled::Resolved(json) => {
                serde_json::from_str(json)
                    .map(Some)
                    .map_err(|e| EffectError::Decode {
                        effect: "promises.wait".to_owned(),
                        message: e.to_string(),
                    })
            }
            _ => Ok(None),
        }
    }
}

impl Ctx {
    /// Makes a promise named `name` that expires after `ttl` (a second at
    /// least): its id and the token that completes it. A resumed or
    /// replayed run gets the same token.
    ///
    /// # Errors
    /// `Denied` on a host without the operator's key.
    pub fn promise(&mut self, name: &str, ttl: Duration) -> Result<Promise, EffectError> {
        let made = promises::create(name, ttl.as_secs().max(1))
            .map_err(|e| effect_error("promises.create", e))?;
        Ok(Promise {
            id: made.id,
            token: made.token,
            expires_at: SystemTime::UNIX_EPOCH + Duration::from_millis(made.expires_at_ms),
        })
    }

    /// Waits, out of memory, until `promise` is completed or expires; one
    /// completed already ends the wait at once.
    ///
    /// # Errors
    /// `Invalid` for a promise this run did not make.
    pub fn wait_promise(&mut self, promise: &Promise) -> Result<Settled, EffectError> {
        Ok(
            match promises::wait(promise.id).map_err(|e| effect_error("promises.wait", e))? {
                promises::Settled::Resolved(json) => Settled::Resolved(json),
                promises::Settled::Rejected(message) => Settled::Rejected(message),
                promises::Settled::Expired => Settled::Expired,
            },
        )
    }
}
