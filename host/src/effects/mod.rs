//! Effects: the handlers behind `effects.call`, the retry loop that owns all
//! retries, and reconciliation of a call found in flight.
//!
//! Live I/O happens only in [`EffectCall`], which the journal invokes from its
//! one durable wrapper; nothing else reaches a handler.

pub mod builtin;
pub mod retry;

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::journal::{Attempts, CallErrorKind, LiveCall, OpContext, Outcome, Reconciled};
use crate::ledger::CallClass;

pub use retry::RetryPolicy;

/// Why a handler could not perform a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The receiver refused; retrying the same request will not help.
    Rejected(String),
    /// Timeouts, connection errors, overload: worth another attempt.
    Retryable(String),
    /// The request is not what the effect accepts.
    Invalid(String),
}

/// What a receiver says about an operation id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// Done; here is the receipt (the response the guest would have seen).
    Found(String),
    NotFound,
    /// This receiver cannot answer lookups.
    Unsupported,
}

/// What a handler is told about the operation it performs.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub run_id: &'a str,
    pub effect: &'a str,
    pub operation_id: &'a str,
    pub fence: i64,
    /// The guest's request, JSON text.
    pub body: &'a str,
}

/// A receiver of effect requests.
pub trait Handler: Send + Sync {
    fn perform(&self, request: &Request<'_>) -> Result<String, Failure>;

    /// Asks the receiver whether the operation already happened.
    fn lookup(&self, _request: &Request<'_>) -> Result<Lookup, Failure> {
        Ok(Lookup::Unsupported)
    }

    /// Whether the receiver deduplicates by operation id, so that a resend
    /// with the same id cannot cause a second effect.
    fn idempotent(&self) -> bool {
        false
    }
}

/// A configured effect.
pub struct Effect {
    pub class: CallClass,
    pub retry: RetryPolicy,
    pub handler: Box<dyn Handler>,
}

/// The effects granted to a step. Anything not named here is denied.
#[derive(Default, Clone)]
pub struct Effects {
    granted: Arc<BTreeMap<String, Effect>>,
}

impl Effects {
    pub fn new(granted: BTreeMap<String, Effect>) -> Self {
        Effects {
            granted: Arc::new(granted),
        }
    }

    pub fn get(&self, name: &str) -> Option<&Effect> {
        self.granted.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.granted.keys().map(String::as_str)
    }
}

/// One `effects.call` going through the journal.
pub struct EffectCall<'a> {
    pub effect: &'a Effect,
    pub name: &'a str,
    pub body: &'a str,
    /// Largest response recorded, in bytes.
    pub payload_bytes_max: usize,
    /// Wait between attempts; tests pass a no-op.
    pub sleep: &'a dyn Fn(std::time::Duration),
}

impl EffectCall<'_> {
    fn request<'r>(&'r self, op: &'r OpContext) -> Request<'r> {
        Request {
            run_id: &op.run_id,
            effect: self.name,
            operation_id: &op.operation_id,
            fence: op.fence,
            body: self.body,
        }
    }
}

impl LiveCall for EffectCall<'_> {
    fn perform(&mut self, op: &OpContext, attempts: &mut Attempts<'_>) -> Outcome {
        let policy = &self.effect.retry;
        let first = std::time::Instant::now();
        let max_attempts = policy.max_attempts.max(1);
        let mut n = 1;
        loop {
            let started = crate::clock::now_ms();
            let result = self.effect.handler.perform(&self.request(op));
            let (label, detail) = match &result {
                Ok(_) => ("ok", None),
                Err(Failure::Rejected(m)) => ("rejected", Some(m.as_str())),
                Err(Failure::Retryable(m)) => ("retryable", Some(m.as_str())),
                Err(Failure::Invalid(m)) => ("invalid", Some(m.as_str())),
            };
            attempts.record("send", started, label, detail);
            match result {
                Ok(response) if response.len() > self.payload_bytes_max => {
                    return Outcome::error(
                        CallErrorKind::Invalid,
                        format!(
                            "the receiver performed the request but its response is {} bytes; \
                             payload_bytes_max is {}",
                            response.len(),
                            self.payload_bytes_max
                        ),
                    );
                }
                Ok(response) => return Outcome::Ok(serde_json::Value::String(response)),
                Err(Failure::Rejected(m)) => return Outcome::error(CallErrorKind::Rejected, m),
                Err(Failure::Invalid(m)) => return Outcome::error(CallErrorKind::Invalid, m),
                Err(Failure::Retryable(m)) => {
                    let elapsed = first.elapsed().as_millis() as u64;
                    if n >= max_attempts || elapsed >= policy.deadline_ms {
                        return Outcome::error(
                            CallErrorKind::Exhausted,
                            format!("{n} attempt(s) failed; last: {m}"),
                        );
                    }
                    n += 1;
                    let entropy = (crate::clock::now_ns() % 1000) as f64 / 1000.0;
                    (self.sleep)(policy.backoff(n, entropy));
                }
            }
        }
    }

    fn reconcile(&mut self, op: &OpContext, attempts: &mut Attempts<'_>) -> Reconciled {
        if self.effect.class != CallClass::Write {
            return Reconciled::PerformAgain;
        }
        let idempotent = self.effect.handler.idempotent();
        let started = crate::clock::now_ms();
        match self.effect.handler.lookup(&self.request(op)) {
            Ok(Lookup::Found(receipt)) => {
                attempts.record("lookup", started, "found", None);
                Reconciled::Outcome(Outcome::Ok(serde_json::Value::String(receipt)))
            }
            Ok(Lookup::NotFound) if idempotent => {
                attempts.record("lookup", started, "not_found", None);
                Reconciled::PerformAgain
            }
            Ok(Lookup::NotFound) => {
                attempts.record("lookup", started, "not_found", None);
                Reconciled::Unknown(
                    "the receiver has no record of the operation but does not deduplicate, \
                     so resending could act twice"
                        .to_string(),
                )
            }
            Ok(Lookup::Unsupported) if idempotent => Reconciled::PerformAgain,
            Ok(Lookup::Unsupported) => Reconciled::Unknown(
                "the receiver offers no lookup and does not deduplicate".to_string(),
            ),
            Err(failure) => {
                let message = match failure {
                    Failure::Rejected(m) | Failure::Retryable(m) | Failure::Invalid(m) => m,
                };
                attempts.record("lookup", started, "error", Some(&message));
                if idempotent {
                    Reconciled::PerformAgain
                } else {
                    Reconciled::Unknown(format!("the lookup failed: {message}"))
                }
            }
        }
    }
}
