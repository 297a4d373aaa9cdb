//! Child runs in the journal: a `start` call recorded with the child's row
//! in one commit ([`Journal::spawn`]), and what a run's end tells its
//! parent ([`EndNotes`]).
//!
//! A child's run id is made by the caller from the start call's operation
//! id ([`crate::ids::child_run_id`]), so an execution that resumes or
//! replays the parent finds the start recorded and never starts a second
//! child; a start whose commit never landed is made again under the same
//! id.

use super::{Call, CallSpec, Compute, Journal, Next, OpContext, Stop};
use crate::crash;
use crate::outcome::{CallErrorKind, Outcome};
use crate::records::{ChildArrival, EndRow, ParentRef, RunRecord};
use crate::store::WriteOp;

/// What a `start` call makes of its operation: the child's row (its
/// outcome is the child's run id), or a refusal the step sees.
pub type MakeChild<'a> = dyn FnMut(&OpContext<'_>) -> Result<RunRecord, Outcome> + 'a;

impl Journal {
    /// Records a call that starts a child run: replayed, its recorded
    /// outcome; live, the call finished with `{"run_id": CHILD, "module":
    /// DIGEST}` and the child's row (made by `child` from the call's
    /// operation), committed together before the step goes on: durable with
    /// the next durable commit, before anything outside the process has
    /// seen the child ([`WriteOp::Spawn`]). A refusal is recorded as the
    /// call's outcome, and nothing is created.
    pub fn spawn(
        &mut self,
        spec: &CallSpec<'_>,
        child: &mut MakeChild<'_>,
    ) -> Result<Outcome, Stop> {
        if let Some(stop) = &self.stop {
            return Err(stop.clone());
        }
        let result = self.spawn_inner(spec, child);
        self.stopping(result)
    }

    fn spawn_inner(
        &mut self,
        spec: &CallSpec<'_>,
        child: &mut MakeChild<'_>,
    ) -> Result<Outcome, Stop> {
        self.budget.check_wall()?;
        self.budget.charge(spec.request.len() as u64)?;
        let mut never = Compute(|| {
            Outcome::error(
                CallErrorKind::Invalid,
                "a start is recorded with its child, never in flight",
            )
        });
        let seq = match self.next_call(spec, &mut never)? {
            Next::Replayed(Call::Done(outcome)) => {
                self.spawned |= matches!(outcome, Outcome::Ok(_));
                return Ok(outcome);
            }
            Next::Replayed(Call::Durable(_)) => {
                return Err(Stop::Corrupt(format!(
                    "call #{} is a start recorded in flight",
                    self.next_seq - 1
                )));
            }
            Next::Live(seq) => seq,
        };
        let mut record = self.new_record(spec, seq);
        let fence = self.fence();
        let made = child(&OpContext::of(
            &self.run_id,
            &self.operations,
            self.trace.as_ref(),
            &record,
            fence,
        ));
        let (outcome, child) = match made {
            Ok(run) => (
                Outcome::Ok(serde_json::json!({
                    "run_id": run.run_id,
                    "module": run.module_digest,
                })),
                Some(run),
            ),
            Err(refused) => (refused, None),
        };
        record.state = outcome.state();
        record.outcome = Some(self.kept(seq, &outcome));
        record.finished_at_ms = Some(record.started_at_ms);
        record.chain = self
            .chain
            .extend(&record, record.state, record.outcome.as_deref());
        match child {
            Some(child) => {
                self.pending.push(WriteOp::Spawn {
                    call: record,
                    child: Box::new(child),
                });
                self.spawned = true;
                // Committed now, for a worker to take the child; durable
                // with the next durable commit, before anything outside the
                // process has seen the child.
                self.flush()?;
                crash::point("after-started", seq);
                self.count("children_started_total");
            }
            None => self.pending.push(WriteOp::Call(record)),
        }
        self.budget.charge(outcome.recorded_bytes())?;
        self.call_done()?;
        Ok(outcome)
    }

    /// Marks the run a child of `parent` in the tree of `root` (a root's
    /// is none): its end goes to the parent's inbox
    /// ([`Journal::child_end`]).
    pub fn set_parent(&mut self, parent: Option<ParentRef>, root: Option<String>) {
        self.parent = parent;
        self.root = root;
    }

    /// The run at the top of this run's tree: its root's id, or its own.
    pub fn tree_root(&self) -> &str {
        self.root.as_deref().unwrap_or(&self.run_id)
    }

    /// The run's parent, if it is a child.
    pub fn parent(&self) -> Option<&ParentRef> {
        self.parent.as_ref()
    }

    /// The run was cancelled before this execution claimed it (`error`
    /// says by whom and why): it replays what it recorded, settling what it
    /// had in flight, and begins no new call.
    pub fn set_cancelled(&mut self, error: String) {
        self.cancelled = Some(error);
    }

    /// Takes the chain's head from the recording without replaying it (a
    /// run ended without running its guest, to seal its end over what it
    /// recorded), checking each finished call's link as a replay would.
    pub fn take_recorded_head(&mut self) -> Result<(), Stop> {
        let mut last = None;
        let mut index = 0;
        while let Some(call) = self
            .history
            .get(index)
            .map_err(Stop::reading_history)?
            .cloned()
        {
            if call.state.has_outcome() {
                if let Some(check) = &self.chain.check {
                    let previous = index
                        .checked_sub(1)
                        .and_then(|before| self.history.arrived(before))
                        .and_then(|c| c.chain.as_deref())
                        .unwrap_or("");
                    check
                        .replayed(&self.run_id, previous, &call)
                        .map_err(|broken| Stop::integrity(&self.run_id, &broken))?;
                }
                last = Some(index);
            }
            index += 1;
        }
        self.chain_at = last;
        Ok(())
    }

    /// The run stops to wait for a child, its inbox having had `seen`
    /// arrivals when it looked.
    pub fn await_inbox(&mut self, seen: u64) {
        self.inbox_seen = Some(seen);
    }

    /// What the run's end tells others ([`EndNotes::fill`]).
    pub fn end_notes(&self) -> EndNotes {
        EndNotes {
            run_id: self.run_id.clone(),
            parent: self.parent.clone(),
            inbox_seen: self.inbox_seen,
            spawned: self.spawned,
        }
    }
}

/// What a run's end tells others, taken from its journal before the end
/// is made.
pub struct EndNotes {
    run_id: String,
    parent: Option<ParentRef>,
    inbox_seen: Option<u64>,
    spawned: bool,
}

impl EndNotes {
    /// Fills in `end`: a child's finished end goes to its parent's inbox;
    /// a run waiting for a child is due at once if one arrived since it
    /// looked; a finished run's children still running and not detached
    /// are cancelled with it (a joined child has ended: the mark skips it).
    pub fn fill(&self, end: &mut EndRow) {
        if end.status.is_finished()
            && let Some(parent) = &self.parent
        {
            end.arrival = Some(ChildArrival {
                parent_run_id: parent.run_id.clone(),
                child_run_id: self.run_id.clone(),
                join_set: parent.join_set.clone(),
                status: end.status,
                at_ms: end.updated_at_ms,
            });
        }
        if end.status == crate::records::RunStatus::Waiting {
            end.inbox_seen = self.inbox_seen;
        }
        if end.status.is_finished() && self.spawned {
            end.cancel_children = Some(crate::records::CancelRequest {
                at_ms: end.updated_at_ms,
                by: format!("run {}", self.run_id),
                reason: Some(format!(
                    "its parent ended ({}) before joining it",
                    end.status.as_str()
                )),
            });
        }
    }
}
