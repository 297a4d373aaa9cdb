//! The lifecycle rules of a run, written once for every backend: when a run
//! is due, who may claim it, and what a claim, a renewal, a release, an
//! execution's end and a repin make of its row. Backends store the rows
//! these functions compute and compare-and-set on [`RunRecord::version`];
//! they decide nothing themselves.

pub use crate::records::EndRow;
use crate::records::{Claim, ClaimedFrom, RunEnd, RunRecord, RunStatus};
use crate::store::{Store, StoreError};

/// When a worker should next look at a run, as its row says (`None`: never
/// by itself; only a person's decision or a claim changes it). Backends
/// keep this in an index; [`is_due`] is the same rule at a given time.
///
/// - pending: due since it was created;
/// - running with no owner (released, or decided by a person): due now;
/// - running under a claim: due once the lease runs out;
/// - waiting: due at its wake time (a timer, an approval's expiry);
/// - parked, completed, failed, diverged: never.
pub fn due_at(run: &RunRecord) -> Option<i64> {
    due_at_of(
        run.status,
        run.owner.is_some(),
        run.lease_until_ms,
        run.wake_at_ms,
        run.created_at_ms,
        run.updated_at_ms,
    )
}

/// Whether a row written with `due_at` and held by nobody (`owned`
/// false) should wake the workers watching the ledger: it will be due
/// (now or at a time) and any of them may claim it. PostgreSQL's
/// `runs_due_notify` trigger keeps the same rule.
pub fn wakes_workers(due_at: Option<i64>, owned: bool) -> bool {
    due_at.is_some() && !owned
}

/// [`due_at`] from the fields it reads.
pub fn due_at_of(
    status: RunStatus,
    owned: bool,
    lease_until_ms: Option<i64>,
    wake_at_ms: Option<i64>,
    created_at_ms: i64,
    updated_at_ms: i64,
) -> Option<i64> {
    match status {
        RunStatus::Pending => Some(created_at_ms),
        RunStatus::Running if owned => Some(lease_until_ms.unwrap_or(updated_at_ms)),
        RunStatus::Running => Some(updated_at_ms),
        RunStatus::Waiting if crate::crash::broken("lose-wake-up") => None,
        RunStatus::Waiting => wake_at_ms,
        RunStatus::Parked
        | RunStatus::Completed
        | RunStatus::Failed
        | RunStatus::Diverged
        | RunStatus::Cancelled => None,
    }
}

/// Whether a worker may take the run at `now_ms` by the clock alone.
pub fn is_due(run: &RunRecord, now_ms: i64) -> bool {
    due_at(run).is_some_and(|at| at <= now_ms)
}

/// Who asks for a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimMode {
    /// A worker: only a run that is due (or whose owner is gone).
    Due,
    /// A person resuming a run: any unfinished run that no live owner holds
    /// (a waiting run is looked at again; a parked one stops again at its
    /// unknown call unless it was resolved).
    Any,
}

/// Whether someone other than `owner` holds the run under a lease that has
/// not run out, and is alive as far as `owner_alive` can tell (it tells
/// only of processes on this machine; any other owner is judged by its
/// lease alone).
pub fn held_by_other(
    run: &RunRecord,
    owner: &str,
    now_ms: i64,
    owner_alive: &dyn Fn(&str) -> bool,
) -> bool {
    held(run, now_ms, owner_alive) && run.owner.as_deref() != Some(owner)
}

/// Whether anyone holds the run under a live lease.
pub fn held(run: &RunRecord, now_ms: i64, owner_alive: &dyn Fn(&str) -> bool) -> bool {
    match (&run.owner, run.lease_until_ms) {
        (Some(holder), Some(until)) => until > now_ms && owner_alive(holder),
        _ => false,
    }
}

/// Why `owner` may not claim `run` now, if it may not.
pub fn check_claimable(
    run: &RunRecord,
    owner: &str,
    now_ms: i64,
    mode: ClaimMode,
    owner_alive: &dyn Fn(&str) -> bool,
) -> Result<(), StoreError> {
    let not_claimable = || StoreError::NotClaimable {
        run_id: run.run_id.clone(),
        status: run.status.as_str().to_string(),
    };
    if run.status.is_finished() {
        return Err(not_claimable());
    }
    // A worker leaves alone even a run it holds itself: its execution is
    // running, or ended abandoned and the run waits for the lease to lapse.
    let refused = match mode {
        ClaimMode::Due => held(run, now_ms, owner_alive),
        ClaimMode::Any => held_by_other(run, owner, now_ms, owner_alive),
    };
    if refused {
        return Err(StoreError::ClaimedElsewhere {
            run_id: run.run_id.clone(),
            owner: run.owner.clone().unwrap_or_default(),
            lease_until_ms: run.lease_until_ms.unwrap_or_default(),
        });
    }
    if mode == ClaimMode::Due {
        // A running run whose owner is gone is due whatever its lease says.
        let due = match run.status {
            RunStatus::Running => true,
            _ => is_due(run, now_ms),
        };
        if !due {
            return Err(not_claimable());
        }
    }
    Ok(())
}

/// The run's row once `owner` claims it, and the claim: running, a new
/// fencing token, a lease of `lease_ms` from `now_ms`.
pub fn claimed(run: &RunRecord, owner: &str, lease_ms: i64, now_ms: i64) -> (RunRecord, Claim) {
    let lease_until_ms = now_ms.saturating_add(lease_ms);
    let row = RunRecord {
        status: RunStatus::Running,
        owner: Some(owner.to_string()),
        lease_until_ms: Some(lease_until_ms),
        fence: run.fence + 1,
        version: run.version + 1,
        wake_at_ms: None,
        updated_at_ms: now_ms,
        ..run.clone()
    };
    let claim = Claim {
        run_id: run.run_id.clone(),
        owner: owner.to_string(),
        fence: row.fence,
        lease_ms,
        lease_until_ms,
        from: Some(ClaimedFrom {
            status: run.status,
            fence: run.fence,
            updated_at_ms: run.updated_at_ms,
            owner: run.owner.clone(),
            error: run.error.clone(),
        }),
    };
    (row, claim)
}

/// The first claim of a run started in this process: fencing token 1.
pub fn first_claim(run_id: &str, owner: &str, lease_ms: i64, now_ms: i64) -> Claim {
    Claim {
        run_id: run_id.to_string(),
        owner: owner.to_string(),
        fence: 1,
        lease_ms,
        lease_until_ms: now_ms.saturating_add(lease_ms),
        from: None,
    }
}

/// The fenced error for a claim that is no longer the run's newest.
pub fn fenced(run: &RunRecord, claim: &Claim) -> StoreError {
    StoreError::Fenced {
        run_id: run.run_id.clone(),
        held: claim.fence,
        newest: run.fence,
    }
}

/// Whether `claim` still holds `run`: the newest fencing token, and the
/// run still running under it.
pub fn holds(run: &RunRecord, claim: &Claim) -> bool {
    run.fence == claim.fence
        && run.status == RunStatus::Running
        && run.owner.as_deref() == Some(claim.owner.as_str())
}

/// What `end` makes of the run's row at `now_ms`.
pub fn ended(end: &RunEnd, now_ms: i64) -> EndRow {
    let (status, output, error, exit_code, wake_at_ms) = match end {
        RunEnd::Completed { output, exit_code } => (
            RunStatus::Completed,
            Some(output.clone()),
            None,
            *exit_code,
            None,
        ),
        RunEnd::Failed { error, exit_code } => (
            RunStatus::Failed,
            None,
            Some(error.clone()),
            *exit_code,
            None,
        ),
        RunEnd::Parked { error } => (RunStatus::Parked, None, Some(error.clone()), None, None),
        RunEnd::Diverged { error } => (RunStatus::Diverged, None, Some(error.clone()), None, None),
        RunEnd::Cancelled { error } => {
            (RunStatus::Cancelled, None, Some(error.clone()), None, None)
        }
        RunEnd::Waiting { wake_at_ms } => (RunStatus::Waiting, None, None, None, *wake_at_ms),
    };
    let due_at_ms = due_at_of(status, false, None, wake_at_ms, now_ms, now_ms);
    EndRow {
        status,
        output,
        error,
        exit_code,
        wake_at_ms,
        due_at_ms,
        updated_at_ms: now_ms,
        seal: None,
        arrival: None,
        inbox_seen: None,
        cancel_children: None,
    }
}

/// What a cancel marks on a run of the subtree it cancels, at `now_ms`:
/// the mark, and (for a run nobody holds that waits or was never claimed)
/// its wake-up now, so that a worker ends it at once. A run held, parked
/// or finished keeps its wake-up. `(wake_at, due_at)` if it changes.
pub fn woken_by_cancel(status: RunStatus, held: bool, now_ms: i64) -> Option<(i64, i64)> {
    match status {
        RunStatus::Pending | RunStatus::Waiting if !held => Some((now_ms, now_ms)),
        _ => None,
    }
}

/// What a child's end at `now_ms` makes of its parent's wake-up: a parent
/// waiting (for that child, or for anything: it looks again) is due at
/// once; a parent running or held is left alone, its fencing token never
/// moved (it finds the arrival when it next looks, or its end's
/// `inbox_seen` makes it due). The parent's `(wake_at, due_at)` if it
/// changes.
pub fn woken_by_arrival(parent_status: RunStatus, now_ms: i64) -> Option<(i64, i64)> {
    (parent_status == RunStatus::Waiting).then_some((now_ms, now_ms))
}

/// Until when a renewal at `now_ms` extends `claim`'s lease.
pub fn renewed_lease(claim: &Claim, now_ms: i64) -> i64 {
    now_ms.saturating_add(claim.lease_ms)
}

/// The run's row once a person decides one of its calls: runnable at once,
/// with a new fencing token, so that an execution still running (which
/// cannot know of the decision) can write nothing more, not even a stale
/// end, and the next one starts from the decision.
pub fn settled(run: &RunRecord, now_ms: i64) -> RunRecord {
    RunRecord {
        status: RunStatus::Running,
        error: None,
        wake_at_ms: None,
        owner: None,
        lease_until_ms: None,
        fence: run.fence + 1,
        version: run.version + 1,
        updated_at_ms: now_ms,
        ..run.clone()
    }
}

/// How many times a compare-and-set is tried again after another writer
/// changed the run in between (a renewal, an execution's end).
pub const CAS_TRIES_MAX: usize = 8;

/// Claims `run_id` for `owner` by compare-and-set on the run's version.
pub fn claim(
    store: &dyn Store,
    run_id: &str,
    owner: &str,
    lease_ms: i64,
    now_ms: i64,
    mode: ClaimMode,
    owner_alive: &dyn Fn(&str) -> bool,
) -> Result<Claim, StoreError> {
    let run = store.run(run_id)?;
    claim_read(store, &run, owner, lease_ms, now_ms, mode, owner_alive)
}

/// [`claim`] of a run already read: one compare-and-set on the version
/// read, which fails with [`StoreError::VersionConflict`] if the run
/// changed since.
pub fn claim_read(
    store: &dyn Store,
    run: &RunRecord,
    owner: &str,
    lease_ms: i64,
    now_ms: i64,
    mode: ClaimMode,
    owner_alive: &dyn Fn(&str) -> bool,
) -> Result<Claim, StoreError> {
    check_claimable(run, owner, now_ms, mode, owner_alive)?;
    let (row, claim) = claimed(run, owner, lease_ms, now_ms);
    store.swap_run(run.version, &row, false)?;
    Ok(claim)
}

/// With a key, refuses a run whose row does not match its seal (or has
/// none): whoever claims it would extend the chain and seal the change with
/// the real key. Its calls are checked as the execution replays them
/// ([`crate::chain::ReplayCheck`]). Without a key the seal is a plain hash
/// anyone can redo, and nothing is refused.
pub fn check_sealed(signer: &crate::chain::Signer, run: &RunRecord) -> Result<(), StoreError> {
    if !signer.is_keyed() {
        return Ok(());
    }
    signer
        .check_row(run)
        .map(|_| ())
        .map_err(|broken| StoreError::Integrity {
            run_id: run.run_id.clone(),
            reason: broken.to_string(),
        })
}

/// Extends `claim`'s lease to `now_ms` + its lease time. `Ok(false)`: the
/// claim ended by its own holder meanwhile (the run finished, waits or was
/// released), so there is nothing to renew; [`StoreError::Fenced`]: another
/// claim took the run.
pub fn renew(store: &dyn Store, claim: &Claim, now_ms: i64) -> Result<bool, StoreError> {
    for _ in 0..CAS_TRIES_MAX {
        let run = store.run(&claim.run_id)?;
        if run.fence != claim.fence {
            return Err(fenced(&run, claim));
        }
        if !holds(&run, claim) {
            return Ok(false);
        }
        let until = renewed_lease(claim, now_ms);
        let row = RunRecord {
            lease_until_ms: Some(until),
            version: run.version + 1,
            ..run.clone()
        };
        match store.swap_run(run.version, &row, false) {
            Ok(()) => return Ok(true),
            Err(StoreError::VersionConflict { .. }) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(busy(&claim.run_id))
}

/// Gives `claim` up (owner and lease cleared, the run due at once) if it is
/// still the run's newest; a claim already ended or taken over is left.
pub fn release(store: &dyn Store, claim: &Claim, now_ms: i64) -> Result<(), StoreError> {
    for _ in 0..CAS_TRIES_MAX {
        let run = store.run(&claim.run_id)?;
        if !holds(&run, claim) {
            return Ok(());
        }
        let row = RunRecord {
            owner: None,
            lease_until_ms: None,
            version: run.version + 1,
            updated_at_ms: now_ms,
            ..run.clone()
        };
        match store.swap_run(run.version, &row, false) {
            Ok(()) => return Ok(()),
            Err(StoreError::VersionConflict { .. }) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(busy(&claim.run_id))
}

/// A repin: the module a run is pinned to now, the one it moves to, and
/// that module's declared step.
#[derive(Debug, Clone, Copy)]
pub struct Repin<'a> {
    pub from: &'a str,
    pub to: &'a str,
    pub step: Option<&'a str>,
}

/// Pins an unfinished run that no live owner holds to module `to` (after
/// a replay proved it compatible), by compare-and-set on the module it was
/// pinned to (`from`) and the version read. It moves the run's fence, so
/// no claim made before it can write again.
pub fn repin(
    store: &dyn Store,
    signer: &crate::chain::Signer,
    run_id: &str,
    pin: &Repin<'_>,
    now_ms: i64,
    owner_alive: &dyn Fn(&str) -> bool,
) -> Result<(), StoreError> {
    let Repin { from, to, step } = *pin;
    let conflict = || StoreError::RepinConflict {
        run_id: run_id.to_string(),
    };
    let run = store.run(run_id)?;
    if run.status.is_finished()
        || run.module_digest != from
        || held_by_other(&run, "", now_ms, owner_alive)
    {
        return Err(conflict());
    }
    crate::settle::check_record(store, signer, &run)?;
    // The fence moves, and a lapsed claim goes with it: an execution of the
    // old build that was stalled (not dead) is refused at its next write.
    let row = RunRecord {
        module_digest: to.to_string(),
        step: step.map(str::to_string),
        fence: run.fence + 1,
        owner: None,
        lease_until_ms: None,
        version: run.version + 1,
        updated_at_ms: now_ms,
        ..run.clone()
    };
    let row = RunRecord {
        seal: signer.reseal(&row),
        ..row
    };
    store
        .swap_run(run.version, &row, true)
        .map_err(|e| match e {
            StoreError::VersionConflict { .. } => conflict(),
            other => other,
        })
}

/// How the error of a run parked at a model call over its budget begins.
pub const OVER_BUDGET: &str = "budget:";

/// Whether `run` is parked at a model call that would have passed its
/// budget (nothing of that call is recorded).
pub fn parked_over_budget(run: &RunRecord) -> bool {
    run.status == RunStatus::Parked
        && run
            .error
            .as_deref()
            .is_some_and(|e| e.starts_with(OVER_BUDGET))
}

/// Sets the bounds `raised` gives in unfinished run `run_id`'s own model
/// budget (a bound it leaves out is kept), resealed, by compare-and-set on
/// the version read: the run's row as it is now. An execution under way
/// keeps the budget it started with; its next one has the new one. A run
/// parked over its budget is due again at once, for any worker to go on
/// with (its call is sent if the new budget lets it).
pub fn set_budget(
    store: &dyn Store,
    signer: &crate::chain::Signer,
    run_id: &str,
    raised: &crate::limits::RunBudget,
    now_ms: i64,
) -> Result<RunRecord, StoreError> {
    for _ in 0..CAS_TRIES_MAX {
        let run = store.run(run_id)?;
        if run.status.is_finished() {
            return Err(StoreError::Ended {
                run_id: run_id.to_string(),
                status: run.status.as_str().to_string(),
            });
        }
        crate::settle::check_record(store, signer, &run)?;
        let parked = parked_over_budget(&run);
        let row = RunRecord {
            budget: run.budget.with(raised),
            version: run.version + 1,
            updated_at_ms: now_ms,
            status: if parked {
                RunStatus::Pending
            } else {
                run.status
            },
            error: if parked { None } else { run.error.clone() },
            ..run.clone()
        };
        let row = RunRecord {
            seal: signer.reseal(&row),
            ..row
        };
        match store.swap_run(run.version, &row, true) {
            Ok(()) => return Ok(row),
            Err(StoreError::VersionConflict { .. }) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(busy(run_id))
}

fn busy(run_id: &str) -> StoreError {
    StoreError::Unavailable(format!(
        "run {run_id} kept changing while its row was being updated; try again"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::NewRun;

    fn run(status: RunStatus) -> RunRecord {
        let mut run = NewRun {
            run_id: "r",
            module_digest: "m",
            step: None,
            world: "w",
            input: "{}",
            now_ms: 1_000,
            budget: Default::default(),
        }
        .record(None);
        run.status = status;
        run
    }

    #[test]
    fn each_status_is_due_as_the_rule_says() {
        assert_eq!(due_at(&run(RunStatus::Pending)), Some(1_000));
        let mut held = run(RunStatus::Running);
        held.owner = Some("w1".into());
        held.lease_until_ms = Some(5_000);
        assert_eq!(due_at(&held), Some(5_000));
        assert!(!is_due(&held, 4_999));
        assert!(is_due(&held, 5_000));
        let mut released = run(RunStatus::Running);
        released.updated_at_ms = 2_000;
        assert_eq!(due_at(&released), Some(2_000));
        let mut waiting = run(RunStatus::Waiting);
        assert_eq!(due_at(&waiting), None, "waits for a person only");
        waiting.wake_at_ms = Some(9_000);
        assert_eq!(due_at(&waiting), Some(9_000));
        for status in [
            RunStatus::Parked,
            RunStatus::Completed,
            RunStatus::Failed,
            RunStatus::Diverged,
        ] {
            assert_eq!(due_at(&run(status)), None, "{status:?}");
        }
    }

    #[test]
    fn a_live_owners_unexpired_lease_refuses_a_claim_and_a_dead_owners_does_not() {
        let mut held = run(RunStatus::Running);
        held.owner = Some("w1".into());
        held.lease_until_ms = Some(5_000);
        let alive = |_: &str| true;
        let dead = |_: &str| false;
        for mode in [ClaimMode::Due, ClaimMode::Any] {
            assert!(matches!(
                check_claimable(&held, "w2", 4_000, mode, &alive),
                Err(StoreError::ClaimedElsewhere { .. })
            ));
            assert!(check_claimable(&held, "w2", 4_000, mode, &dead).is_ok());
            assert!(check_claimable(&held, "w2", 5_000, mode, &alive).is_ok());
        }
        // A person may take a run over from their own process's stale
        // claim; a worker waits for the lease of its own abandoned run.
        assert!(check_claimable(&held, "w1", 4_000, ClaimMode::Any, &alive).is_ok());
        assert!(check_claimable(&held, "w1", 4_000, ClaimMode::Due, &alive).is_err());
    }

    #[test]
    fn a_worker_claims_only_due_runs_and_a_person_any_unfinished_one() {
        let alive = |_: &str| true;
        let mut asleep = run(RunStatus::Waiting);
        asleep.wake_at_ms = Some(9_000);
        assert!(check_claimable(&asleep, "w", 8_999, ClaimMode::Due, &alive).is_err());
        assert!(check_claimable(&asleep, "w", 9_000, ClaimMode::Due, &alive).is_ok());
        assert!(check_claimable(&asleep, "w", 0, ClaimMode::Any, &alive).is_ok());
        let parked = run(RunStatus::Parked);
        assert!(check_claimable(&parked, "w", 0, ClaimMode::Due, &alive).is_err());
        assert!(check_claimable(&parked, "w", 0, ClaimMode::Any, &alive).is_ok());
        for finished in [RunStatus::Completed, RunStatus::Failed, RunStatus::Diverged] {
            for mode in [ClaimMode::Due, ClaimMode::Any] {
                assert!(matches!(
                    check_claimable(&run(finished), "w", 0, mode, &alive),
                    Err(StoreError::NotClaimable { .. })
                ));
            }
        }
    }

    #[test]
    fn a_claim_moves_fence_and_version_and_a_decision_moves_them_again() {
        let pending = run(RunStatus::Pending);
        let (row, claim) = claimed(&pending, "w", 100, 2_000);
        assert_eq!(row.status, RunStatus::Running);
        assert_eq!((row.fence, row.version), (1, 1));
        assert_eq!(claim.fence, 1);
        assert_eq!(due_at(&row), Some(2_100));
        let decided = settled(&row, 3_000);
        assert_eq!((decided.fence, decided.version), (2, 2));
        assert_eq!(decided.owner, None);
        assert!(is_due(&decided, 3_000));
    }

    #[test]
    fn an_end_gives_the_claim_up_and_only_a_wait_with_a_time_is_due_again() {
        let done = ended(
            &RunEnd::Completed {
                output: "{}".into(),
                exit_code: None,
            },
            5,
        );
        assert_eq!((done.status, done.due_at_ms), (RunStatus::Completed, None));
        let timer = ended(
            &RunEnd::Waiting {
                wake_at_ms: Some(90),
            },
            5,
        );
        assert_eq!(
            (timer.status, timer.due_at_ms),
            (RunStatus::Waiting, Some(90))
        );
        let person = ended(&RunEnd::Waiting { wake_at_ms: None }, 5);
        assert_eq!(person.due_at_ms, None);
        let parked = ended(&RunEnd::Parked { error: "e".into() }, 5);
        assert_eq!((parked.status, parked.due_at_ms), (RunStatus::Parked, None));
    }
}
