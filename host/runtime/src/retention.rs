//! Retention as workers apply it (`[retention]` in `stephost.toml`): a
//! thread of the worker's own deletes, every `every_ms`, the finished runs
//! the rule takes, batch after batch ([`stephost_core::retention`] holds
//! the rules; each backend deletes a batch in one short transaction).
//!
//! ```toml
//! [retention]
//! finished_before_ms = 2_592_000_000   # 30 days
//! statuses = ["completed", "failed", "cancelled"]
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::Deserialize;
use stephost_core::retention::{self, Retention, Rule};
use stephost_core::{RunStatus, StoreResult};

/// `[retention]`: which finished runs workers delete, and how often they
/// look.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RetentionConfig {
    /// Runs (trees, by their root) that finished longer ago than this are
    /// deleted, in ms.
    pub finished_before_ms: u64,
    /// The roots' statuses deleted (finished ones only): default
    /// `completed`, `failed` and `cancelled` (a `diverged` run is kept
    /// unless named, for the build that may take it up).
    #[serde(default)]
    pub statuses: Vec<String>,
    /// Trees deleted in one transaction: a commit waits for one batch at
    /// most.
    #[serde(default = "default_batch_runs")]
    pub batch_runs: usize,
    /// How often a worker looks for runs to delete, in ms.
    #[serde(default = "default_every_ms")]
    pub every_ms: u64,
}

fn default_batch_runs() -> usize {
    retention::BATCH_RUNS_DEFAULT
}

fn default_every_ms() -> u64 {
    EVERY_MS_DEFAULT
}

/// How often a worker looks for runs to delete by default, in ms.
pub const EVERY_MS_DEFAULT: u64 = 300_000;

impl RetentionConfig {
    /// The rule as of `now_ms`; an error names a status that is not one
    /// or not a finished one.
    pub fn rule(&self, now_ms: i64) -> Result<Rule, String> {
        let statuses = parse_statuses(&self.statuses)?;
        let before = now_ms.saturating_sub(self.finished_before_ms.min(i64::MAX as u64) as i64);
        let mut rule = Rule::new(before, &statuses)?;
        rule.batch_runs = self.batch_runs.max(1);
        Ok(rule)
    }
}

/// Statuses by name; an error names one that is not a status.
pub fn parse_statuses(names: &[String]) -> Result<Vec<RunStatus>, String> {
    names
        .iter()
        .map(|name| {
            RunStatus::parse(name.trim()).ok_or_else(|| {
                format!(
                    "{name:?} is not a run status: name completed, failed, diverged or cancelled"
                )
            })
        })
        .collect()
}

/// Deletes, every `config.every_ms` until `stop` is set, the runs
/// `config` takes (the first look at once). Errors are logged and the
/// next look tries again.
pub fn keep(retention: &dyn Retention, config: &RetentionConfig, stop: &AtomicBool) {
    let every = Duration::from_millis(config.every_ms.max(1_000));
    loop {
        let started = Instant::now();
        match pass(retention, config, stop) {
            Ok((0, _)) => {}
            Ok((runs, bytes)) => crate::logs::info(
                "retention",
                None,
                format_args!("deleted {runs} finished runs ({bytes} bytes)"),
            ),
            Err(e) => crate::logs::error(
                "retention",
                None,
                format_args!("deleting finished runs: {e}"),
            ),
        }
        while started.elapsed() < every {
            if stop.load(Ordering::SeqCst) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100).min(every));
        }
    }
}

/// One look: batches until none is left or `stop` is set (one at least);
/// the runs and bytes deleted.
fn pass(
    retention: &dyn Retention,
    config: &RetentionConfig,
    stop: &AtomicBool,
) -> StoreResult<(usize, u64)> {
    let rule = config
        .rule(stephost_core::clock::now_ms())
        .map_err(stephost_core::StoreError::Config)?;
    let (mut runs, mut bytes) = (0, 0);
    // One batch at least, however soon the worker stops.
    loop {
        let batch = retention.prune(&rule, false)?;
        runs += batch.run_ids.len();
        bytes += batch.bytes;
        if batch.run_ids.is_empty() || stop.load(Ordering::SeqCst) {
            break;
        }
    }
    if runs > 0 {
        retention.reclaim()?;
    }
    Ok((runs, bytes))
}
