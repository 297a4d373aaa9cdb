//! A ledger in memory: the storage roles over one mutex, for tests of the
//! domain rules and the journal, and as the reference the conformance suite
//! holds every backend to. Nothing survives the process.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::history::History;
use crate::lifecycle;
use crate::notices::{self, Notice, NoticeAttempt, NoticeState};
use crate::records::{
    AttemptRecord, CallRecord, CallState, Claim, Counters, LogRecord, RunRecord, RunStatus,
};
use crate::store::{
    Commit, OpenCall, Pool, RunQuery, Settlement, Store, StoreError, StoreResult, WriteOp, Writer,
};

#[derive(Default, Clone)]
struct RunRows {
    run: Option<RunRecord>,
    calls: Vec<CallRecord>,
    attempts: Vec<AttemptRecord>,
    logs: Vec<LogRecord>,
}

#[derive(Default)]
struct State {
    modules: HashMap<String, Vec<u8>>,
    runs: BTreeMap<String, RunRows>,
    counters: BTreeMap<String, i64>,
    /// By delivery id, in the order they were owed.
    notices: Vec<Notice>,
}

/// An in-memory ledger; clones share it.
#[derive(Clone, Default)]
pub struct MemoryPool(Arc<Mutex<State>>);

impl MemoryPool {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Pool for MemoryPool {
    fn store(&self) -> StoreResult<Box<dyn Store>> {
        Ok(Box::new(self.clone()))
    }

    fn writer(&self) -> StoreResult<Box<dyn Writer>> {
        Ok(Box::new(self.clone()))
    }
}

fn unknown(run_id: &str) -> StoreError {
    StoreError::UnknownRun(run_id.to_string())
}

impl State {
    fn run(&self, run_id: &str) -> StoreResult<&RunRecord> {
        self.runs
            .get(run_id)
            .and_then(|r| r.run.as_ref())
            .ok_or_else(|| unknown(run_id))
    }

    fn add(&mut self, counters: &Counters) {
        for (name, by) in counters {
            *self.counters.entry(name.to_string()).or_insert(0) += by;
        }
    }
}

impl Store for MemoryPool {
    fn put_module(&self, digest: &str, bytes: &[u8]) -> StoreResult<()> {
        self.lock()
            .modules
            .entry(digest.to_string())
            .or_insert_with(|| bytes.to_vec());
        Ok(())
    }

    fn module(&self, digest: &str) -> StoreResult<Vec<u8>> {
        self.lock()
            .modules
            .get(digest)
            .cloned()
            .ok_or_else(|| StoreError::UnknownModule(digest.to_string()))
    }

    fn insert_run(&self, run: &RunRecord) -> StoreResult<RunRecord> {
        let mut state = self.lock();
        let rows = state.runs.entry(run.run_id.clone()).or_default();
        Ok(rows.run.get_or_insert_with(|| run.clone()).clone())
    }

    fn run(&self, run_id: &str) -> StoreResult<RunRecord> {
        self.lock().run(run_id).cloned()
    }

    fn runs(&self, query: &RunQuery) -> StoreResult<Vec<RunRecord>> {
        let state = self.lock();
        let mut runs: Vec<RunRecord> = state
            .runs
            .values()
            .filter_map(|r| r.run.clone())
            .filter(|r| query.matches(r))
            .collect();
        runs.sort_by(|a, b| (b.created_at_ms, &b.run_id).cmp(&(a.created_at_ms, &a.run_id)));
        if let Some(after) = &query.after_run_id {
            match runs.iter().position(|r| &r.run_id == after) {
                Some(at) => {
                    runs.drain(..=at);
                }
                None => runs.clear(),
            }
        }
        if let Some(limit) = query.limit {
            runs.truncate(limit);
        }
        Ok(runs)
    }

    fn status_counts(&self) -> StoreResult<Vec<(RunStatus, u64)>> {
        let state = self.lock();
        let mut counts: BTreeMap<&str, (RunStatus, u64)> = BTreeMap::new();
        for run in state.runs.values().filter_map(|r| r.run.as_ref()) {
            counts
                .entry(run.status.as_str())
                .or_insert((run.status, 0))
                .1 += 1;
        }
        Ok(counts.into_values().collect())
    }

    fn due_runs(&self, limit: usize) -> StoreResult<Vec<RunRecord>> {
        let state = self.lock();
        let mut due: Vec<(i64, RunRecord)> = state
            .runs
            .values()
            .filter_map(|r| r.run.as_ref())
            .filter_map(|r| lifecycle::due_at(r).map(|at| (at, r.clone())))
            .collect();
        due.sort_by(|a, b| (a.0, &a.1.run_id).cmp(&(b.0, &b.1.run_id)));
        Ok(due.into_iter().take(limit).map(|(_, r)| r).collect())
    }

    fn swap_run(&self, expected_version: i64, run: &RunRecord, _durable: bool) -> StoreResult<()> {
        let mut state = self.lock();
        let rows = state
            .runs
            .get_mut(&run.run_id)
            .and_then(|r| r.run.as_mut())
            .ok_or_else(|| unknown(&run.run_id))?;
        if rows.version != expected_version {
            return Err(StoreError::VersionConflict {
                run_id: run.run_id.clone(),
                expected: expected_version,
                found: rows.version,
            });
        }
        *rows = run.clone();
        Ok(())
    }

    fn calls(&self, run_id: &str, from_seq: u64, limit: usize) -> StoreResult<Vec<CallRecord>> {
        let state = self.lock();
        state.run(run_id)?;
        Ok(state.runs[run_id]
            .calls
            .iter()
            .filter(|c| c.seq >= from_seq)
            .take(limit)
            .cloned()
            .collect())
    }

    fn history(&self, run_id: &str) -> StoreResult<History> {
        let state = self.lock();
        state.run(run_id)?;
        let rows = &state.runs[run_id];
        let last_attempts = match rows.calls.last() {
            Some(last) if last.state == CallState::Started => rows
                .attempts
                .iter()
                .filter(|a| a.seq == last.seq)
                .map(|a| a.attempt)
                .max()
                .unwrap_or(0),
            _ => 0,
        };
        Ok(History::checked(run_id, rows.calls.clone())?.with_last_attempts(last_attempts))
    }

    fn attempts(&self, run_id: &str, seq: Option<u64>) -> StoreResult<Vec<AttemptRecord>> {
        let state = self.lock();
        state.run(run_id)?;
        let mut attempts: Vec<AttemptRecord> = state.runs[run_id]
            .attempts
            .iter()
            .filter(|a| seq.is_none_or(|s| a.seq == s))
            .cloned()
            .collect();
        attempts.sort_by_key(|a| (a.seq, a.attempt));
        Ok(attempts)
    }

    fn logs(&self, run_id: &str) -> StoreResult<Vec<LogRecord>> {
        let state = self.lock();
        state.run(run_id)?;
        Ok(state.runs[run_id].logs.clone())
    }

    fn open_calls(&self, state: CallState, interface: Option<&str>) -> StoreResult<Vec<OpenCall>> {
        let locked = self.lock();
        let mut open: Vec<OpenCall> = locked
            .runs
            .values()
            .filter_map(|rows| rows.run.as_ref().map(|run| (run, rows)))
            .filter(|(run, _)| !run.status.is_finished())
            .flat_map(|(run, rows)| {
                rows.calls
                    .iter()
                    .filter(|c| c.state == state && interface.is_none_or(|i| c.interface == i))
                    .map(|call| OpenCall {
                        run: run.clone(),
                        call: call.clone(),
                    })
            })
            .collect();
        open.sort_by(|a, b| {
            (a.call.started_at_ms, &a.run.run_id).cmp(&(b.call.started_at_ms, &b.run.run_id))
        });
        Ok(open)
    }

    fn settle(&self, s: &Settlement) -> StoreResult<()> {
        let mut state = self.lock();
        let rows = state
            .runs
            .get_mut(&s.run_id)
            .ok_or_else(|| unknown(&s.run_id))?;
        let run = rows.run.as_ref().ok_or_else(|| unknown(&s.run_id))?;
        if run.version != s.expected_version {
            return Err(StoreError::VersionConflict {
                run_id: s.run_id.clone(),
                expected: s.expected_version,
                found: run.version,
            });
        }
        let call = rows
            .calls
            .iter_mut()
            .find(|c| c.seq == s.seq)
            .ok_or_else(|| StoreError::CallConflict {
                run_id: s.run_id.clone(),
                seq: s.seq,
                expected: s.expected_state,
                found: "not recorded".into(),
            })?;
        if call.state != s.expected_state {
            return Err(StoreError::CallConflict {
                run_id: s.run_id.clone(),
                seq: s.seq,
                expected: s.expected_state,
                found: call.state.as_str().into(),
            });
        }
        call.state = s.state;
        call.outcome = Some(s.outcome.clone());
        call.finished_at_ms = Some(s.at_ms);
        call.resolved_by = Some(s.by.clone());
        call.chain = s.chain.clone();
        rows.run = Some(s.run.clone());
        state.add(&s.counters);
        Ok(())
    }

    fn add_counters(&self, counters: &Counters) -> StoreResult<()> {
        self.lock().add(counters);
        Ok(())
    }

    fn counters(&self) -> StoreResult<Vec<(String, i64)>> {
        Ok(self
            .lock()
            .counters
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect())
    }

    fn owe_notices(&self, owed: &[Notice]) -> StoreResult<usize> {
        let mut state = self.lock();
        let mut new = 0;
        for notice in owed {
            if !state
                .notices
                .iter()
                .any(|n| n.delivery_id == notice.delivery_id)
            {
                state.notices.push(notice.clone());
                new += 1;
            }
        }
        Ok(new)
    }

    fn take_notices(
        &self,
        webhooks: &[String],
        now_ms: i64,
        hold_until_ms: i64,
        limit: usize,
    ) -> StoreResult<Vec<Notice>> {
        let mut state = self.lock();
        let mut due: Vec<&mut Notice> = state
            .notices
            .iter_mut()
            .filter(|n| n.state == NoticeState::Owed && n.next_at_ms <= now_ms)
            .filter(|n| webhooks.contains(&n.webhook))
            .collect();
        due.sort_by_key(|n| n.next_at_ms);
        Ok(due
            .into_iter()
            .take(limit)
            .map(|n| {
                n.next_at_ms = hold_until_ms;
                n.clone()
            })
            .collect())
    }

    fn notice_tried(
        &self,
        delivery_id: &str,
        held_until_ms: i64,
        attempt: &NoticeAttempt,
    ) -> StoreResult<bool> {
        let mut state = self.lock();
        let held = state.notices.iter_mut().find(|n| {
            n.delivery_id == delivery_id
                && n.state == NoticeState::Owed
                && n.next_at_ms == held_until_ms
        });
        Ok(held.map(|n| notices::apply(n, attempt)).is_some())
    }

    fn notices(&self, run_id: Option<&str>, limit: usize) -> StoreResult<Vec<Notice>> {
        Ok(self
            .lock()
            .notices
            .iter()
            .filter(|n| run_id.is_none_or(|r| n.run_id == r))
            .take(limit)
            .cloned()
            .collect())
    }

    fn last_call(&self, run_id: &str) -> StoreResult<Option<CallRecord>> {
        let locked = self.lock();
        let rows = locked.runs.get(run_id).ok_or_else(|| unknown(run_id))?;
        rows.run.as_ref().ok_or_else(|| unknown(run_id))?;
        Ok(rows.calls.last().cloned())
    }
}

impl Writer for MemoryPool {
    fn commit(&mut self, claim: &Claim, ops: Vec<WriteOp>) -> Commit {
        Commit::Done(self.apply(claim, ops))
    }

    fn landed(&mut self) -> StoreResult<()> {
        Ok(())
    }
}

impl MemoryPool {
    /// Applies a commit all or nothing: the run's rows are changed in a
    /// copy, put back only if every op applied.
    fn apply(&self, claim: &Claim, ops: Vec<WriteOp>) -> StoreResult<()> {
        let mut state = self.lock();
        let mut rows = state.runs.get(&claim.run_id).cloned().unwrap_or_default();
        let mut counters = Counters::new();
        for op in ops {
            match op {
                WriteOp::Create(run) => {
                    if let Some(found) = &rows.run {
                        return Err(StoreError::ClaimedElsewhere {
                            run_id: found.run_id.clone(),
                            owner: found
                                .owner
                                .clone()
                                .unwrap_or_else(|| "another process".into()),
                            lease_until_ms: found.lease_until_ms.unwrap_or(found.updated_at_ms),
                        });
                    }
                    rows.run = Some(*run);
                }
                op => {
                    let run = rows.run.as_mut().ok_or_else(|| unknown(&claim.run_id))?;
                    if run.fence != claim.fence {
                        return Err(lifecycle::fenced(run, claim));
                    }
                    apply_op(&mut rows, claim, op, &mut counters)?;
                }
            }
        }
        if rows.run.is_none() {
            return Err(unknown(&claim.run_id));
        }
        state.runs.insert(claim.run_id.clone(), rows);
        state.add(&counters);
        Ok(())
    }
}

fn apply_op(
    rows: &mut RunRows,
    claim: &Claim,
    op: WriteOp,
    counters: &mut Counters,
) -> StoreResult<()> {
    let not_appended = |seq| StoreError::NotAppended {
        run_id: claim.run_id.clone(),
        seq,
    };
    match op {
        WriteOp::Create(_) => unreachable!("handled by the caller"),
        WriteOp::Call(call) | WriteOp::Started(call) => {
            if call.seq != rows.calls.len() as u64 + 1 {
                return Err(not_appended(call.seq));
            }
            // Kept under the claim's fence, whatever the record says, as
            // the database backends keep it.
            rows.calls.push(CallRecord {
                fence: claim.fence,
                ..call
            });
        }
        WriteOp::Outcome {
            seq,
            state,
            outcome,
            now_ms,
            chain,
        } => {
            let call = rows
                .calls
                .iter_mut()
                .find(|c| c.seq == seq)
                .ok_or_else(|| {
                    StoreError::Corrupt(format!(
                        "an outcome for call #{seq} of run {}, which is not recorded",
                        claim.run_id
                    ))
                })?;
            call.state = state;
            call.outcome = outcome;
            call.finished_at_ms = Some(now_ms);
            call.chain = chain;
        }
        WriteOp::Attempt(attempt) => rows.attempts.push(attempt),
        WriteOp::Log(log) => rows.logs.push(log),
        WriteOp::Lease { until_ms, .. } => {
            let run = rows.run.as_mut().expect("checked by the caller");
            run.lease_until_ms = Some(until_ms);
            run.version += 1;
        }
        WriteOp::End(end) => {
            let run = rows.run.as_mut().expect("checked by the caller");
            *run = end.applied_to(run);
        }
        WriteOp::Counters(more) => {
            for (name, by) in more {
                *counters.entry(name).or_insert(0) += by;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::conformance::TestLedger;

    fn memory() -> TestLedger {
        TestLedger {
            pool: std::sync::Arc::new(super::MemoryPool::new()),
            guard: Box::new(()),
        }
    }

    crate::conformance_tests!(memory);
}
