//! Metrics in the Prometheus text format, from counters kept in the ledger
//! (so they survive restarts) and gauges read from it.

use std::fmt::Write as _;

use stephost_core::lifecycle;
use stephost_core::store::RunQuery;
use stephost_core::{RunStatus, StoreError, Views};

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
        "workflow_version_mismatch_total",
        "Upgrades refused because the new module diverged from a run's history.",
    ),
    (
        "approvals_decided_total",
        "Approvals decided by a person (approved or rejected).",
    ),
    (
        "approvals_expired_total",
        "Approvals that expired before anyone decided.",
    ),
    (
        "children_started_total",
        "Child runs started by runs (runs.start), each once.",
    ),
    (
        "schedule_runs_fired_total",
        "Runs recorded for schedules' slots, each once whatever the number of workers.",
    ),
    (
        "schedule_slots_skipped_total",
        "Schedules' slots passed over: missed by more than the catch-up window, or skipped while the last firing's run was unfinished.",
    ),
    (
        "lease_loss_total",
        "Claims whose lease could not be renewed (the run was stopped).",
    ),
    (
        "runs_pruned_total",
        "Finished runs deleted by retention or `stephost prune`, children included.",
    ),
    (
        "pruned_bytes_total",
        "Bytes of ledger rows deleted with them (bodies, payload parts, log lines, modules, notices).",
    ),
    (
        "integrity_refusal_total",
        "Runs a worker did not claim, or stopped, because their record does not verify against the chain key (counted when the worker exits).",
    ),
    (
        "group_commit_commit_total",
        "Commits of runs handed to a worker's group committer (counted when the worker exits).",
    ),
    (
        "group_commit_transaction_total",
        "Transactions a worker's group committer applied them in.",
    ),
    (
        "group_commit_fsync_total",
        "Fsyncs of the WAL a worker's group committer made: commits per fsync is how many share one.",
    ),
];

/// Upper bounds (seconds) of the resume-latency histogram buckets.
pub const RESUME_BUCKETS: &[(f64, &str)] = &[
    (0.005, "resume_latency_le_5ms"),
    (0.025, "resume_latency_le_25ms"),
    (0.1, "resume_latency_le_100ms"),
    (0.5, "resume_latency_le_500ms"),
    (2.5, "resume_latency_le_2500ms"),
    (f64::INFINITY, "resume_latency_le_inf"),
];

/// The counters to add for one resume that reached its first live call
/// after `latency`.
pub fn resume_latency(
    latency: std::time::Duration,
    counters: &mut stephost_core::journal::Counters,
) {
    let secs = latency.as_secs_f64();
    if let Some((_, name)) = RESUME_BUCKETS.iter().find(|(le, _)| secs <= *le) {
        *counters.entry(name).or_insert(0) += 1;
    }
    *counters.entry("resume_latency_sum_us").or_insert(0) += latency.as_micros() as i64;
}

/// Counter families of model calls, labelled by model alias, with their
/// help text and the divisor their stored integer is rendered with.
const MODEL_FAMILIES: &[(&str, &str, f64)] = &[
    (
        "stephost_model_tokens_total",
        "Tokens of live model calls, by model alias and kind (input, cached_input, cache_write, output, reasoning); replayed calls count nothing.",
        1.0,
    ),
    (
        "stephost_model_cost_total",
        "Cost in USD of live model calls, by model alias, from the configured prices.",
        1e6,
    ),
    (
        "stephost_model_budget_refusals_total",
        "Model calls not sent because they would take their run past its budget, by model alias.",
        1.0,
    ),
];

/// The counters to add for a live model answer of `alias`: its tokens by
/// kind, and its cost (stored in micro-USD).
pub fn model_answer(
    alias: &str,
    usage: &stephost_models::Usage,
    cost_micro_usd: Option<u64>,
    mut add: impl FnMut(&'static str, i64),
) {
    for (kind, n) in [
        ("input", usage.input),
        ("cached_input", usage.cached_input),
        ("cache_write", usage.cache_write),
        ("output", usage.output),
        ("reasoning", usage.reasoning),
    ] {
        if n > 0 {
            let name = format!(
                "stephost_model_tokens_total{{model=\"{}\",kind=\"{kind}\"}}",
                label(alias)
            );
            add(intern(name), n as i64);
        }
    }
    if let Some(micro) = cost_micro_usd.filter(|c| *c > 0) {
        let name = format!("stephost_model_cost_total{{model=\"{}\"}}", label(alias));
        add(intern(name), micro as i64);
    }
}

/// The counter of a model call of `alias` refused for its run's budget.
pub fn model_budget_refusal(alias: &str) -> &'static str {
    intern(format!(
        "stephost_model_budget_refusals_total{{model=\"{}\"}}",
        label(alias)
    ))
}

/// A Prometheus label value, escaped.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A counter's name, kept for the life of the process: a counter is named
/// by a `&'static str`, and the labelled names of model counters are made
/// from model aliases, of which a configuration has few. Each distinct name
/// is kept once.
fn intern(name: String) -> &'static str {
    static NAMES: std::sync::OnceLock<std::sync::Mutex<std::collections::HashSet<&'static str>>> =
        std::sync::OnceLock::new();
    let mut names = NAMES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(known) = names.get(name.as_str()) {
        return known;
    }
    let leaked: &'static str = Box::leak(name.into_boxed_str());
    names.insert(leaked);
    leaked
}

/// Renders all metrics.
pub fn render(store: &dyn Views) -> Result<String, StoreError> {
    let stored = store.counters()?;
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
    let _ = writeln!(
        out,
        "# HELP workflow_resume_latency_seconds Time from the start of a resume to its first live call.\n# TYPE workflow_resume_latency_seconds histogram"
    );
    let stored_value = |name: &str| {
        stored
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| *v)
            .unwrap_or(0)
    };
    let mut cumulative = 0;
    for (le, name) in RESUME_BUCKETS {
        cumulative += stored_value(name);
        let le = if le.is_infinite() {
            "+Inf".to_string()
        } else {
            le.to_string()
        };
        let _ = writeln!(
            out,
            "workflow_resume_latency_seconds_bucket{{le=\"{le}\"}} {cumulative}"
        );
    }
    let _ = writeln!(
        out,
        "workflow_resume_latency_seconds_sum {:.6}\nworkflow_resume_latency_seconds_count {cumulative}",
        stored_value("resume_latency_sum_us") as f64 / 1e6
    );
    for (family, help, divisor) in MODEL_FAMILIES {
        let _ = writeln!(out, "# HELP {family} {help}\n# TYPE {family} counter");
        for (name, value) in &stored {
            if name
                .strip_prefix(family)
                .is_some_and(|rest| rest.starts_with('{'))
            {
                if *divisor == 1.0 {
                    let _ = writeln!(out, "{name} {value}");
                } else {
                    let _ = writeln!(out, "{name} {:.6}", *value as f64 / divisor);
                }
            }
        }
    }
    let counts = store.status_counts()?;
    let _ = writeln!(
        out,
        "# HELP stephost_runs Runs in the ledger by status.\n# TYPE stephost_runs gauge"
    );
    for status in RunStatus::ALL {
        let n = counts
            .iter()
            .find(|(s, _)| *s == status)
            .map_or(0, |(_, n)| *n);
        let _ = writeln!(out, "stephost_runs{{status=\"{}\"}} {n}", status.as_str());
    }
    let now = stephost_core::clock::now_ms();
    let of_status = |status| {
        store.runs(&RunQuery {
            status: Some(status),
            ..RunQuery::default()
        })
    };
    let active = of_status(RunStatus::Running)?
        .iter()
        .filter(|r| r.owner.is_some() && r.lease_until_ms.is_some_and(|t| t > now))
        .count();
    let ages = ages(store, now)?;
    let oldest = ages.oldest_runnable_ms as f64 / 1000.0;
    let oldest_waiting = ages.oldest_waiting_ms as f64 / 1000.0;
    let _ = writeln!(
        out,
        "# HELP stephost_oldest_waiting_age_seconds How long the longest-waiting run has waited.\n# TYPE stephost_oldest_waiting_age_seconds gauge\nstephost_oldest_waiting_age_seconds {oldest_waiting:.3}"
    );
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

/// How long the oldest runnable run has waited for a worker, and the
/// longest-waiting run for its timer or a person.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ages {
    pub oldest_runnable_ms: i64,
    pub oldest_waiting_ms: i64,
}

pub fn ages(store: &dyn Views, now: i64) -> Result<Ages, StoreError> {
    // The earliest-due run, if it is due: how long it has waited for a worker.
    let oldest_runnable_ms = store
        .due_runs(1)?
        .first()
        .and_then(lifecycle::due_at)
        .filter(|at| *at <= now)
        .map(|at| now - at)
        .unwrap_or(0);
    let oldest_waiting_ms = store
        .runs(&RunQuery {
            status: Some(RunStatus::Waiting),
            ..RunQuery::default()
        })?
        .iter()
        .map(|r| r.updated_at_ms)
        .min()
        .map(|t| (now - t).max(0))
        .unwrap_or(0);
    Ok(Ages {
        oldest_runnable_ms,
        oldest_waiting_ms,
    })
}
