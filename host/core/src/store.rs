//! The storage roles every ledger backend fills, each scoped to its
//! callers (see docs/ARCHITECTURE.md, "Storage roles"):
//!
//! - a [`Pool`], opened from a URL, hands out the roles below;
//! - [`Views`]: reads and listings, all that the server's read-only role
//!   and the CLI's listing commands get;
//! - a [`Store`]: the views plus the claim loop and compare-and-set writes
//!   of a run's row (claims, renewals, releases, repins) and a person's
//!   [`Settlement`];
//! - an [`Outbox`]: the notices owed to webhooks, the notifier's;
//! - a [`Writer`]: one execution's commits ([`CommitPlan`]), fenced in the
//!   same transaction as every write.
//!
//! Durability contract of every backend:
//! - a commit holding a durable op ([`WriteOp::durable`]: a write's
//!   `started` row, the run's end) is on disk when it is answered: nothing
//!   leaves the host before;
//! - other commits are ordered before the next durable one but need not be
//!   durable on their own: nothing outside the process has seen their
//!   effect until a later durable commit;
//! - a commit under a claim whose fencing token is not the run's newest
//!   writes nothing and fails with [`StoreError::Fenced`];
//! - a backend that applies commits on another thread applies one
//!   execution's commits in order, and once one fails, none after it.
//!
//! Backends decide no domain rule: what a claim, an end or a decision makes
//! of a row is computed by [`crate::lifecycle`] and [`crate::settle`].

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use crate::commit::CommitPlan;
use crate::history::History;
use crate::notices::{Notice, NoticeAttempt};
use crate::records::{
    AttemptRecord, CallRecord, CallState, CancelRequest, Claim, Counters, EndRow, InboxEntry,
    LogRecord, RunRecord, RunStatus,
};

pub use crate::error::{StoreError, StoreResult};

/// A write under a claim: one unit of a commit.
#[derive(Debug, Clone)]
pub enum WriteOp {
    /// A run started in this process, claimed by the commit's writer, which
    /// this commit records (always its first op). Fails the commit as
    /// claimed elsewhere if the run exists by then.
    Create(Box<RunRecord>),
    /// A finished call row: an observe call with its value, or a read with
    /// its outcome. Not durable on its own.
    Call(CallRecord),
    /// A finished read whose answer was paid for (a model's): durable, so
    /// that a process that dies after it is never asks (and pays) again.
    Answer(CallRecord),
    /// A write or suspend call, before it leaves the host: durable.
    Started(CallRecord),
    /// The outcome of a call recorded `started`.
    Outcome {
        seq: u64,
        state: CallState,
        outcome: Option<String>,
        now_ms: i64,
        /// The call's chain link, when the state is final.
        chain: Option<String>,
    },
    /// An attempt of a call in this commit or an earlier one; a backend
    /// keeps a call's attempts in order with it.
    Attempt(AttemptRecord),
    Log(LogRecord),
    /// The claim's lease, renewed until `until_ms` (the run due then).
    Lease {
        until_ms: i64,
    },
    /// The execution's end (or its wait), giving the claim up: durable.
    End(EndRow),
    /// Metric counters to add (an execution's, with its end).
    Counters(Counters),
    /// A child run started by the parent's call `call` (finished, its
    /// outcome the child's run id): the call and the child's row in one
    /// transaction, so nothing is in doubt. Not durable on its own, like an
    /// observe call: nothing outside the process has seen the child until a
    /// later durable commit (the child's own first write or end, the
    /// parent's), which makes it durable too. Refused as
    /// [`StoreError::RunExists`] if a run with the child's id exists.
    Spawn {
        call: CallRecord,
        child: Box<RunRecord>,
    },
}

impl WriteOp {
    /// Whether the op must be on disk before its writer goes on.
    pub fn durable(&self) -> bool {
        matches!(
            self,
            WriteOp::Started(_) | WriteOp::Answer(_) | WriteOp::End(_)
        )
    }
}

/// A person's decision on a call (an approval, or a call whose outcome was
/// unknown), as [`crate::settle`] computes it: the call's new state and the
/// run's new row, written together by compare-and-set on the call's state
/// and the run's version.
#[derive(Debug, Clone)]
pub struct Settlement {
    pub run_id: String,
    pub seq: u64,
    /// The state the call must still be in.
    pub expected_state: CallState,
    pub state: CallState,
    pub outcome: String,
    pub chain: Option<String>,
    pub by: String,
    pub at_ms: i64,
    /// The version the run's row must still have.
    pub expected_version: i64,
    /// The run's row after the decision.
    pub run: RunRecord,
    pub counters: Counters,
}

/// Which runs a listing returns, newest first.
#[derive(Debug, Clone, Default)]
pub struct RunQuery {
    pub status: Option<RunStatus>,
    pub module_digest: Option<String>,
    /// The step's declared `name@version`.
    pub step: Option<String>,
    pub created_after_ms: Option<i64>,
    pub created_before_ms: Option<i64>,
    /// Only runs whose row changed after this time.
    pub updated_after_ms: Option<i64>,
    /// Only runs created before this one in the listing's order (a page's
    /// last run id, for the next page).
    pub after_run_id: Option<String>,
    pub limit: Option<usize>,
}

impl RunQuery {
    /// Whether any run could pass the filters: a text no ledger stores (one
    /// holding a NUL) matches nothing, and is never sent to a database
    /// (PostgreSQL refuses it outright).
    pub fn may_match(&self) -> bool {
        [&self.module_digest, &self.step, &self.after_run_id]
            .into_iter()
            .flatten()
            .all(|text| !text.contains('\0'))
    }

    /// Whether `run` passes the filters (not the page bounds).
    pub fn matches(&self, run: &RunRecord) -> bool {
        self.status.is_none_or(|s| run.status == s)
            && self
                .module_digest
                .as_deref()
                .is_none_or(|d| run.module_digest == d)
            && self
                .step
                .as_deref()
                .is_none_or(|s| run.step.as_deref() == Some(s))
            && self.created_after_ms.is_none_or(|t| run.created_at_ms > t)
            && self.created_before_ms.is_none_or(|t| run.created_at_ms < t)
            && self.updated_after_ms.is_none_or(|t| run.updated_at_ms > t)
    }
}

/// A call waiting for a person, with its run: the approvals inbox and the
/// queue of calls whose outcome is unknown.
#[derive(Debug, Clone)]
pub struct OpenCall {
    pub run: RunRecord,
    pub call: CallRecord,
}

/// How a pool is opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolOptions {
    /// Let the writers' commits share transactions and fsyncs (a worker
    /// with several runs at once); otherwise each writer commits on its own.
    pub group_commit: bool,
}

/// Hands out the storage roles over one ledger.
pub trait Pool: Send + Sync {
    fn store(&self) -> StoreResult<Box<dyn Store>>;
    /// Reads alone.
    fn views(&self) -> StoreResult<Box<dyn Views>> {
        Ok(self.store()?)
    }
    fn outbox(&self) -> StoreResult<Box<dyn Outbox>>;
    /// A writer for one execution at a time. A pool opened for several
    /// concurrent runs may let its writers' commits share transactions and
    /// fsyncs (group commit).
    fn writer(&self) -> StoreResult<Box<dyn Writer>>;
    /// How the writers' commits have shared transactions and fsyncs so far
    /// (zeros for a pool whose writers commit on their own).
    fn commit_counts(&self) -> CommitCounts {
        CommitCounts::default()
    }
    /// Has `wake` called whenever a run may have become due (submitted,
    /// released, decided by a person, its timer set), by whichever process
    /// made it so. `false` if this backend cannot tell: its workers poll.
    fn watch_due(&self, wake: WakeUp) -> StoreResult<bool> {
        let _ = wake;
        Ok(false)
    }
    /// Models' flow state, shared by every process on the ledger.
    fn flows(&self) -> StoreResult<Arc<dyn crate::flow::Flows>>;
    /// Trees' model spend, shared by every process on the ledger.
    fn tree_spends(&self) -> StoreResult<Arc<dyn crate::tree_spend::TreeSpends>>;

    /// The schedules ([`crate::schedules`]), shared by every process on
    /// the ledger.
    fn schedules(&self) -> StoreResult<Arc<dyn crate::schedules::Schedules>>;

    /// Deleting finished runs ([`crate::retention`]).
    fn retention(&self) -> StoreResult<Arc<dyn crate::retention::Retention>>;
}

/// Opens pools of one ledger: what a worker or a server is given, so that
/// nothing above the backends names one (see the `stephost-ledger` crate).
pub trait Opener: Send + Sync {
    fn open(&self, options: PoolOptions) -> StoreResult<Arc<dyn Pool>>;
    /// Where the ledger is, for messages (no password).
    fn url(&self) -> String;
}

/// What a pool calls when a run may have become due.
pub type WakeUp = Arc<dyn Fn() + Send + Sync>;

/// How commits shared transactions and fsyncs (group commit).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CommitCounts {
    /// Commits handed in by writers.
    pub commits: u64,
    /// Transactions they were applied in.
    pub transactions: u64,
    /// Fsyncs that made them durable.
    pub fsyncs: u64,
}

/// Reads and listings: nothing here changes the ledger.
pub trait Views: Send {
    fn module(&self, digest: &str) -> StoreResult<Vec<u8>>;
    fn run(&self, run_id: &str) -> StoreResult<RunRecord>;
    /// Runs that pass `query`'s filters, newest first.
    fn runs(&self, query: &RunQuery) -> StoreResult<Vec<RunRecord>>;
    /// How many runs are in each status.
    fn status_counts(&self) -> StoreResult<Vec<(RunStatus, u64)>>;
    /// Runs by the time they are due ([`crate::lifecycle::due_at`]), earliest
    /// first, at most `limit`: every due run comes before any not yet due.
    fn due_runs(&self, limit: usize) -> StoreResult<Vec<RunRecord>>;
    /// Calls from `from_seq` on, in order, at most `limit`.
    fn calls(&self, run_id: &str, from_seq: u64, limit: usize) -> StoreResult<Vec<CallRecord>>;
    /// Every call of the run, in order, as an execution replays them.
    fn history(&self, run_id: &str) -> StoreResult<History>;
    /// The attempts of the run's calls (of call `seq` alone, if given), in
    /// order.
    fn attempts(&self, run_id: &str, seq: Option<u64>) -> StoreResult<Vec<AttemptRecord>>;
    fn logs(&self, run_id: &str) -> StoreResult<Vec<LogRecord>>;
    /// Calls in `state` (of `interface`, if given) of runs not finished,
    /// oldest first.
    fn open_calls(&self, state: CallState, interface: Option<&str>) -> StoreResult<Vec<OpenCall>>;
    fn counters(&self) -> StoreResult<Vec<(String, i64)>>;
    /// The notices about run `run_id` (about any run, if none), oldest
    /// first, at most `limit`.
    fn notices(&self, run_id: Option<&str>, limit: usize) -> StoreResult<Vec<Notice>>;
    /// The run's last call (the one an approval or an unknown outcome
    /// waits on), none if it has made no call; one read, whatever the
    /// run's length (a backend that can should override the default).
    fn last_call(&self, run_id: &str) -> StoreResult<Option<CallRecord>> {
        Ok(self.calls(run_id, 1, usize::MAX)?.pop())
    }
    /// The ends of the run's children, in arrival order.
    fn inbox(&self, run_id: &str) -> StoreResult<Vec<InboxEntry>>;
    /// Promise `id` of run `run_id`'s completion, if it has one
    /// ([`crate::promises`]).
    fn promise(&self, run_id: &str, id: u64) -> StoreResult<Option<crate::promises::Completion>>;
    /// The run's children, in the order they were started.
    fn children(&self, run_id: &str) -> StoreResult<Vec<RunRecord>>;
    /// The runs forked from run `run_id`, oldest first.
    fn forks(&self, run_id: &str) -> StoreResult<Vec<RunRecord>>;
    /// How many runs the tree of `root_run_id` holds below its root.
    fn tree_size(&self, root_run_id: &str) -> StoreResult<u64>;
}

/// The views, and the writes of the claim loop and of people: runs and
/// modules put in, compare-and-set of a run's row, decisions.
pub trait Store: Views {
    /// Stores module bytes under their digest (idempotent).
    fn put_module(&self, digest: &str, bytes: &[u8]) -> StoreResult<()>;
    /// Inserts `run` (durably) unless a run with its id exists; returns the
    /// run's row as stored: `run`, or the one that was there.
    fn insert_run(&self, run: &RunRecord) -> StoreResult<RunRecord>;
    /// Replaces the run's row with `run` if its version is still
    /// `expected_version`; else [`StoreError::VersionConflict`] with the
    /// version found. Durable when it returns if `durable`; otherwise
    /// ordered before the next durable write (a claim needs no fsync of its
    /// own: nothing leaves the host before the claimant's first durable
    /// commit, which carries it).
    fn swap_run(&self, expected_version: i64, run: &RunRecord, durable: bool) -> StoreResult<()>;
    /// Writes a person's decision (durably); see [`Settlement`].
    fn settle(&self, settlement: &Settlement) -> StoreResult<()>;
    /// Adds to the metric counters (kept in the ledger across restarts).
    fn add_counters(&self, counters: &Counters) -> StoreResult<()>;
    /// Cancels run `run_id` and every run below it, in one transaction
    /// (durable when it returns): each unfinished run not cancelled yet is
    /// marked with `request` (a start of a child under a marked run is
    /// refused in its own transaction, so none escapes), and one nobody
    /// holds that is pending or waiting is due at once
    /// ([`crate::lifecycle::woken_by_cancel`]), for a worker to end it.
    /// The runs marked now, top down. [`StoreError::Ended`] if `run_id`
    /// has finished.
    fn cancel(&self, run_id: &str, request: &CancelRequest) -> StoreResult<Vec<String>>;
    /// Keeps `completion` as promise `id` of run `run_id`'s, unless it has
    /// one (which is returned), and in the same transaction appends it to
    /// the run's inbox (`promise:ID`), making the run due if it waits, as
    /// a child's end does. An unknown run is `UnknownRun`; a finished one,
    /// `Ended`.
    fn complete_promise(
        &self,
        run_id: &str,
        id: u64,
        completion: &crate::promises::Completion,
    ) -> StoreResult<crate::promises::Kept>;
}

/// Notices owed to webhooks ([`crate::notices`]): recorded before they are
/// sent, taken by one notifier at a time, settled by their attempts.
pub trait Outbox: Send {
    /// Records notices owed; one whose delivery id is recorded already is
    /// left as it is. Durable when it returns; how many were new.
    fn owe_notices(&self, notices: &[Notice]) -> StoreResult<usize>;
    /// Up to `limit` owed notices to the webhooks named `webhooks`, due at
    /// `now_ms`, earliest due first (then first owed), each held from other
    /// takers (its `next_at_ms` set) until `hold_until_ms`.
    fn take_notices(
        &self,
        webhooks: &[String],
        now_ms: i64,
        hold_until_ms: i64,
        limit: usize,
    ) -> StoreResult<Vec<Notice>>;
    /// Records an attempt to deliver the notice (durably), if it is still
    /// owed and held until `held_until_ms` (as [`Outbox::take_notices`] left
    /// it): a taker whose hold lapsed and was taken over records nothing.
    /// Whether it was recorded.
    fn notice_tried(
        &self,
        delivery_id: &str,
        held_until_ms: i64,
        attempt: &NoticeAttempt,
    ) -> StoreResult<bool>;
}

/// One execution's commits.
pub trait Writer: Send {
    /// Applies `ops` for the claim's run in one transaction, fenced, in
    /// order after the writer's earlier commits: checks them as
    /// [`CommitPlan::new`] does and writes the plan ([`Writer::write`]).
    fn commit(&mut self, claim: &Claim, ops: Vec<WriteOp>) -> Commit {
        match CommitPlan::new(claim, ops) {
            Ok(plan) => self.write(plan),
            Err(e) => Commit::Done(Err(e)),
        }
    }

    /// Writes `plan` in one transaction: creates the run if the plan does
    /// (refused as [`StoreError::ClaimedElsewhere`] if it exists), refuses
    /// it unless its fence is the run's newest ([`StoreError::Fenced`]) and
    /// its first call follows the run's last ([`StoreError::NotAppended`]),
    /// then writes what it holds and nothing else. A backend may write a
    /// plan that is not durable later, on another thread: then its error,
    /// if any, is the answer of a later commit or of [`Writer::landed`].
    fn write(&mut self, plan: CommitPlan) -> Commit;

    /// Returns once every commit handed in before is applied (not
    /// necessarily on disk), with the first error among them.
    fn landed(&mut self) -> StoreResult<()>;
}

/// A commit's answer: already known, or pending on another thread.
pub enum Commit {
    Done(StoreResult<()>),
    Pending(PendingCommit),
}

impl Commit {
    /// The answer, waiting for it on this thread if need be.
    pub fn wait(self) -> StoreResult<()> {
        match self {
            Commit::Done(result) => result,
            Commit::Pending(pending) => pending.wait(),
        }
    }
}

/// A commit another thread applies; wait for it ([`PendingCommit::wait`])
/// or await it (a run executed as a task). Waiting blocks the thread, also
/// a runtime's; awaiting does not.
pub struct PendingCommit(Arc<Slot>);

/// The sending half of a [`PendingCommit`], for the thread that applies it.
/// Dropped unanswered, the commit is answered as lost.
pub struct CommitReply(Arc<Slot>);

#[derive(Default)]
struct Slot {
    state: Mutex<SlotState>,
    answered: Condvar,
}

#[derive(Default)]
struct SlotState {
    answer: Option<StoreResult<()>>,
    closed: bool,
    waker: Option<Waker>,
}

impl Slot {
    fn lock(&self) -> MutexGuard<'_, SlotState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn finish(&self, answer: Option<StoreResult<()>>) {
        let waker = {
            let mut state = self.lock();
            if state.answer.is_some() || state.closed {
                return;
            }
            match answer {
                Some(answer) => state.answer = Some(answer),
                None => state.closed = true,
            }
            state.waker.take()
        };
        self.answered.notify_all();
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl PendingCommit {
    pub fn new() -> (CommitReply, PendingCommit) {
        let slot = Arc::new(Slot::default());
        (CommitReply(slot.clone()), PendingCommit(slot))
    }

    /// The answer, blocking this thread until it comes.
    pub fn wait(self) -> StoreResult<()> {
        let mut state = self.0.lock();
        loop {
            if let Some(answer) = state.answer.take() {
                return answer;
            }
            if state.closed {
                return Err(committer_gone());
            }
            state = self
                .0
                .answered
                .wait(state)
                .unwrap_or_else(|p| p.into_inner());
        }
    }
}

impl CommitReply {
    pub fn send(self, result: StoreResult<()>) {
        self.0.finish(Some(result));
    }
}

impl Drop for CommitReply {
    fn drop(&mut self) {
        self.0.finish(None);
    }
}

impl Future for PendingCommit {
    type Output = StoreResult<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.0.lock();
        if let Some(answer) = state.answer.take() {
            return Poll::Ready(answer);
        }
        if state.closed {
            return Poll::Ready(Err(committer_gone()));
        }
        state.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

fn committer_gone() -> StoreError {
    StoreError::Unavailable("the ledger's committer stopped before answering".into())
}

/// The rule of rolling upgrades, written once for every backend: a build
/// whose schema version is `supported` uses a ledger at version `found`
/// when it is not newer, migrating it up (`Ok(true)`); a newer ledger only
/// if the ledger says builds of `compatible_from` or later may use it
/// (`Ok(false)`: used as it is, never migrated down). Each migration that
/// only adds (a table, an index, a column with a default) that older
/// builds may leave alone keeps the ledger's `compatible_from`; one that
/// older builds would break raises it.
pub fn may_use(
    location: &str,
    found: i64,
    compatible_from: Option<i64>,
    supported: i64,
) -> StoreResult<bool> {
    if found <= supported {
        return Ok(true);
    }
    let compatible_from = compatible_from.unwrap_or(found);
    if compatible_from <= supported {
        return Ok(false);
    }
    Err(StoreError::TooNew {
        location: location.to_string(),
        found,
        supported,
        compatible_from,
    })
}
