//! Group commit for many runs in one process.
//!
//! Every run's writer hands its commits to one committer thread, which
//! applies whatever has queued up in one transaction, each commit in a
//! savepoint of its own. Transactions are committed without an fsync
//! (`synchronous = NORMAL`, safe from corruption in WAL mode); a syncer
//! thread fsyncs the WAL after the commit of a batch that holds a durable op
//! and only then answers its writers: a `started` row is on disk before its
//! request leaves, N concurrent writes share one fsync instead of N, and the
//! committer applies the next batch while the syncer waits for the disk.
//! Once an fsync fails, nothing it should have covered can be trusted to be
//! on disk: every durable commit from then on fails, and the runs stop,
//! resumable by another process.
//!
//! A writer waits for (or awaits) each commit's answer before it hands in
//! the next, so a failed commit is seen before anything of its execution
//! follows it.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;

use stephost_core::commit::CommitPlan;
use stephost_core::store::{Commit, CommitCounts, CommitReply, PendingCommit, Writer};
use stephost_core::{StoreError, StoreResult};

use crate::commit;
use crate::conn::{Conn, Sync};

/// Most commits applied in one transaction.
pub const BATCH_COMMITS_MAX: usize = 512;

struct Job {
    plan: CommitPlan,
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
    /// Starts a committer (and its syncer) with its own connection to the
    /// ledger at `path`.
    pub fn start(path: &Path) -> StoreResult<Self> {
        let mut conn = Conn::connect(path)?;
        // Its commits checkpoint inline, as SQLite does (measured faster
        // than the checkpointer here: its fsyncs competed with the syncer's).
        conn.set_sync(Sync::Normal)?;
        let counts = Arc::new(Counts::default());
        let syncer = Syncer::start(path, counts.clone())?;
        let (tx, rx) = mpsc::channel::<Job>();
        let counted = counts.clone();
        let thread = std::thread::Builder::new()
            .name("stephost-commit".into())
            .spawn(move || run(&mut conn, &rx, &syncer, &counted))
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
    fn write(&mut self, plan: CommitPlan) -> Commit {
        let (reply, pending) = PendingCommit::new();
        let job = Job { plan, reply };
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
fn run(conn: &mut Conn, queue: &mpsc::Receiver<Job>, syncer: &Syncer, counts: &Counts) {
    while let Ok(first) = queue.recv() {
        let mut batch = vec![first];
        while batch.len() < BATCH_COMMITS_MAX {
            match queue.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let durable = batch.iter().any(|job| job.plan.durable);
        let answers = apply_batch(conn, &batch);
        counts
            .commits
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        counts.transactions.fetch_add(1, Ordering::Relaxed);
        let answered: Answers = batch
            .into_iter()
            .map(|job| job.reply)
            .zip(answers)
            .collect();
        if durable {
            syncer.answer_after_fsync(answered);
        } else {
            for (reply, answer) in answered {
                reply.send(answer);
            }
        }
    }
}

/// Writers' replies with the outcomes of their jobs in one batch.
type Answers = Vec<(CommitReply, StoreResult<()>)>;

/// The thread that fsyncs the WAL and then answers the writers of the
/// batches it covers.
struct Syncer {
    queue: Option<mpsc::Sender<Answers>>,
    thread: Option<JoinHandle<()>>,
}

impl Syncer {
    fn start(path: &Path, counts: Arc<Counts>) -> StoreResult<Self> {
        let mut wal = path.as_os_str().to_owned();
        wal.push("-wal");
        let wal = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&wal)
            .map_err(|e| {
                StoreError::Unavailable(format!(
                    "cannot open the ledger's write-ahead log {}: {e}",
                    std::path::Path::new(&wal).display()
                ))
            })?;
        let (tx, rx) = mpsc::channel::<Answers>();
        let thread = std::thread::Builder::new()
            .name("stephost-sync".into())
            .spawn(move || sync_loop(&wal, &rx, &counts))
            .map_err(|e| StoreError::Unavailable(format!("cannot start the syncer: {e}")))?;
        Ok(Syncer {
            queue: Some(tx),
            thread: Some(thread),
        })
    }

    /// Answers `answered` once an fsync begun after now has ended.
    fn answer_after_fsync(&self, answered: Answers) {
        if let Some(queue) = &self.queue
            && let Err(mpsc::SendError(lost)) = queue.send(answered)
        {
            for (reply, _) in lost {
                reply.send(Err(StoreError::Unavailable("the syncer stopped".into())));
            }
        }
    }
}

impl Drop for Syncer {
    fn drop(&mut self) {
        self.queue.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn sync_loop(wal: &std::fs::File, queue: &mpsc::Receiver<Answers>, counts: &Counts) {
    let mut failed: Option<StoreError> = None;
    while let Ok(first) = queue.recv() {
        // Every batch committed before this fsync begins is covered by it.
        let mut covered = vec![first];
        while let Ok(more) = queue.try_recv() {
            covered.push(more);
        }
        if failed.is_none()
            && let Err(e) = wal.sync_data()
        {
            failed = Some(StoreError::Unavailable(format!(
                "the fsync of the ledger's write-ahead log failed ({e}); what it should have \
                 made durable cannot be trusted to be on disk, so no durable commit of this \
                 process will succeed: restart it (runs resume from the ledger)"
            )));
        }
        counts.fsyncs.fetch_add(1, Ordering::Relaxed);
        for (reply, answer) in covered.into_iter().flatten() {
            reply.send(match &failed {
                Some(e) => Err(e.clone()),
                None => answer,
            });
        }
    }
}

/// Applies `batch` in one transaction, each job in a savepoint: the answer
/// of each job.
fn apply_batch(conn: &mut Conn, batch: &[Job]) -> Vec<StoreResult<()>> {
    let begun = Conn::run(&conn.conn, "BEGIN IMMEDIATE");
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
        let applied =
            Conn::run(db, "SAVEPOINT job").and_then(|()| commit::apply(db, known, &job.plan));
        if applied.is_err() {
            known.forget();
        }
        let ended = match &applied {
            Ok(_) => Conn::run(db, "RELEASE job"),
            Err(_) => Conn::run(db, "ROLLBACK TO job").and_then(|()| Conn::run(db, "RELEASE job")),
        };
        // A refusal whose record of calls already made was written stands
        // with the transaction; its job is answered with the refusal.
        let answer = applied.and_then(|refusal| ended.map(|()| refusal));
        answers.push(answer.and_then(|refusal| refusal.map_or(Ok(()), Err)));
    }
    if let Err(e) = Conn::run(db, "COMMIT") {
        let _ = Conn::run(db, "ROLLBACK");
        known.forget();
        conn.ended(false);
        return batch.iter().map(|_| Err(e.clone())).collect();
    }
    conn.ended(true);
    answers
}
