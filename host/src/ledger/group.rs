//! Group commit for many runs in one process.
//!
//! Every run (a task of a worker's runtime, or a thread of its own) hands
//! its writes to one committer thread, which applies
//! whatever has queued up in one transaction and answers each writer with
//! its own result. A batch holding a durable write (a `started` row, a run's
//! end) is answered only once a syncer thread has fsync'd the WAL after its
//! commit: a `started` row is on disk before its writer is answered, so
//! before its request leaves, and invariant 2 holds. The committer applies
//! the next batch meanwhile, so one batch's SQL overlaps the previous
//! batch's fsync, and N concurrent writes share one fsync instead of N.
//! An answerer thread wakes the writers an fsync covered while the syncer
//! goes on to the next fsync.
//!
//! After an fsync fails, nothing it should have covered can be trusted to
//! be on disk (the kernel may have dropped the pages): every durable write
//! from then on fails, and the runs stop, resumable by another process.
//!
//! A ledger for one run at a time (`stephost run`, a worker running one
//! run at once) is pipelined instead ([`GroupLedger::pipelined`]): writes
//! that need no fsync go to a committer of its own, without waiting, and a
//! durable write is committed on the ledger's own connection once they have
//! landed, so the step and the SQL recording its calls run side by side.
//!
//! Either way, writes queued without waiting are applied in order, and once
//! one fails, none of the same execution after it is (see
//! [`FailedExecutions`]).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;

use super::reply;
use super::sqlite::FailedExecutions;
use super::{
    AttemptRecord, CallRecord, CallState, Claim, History, Ledger, LedgerError, LogRecord, NewRun,
    RunRecord, RunStatus, SqliteLedger, WriteOp,
};

/// Most writes applied in one transaction.
pub const BATCH_WRITES_MAX: usize = 512;

/// A job's result, with its writes handed back once applied, to the thread
/// that allocated them: it reuses their buffers ([`super::spare`]) or frees
/// them itself (freeing another thread's allocations took a tenth of the
/// committer's time and made the two threads contend for the allocator's
/// locks).
type Answer = (Result<(), LedgerError>, Vec<WriteOp>);

type Reply = reply::Sender<Answer>;

struct Job {
    claim: Claim,
    ops: Vec<WriteOp>,
    reply: Reply,
}

/// Makes the WAL durable: an fsync of the file, opened once.
pub type SyncWal = Box<dyn FnMut(&std::fs::File) -> std::io::Result<()> + Send>;

/// The committer, syncer and answerer threads (a pipelined ledger's has no
/// syncer or answerer) and the queue into them.
pub struct GroupCommitter {
    queue: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    counts: Arc<Counts>,
}

/// What a group committer has done so far: how well runs' commits share
/// transactions and fsyncs.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CommitCounts {
    /// Commits handed in by runs (a write's `started` row, buffered calls,
    /// a run's end).
    pub commits: u64,
    /// Transactions they were applied in.
    pub transactions: u64,
    /// Fsyncs of the WAL that made them durable.
    pub fsyncs: u64,
    /// Time the committer spent applying transactions, in µs.
    pub applying_us: u64,
    /// Time the syncer spent in fsyncs, in µs.
    pub syncing_us: u64,
}

impl CommitCounts {
    /// Commits per transaction they were applied in (0 before the first).
    pub fn per_transaction(&self) -> f64 {
        self.commits as f64 / self.transactions.max(1) as f64
    }

    /// Commits per fsync that made them durable (0 before the first).
    pub fn per_fsync(&self) -> f64 {
        self.commits as f64 / self.fsyncs.max(1) as f64
    }
}

#[derive(Default)]
struct Counts {
    commits: AtomicU64,
    transactions: AtomicU64,
    fsyncs: AtomicU64,
    applying_us: AtomicU64,
    syncing_us: AtomicU64,
}

impl GroupCommitter {
    /// Starts a committer with its own connection to the ledger at `db`.
    pub fn start(db: &Path) -> Result<Self, LedgerError> {
        Self::start_syncing(db, Box::new(|wal: &std::fs::File| wal.sync_data()))
    }

    /// Like [`GroupCommitter::start`], making the WAL durable with `sync`.
    pub fn start_syncing(db: &Path, sync: SyncWal) -> Result<Self, LedgerError> {
        Self::spawn(db, Some(sync))
    }

    /// A committer for writes that need no fsync (a pipelined ledger's,
    /// whose durable writes take its own connection): no syncer thread,
    /// and a durable write sent to it fails.
    pub fn start_unsynced(db: &Path) -> Result<Self, LedgerError> {
        Self::spawn(db, None)
    }

    fn spawn(db: &Path, sync: Option<SyncWal>) -> Result<Self, LedgerError> {
        let mut ledger = SqliteLedger::open(db)?;
        let counts = Arc::new(Counts::default());
        let syncer = match sync {
            Some(sync) => {
                // Opened once, while the committer's connection keeps the
                // WAL from being removed: a write error the kernel reports
                // to one fsync is reported to every file handle open at the
                // time, so another connection's fsync (a checkpoint's)
                // cannot take it from this one.
                let wal = open_wal(&ledger.wal_path())?;
                let (to_answer, synced_batches) = mpsc::channel::<Synced>();
                let answerer = std::thread::Builder::new()
                    .name("stephost-answer".into())
                    .spawn(move || {
                        for (batches, synced) in synced_batches {
                            for answers in batches {
                                answer(answers, synced.clone());
                            }
                        }
                    })
                    .map_err(|e| LedgerError::Batch(format!("cannot start the answerer: {e}")))?;
                let (to_sync, committed) = mpsc::channel::<Answers>();
                let counts = counts.clone();
                let thread = std::thread::Builder::new()
                    .name("stephost-sync".into())
                    .spawn(move || {
                        sync_committed(&wal, sync, &committed, &to_answer, &counts);
                        drop(to_answer);
                        let _ = answerer.join();
                    })
                    .map_err(|e| LedgerError::Batch(format!("cannot start the syncer: {e}")))?;
                Some((to_sync, thread))
            }
            None => None,
        };
        let (queue, jobs) = mpsc::channel::<Job>();
        let counted = counts.clone();
        let thread = std::thread::Builder::new()
            .name("stephost-commit".into())
            .spawn(move || {
                let mut failed = FailedExecutions::default();
                while let Ok(first) = jobs.recv() {
                    let mut batch = vec![first];
                    while batch.len() < BATCH_WRITES_MAX {
                        match jobs.try_recv() {
                            Ok(job) => batch.push(job),
                            Err(_) => break,
                        }
                    }
                    let ops: Vec<(&Claim, &[WriteOp])> =
                        batch.iter().map(|j| (&j.claim, j.ops.as_slice())).collect();
                    let began = std::time::Instant::now();
                    let (results, durable) = ledger.apply_batch(&ops, &mut failed);
                    counted
                        .applying_us
                        .fetch_add(began.elapsed().as_micros() as u64, Ordering::Relaxed);
                    drop(ops);
                    counted
                        .commits
                        .fetch_add(batch.len() as u64, Ordering::Relaxed);
                    counted.transactions.fetch_add(1, Ordering::Relaxed);
                    let answers: Vec<_> = batch
                        .into_iter()
                        .zip(results)
                        .map(|(j, result)| (j.reply, (result, j.ops)))
                        .collect();
                    match (&syncer, durable) {
                        (_, false) => answer(answers, Ok(())),
                        (Some((to_sync, _)), true) => {
                            if let Err(mpsc::SendError(answers)) = to_sync.send(answers) {
                                answer(answers, Err("the syncer has stopped".into()));
                            }
                        }
                        (None, true) => answer(
                            answers,
                            Err(
                                "this committer makes nothing durable; a durable write takes \
                                 the ledger's own connection"
                                    .into(),
                            ),
                        ),
                    }
                }
                if let Some((to_sync, thread)) = syncer {
                    drop(to_sync);
                    let _ = thread.join();
                }
            })
            .map_err(|e| LedgerError::Batch(format!("cannot start the committer: {e}")))?;
        Ok(GroupCommitter {
            queue: Some(queue),
            thread: Some(thread),
            counts,
        })
    }

    /// What the committer has done so far (every commit answered so far is
    /// counted, with the transaction and the fsync that it waited for).
    pub fn counts(&self) -> CommitCounts {
        CommitCounts {
            commits: self.counts.commits.load(Ordering::Relaxed),
            transactions: self.counts.transactions.load(Ordering::Relaxed),
            fsyncs: self.counts.fsyncs.load(Ordering::Relaxed),
            applying_us: self.counts.applying_us.load(Ordering::Relaxed),
            syncing_us: self.counts.syncing_us.load(Ordering::Relaxed),
        }
    }

    /// A handle for one run.
    pub fn handle(&self) -> CommitHandle {
        CommitHandle {
            queue: self.queue.clone().expect("queue present until drop"),
        }
    }
}

/// The WAL at `path`, with its folder's entry for it on disk.
fn open_wal(path: &Path) -> Result<WalFile, LedgerError> {
    let cannot = |e: std::io::Error| {
        LedgerError::Batch(format!(
            "cannot open the WAL {} to sync it: {e}",
            path.display()
        ))
    };
    let file = std::fs::File::open(path).map_err(cannot)?;
    if let Some(folder) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::File::open(folder)
            .and_then(|f| f.sync_all())
            .map_err(cannot)?;
    }
    Ok(WalFile {
        path: path.to_path_buf(),
        file,
    })
}

struct WalFile {
    path: std::path::PathBuf,
    file: std::fs::File,
}

/// A batch's writers and their results, once committed.
type Answers = Vec<(Reply, Answer)>;

/// Batches covered by one fsync, and how it went.
type Synced = (Vec<Answers>, Result<(), String>);

/// The syncer: one fsync for every batch committed before it began, whose
/// writers the answerer thread then answers while the syncer goes on to
/// the next fsync (waking 30 writers one by one takes about as long as an
/// fsync); after a failed fsync, only failures.
fn sync_committed(
    wal: &WalFile,
    mut sync: SyncWal,
    committed: &mpsc::Receiver<Answers>,
    answerer: &mpsc::Sender<Synced>,
    counts: &Counts,
) {
    let mut failed: Option<String> = None;
    while let Ok(first) = committed.recv() {
        // Everything queued now was committed before the fsync begins.
        let mut waiting = vec![first];
        waiting.extend(committed.try_iter());
        if failed.is_none() {
            counts.fsyncs.fetch_add(1, Ordering::Relaxed);
        }
        let began = std::time::Instant::now();
        let synced = if failed.is_none() {
            sync(&wal.file)
        } else {
            Ok(())
        };
        counts
            .syncing_us
            .fetch_add(began.elapsed().as_micros() as u64, Ordering::Relaxed);
        if let Err(e) = synced {
            failed = Some(format!(
                "the fsync of {} failed ({e}); writes since the last one may not be on disk, \
                 so this process makes nothing durable any more: restart it and resume the runs",
                wal.path.display()
            ));
        }
        let synced = failed.clone().map_or(Ok(()), Err);
        if let Err(mpsc::SendError((waiting, synced))) = answerer.send((waiting, synced)) {
            // The answerer is gone (it panicked): answer here.
            for answers in waiting {
                answer(answers, synced.clone());
            }
        }
    }
}

/// Sends each writer its own result, or the sync's failure in place of a
/// success.
fn answer(answers: Answers, synced: Result<(), String>) {
    for (reply, (result, ops)) in answers {
        let result = match (&synced, result) {
            (Err(e), Ok(())) => Err(LedgerError::Batch(e.clone())),
            (_, result) => result,
        };
        reply.send((result, ops));
    }
}

impl Drop for GroupCommitter {
    fn drop(&mut self) {
        self.queue.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Sends writes to the committer and waits for their result.
#[derive(Clone)]
pub struct CommitHandle {
    queue: mpsc::Sender<Job>,
}

impl CommitHandle {
    fn send(
        &self,
        claim: &Claim,
        ops: Vec<WriteOp>,
    ) -> Result<reply::Receiver<Answer>, LedgerError> {
        let (reply, result) = reply::channel();
        self.queue
            .send(Job {
                claim: claim.clone(),
                ops,
                reply,
            })
            .map_err(|_| LedgerError::Batch("the committer has stopped".into()))?;
        Ok(result)
    }
}

/// The result of a job sent to the committer, once it has one; its writes,
/// handed back, are kept for this thread's next calls to reuse.
fn wait(result: reply::Receiver<Answer>) -> Result<(), LedgerError> {
    received(result.wait())
}

/// An answer received (see [`wait`]).
fn received(answer: Option<Answer>) -> Result<(), LedgerError> {
    match answer {
        Some((result, applied)) => {
            super::spare::keep(applied);
            result
        }
        None => Err(LedgerError::Batch("the committer has stopped".into())),
    }
}

/// A durable commit sent to the committer and not answered yet (see
/// [`Ledger::commit_durable`]): a thread waits for it, a task awaits it.
pub struct PendingCommit(reply::Receiver<Answer>);

impl PendingCommit {
    /// Blocks this thread until the commit is answered.
    pub fn wait(self) -> Answered {
        Answered(self.0.wait())
    }
}

impl std::future::Future for PendingCommit {
    type Output = Answered;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Answered> {
        std::pin::Pin::new(&mut self.0).poll(cx).map(Answered)
    }
}

/// The committer's answer to a [`PendingCommit`], for
/// [`Ledger::settle_durable`].
pub struct Answered(Option<Answer>);

impl Answered {
    /// The commit's own result (its writes handed back for reuse).
    pub fn into_result(self) -> Result<(), LedgerError> {
        received(self.0)
    }
}

/// Most writes queued without waiting that a ledger keeps in flight; the
/// next one waits for the oldest to land, so a step that makes calls
/// faster than they are applied is held back instead of filling memory.
pub const IN_FLIGHT_MAX: usize = 4;

/// A ledger whose run writes go through a committer thread; reads and the
/// rare other writes use its own connection.
pub struct GroupLedger {
    direct: SqliteLedger,
    committer: Committer,
    /// Replies still to come for writes that need not be waited for, oldest
    /// first.
    in_flight: std::collections::VecDeque<(Claim, reply::Receiver<Answer>)>,
    /// Executions a commit of which failed: their later commits fail too,
    /// whichever connection they would take.
    failed: FailedExecutions,
}

/// Where a [`GroupLedger`]'s writes go.
enum Committer {
    /// A worker's, shared by its runs: durable writes go through it too,
    /// and share its fsyncs.
    Shared(CommitHandle),
    /// This ledger's own, started by the first write that need not wait:
    /// `PENDING_WRITES_MAX` buffered calls, or a write's outcome committed
    /// before a read leaves. A run that makes neither never starts it.
    /// Durable writes, and a new run's first commit, are committed on the
    /// ledger's own connection once every write queued before them has
    /// landed: one fsync, and no thread between the step and it. Dropped,
    /// it applies whatever is still queued before its thread ends (after a
    /// run's panic, say), failures unreported.
    Own(Option<GroupCommitter>),
}

impl GroupLedger {
    /// A run's ledger in a worker, whose writes go through the worker's
    /// committer.
    pub fn new(direct: SqliteLedger, commits: CommitHandle) -> Self {
        GroupLedger {
            direct,
            committer: Committer::Shared(commits),
            in_flight: Default::default(),
            failed: FailedExecutions::default(),
        }
    }

    /// A ledger for one run at a time whose buffered calls (observes,
    /// reads, outcomes) are applied by a thread of its own while the step
    /// goes on: on two cores, the step and the SQL that records its calls
    /// run side by side.
    pub fn pipelined(direct: SqliteLedger) -> Self {
        GroupLedger {
            direct,
            committer: Committer::Own(None),
            in_flight: Default::default(),
            failed: FailedExecutions::default(),
        }
    }

    /// Waits for every write sent before; the first failure among them.
    fn settle(&mut self) -> Result<(), LedgerError> {
        let mut first = Ok(());
        for (claim, reply) in self.in_flight.drain(..) {
            let result = wait(reply);
            if let Err(e) = &result {
                self.failed.add(&claim, e);
            }
            if first.is_ok() {
                first = result;
            }
        }
        first
    }

    /// The committer to send to, started if it is this ledger's own and is
    /// not running yet.
    fn handle(&mut self) -> Result<CommitHandle, LedgerError> {
        match &mut self.committer {
            Committer::Shared(handle) => Ok(handle.clone()),
            Committer::Own(Some(committer)) => Ok(committer.handle()),
            Committer::Own(own) => {
                let committer = GroupCommitter::start_unsynced(self.direct.path())?;
                Ok(own.insert(committer).handle())
            }
        }
    }

    /// Commits `ops`, or queues them (see [`Ledger::commit`] for this
    /// ledger).
    /// A commit to wait for (a durable one, or a new run's first) that the
    /// worker's committer makes comes back pending.
    fn commit_in_order(
        &mut self,
        claim: &Claim,
        ops: Vec<WriteOp>,
    ) -> Result<Option<PendingCommit>, LedgerError> {
        // A new run's own row is waited for: until it is in, another
        // process that started the same run id may own the run, and a
        // queued write would not stop this execution before the next.
        let creates = matches!(ops.first(), Some(WriteOp::Create(_)));
        if !creates && !ops.iter().any(WriteOp::durable) {
            return self.queue(claim, ops).map(|()| None);
        }
        if let Committer::Own(_) = self.committer {
            self.settle()?;
            let result = self.direct.commit(claim, &ops);
            super::spare::keep(ops);
            return result.map(|()| None);
        }
        let reply = self.handle()?.send(claim, ops)?;
        Ok(Some(PendingCommit(reply)))
    }

    /// Queues `ops` without waiting for them, once fewer than
    /// `IN_FLIGHT_MAX` writes are in flight.
    fn queue(&mut self, claim: &Claim, ops: Vec<WriteOp>) -> Result<(), LedgerError> {
        if self.in_flight.len() >= IN_FLIGHT_MAX {
            let (claim, oldest) = self.in_flight.pop_front().expect("in flight");
            if let Err(e) = wait(oldest) {
                self.failed.add(&claim, &e);
                // The others fail or land in their own time; this one's
                // failure stops the run.
                self.settle().ok();
                return Err(e);
            }
        }
        let reply = self.handle()?.send(claim, ops)?;
        self.in_flight.push_back((claim.clone(), reply));
        Ok(())
    }
}

impl Ledger for GroupLedger {
    fn put_module(&mut self, digest: &str, bytes: &[u8]) -> Result<(), LedgerError> {
        self.direct.put_module(digest, bytes)
    }

    fn module(&self, digest: &str) -> Result<Vec<u8>, LedgerError> {
        self.direct.module(digest)
    }

    fn create_run(&mut self, run: NewRun<'_>) -> Result<RunRecord, LedgerError> {
        self.direct.create_run(run)
    }

    fn create_claimed(
        &mut self,
        run: NewRun<'_>,
        owner: &str,
        lease_ms: i64,
        owner_alive: &dyn Fn(&str) -> bool,
    ) -> Result<(RunRecord, Option<Claim>), LedgerError> {
        self.direct
            .create_claimed(run, owner, lease_ms, owner_alive)
    }

    fn run(&self, run_id: &str) -> Result<RunRecord, LedgerError> {
        self.direct.run(run_id)
    }

    fn runs(&self, status: Option<RunStatus>) -> Result<Vec<RunRecord>, LedgerError> {
        self.direct.runs(status)
    }

    fn claim(
        &mut self,
        run_id: &str,
        owner: &str,
        lease_ms: i64,
        now_ms: i64,
        owner_alive: &dyn Fn(&str) -> bool,
    ) -> Result<Claim, LedgerError> {
        self.direct
            .claim(run_id, owner, lease_ms, now_ms, owner_alive)
    }

    fn release(&mut self, claim: &Claim) -> Result<(), LedgerError> {
        // The writes queued before must land first: once the claim is
        // released another worker may claim the run, and they would then
        // be fenced off and lost.
        self.settle()?;
        self.direct.release(claim)
    }

    fn renew(&mut self, claim: &Claim, now_ms: i64) -> Result<(), LedgerError> {
        // A lease renewed while a queued write had failed would keep an
        // execution going that must stop.
        self.settle()?;
        self.direct.renew(claim, now_ms)
    }

    fn runnable(&self, now_ms: i64, limit: usize) -> Result<Vec<RunRecord>, LedgerError> {
        self.direct.runnable(now_ms, limit)
    }

    fn calls(&self, run_id: &str) -> Result<Vec<CallRecord>, LedgerError> {
        self.direct.calls(run_id)
    }

    fn history(&self, run_id: &str) -> Result<History, LedgerError> {
        self.direct.history(run_id)
    }

    fn attempts(&self, run_id: &str) -> Result<Vec<AttemptRecord>, LedgerError> {
        self.direct.attempts(run_id)
    }

    fn call_attempts(&self, run_id: &str, seq: u64) -> Result<Vec<AttemptRecord>, LedgerError> {
        self.direct.call_attempts(run_id, seq)
    }

    fn logs(&self, run_id: &str) -> Result<Vec<LogRecord>, LedgerError> {
        self.direct.logs(run_id)
    }

    /// Durable writes wait for their commit (and so for everything sent
    /// before them: the committer works in order). Other writes are queued
    /// without waiting: they are ordered before the next durable commit,
    /// which reports their failure if any, and nothing outside the process
    /// depends on them before it.
    fn commit(&mut self, claim: &Claim, ops: &[WriteOp]) -> Result<(), LedgerError> {
        self.commit_taking(claim, &mut ops.to_vec())
    }

    fn commit_taking(&mut self, claim: &Claim, ops: &mut Vec<WriteOp>) -> Result<(), LedgerError> {
        match self.commit_durable(claim, ops)? {
            Some(pending) => self.settle_durable(claim, pending.wait()),
            None => Ok(()),
        }
    }

    /// A commit to wait for that the worker's committer makes is not
    /// waited for here: a task awaits it (a run's own durable writes are
    /// committed on its connection at once, as are writes that need no
    /// waiting).
    fn commit_durable(
        &mut self,
        claim: &Claim,
        ops: &mut Vec<WriteOp>,
    ) -> Result<Option<PendingCommit>, LedgerError> {
        if ops.is_empty() {
            return Ok(None);
        }
        if let Some(refusal) = self.failed.refusal(claim) {
            return Err(refusal);
        }
        let taken = std::mem::replace(ops, Vec::with_capacity(ops.len()));
        let result = self.commit_in_order(claim, taken);
        if let Err(e) = &result {
            self.failed.add(claim, e);
        }
        result
    }

    /// Once a commit the committer made is answered: the writes queued
    /// before it have landed too (the committer works in order), and the
    /// first failure among them is this commit's.
    fn settle_durable(&mut self, claim: &Claim, answered: Answered) -> Result<(), LedgerError> {
        let own = answered.into_result();
        let result = self.settle().and(own);
        if let Err(e) = &result {
            self.failed.add(claim, e);
        }
        result
    }

    fn landed(&mut self) -> Result<(), LedgerError> {
        self.settle()
    }

    fn decide_approval(
        &mut self,
        run_id: &str,
        seq: u64,
        outcome: &str,
        by: &str,
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        self.direct
            .decide_approval(run_id, seq, outcome, by, now_ms)
    }

    fn repin(
        &mut self,
        run_id: &str,
        from: &str,
        to: &str,
        step: Option<&str>,
        now_ms: i64,
        owner_alive: &dyn Fn(&str) -> bool,
    ) -> Result<(), LedgerError> {
        self.direct
            .repin(run_id, from, to, step, now_ms, owner_alive)
    }

    fn pending_approvals(&self) -> Result<Vec<(RunRecord, CallRecord)>, LedgerError> {
        self.direct.pending_approvals()
    }

    fn resolve_call(
        &mut self,
        run_id: &str,
        seq: u64,
        state: CallState,
        outcome: &str,
        by: &str,
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        self.direct
            .resolve_call(run_id, seq, state, outcome, by, now_ms)
    }

    fn add_counters(&mut self, counters: &crate::journal::Counters) -> Result<(), LedgerError> {
        self.direct.add_counters(counters)
    }

    fn counters(&self) -> Result<Vec<(String, i64)>, LedgerError> {
        self.direct.counters()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new ledger `l.db` in a temporary folder, holding module `d`.
    fn ledger_with_module() -> (tempfile::TempDir, SqliteLedger) {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = SqliteLedger::open(&dir.path().join("l.db")).unwrap();
        ledger.put_module("d", b"\0asm").unwrap();
        (dir, ledger)
    }

    #[test]
    fn concurrent_writers_share_batches_and_a_stale_one_fails_alone() {
        let (dir, mut setup) = ledger_with_module();
        let db = dir.path().join("l.db");
        let mut claims = Vec::new();
        for i in 0..8 {
            let id = format!("r{i}");
            setup.create_run(NewRun::for_test(&id, "d", 1)).unwrap();
            claims.push(setup.claim(&id, "w", 60_000, 2, &|_| true).unwrap());
        }
        // Run 0's claim goes stale: a newer claimant takes it over.
        let stale = claims[0].clone();
        claims[0] = setup
            .claim("r0", "other", 60_000, 100_000, &|_| true)
            .unwrap();
        let committer = GroupCommitter::start(&db).unwrap();
        std::thread::scope(|s| {
            for claim in &claims {
                let mut ledger =
                    GroupLedger::new(SqliteLedger::open(&db).unwrap(), committer.handle());
                s.spawn(move || {
                    for seq in 1..=20 {
                        ledger.record_started(claim, &started(seq)).unwrap();
                    }
                });
            }
            let mut zombie = GroupLedger::new(SqliteLedger::open(&db).unwrap(), committer.handle());
            let err = zombie.record_started(&stale, &started(1)).unwrap_err();
            assert!(matches!(err, LedgerError::Fenced { .. }), "{err}");
        });
        for claim in &claims {
            assert_eq!(setup.calls(&claim.run_id).unwrap().len(), 20);
        }
    }

    #[test]
    fn a_failing_job_is_undone_whole_and_the_rest_of_its_batch_applied() {
        let (_dir, mut ledger) = ledger_with_module();
        let mut claims = Vec::new();
        for id in ["a", "b", "c"] {
            ledger.create_run(NewRun::for_test(id, "d", 1)).unwrap();
            claims.push(ledger.claim(id, "w", 60_000, 2, &|_| true).unwrap());
        }
        // Run b's job writes call 1, then call 1 again: its second write
        // fails after its first was applied.
        let good = vec![WriteOp::Started(started(1))];
        let failing = vec![WriteOp::Started(started(1)), WriteOp::Started(started(1))];
        let batch: Vec<(&Claim, &[WriteOp])> = vec![
            (&claims[0], &good),
            (&claims[1], &failing),
            (&claims[2], &good),
        ];
        let mut failed = FailedExecutions::default();
        let (results, durable) = ledger.apply_batch(&batch, &mut failed);
        assert!(durable);
        assert!(results[0].is_ok() && results[2].is_ok(), "{results:?}");
        assert!(results[1].is_err());
        // Nothing of the failed job is in the ledger; the others are.
        assert_eq!(ledger.calls("a").unwrap().len(), 1);
        assert!(ledger.calls("b").unwrap().is_empty());
        assert_eq!(ledger.calls("c").unwrap().len(), 1);
        // And b's next write is refused, in a batch of its own or not.
        let next = vec![WriteOp::Started(started(2))];
        let (results, _) = ledger.apply_batch(&[(&claims[1], &next)], &mut failed);
        assert!(results[0].is_err());
        assert!(ledger.calls("b").unwrap().is_empty());
    }

    /// A ledger `l.db` holding module `d` and run `r` claimed by `w`: its
    /// folder, a connection to it, its path and the claim.
    fn claimed_run() -> (tempfile::TempDir, SqliteLedger, std::path::PathBuf, Claim) {
        let (dir, mut setup) = ledger_with_module();
        let db = dir.path().join("l.db");
        setup.create_run(NewRun::for_test("r", "d", 1)).unwrap();
        let claim = setup.claim("r", "w", 60_000, 2, &|_| true).unwrap();
        (dir, setup, db, claim)
    }

    /// A ledger holding module `d` and run `r` claimed by `w`, and a
    /// committer for it that syncs the WAL with `sync`.
    fn claimed_run_with_syncer(
        sync: SyncWal,
    ) -> (tempfile::TempDir, GroupCommitter, GroupLedger, Claim) {
        let (dir, _, db, claim) = claimed_run();
        let committer = GroupCommitter::start_syncing(&db, sync).unwrap();
        let ledger = GroupLedger::new(SqliteLedger::open(&db).unwrap(), committer.handle());
        (dir, committer, ledger, claim)
    }

    fn started(seq: u64) -> CallRecord {
        CallRecord {
            seq,
            class: super::super::CallClass::Write,
            interface: "i".into(),
            function: "f".into(),
            operation_id: format!("op{seq}"),
            request: "{}".into(),
            request_hash: "h".into(),
            state: CallState::Started,
            outcome: None,
            started_at_ms: 1,
            finished_at_ms: None,
            resolved_by: None,
            chain: None,
        }
    }

    #[test]
    fn a_durable_write_is_answered_once_the_wal_is_synced_and_others_need_no_sync() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let syncs = std::sync::Arc::new(AtomicUsize::new(0));
        let counted = syncs.clone();
        let (_dir, _committer, mut ledger, claim) =
            claimed_run_with_syncer(Box::new(move |wal: &std::fs::File| {
                wal.sync_data()?;
                counted.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }));
        ledger.record_started(&claim, &started(1)).unwrap();
        assert_eq!(syncs.load(Ordering::SeqCst), 1);
        let log = WriteOp::Log(LogRecord {
            after_seq: 1,
            level: "info".into(),
            message: "not durable".into(),
            at_ms: 3,
        });
        ledger.commit(&claim, &[log]).unwrap();
        ledger.landed().unwrap();
        assert_eq!(syncs.load(Ordering::SeqCst), 1);
        assert_eq!(ledger.logs("r").unwrap().len(), 1);
    }

    #[test]
    fn after_a_failed_fsync_no_durable_write_succeeds() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let syncs = std::sync::Arc::new(AtomicUsize::new(0));
        let counted = syncs.clone();
        let (_dir, _committer, mut ledger, claim) =
            claimed_run_with_syncer(Box::new(move |_: &std::fs::File| {
                // Fails once; a later fsync would succeed, but what the
                // failed one covered may be lost.
                match counted.fetch_add(1, Ordering::SeqCst) {
                    0 => Err(std::io::Error::other("EIO")),
                    _ => Ok(()),
                }
            }));
        for seq in [1, 2] {
            let err = ledger.record_started(&claim, &started(seq)).unwrap_err();
            assert!(err.to_string().contains("fsync"), "{err}");
        }
        assert_eq!(syncs.load(Ordering::SeqCst), 1);
    }

    /// A ledger holding module `d` and run `r` claimed by `w`, and a
    /// pipelined ledger over it.
    fn pipelined_run() -> (tempfile::TempDir, SqliteLedger, GroupLedger, Claim) {
        let (dir, setup, db, claim) = claimed_run();
        let ledger = GroupLedger::pipelined(SqliteLedger::open(&db).unwrap());
        (dir, setup, ledger, claim)
    }

    fn observed(seq: u64) -> WriteOp {
        let mut call = started(seq);
        call.class = super::super::CallClass::Observe;
        call.state = CallState::Succeeded;
        call.outcome = Some(seq.to_string());
        call.finished_at_ms = Some(1);
        WriteOp::Call(call)
    }

    /// Hands `ops` to the ledger, which queues them without waiting.
    fn queue(ledger: &mut GroupLedger, claim: &Claim, mut ops: Vec<WriteOp>) {
        ledger.commit_taking(claim, &mut ops).unwrap();
    }

    fn own_committer_started(ledger: &GroupLedger) -> bool {
        matches!(ledger.committer, Committer::Own(Some(_)))
    }

    #[test]
    fn a_pipelined_ledger_queues_buffered_calls_and_commits_a_durable_write_after_them() {
        let (_dir, setup, mut ledger, claim) = pipelined_run();
        // Durable writes alone never start the committer thread.
        ledger.record_started(&claim, &started(1)).unwrap();
        assert!(!own_committer_started(&ledger));
        assert!(ledger.in_flight.is_empty());

        let mut ops: Vec<WriteOp> = (2..=600).map(observed).collect();
        ledger.commit_taking(&claim, &mut ops).unwrap();
        assert!(ops.is_empty(), "the queued calls are taken, not copied");
        assert!(own_committer_started(&ledger));
        assert_eq!(ledger.in_flight.len(), 1);

        // The next durable write waits for them, and lands after them.
        ledger.record_started(&claim, &started(601)).unwrap();
        assert!(ledger.in_flight.is_empty());
        let calls = setup.calls("r").unwrap();
        assert_eq!(calls.len(), 601);
        assert_eq!(calls[599].outcome.as_deref(), Some("600"));
        assert_eq!(calls[600].state, CallState::Started);
    }

    #[test]
    fn a_queued_write_that_fails_stops_the_durable_write_after_it() {
        let (_dir, setup, mut ledger, claim) = pipelined_run();
        queue(&mut ledger, &claim, vec![observed(1)]);
        // Call #1 again, which the ledger refuses; queued, so its failure
        // is not known yet...
        queue(&mut ledger, &claim, vec![observed(1)]);
        // ...and the durable write that follows reports it, unapplied.
        let err = ledger.record_started(&claim, &started(2)).unwrap_err();
        assert!(err.to_string().contains("already recorded"), "{err}");
        let calls = setup.calls("r").unwrap();
        assert_eq!(calls.len(), 1, "{calls:?}");
    }

    #[test]
    fn once_a_queued_write_fails_no_later_write_of_the_execution_is_applied() {
        let (_dir, setup, mut ledger, claim) = pipelined_run();
        // Three commits queued at once; the second repeats call #1, which
        // the ledger refuses. The third must not land after the gap.
        queue(&mut ledger, &claim, vec![observed(1)]);
        queue(&mut ledger, &claim, vec![observed(2), observed(1)]);
        queue(&mut ledger, &claim, vec![observed(3)]);
        let err = ledger.landed().unwrap_err();
        assert!(err.to_string().contains("already recorded"), "{err}");
        let calls = setup.calls("r").unwrap();
        assert_eq!(calls.iter().map(|c| c.seq).collect::<Vec<_>>(), vec![1]);
        // So is a durable one, and it says why.
        let err = ledger.record_started(&claim, &started(2)).unwrap_err();
        assert!(err.to_string().contains("earlier write"), "{err}");
        assert_eq!(setup.calls("r").unwrap().len(), 1);
    }

    #[test]
    fn a_new_runs_first_commit_is_waited_for_and_fails_if_another_process_took_the_id() {
        let (dir, setup) = ledger_with_module();
        let db = dir.path().join("l.db");
        let new = NewRun::for_test("fresh", "d", 7);
        let claim = Claim::first("fresh", "me", 30_000, 7);
        let mut ledger = GroupLedger::pipelined(SqliteLedger::open(&db).unwrap());
        let mut first = vec![
            WriteOp::Create(Box::new(RunRecord::claimed(&new, &claim))),
            observed(1),
        ];
        ledger.commit_taking(&claim, &mut first).unwrap();
        assert!(ledger.in_flight.is_empty());
        assert_eq!(setup.run("fresh").unwrap().owner.as_deref(), Some("me"));
        // Another process that started the same id learns it at once.
        let theirs = Claim::first("fresh", "them", 30_000, 9);
        let mut ledger = GroupLedger::pipelined(SqliteLedger::open(&db).unwrap());
        let mut first = vec![
            WriteOp::Create(Box::new(RunRecord::claimed(&new, &theirs))),
            observed(2),
        ];
        let err = ledger.commit_taking(&theirs, &mut first).unwrap_err();
        assert!(matches!(err, LedgerError::ClaimedElsewhere { .. }), "{err}");
        assert_eq!(setup.calls("fresh").unwrap().len(), 1);
    }

    #[test]
    fn a_committer_without_a_syncer_refuses_to_answer_a_durable_write_as_done() {
        let (_dir, _, db, claim) = claimed_run();
        let committer = GroupCommitter::start_unsynced(&db).unwrap();
        let mut ledger = GroupLedger::new(SqliteLedger::open(&db).unwrap(), committer.handle());
        ledger.commit(&claim, &[observed(1)]).unwrap();
        ledger.landed().unwrap();
        let err = ledger.record_started(&claim, &started(2)).unwrap_err();
        assert!(err.to_string().contains("makes nothing durable"), "{err}");
    }

    #[test]
    fn no_more_than_in_flight_max_queued_writes_wait_in_memory() {
        let (_dir, setup, mut ledger, claim) = pipelined_run();
        for seq in 1..=(IN_FLIGHT_MAX as u64 * 3) {
            queue(&mut ledger, &claim, vec![observed(seq)]);
            assert!(ledger.in_flight.len() <= IN_FLIGHT_MAX);
        }
        ledger.landed().unwrap();
        assert!(ledger.in_flight.is_empty());
        assert_eq!(setup.calls("r").unwrap().len(), IN_FLIGHT_MAX * 3);
    }

    #[test]
    fn writes_queued_before_a_release_land_before_another_can_claim() {
        let (_dir, mut setup, db, claim) = claimed_run();
        let committer = GroupCommitter::start(&db).unwrap();
        let mut ledger = GroupLedger::new(SqliteLedger::open(&db).unwrap(), committer.handle());
        // Not durable, so queued without waiting.
        let logs: Vec<WriteOp> = (0..200)
            .map(|i| {
                WriteOp::Log(LogRecord {
                    after_seq: 0,
                    level: "info".into(),
                    message: format!("line {i}"),
                    at_ms: 3,
                })
            })
            .collect();
        ledger.commit(&claim, &logs).unwrap();
        ledger.release(&claim).unwrap();
        // Whoever claims the run next finds every queued write in place.
        setup.claim("r", "next", 60_000, 4, &|_| true).unwrap();
        assert_eq!(setup.logs("r").unwrap().len(), 200);
    }
}
