//! What an execution's commit means, written once: [`CommitPlan::new`]
//! checks a commit's ops and lays them out as plain data that every backend
//! only writes (the memory ledger applies it, SQLite writes it, PostgreSQL
//! binds it to its commit function).
//!
//! The rules:
//! - a commit creates its run only as its first op; a run that exists by
//!   then was created elsewhere ([`StoreError::ClaimedElsewhere`], the
//!   backend's check);
//! - every op is under the claim's fencing token, which must be the run's
//!   newest (the backend checks it in the commit's transaction) and which
//!   every call the commit appends is kept under;
//! - the calls it appends are consecutive, the first following the run's
//!   last recorded call (the backend checks the first against the ledger);
//! - an outcome of a call appended by the same commit goes into that call;
//!   an outcome of an earlier call updates it (the backend checks it is
//!   recorded); an outcome never comes before its call;
//! - an attempt goes with its call: into the call's row if the commit
//!   appends it, else onto the earlier call's stored attempts;
//! - counters are summed; a lease renewal is the last one asked for, and
//!   makes the run due when the lease ends; the end of an execution is the
//!   run's final column values, its seal kept unless the end brings one;
//!   each of the lease and the end bumps the row's version once;
//! - a child run started by the commit ([`WriteOp::Spawn`]) comes with its
//!   parent's call, finished, whose outcome names it; the child's row names
//!   that call as its parent, is pending and unclaimed; the backend inserts
//!   it after the fence check, in the same transaction, and refuses the
//!   commit if a run with its id exists;
//! - a commit that begins something (a `started` call, a child) is refused
//!   as [`StoreError::Cancelled`] once its run is cancelled: the backend
//!   checks the mark with the fence; outcomes, logs and the end still land,
//!   since they record what already happened, also when they ride in the
//!   refused commit: the backend then writes [`CommitPlan::what_happened`]
//!   in the refusal's place (in its transaction, or the next), and answers
//!   the refusal, which does not stop the writer (the execution's end
//!   follows and lands);
//! - the commit must be durable before it is answered if any op is
//!   ([`WriteOp::durable`]).

use std::collections::BTreeMap;

use crate::lifecycle;
use crate::records::{
    AttemptRecord, CallRecord, CallState, Claim, Counters, EndRow, LogRecord, RunRecord, RunStatus,
};
use crate::store::{StoreError, StoreResult, WriteOp};

/// A commit, checked and laid out for a backend to write in one
/// transaction, in this order: the create, the fence check, `calls`,
/// `updates`, `logs`, `lease`, `end`, `counters`.
#[derive(Debug, Clone, PartialEq)]
pub struct CommitPlan {
    pub run_id: String,
    /// The claim's fencing token: the run's newest, or nothing is written.
    pub fence: i64,
    /// The run's row, when the commit creates the run.
    pub create: Option<RunRecord>,
    /// Calls appended, consecutive from the first, each under `fence`.
    pub calls: Vec<NewCall>,
    /// Changes to calls recorded by earlier commits, by sequence number.
    pub updates: Vec<CallUpdate>,
    pub logs: Vec<LogRecord>,
    pub lease: Option<LeaseChange>,
    pub end: Option<EndRow>,
    /// Metric counters to add, summed.
    pub counters: Counters,
    /// Child runs started by the commit's calls, pending.
    pub spawns: Vec<RunRecord>,
    /// Whether the commit begins something (a write's or a wait's
    /// `started`, a child): refused as [`StoreError::Cancelled`] once the
    /// run is cancelled, in the transaction that checks the fence.
    pub begins: bool,
    /// Whether the commit must be on disk before it is answered.
    pub durable: bool,
}

/// A call appended by a commit, with its attempts so far.
#[derive(Debug, Clone, PartialEq)]
pub struct NewCall {
    pub call: CallRecord,
    pub attempts: Vec<AttemptRecord>,
}

/// A change to a call recorded by an earlier commit: its outcome, more
/// attempts, or both.
#[derive(Debug, Clone, PartialEq)]
pub struct CallUpdate {
    pub seq: u64,
    pub outcome: Option<Settled>,
    /// Attempts to append to the call's stored ones.
    pub attempts: Vec<AttemptRecord>,
}

/// A call's outcome as its row keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    pub state: CallState,
    pub outcome: Option<String>,
    pub finished_at_ms: i64,
    pub chain: Option<String>,
}

/// The claim's lease renewed: the run's row gets `lease_until_ms` and is
/// due at `due_at_ms` ([`lifecycle::due_at_of`] of a run held until then).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseChange {
    pub lease_until_ms: i64,
    pub due_at_ms: Option<i64>,
}

impl CommitPlan {
    /// Checks `ops` under `claim` and lays them out; an error names the
    /// first op that breaks a rule.
    pub fn new(claim: &Claim, ops: Vec<WriteOp>) -> StoreResult<CommitPlan> {
        let durable = ops.iter().any(WriteOp::durable);
        let begins = ops
            .iter()
            .any(|op| matches!(op, WriteOp::Started(_) | WriteOp::Spawn { .. }))
            && !crate::crash::broken("begin-after-cancel");
        let mut plan = CommitPlan {
            begins,
            durable,
            ..CommitPlan::empty(&claim.run_id, claim.fence)
        };
        let mut updates: BTreeMap<u64, CallUpdate> = BTreeMap::new();
        let mut attempts: Vec<AttemptRecord> = Vec::new();
        for (at, op) in ops.into_iter().enumerate() {
            match op {
                WriteOp::Create(run) if at == 0 => plan.create = Some(*run),
                WriteOp::Create(_) => {
                    return Err(StoreError::Corrupt(
                        "a commit creates its run only as its first op".into(),
                    ));
                }
                WriteOp::Spawn { call, child } => {
                    check_spawn(claim, &call, &child)?;
                    plan.spawns.push(*child);
                    push_call(&mut plan, &updates, claim, call)?;
                }
                WriteOp::Call(call) | WriteOp::Answer(call) | WriteOp::Started(call) => {
                    push_call(&mut plan, &updates, claim, call)?;
                }
                WriteOp::Outcome {
                    seq,
                    state,
                    outcome,
                    now_ms,
                    chain,
                } => {
                    let settled = Settled {
                        state,
                        outcome,
                        finished_at_ms: now_ms,
                        chain,
                    };
                    let first = plan.first_seq();
                    match plan.calls.iter_mut().find(|c| c.call.seq == seq) {
                        Some(new) => {
                            new.call.state = settled.state;
                            new.call.outcome = settled.outcome;
                            new.call.finished_at_ms = Some(settled.finished_at_ms);
                            new.call.chain = settled.chain;
                        }
                        None if first.is_some_and(|first| seq > first) => {
                            return Err(StoreError::Corrupt(format!(
                                "an outcome for call #{seq} of run {} comes before the call",
                                claim.run_id
                            )));
                        }
                        None => {
                            updates
                                .entry(seq)
                                .or_insert_with(|| CallUpdate::of(seq))
                                .outcome = Some(settled);
                        }
                    }
                }
                WriteOp::Attempt(attempt) => attempts.push(attempt),
                WriteOp::Log(log) => plan.logs.push(log),
                WriteOp::Lease { until_ms } => plan.lease = Some(LeaseChange::until(until_ms)),
                WriteOp::End(end) => plan.end = Some(end),
                WriteOp::Counters(more) => {
                    for (name, by) in more {
                        *plan.counters.entry(name).or_insert(0) += by;
                    }
                }
            }
        }
        // Attempts go with their call, in the order they were made.
        for attempt in attempts {
            match plan.calls.iter_mut().find(|c| c.call.seq == attempt.seq) {
                Some(new) => new.attempts.push(attempt),
                None => updates
                    .entry(attempt.seq)
                    .or_insert_with(|| CallUpdate::of(attempt.seq))
                    .attempts
                    .push(attempt),
            }
        }
        plan.updates = updates.into_values().collect();
        Ok(plan)
    }

    /// What the plan records of calls already made, without what it
    /// begins: the calls it appends up to the first `started` one or the
    /// first that starts a child (and none after), the outcomes of earlier
    /// calls, logs, counters, the lease and the end. What a backend writes
    /// when the plan is refused because its run was cancelled: the
    /// execution's chain links those calls, so dropping them would break
    /// the run's seal, and an outcome dropped would leave a settled write
    /// in doubt.
    pub fn what_happened(&self) -> CommitPlan {
        if crate::crash::broken("drop-refused-record") {
            return CommitPlan::empty(&self.run_id, self.fence);
        }
        let spawned: Vec<u64> = self
            .spawns
            .iter()
            .filter_map(|child| child.parent.as_ref().map(|p| p.seq))
            .collect();
        let cut = self
            .calls
            .iter()
            .position(|c| c.call.state == CallState::Started || spawned.contains(&c.call.seq))
            .unwrap_or(self.calls.len());
        CommitPlan {
            run_id: self.run_id.clone(),
            fence: self.fence,
            create: self.create.clone(),
            calls: self.calls[..cut].to_vec(),
            updates: self.updates.clone(),
            logs: self.logs.clone(),
            lease: self.lease,
            end: self.end.clone(),
            counters: self.counters.clone(),
            spawns: Vec::new(),
            begins: false,
            durable: self.durable,
        }
    }

    /// A plan of run `run_id` under `fence` that writes nothing.
    fn empty(run_id: &str, fence: i64) -> CommitPlan {
        CommitPlan {
            run_id: run_id.to_string(),
            fence,
            create: None,
            calls: Vec::new(),
            updates: Vec::new(),
            logs: Vec::new(),
            lease: None,
            end: None,
            counters: Counters::new(),
            spawns: Vec::new(),
            begins: false,
            durable: false,
        }
    }

    /// The sequence number of the first call appended, if any.
    pub fn first_seq(&self) -> Option<u64> {
        self.calls.first().map(|c| c.call.seq)
    }

    /// Whether the plan writes nothing.
    pub fn is_empty(&self) -> bool {
        self.create.is_none()
            && self.calls.is_empty()
            && self.updates.is_empty()
            && self.logs.is_empty()
            && self.lease.is_none()
            && self.end.is_none()
            && self.counters.is_empty()
            && self.spawns.is_empty()
    }
}

/// Appends `call` to the plan's calls, under the claim's fence, if it
/// follows the calls before it.
fn push_call(
    plan: &mut CommitPlan,
    updates: &BTreeMap<u64, CallUpdate>,
    claim: &Claim,
    call: CallRecord,
) -> StoreResult<()> {
    let follows = match plan.calls.last() {
        Some(last) => call.seq == last.call.seq + 1,
        None => !updates.keys().any(|seq| *seq >= call.seq),
    };
    if !follows {
        return Err(StoreError::NotAppended {
            run_id: claim.run_id.clone(),
            seq: call.seq,
        });
    }
    plan.calls.push(NewCall {
        call: CallRecord {
            fence: claim.fence,
            ..call
        },
        attempts: Vec::new(),
    });
    Ok(())
}

/// A child started by `call` of the claim's run: the call finished, and
/// the child's row pending, unclaimed, naming that call as its parent.
fn check_spawn(claim: &Claim, call: &CallRecord, child: &RunRecord) -> StoreResult<()> {
    let names_call = child
        .parent
        .as_ref()
        .is_some_and(|p| p.run_id == claim.run_id && p.seq == call.seq);
    let problem = if !names_call {
        Some("does not name the call that starts it as its parent")
    } else if !call.state.has_outcome() {
        Some("comes with a call that has no outcome")
    } else if child.status != RunStatus::Pending || child.fence != 0 || child.owner.is_some() {
        Some("is not a pending, unclaimed run")
    } else {
        None
    };
    match problem {
        Some(problem) => Err(StoreError::Corrupt(format!(
            "child run {} started by call #{} of run {} {problem}",
            child.run_id, call.seq, claim.run_id
        ))),
        None => Ok(()),
    }
}

impl CallUpdate {
    fn of(seq: u64) -> CallUpdate {
        CallUpdate {
            seq,
            outcome: None,
            attempts: Vec::new(),
        }
    }
}

impl LeaseChange {
    /// A lease held until `until_ms`: the run is due then, if its holder is
    /// gone.
    pub fn until(until_ms: i64) -> LeaseChange {
        LeaseChange {
            lease_until_ms: until_ms,
            due_at_ms: lifecycle::due_at_of(
                RunStatus::Running,
                true,
                Some(until_ms),
                None,
                until_ms,
                until_ms,
            ),
        }
    }
}

/// `attempts` as the JSON array a call's row keeps them in, if any.
pub fn stored_attempts(attempts: &[AttemptRecord]) -> Option<String> {
    if attempts.is_empty() {
        return None;
    }
    let refs: Vec<&AttemptRecord> = attempts.iter().collect();
    Some(AttemptRecord::to_stored_json(&refs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::CallClass;

    fn claim() -> Claim {
        Claim {
            run_id: "r".into(),
            owner: "w".into(),
            fence: 7,
            lease_ms: 1_000,
            lease_until_ms: 1_000,
            from: None,
        }
    }

    fn call(seq: u64, state: CallState) -> CallRecord {
        CallRecord {
            seq,
            class: CallClass::Write,
            interface: "stephost:step/effects".into(),
            function: "orders.write".into(),
            operation_id: format!("op{seq}"),
            request: "{}".into(),
            request_hash: "h".into(),
            state,
            outcome: None,
            started_at_ms: 1,
            finished_at_ms: None,
            fence: 0,
            resolved_by: None,
            chain: None,
        }
    }

    fn attempt(seq: u64, n: u32) -> AttemptRecord {
        AttemptRecord {
            seq,
            attempt: n,
            kind: "send".into(),
            started_at_ms: 1,
            finished_at_ms: 2,
            result: "retryable".into(),
            detail: None,
        }
    }

    fn outcome(seq: u64) -> WriteOp {
        WriteOp::Outcome {
            seq,
            state: CallState::Succeeded,
            outcome: Some("{\"ok\":1}".into()),
            now_ms: 9,
            chain: Some("link".into()),
        }
    }

    #[test]
    fn calls_are_kept_under_the_claims_fence_with_their_outcomes_and_attempts() {
        let plan = CommitPlan::new(
            &claim(),
            vec![
                WriteOp::Attempt(attempt(3, 1)),
                WriteOp::Started(call(3, CallState::Started)),
                WriteOp::Attempt(attempt(3, 2)),
                outcome(3),
                WriteOp::Call(call(4, CallState::Succeeded)),
            ],
        )
        .unwrap();
        assert_eq!(plan.first_seq(), Some(3));
        assert_eq!(plan.calls.len(), 2);
        let first = &plan.calls[0];
        assert_eq!(first.call.fence, 7, "the claim's fence, not the record's");
        assert_eq!(first.call.state, CallState::Succeeded);
        assert_eq!(first.call.outcome.as_deref(), Some("{\"ok\":1}"));
        assert_eq!(first.call.finished_at_ms, Some(9));
        assert_eq!(first.call.chain.as_deref(), Some("link"));
        assert_eq!(
            first.attempts.iter().map(|a| a.attempt).collect::<Vec<_>>(),
            [1, 2]
        );
        assert!(plan.updates.is_empty());
        assert!(plan.durable, "a started write is durable");
    }

    #[test]
    fn outcomes_and_attempts_of_earlier_calls_are_updates_in_sequence_order() {
        let plan = CommitPlan::new(
            &claim(),
            vec![
                WriteOp::Attempt(attempt(5, 3)),
                outcome(5),
                WriteOp::Attempt(attempt(2, 1)),
                WriteOp::Call(call(6, CallState::Succeeded)),
            ],
        )
        .unwrap();
        assert_eq!(
            plan.updates
                .iter()
                .map(|u| (u.seq, u.outcome.is_some(), u.attempts.len()))
                .collect::<Vec<_>>(),
            [(2, false, 1), (5, true, 1)]
        );
        assert!(!plan.durable);
    }

    #[test]
    fn calls_that_skip_a_number_or_an_outcome_before_its_call_are_refused() {
        let err = CommitPlan::new(
            &claim(),
            vec![
                WriteOp::Call(call(1, CallState::Succeeded)),
                WriteOp::Call(call(3, CallState::Succeeded)),
            ],
        )
        .unwrap_err();
        assert!(
            matches!(err, StoreError::NotAppended { seq: 3, .. }),
            "{err:?}"
        );
        let err = CommitPlan::new(
            &claim(),
            vec![outcome(4), WriteOp::Call(call(4, CallState::Started))],
        )
        .unwrap_err();
        assert!(
            matches!(err, StoreError::NotAppended { seq: 4, .. }),
            "{err:?}"
        );
        let err = CommitPlan::new(
            &claim(),
            vec![WriteOp::Call(call(4, CallState::Started)), outcome(5)],
        )
        .unwrap_err();
        assert!(matches!(err, StoreError::Corrupt(_)), "{err:?}");
    }

    #[test]
    fn a_create_only_first() {
        let run = crate::records::NewRun {
            run_id: "r",
            module_digest: "d",
            step: None,
            world: "stephost:step@0.1.0",
            input: "{}",
            now_ms: 1,
            budget: Default::default(),
        }
        .record(Some(&claim()));
        let plan = CommitPlan::new(&claim(), vec![WriteOp::Create(Box::new(run.clone()))]).unwrap();
        assert_eq!(plan.create.as_ref().map(|r| &r.run_id), Some(&run.run_id));
        let err = CommitPlan::new(
            &claim(),
            vec![
                WriteOp::Log(LogRecord {
                    after_seq: 0,
                    level: "info".into(),
                    message: "m".into(),
                    at_ms: 1,
                }),
                WriteOp::Create(Box::new(run)),
            ],
        )
        .unwrap_err();
        assert!(matches!(err, StoreError::Corrupt(_)), "{err:?}");
    }

    #[test]
    fn counters_are_summed_and_the_last_lease_stands_due_when_it_ends() {
        let plan = CommitPlan::new(
            &claim(),
            vec![
                WriteOp::Counters(Counters::from([("calls", 2), ("writes", 1)])),
                WriteOp::Lease { until_ms: 50 },
                WriteOp::Counters(Counters::from([("calls", 3)])),
                WriteOp::Lease { until_ms: 80 },
            ],
        )
        .unwrap();
        assert_eq!(plan.counters, Counters::from([("calls", 5), ("writes", 1)]));
        assert_eq!(
            plan.lease,
            Some(LeaseChange {
                lease_until_ms: 80,
                due_at_ms: Some(80)
            }),
            "due when the lease ends"
        );
        assert!(!plan.durable);
        assert!(!plan.is_empty());
        assert!(CommitPlan::new(&claim(), vec![]).unwrap().is_empty());
    }
}
