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
        "Executions that replayed a recorded prefix.",
    ),
    (
        "workflow_resume_total",
        "Executions of a run that already had recorded calls (resumes).",
    ),
    (
        "claim_conflict_total",
        "Claims lost to another claimant (compare-and-set conflicts).",
    ),
    (
        "lease_loss_total",
        "Claims whose lease could not be renewed (the run was stopped).",
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
        RunStatus::Pending,
        RunStatus::Running,
        RunStatus::Completed,
        RunStatus::Failed,
        RunStatus::Parked,
        RunStatus::Diverged,
    ] {
        let n = runs.iter().filter(|r| r.status == status).count();
        let _ = writeln!(out, "stephost_runs{{status=\"{}\"}} {n}", status.as_str());
    }
    let now = crate::clock::now_ms();
    let active = runs
        .iter()
        .filter(|r| r.status == RunStatus::Running && r.lease_until_ms.is_some_and(|t| t > now))
        .count();
    let oldest = runs
        .iter()
        .filter(|r| {
            r.status == RunStatus::Pending
                || (r.status == RunStatus::Running && r.lease_until_ms.is_none_or(|t| t <= now))
        })
        .map(|r| r.created_at_ms)
        .min()
        .map(|t| (now - t).max(0) as f64 / 1000.0)
        .unwrap_or(0.0);
    let _ = writeln!(
        out,
        "# HELP stephost_active_runs Runs held under a live lease.\n# TYPE stephost_active_runs gauge\nstephost_active_runs {active}"
    );
    let _ = writeln!(
        out,
        "# HELP stephost_oldest_runnable_age_seconds Age of the oldest run waiting for a worker.\n# TYPE stephost_oldest_runnable_age_seconds gauge\nstephost_oldest_runnable_age_seconds {oldest:.3}"
    );
    Ok(out)
}
