//! `stephost:step/effects`: the single gate for side effects.

use crate::bindings::CallError;
use crate::bindings::stephost::step::effects::Host;
use crate::effects::{Effect, EffectCall};
use crate::imports::{StepState, lock, trap};
use crate::journal::{CallErrorKind, CallSpec, Compute, Outcome};
use crate::ledger::CallClass;

pub const INTERFACE: &str = "stephost:step/effects";

/// Longest business key accepted, in bytes.
pub const KEY_BYTES_MAX: usize = 1024;

impl Host for StepState {
    fn call(
        &mut self,
        name: String,
        request: String,
        key: Option<String>,
    ) -> wasmtime::Result<Result<String, CallError>> {
        let effects = self.effects.clone();
        gated_call(
            self,
            INTERFACE,
            &name,
            effects.get(&name),
            &request,
            key.as_deref(),
            || {
                format!(
                    "effect `{name}` is not granted to this step; grant it with \
                     [effects.\"{name}\"] in stephost.toml"
                )
            },
        )
    }
}

/// One call through a configured effect (or its refusal), recorded by the
/// journal. Shared by `effects.call` and `llm.complete`.
pub fn gated_call(
    state: &mut StepState,
    interface: &str,
    function: &str,
    effect: Option<&Effect>,
    request: &str,
    key: Option<&str>,
    denied: impl FnOnce() -> String,
) -> wasmtime::Result<Result<String, CallError>> {
    let mut journal = lock(&state.journal);
    let max = journal.limits().payload_bytes_max as usize;
    // A request refused before it is sent is still a recorded call: the
    // guest saw the refusal and replay must show it again.
    let refusal = if request.len() > max {
        Some(Outcome::error(
            CallErrorKind::Invalid,
            format!(
                "request is {} bytes; payload_bytes_max is {max}",
                request.len()
            ),
        ))
    } else if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(request) {
        Some(Outcome::error(
            CallErrorKind::Invalid,
            format!("request is not JSON: {e}"),
        ))
    } else if key.is_some_and(|k| k.len() > KEY_BYTES_MAX) {
        Some(Outcome::error(
            CallErrorKind::Invalid,
            format!("business key is longer than {KEY_BYTES_MAX} bytes"),
        ))
    } else if effect.is_none() {
        Some(Outcome::error(CallErrorKind::Denied, denied()))
    } else {
        None
    };
    let outcome = match (refusal, effect) {
        (None, Some(effect)) => {
            let spec = CallSpec {
                class: effect.class,
                interface,
                function,
                request,
                key,
            };
            let mut call = EffectCall {
                effect,
                name: function,
                body: request,
                payload_bytes_max: max,
                sleep: &state.sleep,
                unknown: None,
            };
            journal.call(&spec, &mut call)
        }
        (refusal, _) => {
            let outcome = refusal.unwrap_or_else(|| {
                Outcome::error(CallErrorKind::Denied, format!("{function} is not granted"))
            });
            // Too-large requests are recorded by size only.
            let recorded = if request.len() > max {
                format!("{{\"stephost_request_bytes\":{}}}", request.len())
            } else {
                request.to_string()
            };
            let spec = CallSpec {
                class: CallClass::Observe,
                interface,
                function,
                request: &recorded,
                key,
            };
            journal.call(&spec, &mut Compute(|| outcome.clone()))
        }
    }
    .map_err(trap)?;
    Ok(to_guest(outcome))
}

/// The guest's view of a recorded outcome.
pub fn to_guest(outcome: Outcome) -> Result<String, CallError> {
    match outcome {
        Outcome::Ok(serde_json::Value::String(s)) => Ok(s),
        Outcome::Ok(other) => Ok(other.to_string()),
        Outcome::Err(e) => Err(match e.kind {
            CallErrorKind::Rejected => CallError::Rejected(e.message),
            CallErrorKind::Denied => CallError::Denied(e.message),
            CallErrorKind::Exhausted => CallError::Exhausted(e.message),
            CallErrorKind::Invalid => CallError::Invalid(e.message),
        }),
    }
}
