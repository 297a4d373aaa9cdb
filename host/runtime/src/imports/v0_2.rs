//! The `stephost:step@0.2.0` world: each 0.1.0 interface under its 0.2.0
//! name is served by the same code as in 0.1.0 (so a call records the same
//! row in either world); `models` is 0.2.0's own ([`crate::imports::models`]).

use crate::bindings::stephost::step as v1;
use crate::bindings::v0_2::stephost::step as v2;
use crate::bindings::{CallError, v0_2};
use crate::imports::StepState;

/// A 0.1.0 call error as 0.2.0 spells it.
pub fn call_error(e: CallError) -> v0_2::CallError {
    match e {
        CallError::Rejected(m) => v0_2::CallError::Rejected(m),
        CallError::Denied(m) => v0_2::CallError::Denied(m),
        CallError::Exhausted(m) => v0_2::CallError::Exhausted(m),
        CallError::Invalid(m) => v0_2::CallError::Invalid(m),
    }
}

/// The guest's view of a recorded outcome, in 0.2.0's spelling.
pub fn to_guest(outcome: stephost_core::journal::Outcome) -> Result<String, v0_2::CallError> {
    use stephost_core::journal::{CallErrorKind, Outcome};
    match outcome {
        Outcome::Err(e) if e.kind == CallErrorKind::Budget => {
            Err(v0_2::CallError::Budget(e.message))
        }
        other => crate::imports::effects::to_guest(other).map_err(call_error),
    }
}

type Answer = wasmtime::Result<Result<String, v0_2::CallError>>;

impl v2::types::Host for StepState {}

impl v2::effects::Host for StepState {
    fn call(&mut self, name: String, request: String, key: Option<String>) -> Answer {
        Ok(v1::effects::Host::call(self, name, request, key)?.map_err(call_error))
    }
}

impl v2::llm::Host for StepState {
    fn complete(&mut self, request: String) -> Answer {
        Ok(v1::llm::Host::complete(self, request)?.map_err(call_error))
    }
}

impl v2::models::Host for StepState {
    fn chat(&mut self, model: String, request: String) -> Answer {
        crate::imports::models::chat(self, &model, &request)
    }
}

impl v2::clock::Host for StepState {
    fn now(&mut self) -> wasmtime::Result<u64> {
        v1::clock::Host::now(self)
    }
}

impl v2::random::Host for StepState {
    fn get_bytes(&mut self, len: u32) -> wasmtime::Result<Vec<u8>> {
        v1::random::Host::get_bytes(self, len)
    }

    fn get_u64(&mut self) -> wasmtime::Result<u64> {
        v1::random::Host::get_u64(self)
    }
}

impl v2::log::Host for StepState {
    fn emit(&mut self, level: v2::log::Level, message: String) -> wasmtime::Result<()> {
        use v1::log::Level as L1;
        use v2::log::Level as L2;
        let level = match level {
            L2::Trace => L1::Trace,
            L2::Debug => L1::Debug,
            L2::Info => L1::Info,
            L2::Warn => L1::Warn,
            L2::Error => L1::Error,
        };
        v1::log::Host::emit(self, level, message)
    }
}

impl v2::timers::Host for StepState {
    fn sleep(&mut self, ms: u64) -> wasmtime::Result<()> {
        v1::timers::Host::sleep(self, ms)
    }
}

impl v2::approvals::Host for StepState {
    fn request(
        &mut self,
        subject: String,
        details: String,
        ttl_seconds: u64,
    ) -> wasmtime::Result<Result<v2::approvals::Decision, v0_2::CallError>> {
        use v1::approvals::Verdict as V1;
        use v2::approvals::Verdict as V2;
        let decided = v1::approvals::Host::request(self, subject, details, ttl_seconds)?;
        Ok(decided
            .map(|d| v2::approvals::Decision {
                verdict: match d.verdict {
                    V1::Approved => V2::Approved,
                    V1::Rejected => V2::Rejected,
                    V1::Expired => V2::Expired,
                },
                by: d.by,
                note: d.note,
                at_ms: d.at_ms,
            })
            .map_err(call_error))
    }
}
