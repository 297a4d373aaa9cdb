//! Group commit for many runs in one process.
//!
//! Every run's writer hands its commits to one committer thread, which
//! applies whatever has queued up in one transaction, each commit in a
//! savepoint of its own, and answers each writer with its own result. A
//! transaction holding a durable op is fsync'd before anyone is answered: a
//! `started` row is on disk before its request leaves, and N concurrent
//! writes share one fsync instead of N. A writer waits for (or awaits) each
//! commit's answer before it hands in the next, so a failed commit is seen
//! before anything of its execution follows it.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;

use stephost_core::store::{Commit, CommitCounts, CommitReply, PendingCommit, WriteOp, Writer};
use stephost_core::{Claim, StoreError, StoreResult};

use crate::commit;
use crate::conn::{Conn, Sync};

/// Most commits applied in one transaction.
pub const BATCH_COMMITS_MAX: usize = 512;

struct Job {
    claim: Claim,
    ops: Vec<WriteOp>,
    reply: CommitReply,
}

#[derive(Default)]
struct Counts {
    commits: AtomicU64,
    transactions: AtomicU64,
    fsyncs: AtomicU64,
}

/// The committer thread and the queue into it.
pub struct GroupCommitter {
    queue: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    counts: Arc<Counts>,
}

impl GroupCommitter {
    /// Starts a committer with its own connection to the ledger at `path`.
    pub fn start(path: &Path) -> StoreResult<Self> {
        let mut conn = Conn::connect(path)?;
        let (tx, rx) = mpsc::channel::<Job>();
        let counts = Arc::new(Counts::default());
        let counted = counts.clone();
        let thread = std::thread::Builder::new()
            .name("stephost-commit".into())
            .spawn(move || run(&mut conn, &rx, &counted))
            .map_err(|e| StoreError::Unavailable(format!("cannot start the committer: {e}")))?;
        Ok(GroupCommitter {
            queue: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
            counts,
        })
    }

    /// A writer whose commits go through this committer.
    pub fn writer(&self) -> StoreResult<GroupWriter> {
        let queue = self
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| StoreError::Unavailable("the committer has stopped".into()))?;
        Ok(GroupWriter { queue })
    }

    pub fn counts(&self) -> CommitCounts {
        CommitCounts {
            commits: self.counts.commits.load(Ordering::Relaxed),
            transactions: self.counts.transactions.load(Ordering::Relaxed),
            fsyncs: self.counts.fsyncs.load(Ordering::Relaxed),
        }
    }
}

impl Drop for GroupCommitter {
    fn drop(&mut self) {
        // The thread ends once every writer's queue handle is gone too.
        self.queue.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(thread) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = thread.join();
        }
    }
}

/// A writer whose commits the committer applies; each is answered pending,
/// and its caller waits for (or awaits) the answer.
pub struct GroupWriter {
    queue: mpsc::Sender<Job>,
}

impl Writer for GroupWriter {
    fn commit(&mut self, claim: &Claim, ops: Vec<WriteOp>) -> Commit {
        let (reply, pending) = PendingCommit::new();
        let job = Job {
            claim: claim.clone(),
            ops,
            reply,
        };
        if self.queue.send(job).is_err() {
            return Commit::Done(Err(StoreError::Unavailable(
                "the committer has stopped".into(),
            )));
        }
        Commit::Pending(pending)
    }

    /// Every commit was answered to its caller already.
    fn landed(&mut self) -> StoreResult<()> {
        Ok(())
    }
}

/// The committer's loop: a batch of queued commits per transaction.
fn run(conn: &mut Conn, queue: &mpsc::Receiver<Job>, counts: &Counts) {
    while let Ok(first) = queue.recv() {
        let mut batch = vec![first];
        while batch.len() < BATCH_COMMITS_MAX {
            match queue.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let durable = batch.iter().any(|job| commit::durable(&job.ops));
        let answers = apply_batch(conn, &batch, durable);
        counts
            .commits
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        counts.transactions.fetch_add(1, Ordering::Relaxed);
        if durable {
            counts.fsyncs.fetch_add(1, Ordering::Relaxed);
        }
        for (job, answer) in batch.into_iter().zip(answers) {
            job.reply.send(answer);
        }
    }
}

/// Applies `batch` in one transaction, each job in a savepoint: the answer
/// of each job.
fn apply_batch(conn: &mut Conn, batch: &[Job], durable: bool) -> Vec<StoreResult<()>> {
    let begun = conn
        .set_sync(Sync::when(durable))
        .and_then(|()| Conn::run(&conn.conn, "BEGIN IMMEDIATE"));
    if let Err(e) = begun {
        return batch.iter().map(|_| Err(e.clone())).collect();
    }
    let mut answers = Vec::with_capacity(batch.len());
    if let Err(e) = conn.known.begin(&conn.conn) {
        let _ = Conn::run(&conn.conn, "ROLLBACK");
        return batch.iter().map(|_| Err(e.clone())).collect();
    }
    let db = &conn.conn;
    let known = &mut conn.known;
    for job in batch {
        let applied = Conn::run(db, "SAVEPOINT job")
            .and_then(|()| commit::apply(db, known, &job.claim, &job.ops));
        if applied.is_err() {
            known.forget();
        }
        let ended = match &applied {
            Ok(()) => Conn::run(db, "RELEASE job"),
            Err(_) => Conn::run(db, "ROLLBACK TO job").and_then(|()| Conn::run(db, "RELEASE job")),
        };
        answers.push(applied.and_then(|()| ended));
    }
    if let Err(e) = Conn::run(db, "COMMIT") {
        let _ = Conn::run(db, "ROLLBACK");
        known.forget();
        return batch.iter().map(|_| Err(e.clone())).collect();
    }
    answers
}
