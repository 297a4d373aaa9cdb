//! A writer for one execution at a time: its commits are applied in order
//! by a task of the writer's, each in one transaction on a connection taken
//! from the pool for it; once one fails, none after it is applied.

use std::sync::Arc;

use stephost_core::commit::CommitPlan;
use stephost_core::store::{Commit, CommitReply, PendingCommit, Writer};
use stephost_core::{StoreError, StoreResult};
use tokio::sync::mpsc;

use crate::Shared;
use crate::commit::{self, Failed, Job};
use crate::conns::Conns;

enum Request {
    Commit(Box<CommitPlan>, CommitReply),
    /// Answered once every commit before it is applied.
    Landed(CommitReply),
}

pub struct DirectWriter {
    queue: mpsc::UnboundedSender<Request>,
}

impl DirectWriter {
    pub(crate) fn start(shared: &Arc<Shared>) -> Self {
        let (queue, requests) = mpsc::unbounded_channel();
        let conns = shared.conns.clone();
        shared.spawn(async move {
            let mut requests = requests;
            let mut failed: Option<StoreError> = None;
            while let Some(request) = requests.recv().await {
                match request {
                    Request::Landed(reply) => reply.send(failed.clone().map_or(Ok(()), Err)),
                    Request::Commit(plan, reply) => {
                        if let Some(e) = &failed {
                            reply.send(Err(e.clone()));
                            continue;
                        }
                        let result = apply(&conns, &plan).await;
                        // A refusal because the run was cancelled wrote
                        // what the commit recorded in its place: the
                        // execution's end, which follows, still lands.
                        if let Err(e) = &result
                            && !matches!(e, StoreError::Cancelled { .. })
                        {
                            failed = Some(e.clone());
                        }
                        reply.send(result);
                    }
                }
            }
        });
        DirectWriter { queue }
    }

    fn send(&mut self, request: impl FnOnce(CommitReply) -> Request) -> PendingCommit {
        let (reply, pending) = PendingCommit::new();
        // A closed queue drops the reply, which answers it as lost.
        let _ = self.queue.send(request(reply));
        pending
    }
}

async fn apply(conns: &Arc<Conns>, plan: &CommitPlan) -> StoreResult<()> {
    let mut conn = conns.get().await?;
    match commit::apply(&mut conn, &[Job { plan }]).await {
        Ok(()) => Ok(()),
        // What the refused commit records of calls already made lands all
        // the same, in a transaction of its own (stephost_core::commit).
        Err(Failed::Job(_, refusal @ StoreError::Cancelled { .. })) if plan.begins => {
            let kept = plan.what_happened();
            match commit::apply(&mut conn, &[Job { plan: &kept }]).await {
                Ok(()) => Err(refusal),
                Err(Failed::Job(_, e)) | Err(Failed::All(e)) => Err(e),
            }
        }
        Err(Failed::Job(_, e)) | Err(Failed::All(e)) => Err(e),
    }
}

impl Writer for DirectWriter {
    fn write(&mut self, plan: CommitPlan) -> Commit {
        Commit::Pending(self.send(|reply| Request::Commit(Box::new(plan), reply)))
    }

    fn landed(&mut self) -> StoreResult<()> {
        self.send(Request::Landed).wait()
    }
}
