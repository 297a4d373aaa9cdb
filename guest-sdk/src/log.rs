//! The run's log.
//!
//! Log lines are not ledger calls: the host writes them to the run's log and
//! marks them as replayed when a replay emits them again, so logging never
//! makes a replay diverge.
//!
//! ```no_run
//! stephost_guest::log::info("checking stock");
//! stephost_guest::log::warn(format_args!("short by {} units", 7));
//! ```

use crate::bindings::stephost::step::log as wit;
use std::fmt::Display;

/// How important a log line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Fine-grained detail.
    Trace,
    /// Detail for debugging.
    Debug,
    /// Normal progress.
    Info,
    /// Something unexpected that the step handled.
    Warn,
    /// Something failed.
    Error,
}

/// Writes `message` to the run's log at `level`.
pub fn emit(level: Level, message: impl Display) {
    let level = match level {
        Level::Trace => wit::Level::Trace,
        Level::Debug => wit::Level::Debug,
        Level::Info => wit::Level::Info,
        Level::Warn => wit::Level::Warn,
        Level::Error => wit::Level::Error,
    };
    wit::emit(level, &message.to_string());
}

/// Writes `message` to the run's log at [`Level::Trace`].
pub fn trace(message: impl Display) {
    emit(Level::Trace, message);
}

/// Writes `message` to the run's log at [`Level::Debug`].
pub fn debug(message: impl Display) {
    emit(Level::Debug, message);
}

/// Writes `message` to the run's log at [`Level::Info`].
pub fn info(message: impl Display) {
    emit(Level::Info, message);
}

/// Writes `message` to the run's log at [`Level::Warn`].
pub fn warn(message: impl Display) {
    emit(Level::Warn, message);
}

/// Writes `message` to the run's log at [`Level::Error`].
pub fn error(message: impl Display) {
    emit(Level::Error, message);
}
