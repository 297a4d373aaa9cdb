//! `stephost:step/log`: written to the run's log, not a ledger call.

use crate::bindings::stephost::step::log::{Host, Level};
use crate::imports::{StepState, lock, trap};

pub fn level_name(level: Level) -> &'static str {
    match level {
        Level::Trace => "trace",
        Level::Debug => "debug",
        Level::Info => "info",
        Level::Warn => "warn",
        Level::Error => "error",
    }
}

impl Host for StepState {
    fn emit(&mut self, level: Level, message: String) -> wasmtime::Result<()> {
        lock(&self.journal)
            .log(level_name(level), &message)
            .map_err(trap)
    }
}
