//! Named crash points for crash-resume tests, and switches that break one
//! of the host's rules on purpose, to show that the fault-injection
//! harness catches a host that breaks it.
//!
//! Built only with the cargo feature `crash-points`. When the environment
//! variable `STEPHOST_CRASH_AT` names a point (`after-started`) or a point at
//! a sequence number (`after-started@3`), the process announces it on stderr
//! and aborts on the spot: no destructors run and nothing is flushed, as
//! with `kill -9`. When `STEPHOST_BREAK` names one of [`BREAKS`] (several,
//! separated by commas), the host breaks that rule.

/// The crash points, in the order a call passes them.
pub const POINTS: &[&str] = &[
    "after-claim",
    "after-started",
    "after-send",
    "after-outcome",
    "before-complete",
];

/// Aborts the process if `STEPHOST_CRASH_AT` names this point (and sequence
/// number, when it names one). A no-op in builds without `crash-points`.
#[inline]
pub fn point(name: &'static str, seq: u64) {
    #[cfg(feature = "crash-points")]
    {
        if let Ok(spec) = std::env::var("STEPHOST_CRASH_AT") {
            let (want, at) = match spec.split_once('@') {
                Some((p, s)) => (p.to_string(), s.parse::<u64>().ok()),
                None => (spec.clone(), None),
            };
            if want == name && at.is_none_or(|s| s == seq) {
                eprintln!("stephost: crash point {name}@{seq} fired");
                std::process::abort();
            }
        }
    }
    #[cfg(not(feature = "crash-points"))]
    {
        let _ = (name, seq);
    }
}

/// The rules a test build can be told to break (`STEPHOST_BREAK`):
/// - `send-before-started`: a write's request leaves before its `started`
///   row is durable (it is committed with the outcome);
/// - `doubt-as-failed`: a write whose outcome is in doubt is recorded as
///   rejected instead of `unknown`;
/// - `skip-fence`: a write's request carries no `Stephost-Fence`;
/// - `ask-model-again`: a model turn already answered is asked again as
///   its run resumes (the recorded answer is still the one used);
/// - `doubt-as-succeeded`: a write whose outcome is in doubt is recorded as
///   succeeded;
/// - `skip-budget`: a model call is sent whatever the run's budget;
/// - `begin-after-cancel`: a cancelled run's commits that begin something
///   are not refused;
/// - `drop-refused-record`: a commit refused because its run was cancelled
///   drops what it recorded of calls already made;
/// - `lose-wake-up`: a waiting run is never due by its wake time (a timer
///   or an expiry wakes nobody; an arrival still does);
/// - `start-child-again`: a resumed parent replaying a recorded start
///   starts another child for it as well (the recorded one is still the
///   one it joins);
/// - `not-found-as-failed`: a write in doubt whose receiver's lookup finds
///   no record of it yet is recorded failed (the rule before a receiver
///   committing late was known to make that no proof);
/// - `budget-replayed-as-other`: a model call's recorded budget refusal is
///   given back to the step as `exhausted` when replayed (live, it is
///   `budget`);
/// - `resend-with-another-key`: a write sent again after a failed attempt
///   carries another operation id (as a host that keyed each attempt).
pub const BREAKS: &[&str] = &[
    "send-before-started",
    "doubt-as-failed",
    "skip-fence",
    "ask-model-again",
    "doubt-as-succeeded",
    "skip-budget",
    "begin-after-cancel",
    "drop-refused-record",
    "lose-wake-up",
    "start-child-again",
    "not-found-as-failed",
    "budget-replayed-as-other",
    "resend-with-another-key",
];

/// Whether `STEPHOST_BREAK` tells this process to break rule `name` (one
/// of [`BREAKS`]). Always false in builds without `crash-points`.
#[inline]
pub fn broken(name: &'static str) -> bool {
    debug_assert!(BREAKS.contains(&name), "unknown break {name}");
    #[cfg(feature = "crash-points")]
    {
        std::env::var("STEPHOST_BREAK").is_ok_and(|v| v.split(',').any(|b| b.trim() == name))
    }
    #[cfg(not(feature = "crash-points"))]
    {
        false
    }
}
