//! One execution of a claimed run: its journal over the recorded history,
//! and how it ends: the step's result, or the stop its journal holds, turned
//! into the run's end, committed with every buffered write in one durable
//! commit.

use std::sync::{Arc, Mutex};

use stephost_core::journal::{Counters, Journal, Mode, RunControl, Stats, Stop};
use stephost_core::lifecycle;
use stephost_core::store::{Commit, WriteOp, Writer};
use stephost_core::trace::CallTiming;
use stephost_core::{CallState, Claim, History, RunEnd, RunRecord, Store, StoreResult};

use crate::error::HostError;
use crate::instance::{GuestResult, check_json, classify_trap};
use crate::options::HostOptions;

/// Whether the run an execution starts is in the ledger yet.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Recorded and claimed before the execution.
    Recorded,
    /// New: recorded, claimed, by the execution's first commit.
    Creating,
}

/// The writer back from an execution, and what became of it.
pub struct Executed {
    pub writer: Box<dyn Writer>,
    pub result: Result<Stats, HostError>,
    /// When the execution went through each call (when spans are reported).
    pub timings: Vec<CallTiming>,
}

/// How an execution ends: done, or with its last durable commit (the run's
/// end, or its wait, with every buffered write) still to make.
pub enum Ended {
    Done(Executed),
    Commit(LastCommit),
}

/// An execution's last durable commit.
pub struct LastCommit {
    writer: Box<dyn Writer>,
    claim: Claim,
    ops: Vec<WriteOp>,
    stats: Stats,
    timings: Vec<CallTiming>,
}

impl Ended {
    /// Makes the last commit, if any, waiting for it on this thread.
    pub fn commit(self) -> Executed {
        match self {
            Ended::Done(executed) => executed,
            Ended::Commit(mut last) => {
                let ops = std::mem::take(&mut last.ops);
                let committed = last.writer.commit(&last.claim, ops).wait();
                last.executed(committed)
            }
        }
    }

    /// Makes the last commit, if any, awaiting it when the writer leaves it
    /// pending (a run executed as a task).
    pub async fn commit_task(self) -> Executed {
        match self {
            Ended::Done(executed) => executed,
            Ended::Commit(mut last) => {
                let ops = std::mem::take(&mut last.ops);
                let committed = match last.writer.commit(&last.claim, ops) {
                    Commit::Done(result) => result,
                    Commit::Pending(pending) => pending.await,
                };
                last.executed(committed)
            }
        }
    }
}

impl LastCommit {
    fn executed(self, committed: StoreResult<()>) -> Executed {
        Executed {
            writer: self.writer,
            result: committed.map(|()| self.stats).map_err(HostError::from),
            timings: self.timings,
        }
    }
}

/// The journal of an execution of `run` under `claim`, over its recorded
/// history; or the writer back with the error that stopped it before the
/// step began.
pub fn journal_for(
    store: &dyn Store,
    run: &RunRecord,
    claim: Claim,
    writer: Box<dyn Writer>,
    control: Option<Arc<RunControl>>,
    start: Start,
    options: &HostOptions,
) -> Result<Arc<Mutex<Journal>>, Box<Executed>> {
    // Claimed from pending or waiting: it was not executing.
    let idle = matches!(
        claim.from.as_ref().map(|from| from.status),
        Some(stephost_core::RunStatus::Pending | stephost_core::RunStatus::Waiting)
    );
    // Every ledger write needs a claim, so a run claimed for the first time
    // (fencing token 1) has recorded nothing: no history to read.
    let recorded = if claim.fence == 1 {
        Ok((History::empty(&run.run_id), Vec::new()))
    } else {
        store
            .history(&run.run_id)
            .and_then(|history| Ok((history, store.logs(&run.run_id)?)))
    };
    let (history, logs) = match recorded {
        Ok(v) => v,
        Err(e) => {
            return Err(Box::new(Executed {
                writer,
                result: Err(e.into()),
                timings: Vec::new(),
            }));
        }
    };
    let mut journal = Journal::new(
        &run.run_id,
        Mode::Live { writer, claim },
        history,
        &logs,
        // The run's own model budget, where it has one, over [limits]'s.
        run.budget.applied_to(&options.limits),
    );
    journal.set_signer(options.signer.clone(), run);
    journal.set_operations(run.operations());
    journal.set_parent(run.parent.clone(), run.root_run_id.clone());
    if let Some(request) = &run.cancel {
        journal.set_cancelled(request.error());
        // A run cancelled before it began, or while it waited, ends now:
        // its guest is not run.
        if idle {
            let stop = match journal.take_recorded_head() {
                Ok(()) => Stop::Cancelled(request.error()),
                Err(stop) => stop,
            };
            journal.set_stop(stop);
        }
    }
    journal.set_scrub(options.effects.scrub().clone());
    if options.telemetry.is_some() {
        journal.set_trace(run.trace());
    }
    if start == Start::Creating {
        journal.create_run_with_first_commit(run.clone());
    }
    if let Some(control) = control {
        journal.set_control(control);
    }
    if let Some(sink) = &options.log_sink {
        let sink = sink.clone();
        let run_id = run.run_id.clone();
        let trace_id = run.trace().trace_id;
        journal.set_log_sink(Box::new(move |rec, replayed| {
            let of = crate::options::RunOfLine {
                run_id: &run_id,
                trace_id: &trace_id,
            };
            sink(&of, rec, replayed)
        }));
    }
    Ok(Arc::new(Mutex::new(journal)))
}

/// How an execution of `run` ended (the step's result, or the stop its
/// journal holds): done, or with the last durable commit to make, which
/// carries every buffered write (see [`Ended`]).
pub fn conclude(
    store: &dyn Store,
    journal: Arc<Mutex<Journal>>,
    guest: GuestResult,
    exit_code: Option<i32>,
) -> Ended {
    let mut journal = match Arc::try_unwrap(journal) {
        Ok(m) => m.into_inner().unwrap_or_else(|p| p.into_inner()),
        Err(_) => unreachable_shared(),
    };
    let stats = journal.stats;
    let limits = journal.limits().clone();
    let mut counters = execution_counters(&journal);
    let mut stop = journal.stop().cloned();
    let unreached = journal.unreached().unwrap_or_else(|e| {
        stop.get_or_insert(Stop::reading_history(e));
        None
    });
    let diverged_at = match (&stop, &unreached) {
        (Some(Stop::Diverged(d)), _) => Some(d.seq),
        (None, Some(u)) if guest.is_ok() => Some(u.seq),
        _ => None,
    };
    let in_flight = diverged_at
        .map(|seq| journal.in_flight_writes_from(seq))
        .transpose()
        .unwrap_or_else(|e| {
            stop = Some(Stop::reading_history(e));
            None
        })
        .unwrap_or_default();
    let mut pending = journal.take_pending();
    let timings = journal.take_timings();
    let sealer = journal.end_sealer();
    let notes = journal.end_notes();
    let Mode::Live { mut writer, claim } = journal.into_mode() else {
        unreachable_shared()
    };
    let done = |writer, timings, result| {
        Ended::Done(Executed {
            writer,
            result,
            timings,
        })
    };
    let end = match stop {
        Some(Stop::Fenced(m)) => return done(writer, timings, Err(HostError::Fenced(m))),
        Some(Stop::Released { .. }) => {
            pending.push(WriteOp::Counters(counters));
            // At a worker's shutdown, as a task: the commit and the release
            // wait for the committer, the runtime told.
            let released = stephost_effects::blocking(|| {
                writer.commit(&claim, pending).wait().and_then(|()| {
                    lifecycle::release(store, &claim, stephost_core::clock::now_ms())
                })
            });
            return done(
                writer,
                timings,
                released.map(|()| stats).map_err(HostError::from),
            );
        }
        Some(Stop::Suspended { wake_at_ms, .. }) => RunEnd::Waiting { wake_at_ms },
        Some(Stop::Cancelled(error)) => RunEnd::Cancelled { error },
        Some(Stop::Ledger(m)) => return done(writer, timings, Err(HostError::LedgerWrite(m))),
        Some(Stop::LedgerRead { message, corrupt }) => {
            return done(
                writer,
                timings,
                Err(HostError::reading_calls(message, corrupt)),
            );
        }
        // A record that does not verify: nothing more is written, so the
        // change is never sealed; the claim lapses.
        Some(Stop::Integrity(m)) => return done(writer, timings, Err(HostError::Integrity(m))),
        // Damaged records: leave the run as it is for a person to look at.
        Some(Stop::Corrupt(m)) => {
            return done(
                writer,
                timings,
                Err(stephost_core::StoreError::Corrupt(m).into()),
            );
        }
        Some(Stop::ReplayEnd { reason, .. }) => {
            return done(writer, timings, Err(HostError::Internal(reason)));
        }
        Some(Stop::Diverged(d)) => diverged(
            format!("diverged: {d}"),
            &in_flight,
            &mut pending,
            &mut counters,
        ),
        Some(Stop::Parked { seq, name, reason }) => RunEnd::Parked {
            error: format!("unknown_outcome: call #{seq} ({name}): {reason}"),
        },
        Some(Stop::OverBudget { seq, name, reason }) => RunEnd::Parked {
            error: format!(
                "{} call #{seq} ({name}) was not sent: {reason}",
                stephost_core::lifecycle::OVER_BUDGET
            ),
        },
        Some(Stop::Limit(m)) => RunEnd::Failed {
            error: format!("limit: {m}"),
            exit_code: None,
        },
        Some(stop @ Stop::RedactedValue { .. }) => RunEnd::Failed {
            error: format!("redacted_value: {stop}"),
            exit_code: None,
        },
        // A resumed step that ends before reaching every recorded call is
        // not the run that was recorded.
        None if guest.is_ok() && unreached.is_some() => diverged(
            format!("diverged: {}", unreached.expect("checked just above")),
            &in_flight,
            &mut pending,
            &mut counters,
        ),
        None => match guest {
            Ok(Ok(output)) => match check_json(&output, "output", &limits) {
                Ok(()) => {
                    stephost_core::crash::point("before-complete", stats.replayed + stats.live);
                    RunEnd::Completed { output, exit_code }
                }
                Err(e) => RunEnd::Failed {
                    error: format!("invalid_output: {e}"),
                    exit_code,
                },
            },
            Ok(Err(message)) => RunEnd::Failed {
                error: format!(
                    "step_error: {}",
                    bounded_error(&message, limits.error_bytes_max)
                ),
                exit_code,
            },
            Err(trap) => RunEnd::Failed {
                error: classify_trap(&trap, &limits),
                exit_code,
            },
        },
    };
    // The end rides with every buffered write, and the execution's metric
    // counters, in one durable commit.
    let mut end = lifecycle::ended(&end, stephost_core::clock::now_ms());
    notes.fill(&mut end);
    sealer.seal(&mut end);
    pending.push(WriteOp::End(end));
    pending.push(WriteOp::Counters(counters));
    Ended::Commit(LastCommit {
        writer,
        claim,
        ops: pending,
        stats,
        timings,
    })
}

/// A step's error message cut to `max` bytes, its size named when cut.
fn bounded_error(message: &str, max: u64) -> String {
    let max = usize::try_from(max).unwrap_or(usize::MAX);
    if message.len() <= max {
        return message.to_string();
    }
    format!(
        "{}… (cut: the message is {} bytes; error_bytes_max = {max})",
        stephost_core::journal::truncate(message, max),
        message.len()
    )
}

/// The metric counters of an execution, with its resume counted.
fn execution_counters(journal: &Journal) -> Counters {
    let mut counters = journal.counters().clone();
    if journal.stats.replayed > 0 {
        counters.insert("replayed_step_total", 1);
    }
    if journal.history_len() > 0 {
        counters.insert("workflow_resume_total", 1);
        if let Some(latency) = journal.first_live_after {
            crate::metrics::resume_latency(latency, &mut counters);
        }
    }
    counters
}

/// The end of a run that diverged from its recording. Writes it left in
/// flight (recorded `started`, never settled) become `unknown` in the same
/// commit, for a person to check at the receiver: the run will not resume,
/// so nothing else would ever look at them.
fn diverged(
    mut error: String,
    in_flight: &[u64],
    pending: &mut Vec<WriteOp>,
    counters: &mut Counters,
) -> RunEnd {
    for &seq in in_flight {
        pending.push(WriteOp::Outcome {
            seq,
            state: CallState::Unknown,
            outcome: None,
            now_ms: stephost_core::clock::now_ms(),
            chain: None,
        });
        *counters.entry("side_effect_unknown_total").or_insert(0) += 1;
    }
    if !in_flight.is_empty() {
        let seqs: Vec<String> = in_flight.iter().map(|s| format!("#{s}")).collect();
        error.push_str(&format!(
            "; the write(s) {} were in flight and are now unknown: check the receiver \
             by their operation ids",
            seqs.join(", ")
        ));
    }
    RunEnd::Diverged { error }
}

fn unreachable_shared() -> ! {
    // The store, and with it every clone of the journal, is dropped when
    // the step's invocation returns.
    panic!("journal still shared after the store was dropped")
}
