//! Retention: finished runs deleted from the ledger once they are old
//! enough, with everything they owned.
//!
//! The rules, written once here and kept by every backend:
//! - the unit is a **tree**: a root run (one without a parent) and every
//!   run below it. A tree goes when its root finished (its last change)
//!   before the rule's cutoff with one of the rule's statuses, and every
//!   run in it is finished; a child is never deleted under a live parent,
//!   nor a parent whose child still runs;
//! - only finished statuses may be named ([`RunStatus::is_finished`]): a
//!   pending, running, waiting or parked run (an outcome `unknown`, waiting
//!   for a person) is never deleted, whatever the rule;
//! - a tree with a notice still owed to a webhook waits until it is
//!   delivered or given up;
//! - what a deleted run owned goes with it, in the same transaction: its
//!   calls and their attempts, its log lines, its notices, its inbox, its
//!   promises' completions, its tree's model spend, the payload parts no
//!   remaining run refers to, and its module once no run and no schedule
//!   pins it and it was not stored in the last [`Rule::module_kept_ms`]
//!   (by default never: see [`MODULE_KEPT_MS`]). Flow rows are shared by a model's calls, not owned by a run
//!   (their slots expire on their own);
//! - a fork keeps copies of the calls it was made from: deleting the run
//!   it forked leaves it whole (`verify` then checks its own chain only);
//! - deleting is done in batches of at most [`Rule::batch_runs`] trees, each
//!   its own short transaction, oldest first, so that commits wait at most
//!   one batch.

use crate::StoreResult;
use crate::records::RunStatus;

/// The statuses a rule deletes when none are named.
pub const DEFAULT_STATUSES: [RunStatus; 3] = [
    RunStatus::Completed,
    RunStatus::Failed,
    RunStatus::Cancelled,
];

/// A module no run pins is kept this long after it was last stored, in
/// ms: for now, always. A long-lived process stores a module once and
/// pins later runs (and children) to it without storing it again, so the
/// time of the last store does not show it is still used; until every
/// run's record stores or notes its module, modules are not deleted.
pub const MODULE_KEPT_MS: i64 = i64::MAX;

/// The finished statuses as an SQL list (`'completed', …`), for backends'
/// queries.
pub fn finished_sql_list() -> String {
    RunStatus::ALL
        .iter()
        .filter(|s| s.is_finished())
        .map(|s| format!("'{}'", s.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Trees deleted in one transaction by default.
pub const BATCH_RUNS_DEFAULT: usize = 100;

/// Which trees to delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Trees whose root finished before this time (ms since the epoch).
    pub finished_before_ms: i64,
    /// The root's status must be one of these (all finished).
    pub statuses: Vec<RunStatus>,
    /// Most trees in one transaction.
    pub batch_runs: usize,
    /// A module no remaining run pins is deleted once it was last stored
    /// this long ago ([`MODULE_KEPT_MS`]), in ms.
    pub module_kept_ms: i64,
}

impl Rule {
    /// A rule for trees whose root finished before `finished_before_ms`
    /// with one of `statuses` (the defaults when empty); an error names a
    /// status that is not a finished one.
    pub fn new(finished_before_ms: i64, statuses: &[RunStatus]) -> Result<Rule, String> {
        if let Some(live) = statuses.iter().find(|s| !s.is_finished()) {
            return Err(format!(
                "runs {} are never pruned: name finished statuses only (completed, failed, \
                 diverged, cancelled)",
                live.as_str()
            ));
        }
        let statuses = match statuses.is_empty() {
            true => DEFAULT_STATUSES.to_vec(),
            false => statuses.to_vec(),
        };
        Ok(Rule {
            finished_before_ms,
            statuses,
            batch_runs: BATCH_RUNS_DEFAULT,
            module_kept_ms: MODULE_KEPT_MS,
        })
    }

    /// The statuses as the ledger spells them.
    pub fn status_names(&self) -> Vec<&'static str> {
        self.statuses.iter().map(|s| s.as_str()).collect()
    }

    /// Whether a root with `status`, last changed at `updated_at_ms`, is one
    /// this rule deletes (its tree being all finished).
    pub fn takes(&self, status: RunStatus, updated_at_ms: i64) -> bool {
        status.is_finished()
            && self.statuses.contains(&status)
            && updated_at_ms < self.finished_before_ms
    }
}

/// What a batch deleted (or, dry, would delete).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pruned {
    /// The runs' ids, roots and the runs below them.
    pub run_ids: Vec<String>,
    /// Bytes of the rows deleted: bodies, payload parts, log lines,
    /// modules, notices (what the ledger held, not what its files shrink).
    pub bytes: u64,
}

impl Pruned {
    pub fn add(&mut self, other: Pruned) {
        self.run_ids.extend(other.run_ids);
        self.bytes += other.bytes;
    }
}

/// The ledger counter of runs deleted.
pub const RUNS_PRUNED_COUNTER: &str = "runs_pruned_total";
/// The ledger counter of bytes deleted with them.
pub const BYTES_PRUNED_COUNTER: &str = "pruned_bytes_total";

/// A backend's retention.
pub trait Retention: Send + Sync {
    /// Deletes one batch of trees `rule` takes, oldest first, adding to the
    /// ledger's counters in the same transaction; with `dry_run`, only says
    /// which (from the oldest, one batch). An empty answer: nothing left.
    fn prune(&self, rule: &Rule, dry_run: bool) -> StoreResult<Pruned>;

    /// Gives space freed by deleting back to the file system where the
    /// backend needs a step for that (an SQLite file's free pages); the
    /// bytes given back.
    fn reclaim(&self) -> StoreResult<u64> {
        Ok(0)
    }
}

/// Deletes every tree `rule` takes, batch after batch (or, dry, lists the
/// first batch), then reclaims the space.
pub fn prune_all(retention: &dyn Retention, rule: &Rule, dry_run: bool) -> StoreResult<Summary> {
    let mut summary = Summary::default();
    loop {
        let batch = retention.prune(rule, dry_run)?;
        let done = batch.run_ids.is_empty() || dry_run;
        summary.pruned.add(batch);
        if done {
            break;
        }
    }
    if !dry_run && !summary.pruned.run_ids.is_empty() {
        summary.reclaimed_bytes = retention.reclaim()?;
    }
    Ok(summary)
}

/// What [`prune_all`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    pub pruned: Pruned,
    /// Bytes the files gave back ([`Retention::reclaim`]).
    pub reclaimed_bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rule_names_finished_statuses_only() {
        let err = Rule::new(0, &[RunStatus::Completed, RunStatus::Parked]).unwrap_err();
        assert!(err.contains("parked"), "{err}");
        assert!(Rule::new(0, &[RunStatus::Waiting]).is_err());
        let rule = Rule::new(10, &[]).unwrap();
        assert_eq!(rule.statuses, DEFAULT_STATUSES.to_vec());
    }

    #[test]
    fn a_rule_takes_roots_finished_before_its_cutoff_with_its_statuses() {
        let rule = Rule::new(1_000, &[RunStatus::Completed]).unwrap();
        assert!(rule.takes(RunStatus::Completed, 999));
        assert!(!rule.takes(RunStatus::Completed, 1_000));
        assert!(!rule.takes(RunStatus::Failed, 10));
        let all = Rule::new(
            1_000,
            &RunStatus::ALL
                .map(|s| s)
                .into_iter()
                .filter(|s| s.is_finished())
                .collect::<Vec<_>>(),
        )
        .unwrap();
        for live in [
            RunStatus::Pending,
            RunStatus::Running,
            RunStatus::Waiting,
            RunStatus::Parked,
        ] {
            assert!(!all.takes(live, 0), "{live:?}");
        }
    }
}
