//! Metrics in the Prometheus text format, from counters kept in the ledger
//! (so they survive restarts) and gauges read from it.

use std::fmt::Write as _;

use crate::ledger::{Ledger, LedgerError, RunStatus};

/// Every counter stephost keeps, with its help text.
pub const COUNTERS: &[(&str, &str)] = &[
    (
        "side_effect_unknown_total",
        "Calls whose outcome could not be established and were parked as unknown.",
    ),
    (
        "reconciliation_total",
        "Calls found started without an outcome and reconciled on resume.",
    ),
    (
        "idempotency_key_hit_total",
        "Writes the receiver reported as duplicates of an operation id it had seen.",
    ),
    (
        "side_effect_duplicate_prevented_total",
        "Recorded write outcomes served on resume instead of sending again.",
    ),
    (
        "activity_retry_total",
        "Retries of retryable failures (attempts after the first).",
    ),
    ("retry_exhausted_total", "Calls whose retry policy ran out."),
    (
        "non_retryable_failure_total",
        "Calls that failed with a rejection or an invalid request.",
    ),
    (
        "replayed_step_total",
        "Executions that replayed a recorded prefix (resumes).",
    ),
];

/// Renders all metrics.
pub fn render(ledger: &dyn Ledger) -> Result<String, LedgerError> {
    let stored = ledger.counters()?;
    let mut out = String::new();
    for (name, help) in COUNTERS {
        let value = stored
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| *v)
            .unwrap_or(0);
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
        );
    }
    let runs = ledger.runs(None)?;
    let _ = writeln!(
        out,
        "# HELP stephost_runs Runs in the ledger by status.\n# TYPE stephost_runs gauge"
    );
    for status in [
        RunStatus::Running,
        RunStatus::Completed,
        RunStatus::Failed,
        RunStatus::Parked,
        RunStatus::Diverged,
    ] {
        let n = runs.iter().filter(|r| r.status == status).count();
        let _ = writeln!(out, "stephost_runs{{status=\"{}\"}} {n}", status.as_str());
    }
    Ok(out)
}
