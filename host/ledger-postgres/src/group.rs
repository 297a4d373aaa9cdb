//! Group commit: the commits of a worker's concurrent runs go to one
//! committer task, which applies whatever has queued up in one transaction
//! (its statements sent together) and answers them once it commits: one
//! WAL flush for all of them when any holds a durable op. A commit that
//! fails on its own (a stale fence) fails alone: the transaction is made
//! again without it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use stephost_core::commit::CommitPlan;
use stephost_core::store::{Commit, CommitCounts, CommitReply, PendingCommit, Writer};
use stephost_core::{StoreError, StoreResult};
use tokio::sync::mpsc;

use crate::Shared;
use crate::commit::{self, Failed, Job};
use crate::conns::{Conns, PgConn};

/// Most commits applied in one transaction.
pub const BATCH_COMMITS_MAX: usize = 256;

/// Times a transaction that hit a deadlock or a serialization failure is
/// made again before its commits fail.
const RETRIES_MAX: u32 = 3;

#[derive(Default)]
struct Counts {
    commits: AtomicU64,
    transactions: AtomicU64,
    fsyncs: AtomicU64,
}

/// What a writer's commits have come to: once one failed, its error.
#[derive(Default)]
struct WriterState {
    failed: Mutex<Option<StoreError>>,
}

impl WriterState {
    fn failed(&self) -> Option<StoreError> {
        self.failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn fail(&self, e: &StoreError) {
        let mut failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        if failed.is_none() {
            *failed = Some(e.clone());
        }
    }
}

enum Request {
    Commit {
        plan: Box<CommitPlan>,
        reply: CommitReply,
        writer: Arc<WriterState>,
    },
    /// Answered once every commit queued before it is applied.
    Landed(CommitReply, Arc<WriterState>),
}

pub struct GroupCommitter {
    queue: mpsc::UnboundedSender<Request>,
    counts: Arc<Counts>,
}

impl GroupCommitter {
    pub(crate) fn start(shared: &Arc<Shared>) -> Self {
        let (queue, requests) = mpsc::unbounded_channel();
        let counts = Arc::new(Counts::default());
        shared.spawn(committer(shared.conns.clone(), requests, counts.clone()));
        GroupCommitter { queue, counts }
    }

    pub fn writer(&self) -> GroupWriter {
        GroupWriter {
            queue: self.queue.clone(),
            state: Arc::default(),
        }
    }

    pub fn counts(&self) -> CommitCounts {
        CommitCounts {
            commits: self.counts.commits.load(Ordering::Relaxed),
            transactions: self.counts.transactions.load(Ordering::Relaxed),
            fsyncs: self.counts.fsyncs.load(Ordering::Relaxed),
        }
    }
}

async fn committer(
    conns: Arc<Conns>,
    mut requests: mpsc::UnboundedReceiver<Request>,
    counts: Arc<Counts>,
) {
    let mut conn: Option<PgConn> = None;
    while let Some(first) = requests.recv().await {
        let mut batch = vec![first];
        while batch.len() < BATCH_COMMITS_MAX {
            match requests.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let mut jobs = Vec::new();
        let mut landed = Vec::new();
        for request in batch {
            match request {
                Request::Commit {
                    plan,
                    reply,
                    writer,
                } => jobs.push((plan, reply, writer, None)),
                Request::Landed(reply, writer) => landed.push((reply, writer)),
            }
        }
        counts
            .commits
            .fetch_add(jobs.len() as u64, Ordering::Relaxed);
        apply_batch(&conns, &mut conn, jobs, &counts).await;
        for (reply, writer) in landed {
            reply.send(writer.failed().map_or(Ok(()), Err));
        }
    }
}

/// A commit, its reply, its writer, and the refusal to answer once it is
/// applied (a plan refused because its run was cancelled, replaced by what
/// it records of calls already made: stephost_core::commit).
type Queued = (
    Box<CommitPlan>,
    CommitReply,
    Arc<WriterState>,
    Option<StoreError>,
);

async fn apply_batch(
    conns: &Conns,
    conn: &mut Option<PgConn>,
    mut jobs: Vec<Queued>,
    counts: &Counts,
) {
    let mut retries = 0;
    loop {
        // A writer whose earlier commit failed has none after it applied.
        let (dead, live): (Vec<Queued>, Vec<Queued>) =
            jobs.into_iter().partition(|job| job.2.failed().is_some());
        for (_, reply, writer, _) in dead {
            reply.send(Err(writer.failed().unwrap_or_else(|| {
                StoreError::Unavailable("an earlier commit failed".into())
            })));
        }
        jobs = live;
        if jobs.is_empty() {
            return;
        }
        if conn.as_ref().is_none_or(|c| c.client.is_closed()) {
            match PgConn::connect(&conns.server).await {
                Ok(c) => *conn = Some(c),
                Err(e) => {
                    fail_all(jobs, &e);
                    return;
                }
            }
        }
        let Some(c) = conn.as_mut() else { return };
        let batch: Vec<Job<'_>> = jobs.iter().map(|(plan, ..)| Job { plan }).collect();
        let durable = commit::durable(&batch);
        let result = commit::apply(c, &batch).await;
        drop(batch);
        match result {
            Ok(()) => {
                counts.transactions.fetch_add(1, Ordering::Relaxed);
                if durable {
                    counts.fsyncs.fetch_add(1, Ordering::Relaxed);
                }
                for (_, reply, writer, refusal) in jobs {
                    // A refusal because the run was cancelled does not stop
                    // its writer: the execution's end still lands.
                    let _ = writer;
                    reply.send(refusal.map_or(Ok(()), Err));
                }
                return;
            }
            Err(Failed::Job(at, refusal @ StoreError::Cancelled { .. }))
                if jobs[at].0.begins && jobs[at].3.is_none() =>
            {
                let kept = jobs[at].0.what_happened();
                *jobs[at].0 = kept;
                jobs[at].3 = Some(refusal);
            }
            Err(Failed::Job(at, e)) => {
                let (_, reply, writer, _) = jobs.remove(at);
                writer.fail(&e);
                reply.send(Err(e));
            }
            Err(Failed::All(e)) => {
                retries += 1;
                let closed = conn.as_ref().is_none_or(|c| c.client.is_closed());
                if closed {
                    *conn = None;
                }
                if retries > RETRIES_MAX || closed {
                    fail_all(jobs, &e);
                    return;
                }
            }
        }
    }
}

fn fail_all(jobs: Vec<Queued>, e: &StoreError) {
    for (_, reply, writer, _) in jobs {
        writer.fail(e);
        reply.send(Err(e.clone()));
    }
}

/// A writer whose commits go through the group committer.
pub struct GroupWriter {
    queue: mpsc::UnboundedSender<Request>,
    state: Arc<WriterState>,
}

impl GroupWriter {
    fn send(&self, request: Request) {
        // A closed queue drops the reply, which answers it as lost.
        let _ = self.queue.send(request);
    }
}

impl Writer for GroupWriter {
    fn write(&mut self, plan: CommitPlan) -> Commit {
        if let Some(e) = self.state.failed() {
            return Commit::Done(Err(e));
        }
        let (reply, pending) = PendingCommit::new();
        self.send(Request::Commit {
            plan: Box::new(plan),
            reply,
            writer: self.state.clone(),
        });
        Commit::Pending(pending)
    }

    fn landed(&mut self) -> StoreResult<()> {
        let (reply, pending) = PendingCommit::new();
        self.send(Request::Landed(reply, self.state.clone()));
        pending.wait()
    }
}
