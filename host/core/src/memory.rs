//! A ledger in memory: the storage roles over one mutex, for tests of the
//! domain rules and the journal, and as the reference the conformance suite
//! holds every backend to. Nothing survives the process.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::commit::CommitPlan;
use crate::history::History;
use crate::lifecycle;
use crate::notices::{self, Notice, NoticeAttempt, NoticeState};
use crate::records::{
    AttemptRecord, CallRecord, CallState, CancelRequest, ChildArrival, Counters, InboxEntry,
    LogRecord, RunRecord, RunStatus,
};
use crate::store::{
    Commit, OpenCall, Outbox, Pool, RunQuery, Settlement, Store, StoreError, StoreResult, Views,
    Writer,
};

#[derive(Default, Clone)]
struct RunRows {
    run: Option<RunRecord>,
    calls: Vec<CallRecord>,
    attempts: Vec<AttemptRecord>,
    logs: Vec<LogRecord>,
    /// The ends of the run's children, in arrival order.
    inbox: Vec<InboxEntry>,
    /// Its promises' completions, by id.
    promises: BTreeMap<u64, crate::promises::Completion>,
    /// When the run was recorded, among all runs (children list in it).
    order: u64,
}

#[derive(Default)]
struct State {
    modules: HashMap<String, Vec<u8>>,
    /// When each module was last stored ([`crate::retention::MODULE_KEPT_MS`]).
    module_stored: HashMap<String, i64>,
    runs: BTreeMap<String, RunRows>,
    counters: BTreeMap<String, i64>,
    /// By delivery id, in the order they were owed.
    notices: Vec<Notice>,
    flows: HashMap<String, crate::flow::FlowState>,
    /// Trees' model spend: by root, by run.
    tree_spend: HashMap<String, BTreeMap<String, crate::Spent>>,
    schedules: BTreeMap<String, crate::schedules::Schedule>,
    /// Runs recorded so far.
    recorded: u64,
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

    fn outbox(&self) -> StoreResult<Box<dyn Outbox>> {
        Ok(Box::new(self.clone()))
    }

    fn writer(&self) -> StoreResult<Box<dyn Writer>> {
        Ok(Box::new(self.clone()))
    }

    fn flows(&self) -> StoreResult<Arc<dyn crate::flow::Flows>> {
        Ok(Arc::new(self.clone()))
    }

    fn tree_spends(&self) -> StoreResult<Arc<dyn crate::tree_spend::TreeSpends>> {
        Ok(Arc::new(self.clone()))
    }

    fn schedules(&self) -> StoreResult<Arc<dyn crate::schedules::Schedules>> {
        Ok(Arc::new(self.clone()))
    }

    fn retention(&self) -> StoreResult<Arc<dyn crate::retention::Retention>> {
        Ok(Arc::new(self.clone()))
    }
}

impl crate::retention::Retention for MemoryPool {
    fn prune(
        &self,
        rule: &crate::retention::Rule,
        dry_run: bool,
    ) -> StoreResult<crate::retention::Pruned> {
        let mut state = self.lock();
        let finished = |r: &RunRecord| r.status.is_finished();
        let mut roots: Vec<(i64, String)> = state
            .runs
            .values()
            .filter_map(|rows| rows.run.as_ref())
            .filter(|r| r.root_run_id.is_none() && rule.takes(r.status, r.updated_at_ms))
            .map(|r| (r.updated_at_ms, r.run_id.clone()))
            .collect();
        roots.sort();
        let mut pruned = crate::retention::Pruned::default();
        let mut trees = 0;
        let mut modules = Vec::new();
        for (_, root) in roots {
            if trees == rule.batch_runs {
                break;
            }
            let tree: Vec<String> = state
                .runs
                .values()
                .filter_map(|rows| rows.run.as_ref())
                .filter(|r| r.run_id == root || r.root_run_id.as_deref() == Some(root.as_str()))
                .map(|r| r.run_id.clone())
                .collect();
            let all_finished = tree
                .iter()
                .all(|id| state.runs[id].run.as_ref().is_some_and(finished));
            let owed = state
                .notices
                .iter()
                .any(|n| tree.contains(&n.run_id) && n.state == NoticeState::Owed);
            if !all_finished || owed {
                continue;
            }
            trees += 1;
            for id in &tree {
                let rows = &state.runs[id];
                let run = rows.run.as_ref().expect("listed");
                pruned.bytes += (run.input.len()
                    + run.output.as_ref().map_or(0, String::len)
                    + run.error.as_ref().map_or(0, String::len))
                    as u64;
                for call in &rows.calls {
                    pruned.bytes +=
                        (call.request.len() + call.outcome.as_ref().map_or(0, String::len)) as u64;
                }
                pruned.bytes += rows
                    .logs
                    .iter()
                    .map(|l| l.message.len() as u64)
                    .sum::<u64>();
                pruned.run_ids.push(id.clone());
                modules.push(run.module_digest.clone());
            }
            if dry_run {
                continue;
            }
            for id in &tree {
                state.runs.remove(id);
            }
            state.notices.retain(|n| !tree.contains(&n.run_id));
            state.tree_spend.remove(&root);
        }
        if dry_run || pruned.run_ids.is_empty() {
            return Ok(pruned);
        }
        let pinned: std::collections::HashSet<String> = state
            .runs
            .values()
            .filter_map(|rows| rows.run.as_ref().map(|r| r.module_digest.clone()))
            .chain(state.schedules.values().map(|s| s.module_digest.clone()))
            .collect();
        let kept_since = crate::clock::now_ms() - rule.module_kept_ms;
        for digest in modules {
            let recent = state
                .module_stored
                .get(&digest)
                .is_some_and(|at| *at > kept_since);
            if pinned.contains(&digest) || recent {
                continue;
            }
            state.module_stored.remove(&digest);
            if let Some(bytes) = state.modules.remove(&digest) {
                pruned.bytes += bytes.len() as u64;
            }
        }
        *state
            .counters
            .entry(crate::retention::RUNS_PRUNED_COUNTER.into())
            .or_default() += pruned.run_ids.len() as i64;
        *state
            .counters
            .entry(crate::retention::BYTES_PRUNED_COUNTER.into())
            .or_default() += pruned.bytes as i64;
        Ok(pruned)
    }
}

impl crate::schedules::Schedules for MemoryPool {
    fn add(&self, schedule: &crate::schedules::Schedule) -> StoreResult<bool> {
        let mut state = self.lock();
        if state.schedules.contains_key(&schedule.name) {
            return Ok(false);
        }
        let added = crate::schedules::Schedule {
            version: 1,
            ..schedule.clone()
        };
        state.schedules.insert(schedule.name.clone(), added);
        Ok(true)
    }

    fn list(&self) -> StoreResult<Vec<crate::schedules::Schedule>> {
        Ok(self.lock().schedules.values().cloned().collect())
    }

    fn get(&self, name: &str) -> StoreResult<Option<crate::schedules::Schedule>> {
        Ok(self.lock().schedules.get(name).cloned())
    }

    fn due(&self, now_ms: i64, limit: usize) -> StoreResult<Vec<crate::schedules::Schedule>> {
        let state = self.lock();
        let mut due: Vec<_> = state
            .schedules
            .values()
            .filter(|s| crate::schedules::is_due(s, now_ms))
            .cloned()
            .collect();
        due.sort_by_key(|s| s.next_at_ms);
        due.truncate(limit);
        Ok(due)
    }

    fn next_at(&self) -> StoreResult<Option<i64>> {
        Ok(self
            .lock()
            .schedules
            .values()
            .filter(|s| !s.paused)
            .map(|s| s.next_at_ms)
            .min())
    }

    fn swap(
        &self,
        expected: i64,
        schedule: &crate::schedules::Schedule,
        _durable: bool,
    ) -> StoreResult<bool> {
        let mut state = self.lock();
        let Some(found) = state.schedules.get_mut(&schedule.name) else {
            return Ok(false);
        };
        if found.version != expected {
            return Ok(false);
        }
        found.paused = schedule.paused;
        found.next_at_ms = schedule.next_at_ms;
        found.last_run_id = schedule.last_run_id.clone();
        found.buffered_at_ms = schedule.buffered_at_ms;
        found.updated_at_ms = schedule.updated_at_ms;
        found.version += 1;
        Ok(true)
    }

    fn remove(&self, name: &str) -> StoreResult<bool> {
        Ok(self.lock().schedules.remove(name).is_some())
    }
}

impl crate::tree_spend::TreeSpends for MemoryPool {
    fn set_spent(
        &self,
        root_run_id: &str,
        run_id: &str,
        spent: crate::Spent,
        cap: Option<crate::Spent>,
    ) -> StoreResult<Result<(), crate::Spent>> {
        let mut state = self.lock();
        let tree = state.tree_spend.entry(root_run_id.to_string()).or_default();
        let others = tree
            .iter()
            .filter(|(run, _)| *run != run_id)
            .fold(crate::Spent::default(), |sum, (_, s)| sum.plus(*s));
        if let Some(cap) = cap
            && !crate::tree_spend::fits(others, spent, cap)
        {
            return Ok(Err(others));
        }
        tree.insert(run_id.to_string(), spent);
        Ok(Ok(()))
    }

    fn tree_spent(&self, root_run_id: &str) -> StoreResult<crate::Spent> {
        Ok(self
            .lock()
            .tree_spend
            .get(root_run_id)
            .map(|tree| {
                tree.values()
                    .fold(crate::Spent::default(), |sum, s| sum.plus(*s))
            })
            .unwrap_or_default())
    }
}

impl crate::flow::Flows for MemoryPool {
    fn flow(
        &self,
        key: &str,
        caps: crate::flow::FlowCaps,
        op: crate::flow::FlowOp,
    ) -> StoreResult<Result<(), i64>> {
        let now_ms = crate::clock::now_ms();
        let mut state = self.lock();
        let flow = state
            .flows
            .entry(key.to_string())
            .or_insert_with(|| crate::flow::FlowState::full(&caps, now_ms));
        Ok(flow.apply(&caps, op, now_ms))
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

    /// Inserts `run` unless a run with its id exists; the row as stored.
    fn insert(&mut self, run: &RunRecord) -> RunRecord {
        self.recorded += 1;
        let order = self.recorded;
        let rows = self.runs.entry(run.run_id.clone()).or_default();
        if rows.run.is_none() {
            rows.order = order;
        }
        rows.run.get_or_insert_with(|| run.clone()).clone()
    }

    /// A child's end into its parent's inbox; the parent made due if it
    /// waits ([`lifecycle::woken_by_arrival`]).
    fn arrive(&mut self, arrival: &ChildArrival) -> StoreResult<()> {
        let rows = self
            .runs
            .get_mut(&arrival.parent_run_id)
            .ok_or_else(|| unknown(&arrival.parent_run_id))?;
        if rows
            .inbox
            .iter()
            .any(|e| e.child_run_id == arrival.child_run_id)
        {
            return Ok(());
        }
        rows.inbox.push(InboxEntry {
            arrival: rows.inbox.len() as u64 + 1,
            child_run_id: arrival.child_run_id.clone(),
            join_set: arrival.join_set.clone(),
            status: arrival.status,
            at_ms: arrival.at_ms,
        });
        let parent = rows
            .run
            .as_mut()
            .ok_or_else(|| unknown(&arrival.parent_run_id))?;
        if let Some((wake_at, _)) = lifecycle::woken_by_arrival(parent.status, arrival.at_ms) {
            parent.wake_at_ms = Some(wake_at);
        }
        parent.version += 1;
        Ok(())
    }

    /// Marks run `run_id` cancelled by `request` if it is unfinished and
    /// not marked yet ([`lifecycle::woken_by_cancel`]), then every run
    /// below it; the ids marked, top down.
    fn mark_tree(&mut self, run_id: &str, request: &CancelRequest, marked: &mut Vec<String>) {
        let mut level = vec![run_id.to_string()];
        while !level.is_empty() {
            for id in &level {
                let Some(run) = self.runs.get_mut(id).and_then(|r| r.run.as_mut()) else {
                    continue;
                };
                if run.status.is_finished() || run.cancel.is_some() {
                    continue;
                }
                run.cancel = Some(request.clone());
                run.version += 1;
                run.updated_at_ms = request.at_ms;
                if let Some((wake_at, _)) =
                    lifecycle::woken_by_cancel(run.status, run.owner.is_some(), request.at_ms)
                    && run.status == RunStatus::Waiting
                {
                    run.wake_at_ms = Some(wake_at);
                }
                marked.push(id.clone());
            }
            level = self.children_of(&level, false);
        }
    }

    /// The children of the runs `parents` (those not detached only, if
    /// `attached`).
    fn children_of(&self, parents: &[String], attached: bool) -> Vec<String> {
        let mut found: Vec<(u64, String)> = self
            .runs
            .values()
            .filter_map(|r| Some((r.order, r.run.as_ref()?)))
            .filter(|(_, r)| {
                r.parent
                    .as_ref()
                    .is_some_and(|p| parents.contains(&p.run_id) && !(attached && p.detached))
            })
            .map(|(order, r)| (order, r.run_id.clone()))
            .collect();
        found.sort();
        found.into_iter().map(|(_, id)| id).collect()
    }

    fn add(&mut self, counters: &Counters) {
        for (name, by) in counters {
            *self.counters.entry(name.to_string()).or_insert(0) += by;
        }
    }
}

impl Views for MemoryPool {
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

    fn module(&self, digest: &str) -> StoreResult<Vec<u8>> {
        self.lock()
            .modules
            .get(digest)
            .cloned()
            .ok_or_else(|| StoreError::UnknownModule(digest.to_string()))
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

    fn counters(&self) -> StoreResult<Vec<(String, i64)>> {
        Ok(self
            .lock()
            .counters
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect())
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

    fn inbox(&self, run_id: &str) -> StoreResult<Vec<InboxEntry>> {
        let state = self.lock();
        state.run(run_id)?;
        Ok(state.runs[run_id].inbox.clone())
    }

    fn tree_size(&self, root_run_id: &str) -> StoreResult<u64> {
        Ok(self
            .lock()
            .runs
            .values()
            .filter_map(|r| r.run.as_ref())
            .filter(|r| r.root_run_id.as_deref() == Some(root_run_id))
            .count() as u64)
    }

    fn promise(&self, run_id: &str, id: u64) -> StoreResult<Option<crate::promises::Completion>> {
        let state = self.lock();
        state.run(run_id)?;
        Ok(state.runs[run_id].promises.get(&id).cloned())
    }

    fn children(&self, run_id: &str) -> StoreResult<Vec<RunRecord>> {
        let state = self.lock();
        state.run(run_id)?;
        let mut children: Vec<(u64, RunRecord)> = state
            .runs
            .values()
            .filter_map(|r| Some((r.order, r.run.clone()?)))
            .filter(|(_, r)| r.parent.as_ref().is_some_and(|p| p.run_id == run_id))
            .collect();
        children.sort_by_key(|(order, _)| *order);
        Ok(children.into_iter().map(|(_, r)| r).collect())
    }

    fn forks(&self, run_id: &str) -> StoreResult<Vec<RunRecord>> {
        let state = self.lock();
        state.run(run_id)?;
        let mut forks: Vec<(u64, RunRecord)> = state
            .runs
            .values()
            .filter_map(|r| Some((r.order, r.run.clone()?)))
            .filter(|(_, r)| r.fork.as_ref().is_some_and(|f| f.run_id == run_id))
            .collect();
        forks.sort_by_key(|(order, _)| *order);
        Ok(forks.into_iter().map(|(_, r)| r).collect())
    }

    fn last_call(&self, run_id: &str) -> StoreResult<Option<CallRecord>> {
        let locked = self.lock();
        let rows = locked.runs.get(run_id).ok_or_else(|| unknown(run_id))?;
        rows.run.as_ref().ok_or_else(|| unknown(run_id))?;
        Ok(rows.calls.last().cloned())
    }
}

impl Store for MemoryPool {
    fn put_module(&self, digest: &str, bytes: &[u8]) -> StoreResult<()> {
        let mut state = self.lock();
        state
            .modules
            .entry(digest.to_string())
            .or_insert_with(|| bytes.to_vec());
        state
            .module_stored
            .insert(digest.to_string(), crate::clock::now_ms());
        Ok(())
    }

    fn insert_run(&self, run: &RunRecord) -> StoreResult<RunRecord> {
        Ok(self.lock().insert(run))
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

    fn cancel(&self, run_id: &str, request: &CancelRequest) -> StoreResult<Vec<String>> {
        let mut state = self.lock();
        let run = state.run(run_id)?;
        if run.status.is_finished() {
            return Err(StoreError::Ended {
                run_id: run_id.to_string(),
                status: run.status.as_str().to_string(),
            });
        }
        let mut marked = Vec::new();
        state.mark_tree(run_id, request, &mut marked);
        Ok(marked)
    }

    fn add_counters(&self, counters: &Counters) -> StoreResult<()> {
        self.lock().add(counters);
        Ok(())
    }

    fn complete_promise(
        &self,
        run_id: &str,
        id: u64,
        completion: &crate::promises::Completion,
    ) -> StoreResult<crate::promises::Kept> {
        let mut state = self.lock();
        let run = state.run(run_id)?;
        if let Some(kept) = state.runs[run_id].promises.get(&id) {
            return Ok(crate::promises::Kept::Already(kept.clone()));
        }
        if run.status.is_finished() {
            return Err(StoreError::Ended {
                run_id: run_id.to_string(),
                status: run.status.as_str().to_string(),
            });
        }
        state
            .runs
            .get_mut(run_id)
            .expect("found above")
            .promises
            .insert(id, completion.clone());
        state.arrive(&crate::promises::arrival(run_id, id, completion))?;
        Ok(crate::promises::Kept::Now)
    }
}

impl Outbox for MemoryPool {
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
}

impl Writer for MemoryPool {
    fn write(&mut self, plan: CommitPlan) -> Commit {
        let kept = plan.begins.then(|| plan.what_happened());
        Commit::Done(match (self.apply(plan), kept) {
            // What the refused commit records of calls already made lands
            // all the same (crate::commit).
            (Err(refusal @ StoreError::Cancelled { .. }), Some(kept)) => {
                self.apply(kept).and(Err(refusal))
            }
            (answer, _) => answer,
        })
    }

    fn landed(&mut self) -> StoreResult<()> {
        Ok(())
    }
}

impl MemoryPool {
    /// Applies a plan all or nothing: the run's rows are changed in a copy,
    /// put back only if every part applied.
    fn apply(&self, plan: CommitPlan) -> StoreResult<()> {
        let mut state = self.lock();
        let mut rows = state.runs.get(&plan.run_id).cloned().unwrap_or_default();
        let first_seq = plan.first_seq();
        if let Some(run) = plan.create {
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
            rows.run = Some(run);
            state.recorded += 1;
            rows.order = state.recorded;
        }
        let run = rows.run.as_mut().ok_or_else(|| unknown(&plan.run_id))?;
        if run.fence != plan.fence {
            return Err(StoreError::Fenced {
                run_id: plan.run_id.clone(),
                held: plan.fence,
                newest: run.fence,
            });
        }
        if plan.begins
            && let Some(request) = &run.cancel
        {
            return Err(StoreError::Cancelled {
                run_id: plan.run_id.clone(),
                reason: request.error(),
            });
        }
        if let Some(first) = first_seq
            && first != rows.calls.len() as u64 + 1
        {
            return Err(StoreError::NotAppended {
                run_id: plan.run_id.clone(),
                seq: first,
            });
        }
        for new in plan.calls {
            rows.attempts.extend(new.attempts);
            rows.calls.push(new.call);
        }
        for update in plan.updates {
            let call = rows
                .calls
                .iter_mut()
                .find(|c| c.seq == update.seq)
                .ok_or_else(|| {
                    StoreError::Corrupt(format!(
                        "an outcome for call #{} of run {}, which is not recorded",
                        update.seq, plan.run_id
                    ))
                })?;
            if let Some(settled) = update.outcome {
                call.state = settled.state;
                call.outcome = settled.outcome;
                call.finished_at_ms = Some(settled.finished_at_ms);
                call.chain = settled.chain;
            }
            rows.attempts.extend(update.attempts);
        }
        rows.logs.extend(plan.logs);
        let run = rows.run.as_mut().expect("checked above");
        if let Some(lease) = plan.lease {
            // The run's due time follows from its row (lifecycle::due_at),
            // which the lease's due time was computed by.
            run.lease_until_ms = Some(lease.lease_until_ms);
            run.version += 1;
        }
        if let Some(end) = &plan.end {
            *run = end.applied_to(run);
            if end
                .inbox_seen
                .is_some_and(|seen| rows.inbox.len() as u64 > seen)
            {
                run.wake_at_ms = Some(end.updated_at_ms);
            }
        }
        for child in &plan.spawns {
            if state
                .runs
                .get(&child.run_id)
                .is_some_and(|r| r.run.is_some())
            {
                return Err(StoreError::RunExists {
                    run_id: child.run_id.clone(),
                });
            }
        }
        if let Some(arrival) = plan.end.as_ref().and_then(|e| e.arrival.as_ref())
            && !state.runs.contains_key(&arrival.parent_run_id)
        {
            return Err(unknown(&arrival.parent_run_id));
        }
        state.runs.insert(plan.run_id.clone(), rows);
        for child in &plan.spawns {
            state.insert(child);
        }
        if let Some(arrival) = plan.end.as_ref().and_then(|e| e.arrival.as_ref()) {
            state.arrive(arrival)?;
        }
        if let Some(request) = plan.end.as_ref().and_then(|e| e.cancel_children.as_ref()) {
            let mut marked = Vec::new();
            for child in state.children_of(std::slice::from_ref(&plan.run_id), true) {
                state.mark_tree(&child, request, &mut marked);
            }
        }
        state.add(&plan.counters);
        Ok(())
    }
}
