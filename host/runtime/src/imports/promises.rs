//! `stephost:step/promises` (0.3.0): a run waits for another system
//! ([`stephost_core::promises`]).
//!
//! - `create` is an observe call recording `{"expires_at_ms"}`; the token
//!   is made from the call under the operator's key each time the call is
//!   gone through (live or replayed), never recorded.
//! - `wait` looks for the promise's completion: found at once, it is
//!   recorded as an observe call (as a join that finds a child's end);
//!   otherwise it is a suspend call, recorded `started`, and the run
//!   leaves memory until the completion lands in its inbox (which makes it
//!   due) or the promise expires (a timer).

use std::collections::HashMap;

use serde_json::{Value, json};
use stephost_core::CallClass;
use stephost_core::journal::{
    Attempts, CallErrorKind, CallSpec, Compute, LiveCall, OpContext, Outcome, Performed, Stop, Wait,
};
use stephost_core::promises::{self, INTERFACE};

use crate::bindings::v0_3::CallError;
use crate::bindings::v0_3::stephost::step::promises::{Host, Promise, Settled};
use crate::imports::runs::{ChildSteps, guest};
use crate::imports::{StepState, lock, trap};

/// The promises a run made, by id: when each expires (learnt from its
/// calls, recorded or live, so the same in every execution).
#[derive(Default)]
pub struct PromisesState {
    made: HashMap<u64, i64>,
}

fn create(state: &mut StepState, name: &str, ttl_seconds: u64) -> Result<Outcome, Stop> {
    let keyed = state.signer.mac_key().is_some();
    let request = json!({ "name": name, "ttl_seconds": ttl_seconds }).to_string();
    let spec = CallSpec {
        class: CallClass::Observe,
        interface: INTERFACE,
        function: "create",
        request: &request,
        key: None,
        paid: false,
        redact: None,
    };
    let ttl_ms = i64::try_from(ttl_seconds.saturating_mul(1000)).unwrap_or(i64::MAX);
    let mut journal = lock(&state.journal);
    let outcome = journal.call(
        &spec,
        &mut Compute(|| {
            if !keyed {
                return Outcome::error(
                    CallErrorKind::Denied,
                    "promises need the operator's key, which makes their tokens; this host has \
                     none (STEPHOST_CHAIN_KEY_FILE)",
                );
            }
            if ttl_seconds == 0 {
                return Outcome::error(CallErrorKind::Invalid, "ttl-seconds must be at least 1");
            }
            let now = stephost_core::clock::now_ms();
            Outcome::Ok(json!({ "expires_at_ms": now.saturating_add(ttl_ms) }))
        }),
    )?;
    let id = journal.calls_made();
    drop(journal);
    if let Outcome::Ok(value) = &outcome {
        let expires = value
            .get("expires_at_ms")
            .and_then(Value::as_i64)
            .ok_or_else(|| Stop::Corrupt(format!("a recorded promise has no expiry: {value}")))?;
        state.promises.made.insert(id, expires);
    }
    Ok(outcome)
}

/// A wait on a promise: its completion, from the run's own row of it.
struct Awaited<'a> {
    steps: Option<&'a ChildSteps>,
    id: u64,
    expires_at_ms: i64,
    /// The arrivals the run's inbox had when the wait last looked.
    seen: Option<u64>,
}

impl Awaited<'_> {
    fn find(&mut self, run_id: &str) -> Result<Option<Outcome>, String> {
        let Some(steps) = self.steps else {
            return Err("this host keeps no promises".into());
        };
        let store = steps.store();
        // What the inbox held before the look: a completion after it makes
        // the run due even if it lands before the run's wait is committed.
        self.seen = Some(store.inbox(run_id).map_err(|e| e.to_string())?.len() as u64);
        let found = store.promise(run_id, self.id).map_err(|e| e.to_string())?;
        Ok(found.map(|c| c.outcome()))
    }
}

impl LiveCall for Awaited<'_> {
    fn perform(&mut self, _op: &OpContext<'_>, _attempts: &mut Attempts<'_>) -> Performed {
        Outcome::error(
            CallErrorKind::Invalid,
            "a promise is completed by another system",
        )
        .into()
    }

    fn wait(&mut self, op: &OpContext<'_>, _started_at_ms: i64) -> Wait {
        match self.find(op.run_id) {
            Ok(Some(outcome)) => Wait::Ready(outcome),
            Ok(None) => {
                let now = stephost_core::clock::now_ms();
                if now >= self.expires_at_ms {
                    return Wait::Ready(promises::expired(now));
                }
                Wait::Until {
                    wake_at_ms: Some(self.expires_at_ms),
                    reason: format!(
                        "waiting for promise {} to be completed (expires {})",
                        self.id,
                        stephost_core::clock::format_time(self.expires_at_ms)
                    ),
                }
            }
            Err(e) => Wait::Ready(Outcome::error(CallErrorKind::Exhausted, e)),
        }
    }
}

fn wait(state: &mut StepState, id: u64) -> Result<Outcome, Stop> {
    let steps = state.children.clone();
    let request = json!({ "id": id }).to_string();
    let mut journal = lock(&state.journal);
    let spec = |class| CallSpec {
        class,
        interface: INTERFACE,
        function: "wait",
        request: &request,
        key: None,
        paid: false,
        redact: None,
    };
    let Some(&expires_at_ms) = state.promises.made.get(&id) else {
        let refused = Outcome::error(
            CallErrorKind::Invalid,
            format!("this run created no promise {id}"),
        );
        return journal.call(&spec(CallClass::Observe), &mut Compute(|| refused.clone()));
    };
    let mut live = Awaited {
        steps: steps.as_deref(),
        id,
        expires_at_ms,
        seen: None,
    };
    // Completed before the wait: recorded as an observe call, with no
    // fsync of its own (a process that dies first finds it again).
    let ready = if journal.next_goes_live() {
        let run_id = journal.run_id().to_string();
        live.find(&run_id).ok().flatten()
    } else {
        None
    };
    let outcome = match ready {
        Some(found) => journal.call(&spec(CallClass::Observe), &mut Compute(|| found.clone())),
        None => stephost_effects::blocking(|| journal.call(&spec(CallClass::Suspend), &mut live)),
    };
    if let (Err(Stop::Suspended { .. }), Some(seen)) = (&outcome, live.seen) {
        journal.await_inbox(seen);
    }
    outcome
}

fn settled(value: &Value) -> Result<Settled, Stop> {
    let corrupt = || Stop::Corrupt(format!("a recorded wait is not a promise's end: {value}"));
    let text = || {
        value
            .get("value")
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(corrupt)
    };
    match value.get("state").and_then(Value::as_str) {
        Some("resolved") => Ok(Settled::Resolved(text()?)),
        Some("rejected") => Ok(Settled::Rejected(text()?)),
        Some("expired") => Ok(Settled::Expired),
        _ => Err(corrupt()),
    }
}

impl Host for StepState {
    fn create(
        &mut self,
        name: String,
        ttl_seconds: u64,
    ) -> wasmtime::Result<Result<Promise, CallError>> {
        let outcome = create(self, &name, ttl_seconds).map_err(trap)?;
        let id = lock(&self.journal).calls_made();
        let run_id = lock(&self.journal).run_id().to_string();
        let signer = self.signer.clone();
        guest(self, outcome, |v| {
            let expires_at_ms = v.get("expires_at_ms").and_then(Value::as_u64).unwrap_or(0);
            let token = promises::token(&signer, &run_id, id).ok_or_else(|| {
                Stop::Limit(
                    "the run made a promise under the operator's key, and this host has none \
                         to make its token again (STEPHOST_CHAIN_KEY_FILE)"
                        .into(),
                )
            })?;
            Ok(Promise {
                id,
                token,
                expires_at_ms,
            })
        })
    }

    fn wait(&mut self, id: u64) -> wasmtime::Result<Result<Settled, CallError>> {
        let outcome = wait(self, id).map_err(trap)?;
        guest(self, outcome, settled)
    }
}
