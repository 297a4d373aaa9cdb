//! Named crash points for crash-resume tests.
//!
//! Built only with the cargo feature `crash-points`. When the environment
//! variable `STEPHOST_CRASH_AT` names a point (`after-started`) or a point at
//! a sequence number (`after-started@3`), the process announces it on stderr
//! and aborts on the spot: no destructors run and nothing is flushed, as
//! with `kill -9`.

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
