//! The `stephost:step@0.3.0` world: each 0.2.0 interface under its 0.3.0
//! name is served by the same code as in 0.2.0 (so a call records the same
//! row in any world); `runs` is 0.3.0's own ([`crate::imports::runs`]).

use crate::bindings::v0_2::stephost::step as v2;
use crate::bindings::v0_3::stephost::step as v3;
use crate::bindings::{v0_2, v0_3};
use crate::imports::StepState;

/// A 0.2.0 call error as 0.3.0 spells it.
pub fn call_error(e: v0_2::CallError) -> v0_3::CallError {
    match e {
        v0_2::CallError::Rejected(m) => v0_3::CallError::Rejected(m),
        v0_2::CallError::Denied(m) => v0_3::CallError::Denied(m),
        v0_2::CallError::Exhausted(m) => v0_3::CallError::Exhausted(m),
        v0_2::CallError::Invalid(m) => v0_3::CallError::Invalid(m),
        v0_2::CallError::Budget(m) => v0_3::CallError::Budget(m),
    }
}

/// The guest's view of a recorded outcome, in 0.3.0's spelling.
pub fn to_guest(outcome: stephost_core::journal::Outcome) -> Result<String, v0_3::CallError> {
    crate::imports::v0_2::to_guest(outcome).map_err(call_error)
}

type Answer = wasmtime::Result<Result<String, v0_3::CallError>>;

impl v3::types::Host for StepState {}

impl v3::effects::Host for StepState {
    fn call(&mut self, name: String, request: String, key: Option<String>) -> Answer {
        Ok(v2::effects::Host::call(self, name, request, key)?.map_err(call_error))
    }
}

impl v3::llm::Host for StepState {
    fn complete(&mut self, request: String) -> Answer {
        Ok(v2::llm::Host::complete(self, request)?.map_err(call_error))
    }
}

impl v3::models::Host for StepState {
    fn chat(&mut self, model: String, request: String) -> Answer {
        Ok(v2::models::Host::chat(self, model, request)?.map_err(call_error))
    }
}

impl v3::clock::Host for StepState {
    fn now(&mut self) -> wasmtime::Result<u64> {
        v2::clock::Host::now(self)
    }
}

impl v3::random::Host for StepState {
    fn get_bytes(&mut self, len: u32) -> wasmtime::Result<Vec<u8>> {
        v2::random::Host::get_bytes(self, len)
    }

    fn get_u64(&mut self) -> wasmtime::Result<u64> {
        v2::random::Host::get_u64(self)
    }
}

impl v3::log::Host for StepState {
    fn emit(&mut self, level: v3::log::Level, message: String) -> wasmtime::Result<()> {
        use v2::log::Level as L2;
        use v3::log::Level as L3;
        let level = match level {
            L3::Trace => L2::Trace,
            L3::Debug => L2::Debug,
            L3::Info => L2::Info,
            L3::Warn => L2::Warn,
            L3::Error => L2::Error,
        };
        v2::log::Host::emit(self, level, message)
    }
}

impl v3::timers::Host for StepState {
    fn sleep(&mut self, ms: u64) -> wasmtime::Result<()> {
        v2::timers::Host::sleep(self, ms)
    }
}

impl v3::approvals::Host for StepState {
    fn request(
        &mut self,
        subject: String,
        details: String,
        ttl_seconds: u64,
    ) -> wasmtime::Result<Result<v3::approvals::Decision, v0_3::CallError>> {
        use v2::approvals::Verdict as V2;
        use v3::approvals::Verdict as V3;
        let decided = v2::approvals::Host::request(self, subject, details, ttl_seconds)?;
        Ok(decided
            .map(|d| v3::approvals::Decision {
                verdict: match d.verdict {
                    V2::Approved => V3::Approved,
                    V2::Rejected => V3::Rejected,
                    V2::Expired => V3::Expired,
                },
                by: d.by,
                note: d.note,
                at_ms: d.at_ms,
            })
            .map_err(call_error))
    }
}
