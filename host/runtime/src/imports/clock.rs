//! `stephost:step/clock`.

use crate::bindings::stephost::step::clock::Host;
use crate::imports::{StepState, as_u64, observe, trap};

pub const INTERFACE: &str = "stephost:step/clock";

impl Host for StepState {
    fn now(&mut self) -> wasmtime::Result<u64> {
        let value = observe(&self.journal, INTERFACE, "now", "", || {
            stephost_core::clock::now_ns().into()
        })
        .map_err(trap)?;
        as_u64(&value, "clock.now").map_err(|s| self.fail(s))
    }
}
