//! `stephost:step/llm`: completions through the configured model endpoint,
//! each a recorded read.

use crate::bindings::CallError;
use crate::bindings::stephost::step::llm::Host;
use crate::imports::StepState;
use crate::imports::effects::{Gated, gated_call};

pub const INTERFACE: &str = "stephost:step/llm";

impl Host for StepState {
    fn complete(&mut self, request: String) -> wasmtime::Result<Result<String, CallError>> {
        let effects = self.effects.clone();
        let call = Gated {
            interface: INTERFACE,
            function: "complete",
            effect: effects.llm(),
            class: None,
            request: &request,
            sent: None,
            key: None,
        };
        gated_call(self, &call, || {
            "no model endpoint is configured; add an [llm] section to stephost.toml".to_string()
        })
    }
}
