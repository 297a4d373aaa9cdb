//! A ledger that fails on purpose, for the fault-injection harness: built
//! only with the `faults` feature (the test binary's), and only when the
//! environment variable `STEPHOST_LEDGER_FAULTS` is set, as
//! `seed=N,percent=P`. Then each commit of a run's writer, each
//! compare-and-set of a run's row and each read of a run's recorded calls
//! draws, from the seed, whether to misbehave (`P` in 100), and how:
//! - fail before it is applied (nothing written, `Unavailable`);
//! - fail after it is applied (written, and answered `Unavailable`, as a
//!   commit whose fsync reported failure is: the caller cannot tell);
//! - answer late (50 to 300 ms).
//!
//! A read fails (nothing read, `Unavailable`). The host must treat each as
//! it treats a real one: stop the execution and leave the run resumable,
//! never guess.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use stephost_core::StoreError;
use stephost_core::commit::CommitPlan;
use stephost_core::history::History;
use stephost_core::notices::Notice;
use stephost_core::records::{
    AttemptRecord, CallRecord, CallState, CancelRequest, Counters, InboxEntry, LogRecord,
    RunRecord, RunStatus,
};
use stephost_core::store::{
    Commit, CommitCounts, OpenCall, Outbox, Pool, RunQuery, Settlement, Store, StoreResult, Views,
    WakeUp, Writer,
};

/// The environment variable that turns the faults on.
pub const ENV: &str = "STEPHOST_LEDGER_FAULTS";

/// What one draw decided.
enum Draw {
    Pass,
    FailBefore,
    FailAfter,
    Late(Duration),
}

/// The seeded draws of one process.
struct Dice {
    state: u64,
    percent: u64,
}

impl Dice {
    fn next(&mut self) -> u64 {
        // SplitMix64.
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn draw(&mut self) -> Draw {
        if self.next() % 100 >= self.percent {
            return Draw::Pass;
        }
        match self.next() % 3 {
            0 => Draw::FailBefore,
            1 => Draw::FailAfter,
            _ => Draw::Late(Duration::from_millis(50 + self.next() % 251)),
        }
    }
}

type Shared = Arc<Mutex<Dice>>;

fn draw(dice: &Shared) -> Draw {
    dice.lock().unwrap_or_else(|p| p.into_inner()).draw()
}

fn injected(what: &str, applied: bool) -> StoreError {
    StoreError::Unavailable(format!(
        "injected fault ({ENV}): {what} {}",
        if applied {
            "was applied and reported failed"
        } else {
            "failed before it was applied"
        }
    ))
}

/// Runs `op` as the draw says.
fn faulty<T>(dice: &Shared, what: &str, op: impl FnOnce() -> StoreResult<T>) -> StoreResult<T> {
    match draw(dice) {
        Draw::Pass => op(),
        Draw::FailBefore => Err(injected(what, false)),
        Draw::FailAfter => op().and(Err(injected(what, true))),
        Draw::Late(delay) => {
            std::thread::sleep(delay);
            op()
        }
    }
}

/// `pool`, failing as `STEPHOST_LEDGER_FAULTS` says, or as it is if unset.
pub fn wrap(pool: Arc<dyn Pool>) -> Result<Arc<dyn Pool>, StoreError> {
    let Ok(spec) = std::env::var(ENV) else {
        return Ok(pool);
    };
    let (mut seed, mut percent) = (None, None);
    for part in spec.split(',') {
        match part.trim().split_once('=') {
            Some(("seed", n)) => seed = n.parse::<u64>().ok(),
            Some(("percent", n)) => percent = n.parse::<u64>().ok().filter(|p| *p <= 100),
            _ => {}
        }
    }
    let (Some(seed), Some(percent)) = (seed, percent) else {
        return Err(StoreError::Config(format!(
            "{ENV}={spec:?}: expected seed=N,percent=P (P from 0 to 100)"
        )));
    };
    Ok(Arc::new(FaultyPool {
        inner: pool,
        dice: Arc::new(Mutex::new(Dice {
            state: seed,
            percent,
        })),
    }))
}

struct FaultyPool {
    inner: Arc<dyn Pool>,
    dice: Shared,
}

impl Pool for FaultyPool {
    fn store(&self) -> StoreResult<Box<dyn Store>> {
        Ok(Box::new(FaultyStore {
            inner: self.inner.store()?,
            dice: self.dice.clone(),
        }))
    }
    fn views(&self) -> StoreResult<Box<dyn Views>> {
        Ok(self.store()?)
    }
    fn outbox(&self) -> StoreResult<Box<dyn Outbox>> {
        self.inner.outbox()
    }
    fn writer(&self) -> StoreResult<Box<dyn Writer>> {
        Ok(Box::new(FaultyWriter {
            inner: self.inner.writer()?,
            dice: self.dice.clone(),
        }))
    }
    fn commit_counts(&self) -> CommitCounts {
        self.inner.commit_counts()
    }
    fn watch_due(&self, wake: WakeUp) -> StoreResult<bool> {
        self.inner.watch_due(wake)
    }
    fn flows(&self) -> StoreResult<Arc<dyn stephost_core::flow::Flows>> {
        self.inner.flows()
    }
    fn tree_spends(&self) -> StoreResult<Arc<dyn stephost_core::tree_spend::TreeSpends>> {
        self.inner.tree_spends()
    }
    fn schedules(&self) -> StoreResult<Arc<dyn stephost_core::schedules::Schedules>> {
        self.inner.schedules()
    }

    fn retention(&self) -> StoreResult<Arc<dyn stephost_core::retention::Retention>> {
        self.inner.retention()
    }
}

struct FaultyWriter {
    inner: Box<dyn Writer>,
    dice: Shared,
}

impl Writer for FaultyWriter {
    fn write(&mut self, plan: CommitPlan) -> Commit {
        match draw(&self.dice) {
            Draw::Pass => self.inner.write(plan),
            Draw::FailBefore => Commit::Done(Err(injected("a commit", false))),
            Draw::FailAfter => {
                let applied = self.inner.write(plan).wait();
                Commit::Done(applied.and(Err(injected("a commit", true))))
            }
            Draw::Late(delay) => {
                std::thread::sleep(delay);
                self.inner.write(plan)
            }
        }
    }

    fn landed(&mut self) -> StoreResult<()> {
        self.inner.landed()
    }
}

struct FaultyStore {
    inner: Box<dyn Store>,
    dice: Shared,
}

impl Views for FaultyStore {
    fn module(&self, digest: &str) -> StoreResult<Vec<u8>> {
        self.inner.module(digest)
    }
    fn run(&self, run_id: &str) -> StoreResult<RunRecord> {
        self.inner.run(run_id)
    }
    fn runs(&self, query: &RunQuery) -> StoreResult<Vec<RunRecord>> {
        self.inner.runs(query)
    }
    fn status_counts(&self) -> StoreResult<Vec<(RunStatus, u64)>> {
        self.inner.status_counts()
    }
    fn due_runs(&self, limit: usize) -> StoreResult<Vec<RunRecord>> {
        self.inner.due_runs(limit)
    }
    fn calls(&self, run_id: &str, from_seq: u64, limit: usize) -> StoreResult<Vec<CallRecord>> {
        self.inner.calls(run_id, from_seq, limit)
    }
    fn history(&self, run_id: &str) -> StoreResult<History> {
        match draw(&self.dice) {
            Draw::FailBefore | Draw::FailAfter => Err(StoreError::Unavailable(format!(
                "injected fault ({ENV}): a read of run {run_id}'s calls failed"
            ))),
            Draw::Late(delay) => {
                std::thread::sleep(delay);
                self.inner.history(run_id)
            }
            Draw::Pass => self.inner.history(run_id),
        }
    }
    fn attempts(&self, run_id: &str, seq: Option<u64>) -> StoreResult<Vec<AttemptRecord>> {
        self.inner.attempts(run_id, seq)
    }
    fn logs(&self, run_id: &str) -> StoreResult<Vec<LogRecord>> {
        self.inner.logs(run_id)
    }
    fn open_calls(&self, state: CallState, interface: Option<&str>) -> StoreResult<Vec<OpenCall>> {
        self.inner.open_calls(state, interface)
    }
    fn counters(&self) -> StoreResult<Vec<(String, i64)>> {
        self.inner.counters()
    }
    fn notices(&self, run_id: Option<&str>, limit: usize) -> StoreResult<Vec<Notice>> {
        self.inner.notices(run_id, limit)
    }
    fn last_call(&self, run_id: &str) -> StoreResult<Option<CallRecord>> {
        self.inner.last_call(run_id)
    }
    fn inbox(&self, run_id: &str) -> StoreResult<Vec<InboxEntry>> {
        self.inner.inbox(run_id)
    }
    fn promise(
        &self,
        run_id: &str,
        id: u64,
    ) -> StoreResult<Option<stephost_core::promises::Completion>> {
        self.inner.promise(run_id, id)
    }
    fn children(&self, run_id: &str) -> StoreResult<Vec<RunRecord>> {
        self.inner.children(run_id)
    }
    fn forks(&self, run_id: &str) -> StoreResult<Vec<RunRecord>> {
        self.inner.forks(run_id)
    }
    fn tree_size(&self, root_run_id: &str) -> StoreResult<u64> {
        self.inner.tree_size(root_run_id)
    }
}

impl Store for FaultyStore {
    fn put_module(&self, digest: &str, bytes: &[u8]) -> StoreResult<()> {
        self.inner.put_module(digest, bytes)
    }
    fn insert_run(&self, run: &RunRecord) -> StoreResult<RunRecord> {
        self.inner.insert_run(run)
    }
    fn swap_run(&self, expected_version: i64, run: &RunRecord, durable: bool) -> StoreResult<()> {
        faulty(&self.dice, "a run's compare-and-set", || {
            self.inner.swap_run(expected_version, run, durable)
        })
    }
    fn settle(&self, settlement: &Settlement) -> StoreResult<()> {
        self.inner.settle(settlement)
    }
    fn add_counters(&self, counters: &Counters) -> StoreResult<()> {
        self.inner.add_counters(counters)
    }
    fn cancel(&self, run_id: &str, request: &CancelRequest) -> StoreResult<Vec<String>> {
        self.inner.cancel(run_id, request)
    }
    fn complete_promise(
        &self,
        run_id: &str,
        id: u64,
        completion: &stephost_core::promises::Completion,
    ) -> StoreResult<stephost_core::promises::Kept> {
        self.inner.complete_promise(run_id, id, completion)
    }
}
