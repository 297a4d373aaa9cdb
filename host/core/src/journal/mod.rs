//! The one durable wrapper every import call passes through.
//!
//! ```text
//! seq += 1
//! recorded = history[seq]
//! if recorded:                      # replay
//!     check interface, function, request hash   -> divergence
//!     if recorded.outcome: return it
//!     reconcile(recorded)                       # started, no outcome
//! else:                             # live
//!     record started (durable)  -> perform (attempts recorded) -> record outcome
//! ```
//! Live I/O happens only inside [`LiveCall::perform`] and
//! [`LiveCall::reconcile`], which only this module calls.
//!
//! Observe and read calls are buffered and ride on the next commit; a
//! write's `started` row is committed durably, with everything buffered
//! before it, before the request leaves the host. Every branch, by class
//! (a write's outcome buffered or committed at once, an unknown outcome, a
//! suspension): docs/ARCHITECTURE.md, "The call protocol".

use std::collections::HashMap;

use serde::Serialize;

use crate::chain::{Finished, Head, ReplayCheck, Signer};
use crate::crash;
use crate::error::StoreError;
use crate::history::History;
use crate::ids;
use crate::limits::Limits;
pub use crate::outcome::{CallErrorKind, CallErrorRecord, Outcome};
use crate::records::{
    AttemptRecord, CallClass, CallRecord, CallState, Claim, EndRow, LogRecord, RunRecord,
};
use crate::redact::{Redaction, Scrub};
use crate::store::{Commit, PendingCommit, WriteOp, Writer};
use crate::trace::{CallTiming, RunTrace};
use budget::Budget;

/// Most buffered writes before they are committed anyway.
pub const PENDING_WRITES_MAX: usize = 1024;
/// Most bytes recorded since the last commit before the buffer is
/// committed anyway (large observed values, log lines).
pub const PENDING_BYTES_MAX: u64 = 8 * 1024 * 1024;

pub use crate::records::Counters;

/// What the wrapper needs to know about a call.
#[derive(Debug, Clone, Copy)]
pub struct CallSpec<'a> {
    pub class: CallClass,
    pub interface: &'a str,
    pub function: &'a str,
    /// The request as recorded and hashed (JSON text).
    pub request: &'a str,
    /// The guest's business key, for the operation id.
    pub key: Option<&'a str>,
    /// A read whose answer is paid for (a model's): its outcome is
    /// committed durably before the step sees it, so it is never asked
    /// twice.
    pub paid: bool,
    /// Values of the request and the response kept only as keyed hashes.
    pub redact: Option<&'a Redaction>,
}

impl CallSpec<'_> {
    /// The request as the ledger keeps it (redacted, if the call asks).
    fn kept_request(&self) -> String {
        match self.redact {
            Some(redaction) => redaction.request(self.request),
            None => self.request.to_string(),
        }
    }
}

/// The identity of the operation being performed, handed to live I/O.
#[derive(Debug, Clone)]
pub struct OpContext<'a> {
    pub run_id: &'a str,
    /// The run whose id the operation ids of this run's calls derive from:
    /// `run_id`, or a fork's source ([`crate::ForkRef::operations`]).
    pub operations: &'a str,
    pub seq: u64,
    /// The call's class as recorded (on reconciliation) or as configured.
    pub class: CallClass,
    pub operation_id: &'a str,
    pub fence: i64,
    /// The run's trace, when the host reports spans: a request carries
    /// its call's span to the receiver ([`OpContext::traceparent`]).
    pub trace: Option<&'a RunTrace>,
}

impl<'a> OpContext<'a> {
    /// The operation of a call recorded (or being recorded) for run `run_id`.
    fn of(
        run_id: &'a str,
        operations: &'a str,
        trace: Option<&'a RunTrace>,
        recorded: &'a CallRecord,
        fence: i64,
    ) -> Self {
        OpContext {
            run_id,
            operations,
            seq: recorded.seq,
            class: recorded.class,
            operation_id: &recorded.operation_id,
            fence,
            trace,
        }
    }

    /// The `traceparent` and `tracestate` of this call's span, when the
    /// host reports spans. Never part of what is recorded or hashed.
    pub fn trace_context(&self) -> Option<(String, Option<&'a str>)> {
        let trace = self.trace?;
        Some(trace.call_context(self.run_id, self.seq, self.fence))
    }
}

/// The answer of reconciliation for a call found started without an outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reconciled {
    /// The receiver knows the outcome: record it.
    Outcome(Outcome),
    /// Performing again cannot act twice (a read, or a deduplicating receiver).
    PerformAgain,
    /// Nobody can say; a person must resolve the call.
    Unknown(String),
}

/// What a suspending call (timer, approval) says when asked whether it
/// can complete now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wait {
    Ready(Outcome),
    /// Not yet: the run leaves memory; a worker looks again at `wake_at_ms`
    /// (or when a person decides).
    Until {
        wake_at_ms: Option<i64>,
        reason: String,
    },
}

/// What performing a call live established.
#[derive(Debug, Clone, PartialEq)]
pub enum Performed {
    /// The call's outcome: a value, or an error the step sees.
    Done(Outcome),
    /// A write that may or may not have acted, with no way to tell which:
    /// its outcome is unknown and the run waits for a person. The reason
    /// says what was tried.
    Unknown(String),
}

impl From<Outcome> for Performed {
    fn from(outcome: Outcome) -> Performed {
        Performed::Done(outcome)
    }
}

/// Live I/O for one call.
pub trait LiveCall {
    fn perform(&mut self, op: &OpContext<'_>, attempts: &mut Attempts<'_>) -> Performed;

    /// For `suspend` calls: may the call complete now? `started_at_ms` is
    /// when it was first recorded.
    fn wait(&mut self, _op: &OpContext<'_>, _started_at_ms: i64) -> Wait {
        Wait::Ready(Outcome::error(
            CallErrorKind::Invalid,
            "this call cannot suspend",
        ))
    }

    fn reconcile(&mut self, _op: &OpContext<'_>, _attempts: &mut Attempts<'_>) -> Reconciled {
        Reconciled::PerformAgain
    }

    /// Whether this call can settle a recorded write left in flight (only
    /// a configured effect can ask its receiver).
    fn reconciles_writes(&self) -> bool {
        false
    }

    /// Whether sending this write again with the same operation id cannot
    /// act twice (the receiver deduplicates). Such a write's outcome rides
    /// on the next commit instead of a commit of its own: if the process
    /// dies first, resume resends it and the receiver answers as before.
    fn resend_is_harmless(&self) -> bool {
        false
    }
}

/// A call whose value is computed in-process (clock, random, denials).
pub struct Compute<F: FnMut() -> Outcome>(pub F);

impl<F: FnMut() -> Outcome> LiveCall for Compute<F> {
    fn perform(&mut self, _op: &OpContext<'_>, _attempts: &mut Attempts<'_>) -> Performed {
        Performed::Done((self.0)())
    }
}

/// Records each attempt of a call as it happens, and counts events for the
/// metrics.
pub struct Attempts<'a> {
    /// Where attempt rows go (the journal's write buffer); none for
    /// in-process calls.
    sink: Option<&'a mut Vec<WriteOp>>,
    seq: u64,
    next: u32,
    counters: &'a mut Counters,
    /// What an attempt's detail must not hold.
    scrub: &'a Scrub,
    /// The execution's control, when a worker runs it.
    control: Option<&'a RunControl>,
    /// Why an attempt did not leave ([`Attempts::may_send`]).
    halted: Option<String>,
}

impl<'a> Attempts<'a> {
    /// The execution's control, for a handler that waits before it sends
    /// to look again ([`RunControl::holds`]).
    pub fn control(&self) -> Option<&'a RunControl> {
        self.control
    }
}

impl Attempts<'_> {
    /// Before an attempt leaves: may this execution still send? Not once
    /// its worker lost the claim's lease, by the ledger's word or by its
    /// own clock (a worker frozen past its lease sends nothing before it
    /// hears that another may own the run; a receiver's fence refuses a
    /// write, but a model or a read is not fenced). When not, the caller
    /// returns at once and the execution stops, leaving the call as it
    /// stands for the run's next owner.
    pub fn may_send(&mut self) -> bool {
        let Some(Err(why)) = self.control.map(RunControl::holds) else {
            return true;
        };
        self.halted = Some(format!(
            "{why} before attempt {} of call #{}; another worker may own the run, this one stops",
            self.next, self.seq
        ));
        false
    }

    /// The stop an attempt not sent asks for ([`Attempts::may_send`]).
    fn halted(&mut self, run_id: &str) -> Result<(), Stop> {
        match self.halted.take() {
            Some(why) => Err(Stop::Fenced(format!("run {run_id}: {why}"))),
            None => Ok(()),
        }
    }

    /// Adds one to the counter `name`.
    pub fn count(&mut self, name: &'static str) {
        *self.counters.entry(name).or_insert(0) += 1;
    }

    pub fn record(
        &mut self,
        kind: &'static str,
        started_at_ms: i64,
        result: &'static str,
        detail: Option<&str>,
    ) {
        let number = self.next;
        self.next += 1;
        if let Some(sink) = self.sink.as_mut() {
            sink.push(WriteOp::Attempt(AttemptRecord {
                seq: self.seq,
                attempt: number,
                kind: kind.to_string(),
                started_at_ms,
                finished_at_ms: crate::clock::now_ms(),
                result: result.to_string(),
                detail: detail.map(|d| self.scrub.text(d).into_owned()),
            }));
        }
    }
}

/// What [`Journal::request_hash`] keeps of the last live call's interface
/// and function: a step calls the same function again and again.
struct RequestHashes {
    interface: String,
    function: String,
    hasher: ids::RequestHasher,
    /// The hash of an empty request (clock, random).
    empty: String,
}

/// Refuses to let a read or write leave the host with a redacted value's
/// marker in its request (see [`Stop::RedactedValue`]).
pub fn check_sendable(spec: &CallSpec<'_>, seq: u64) -> Result<(), Stop> {
    if matches!(spec.class, CallClass::Read | CallClass::Write)
        && crate::redact::is_redacted(spec.request)
    {
        return Err(Stop::RedactedValue {
            seq,
            name: spec.function.to_string(),
        });
    }
    Ok(())
}

/// One side of a divergence report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CallSummary {
    pub interface: String,
    pub function: String,
    pub request: String,
}

/// The first call where a replay differs from the recording.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Divergence {
    pub seq: u64,
    /// `None` when the new module makes a call the recording does not have.
    pub recorded: Option<CallSummary>,
    /// `None` when the new module ends before a recorded call.
    pub new: Option<CallSummary>,
}

impl std::fmt::Display for Divergence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "call #{} diverged", self.seq)?;
        let side = |s: &Option<CallSummary>| match s {
            Some(c) => format!("{} {} {}", c.interface, c.function, c.request),
            None => "(no call)".to_string(),
        };
        write!(
            f,
            "\n  recorded: {}\n  new:      {}",
            side(&self.recorded),
            side(&self.new)
        )
    }
}

/// Why a run cannot go on; the first one sticks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Stop {
    #[error("ledger write failed: {0}")]
    Ledger(String),
    /// The run's recorded calls could not be read (`corrupt`: they are
    /// damaged, e.g. a call is missing).
    #[error("reading the run's recorded calls failed: {message}")]
    LedgerRead { message: String, corrupt: bool },
    /// A recorded value is not what its call returns: the ledger is damaged.
    #[error("{0}")]
    Corrupt(String),
    #[error("{0}")]
    Fenced(String),
    #[error("{0}")]
    Diverged(Box<Divergence>),
    #[error("call #{seq} ({name}) has an unknown outcome: {reason}")]
    Parked {
        seq: u64,
        name: String,
        reason: String,
    },
    /// A model call would take the run past its budget and the limits
    /// say to park it: the call is not sent nor recorded.
    #[error("call #{seq} ({name}) was not sent: {reason}")]
    OverBudget {
        seq: u64,
        name: String,
        reason: String,
    },
    #[error("replay stopped at call #{seq}: {reason}")]
    ReplayEnd { seq: u64, reason: String },
    #[error("{0}")]
    Limit(String),
    /// A call about to leave the host carries a redacted value's marker in
    /// its request: built, after a resume, from a value the ledger does not
    /// keep. It is not sent; the run fails.
    #[error(
        "call #{seq} ({name}) was not sent: its request holds the marker of a redacted value, \
         which the ledger does not keep, so the step could only have built it after a resume; \
         a step that sends a value on must not have it redacted from the answer it came in \
         (redact it from the requests that carry it)"
    )]
    RedactedValue { seq: u64, name: String },
    /// The run waits for a timer or a person; it leaves memory.
    #[error("waiting at call #{seq}: {reason}")]
    Suspended {
        seq: u64,
        wake_at_ms: Option<i64>,
        reason: String,
    },
    /// The worker is shutting down: the run stops at this call boundary and
    /// its claim is released for another worker.
    #[error("released at call #{seq}: the worker is shutting down")]
    Released { seq: u64 },
    /// The run's record does not verify against the chain key: it was
    /// changed after it was written. The execution writes nothing more
    /// (no outcome, no end, no seal): a person looks at it.
    #[error("{0}")]
    Integrity(String),
    /// The run was cancelled: the call about to begin did not, and the run
    /// ends `cancelled` with this error (who cancelled it, and why).
    #[error("{0}")]
    Cancelled(String),
}

impl Stop {
    /// The stop of an execution whose run's record does not verify.
    pub fn integrity(run_id: &str, broken: &crate::chain::Broken) -> Stop {
        Stop::Integrity(format!(
            "run {run_id}'s record does not verify ({broken}): it was changed after it was \
             written, so it is not resumed, extended or sealed; check it with `stephost verify \
             {run_id}` and restore the ledger from a backup"
        ))
    }
}

impl Stop {
    /// Why a run stops when its recorded calls cannot be read.
    pub fn reading_history(e: StoreError) -> Stop {
        match e {
            StoreError::Corrupt(message) => Stop::LedgerRead {
                message,
                corrupt: true,
            },
            StoreError::Fenced { .. } => Stop::from(e),
            other => Stop::LedgerRead {
                message: other.to_string(),
                corrupt: false,
            },
        }
    }
}

impl From<StoreError> for Stop {
    fn from(e: StoreError) -> Self {
        match e {
            // A newer claim, or another process that started the same run
            // id first: this execution stops without writing.
            StoreError::Fenced { .. } | StoreError::ClaimedElsewhere { .. } => {
                Stop::Fenced(e.to_string())
            }
            StoreError::Cancelled { reason, .. } => Stop::Cancelled(reason),
            other => Stop::Ledger(other.to_string()),
        }
    }
}

/// Signals from a worker to a run it executes, checked at every call
/// boundary before any live I/O.
#[derive(Debug, Default)]
pub struct RunControl {
    /// The claim's lease could not be renewed: another worker may own the
    /// run now, so this one must not act.
    pub lost: std::sync::atomic::AtomicBool,
    /// Stop at the next call boundary and release the claim.
    pub drain: std::sync::atomic::AtomicBool,
    /// Until when (wall clock, ms) the claim's last renewal holds it; 0
    /// when not told. Past it, another worker may have claimed the run
    /// though this one has not heard yet (it was frozen, say): no attempt
    /// leaves ([`Attempts::may_send`]).
    pub lease_until_ms: std::sync::atomic::AtomicI64,
}

impl RunControl {
    /// Control of a claim whose lease holds until `lease_until_ms`.
    pub fn holding(lease_until_ms: i64) -> RunControl {
        let control = RunControl::default();
        control.renewed(lease_until_ms);
        control
    }

    /// The claim's lease was renewed until `lease_until_ms`.
    pub fn renewed(&self, lease_until_ms: i64) {
        self.lease_until_ms
            .store(lease_until_ms, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether the claim still holds the run as far as this worker knows:
    /// not once its lease was reported lost, nor once it has run out by
    /// this worker's own clock; why not, if not.
    pub fn holds(&self) -> Result<(), &'static str> {
        use std::sync::atomic::Ordering;
        let until = self.lease_until_ms.load(Ordering::SeqCst);
        if self.lost.load(Ordering::SeqCst) {
            Err("the claim's lease was lost")
        } else if until > 0 && crate::clock::now_ms() >= until {
            Err("the claim's lease ran out by this worker's clock")
        } else {
            Ok(())
        }
    }
}

/// Where [`Journal::begin`] left a call.
pub enum Call {
    /// Answered (recorded, replayed or refused).
    Done(Outcome),
    /// A write whose `started` commit another thread applies: wait for it,
    /// then [`Journal::send`].
    Durable(Box<PendingWrite>),
}

impl From<Outcome> for Call {
    fn from(outcome: Outcome) -> Self {
        Call::Done(outcome)
    }
}

/// A write recorded as started, its commit not yet answered.
pub struct PendingWrite {
    started: CallRecord,
    commit: PendingCommit,
}

impl PendingWrite {
    /// The write, and its commit to wait for (or await).
    pub fn into_parts(self: Box<Self>) -> (WriteStarted, PendingCommit) {
        (WriteStarted(self.started), self.commit)
    }
}

/// A write's `started` record, on its way out once its commit is answered.
pub struct WriteStarted(CallRecord);

/// Live runs write to the ledger under a claim; replays write nothing.
pub enum Mode {
    Live {
        writer: Box<dyn Writer>,
        claim: Claim,
    },
    Replay,
}

/// Counts for the run report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// Calls answered from the recording.
    pub replayed: u64,
    /// Calls performed (or reconciled) in this execution.
    pub live: u64,
}

pub type LogSink = Box<dyn FnMut(&LogRecord, bool) + Send>;

/// What [`Journal::next_call`] found.
enum Next {
    Replayed(Call),
    Live(u64),
}

/// The per-run state of the durable wrapper.
pub struct Journal {
    run_id: String,
    /// The run its operation ids derive from: `run_id`, or a fork's
    /// source's ([`Journal::set_operations`]).
    operations: String,
    mode: Mode,
    history: History,
    next_seq: u64,
    /// What the execution may spend, and has.
    budget: Budget,
    /// The redaction of the live call in progress (its sequence number),
    /// applied to what the ledger keeps of its outcome.
    redacting: Option<(u64, Redaction)>,
    /// The secrets no recorded text may hold (the configuration's).
    scrub: Scrub,
    /// Those and the current live call's redacted request values.
    call_scrub: Scrub,
    stop: Option<Stop>,
    logs_recorded: HashMap<u64, usize>,
    log_sink: Option<LogSink>,
    /// In a replay: whether the recording is of a finished run, so that a
    /// call past its end is a divergence rather than the end of the record.
    recording_complete: bool,
    counters: Counters,
    /// Writes not yet committed: they ride on the next commit.
    pending: Vec<WriteOp>,
    /// Whether `pending` may hold the outcome of a write (to a receiver
    /// that deduplicates), which is committed before a read leaves.
    outcome_pending: bool,
    /// The chain's head: the last finished call's link (see
    /// [`crate::chain`]), and what makes links.
    chain: ChainState,
    request_hashes: Option<RequestHashes>,
    /// When the last finished call was replayed: its index in `history`,
    /// whose link is copied into `chain` only if a live call follows
    /// (a replay of 100,000 calls need not copy 100,000 links).
    chain_at: Option<usize>,
    control: Option<std::sync::Arc<RunControl>>,
    /// When the lease was last renewed by this execution.
    lease_checked: std::time::Instant,
    /// Time from the start of this execution to its first live call.
    pub first_live_after: Option<std::time::Duration>,
    pub stats: Stats,
    /// The run's trace, when the host reports spans ([`Journal::set_trace`]).
    trace: Option<RunTrace>,
    /// When each call other than an observe call was gone through, when
    /// the host reports spans.
    timings: Option<Vec<CallTiming>>,
    /// The write whose `started` commit [`Journal::begin`] left pending:
    /// its sequence number and when it began.
    timing_open: Option<(u64, i64)>,
    /// For a child run: its parent's call that started it.
    parent: Option<crate::records::ParentRef>,
    /// For a child run: its tree's root.
    root: Option<String>,
    /// Whether the run has started a child (its end cancels those it did
    /// not join, unless detached).
    spawned: bool,
    /// The run was cancelled before this execution claimed it: why.
    cancelled: Option<String>,
    /// For a run that stops to wait for a child: its inbox's arrivals when
    /// it looked ([`crate::records::EndRow::inbox_seen`]).
    inbox_seen: Option<u64>,
}

/// The head of a run's chain as an execution extends it.
#[derive(Default)]
struct ChainState {
    run_id: String,
    signer: Signer,
    head: Head,
    /// The run's row as this execution found it, to seal at its end.
    run: Option<Box<RunRecord>>,
    /// With a key: what each replayed call is checked against.
    check: Option<ReplayCheck>,
}

/// Seals a run's row as an execution's end leaves it.
pub struct EndSealer {
    signer: Signer,
    head: Head,
    run: Option<Box<RunRecord>>,
}

impl EndSealer {
    /// Sets `end`'s seal; nothing for a run not given to
    /// [`Journal::set_signer`].
    pub fn seal(&self, end: &mut EndRow) {
        if let Some(run) = &self.run {
            end.seal = Some(self.signer.seal(&end.applied_to(run), &self.head));
        }
    }
}

impl ChainState {
    /// The link of `call` finished with `state` and `outcome`, if the
    /// state is final; it becomes the head the next call follows.
    fn extend(
        &mut self,
        call: &CallRecord,
        state: CallState,
        outcome: Option<&str>,
    ) -> Option<String> {
        if !state.has_outcome() {
            return None;
        }
        let mut link = String::new();
        let finished = Finished {
            call,
            state,
            outcome,
            resolved_by: None,
        };
        self.signer
            .link_into(&mut link, &self.run_id, &self.head.link, &finished);
        self.head.link.clone_from(&link);
        self.head.seq = call.seq;
        Some(link)
    }
}

impl Journal {
    /// A journal over `history` (the run's recorded calls, in order).
    /// `logs` already in the ledger keep replayed log lines from being
    /// written twice.
    pub fn new(
        run_id: &str,
        mode: Mode,
        history: History,
        logs: &[LogRecord],
        limits: Limits,
    ) -> Self {
        let mut logs_recorded = HashMap::new();
        for log in logs {
            *logs_recorded.entry(log.after_seq).or_insert(0) += 1;
        }
        Journal {
            run_id: run_id.to_string(),
            operations: run_id.to_string(),
            mode,
            history,
            next_seq: 1,
            budget: Budget::new(limits),
            redacting: None,
            scrub: Scrub::default(),
            call_scrub: Scrub::default(),
            stop: None,
            logs_recorded,
            log_sink: None,
            recording_complete: false,
            counters: Counters::new(),
            pending: Vec::new(),
            outcome_pending: false,
            chain: ChainState {
                run_id: run_id.to_string(),
                ..ChainState::default()
            },
            request_hashes: None,
            chain_at: None,
            control: None,
            lease_checked: std::time::Instant::now(),
            first_live_after: None,
            stats: Stats::default(),
            trace: None,
            timings: None,
            timing_open: None,
            parent: None,
            root: None,
            spawned: false,
            cancelled: None,
            inbox_seen: None,
        }
    }

    /// Reports spans for this execution into `trace`: requests carry their
    /// call's span, and the journal notes when it goes through each call
    /// ([`Journal::take_timings`]).
    pub fn set_trace(&mut self, trace: RunTrace) {
        self.trace = Some(trace);
        self.timings = Some(Vec::new());
    }

    /// When this execution went through each call, in order, observe calls
    /// (clock, random) left out (empty unless [`Journal::set_trace`] was
    /// called).
    pub fn take_timings(&mut self) -> Vec<CallTiming> {
        self.timings.take().unwrap_or_default()
    }

    /// Notes call `seq`, begun at `start` ns, as gone through now, if it
    /// was (a call refused before it was recorded was not).
    fn timed(&mut self, seq: u64, replayed: bool, start: i64) {
        if seq >= self.next_seq {
            return;
        }
        if let Some(timings) = &mut self.timings {
            timings.push(CallTiming {
                seq,
                replayed,
                start_unix_ns: start,
                end_unix_ns: crate::trace::unix_ns(),
            });
        }
    }

    /// Records the run itself with the execution's first commit: a run
    /// started in this process costs no transaction before its guest
    /// starts. That commit comes before the first read or write leaves the
    /// host, or with the first buffered calls, or at the run's end,
    /// whichever is first.
    pub fn create_run_with_first_commit(&mut self, run: RunRecord) {
        self.pending.insert(0, WriteOp::Create(Box::new(run)));
    }

    /// Whether `pending` still records the run itself.
    fn creates_run(pending: &[WriteOp]) -> bool {
        matches!(pending.first(), Some(WriteOp::Create(_)))
    }

    /// Derives the operation ids of the calls this execution makes from
    /// run `operations`' id: a fork's source's ([`crate::fork`]), so a
    /// write it makes again reaches the receiver as the same operation.
    pub fn set_operations(&mut self, operations: &str) {
        self.operations = operations.to_string();
    }

    pub fn set_control(&mut self, control: std::sync::Arc<RunControl>) {
        self.control = Some(control);
    }

    /// What tells this execution to stop (its worker draining, its lease
    /// lost), if anything does.
    pub fn control(&self) -> Option<std::sync::Arc<RunControl>> {
        self.control.clone()
    }

    /// Before live I/O: may this execution still act?
    fn check_control(&self, seq: u64) -> Result<(), Stop> {
        use std::sync::atomic::Ordering;
        self.check_lease(seq)?;
        if let Some(control) = &self.control
            && control.drain.load(Ordering::SeqCst)
        {
            return Err(Stop::Released { seq });
        }
        Ok(())
    }

    /// Asked while the step computes between calls (an epoch tick): the
    /// stop the execution must end with now, if any (its worker lost the
    /// lease or drains, or it ran past `wall_ms_max`). It is kept: the
    /// execution ends with it.
    pub fn interrupted(&mut self) -> Option<Stop> {
        if self.stop.is_none() {
            let seq = self.next_seq;
            self.stop = self
                .check_control(seq)
                .and_then(|()| self.budget.check_wall())
                .err();
        }
        self.stop.clone()
    }

    /// What is left of this execution's `wall_ms_max`.
    pub fn wall_left(&self) -> std::time::Duration {
        self.budget.wall_left()
    }

    /// When this execution's `wall_ms_max` is up, by the rule
    /// [`Journal::interrupted`] applies (`None`: never).
    pub fn wall_deadline(&self) -> Option<std::time::Instant> {
        self.budget.wall_deadline()
    }

    /// Stops the run if its worker has lost the claim's lease.
    fn check_lease(&self, seq: u64) -> Result<(), Stop> {
        use std::sync::atomic::Ordering;
        if let Some(control) = &self.control
            && control.lost.load(Ordering::SeqCst)
        {
            return Err(Stop::Fenced(format!(
                "run {}: the claim's lease was lost before call #{seq}; another worker may own \
                 the run, this one stops",
                self.run_id
            )));
        }
        Ok(())
    }

    pub fn set_recording_complete(&mut self, complete: bool) {
        self.recording_complete = complete;
    }

    pub fn set_log_sink(&mut self, sink: LogSink) {
        self.log_sink = Some(sink);
    }

    /// Links this execution's calls with `signer` (plain by default), and
    /// seals `run`'s row at the execution's end ([`Journal::end_sealer`]).
    /// With a key, the run's row is checked against its seal now, and each
    /// recorded call as it is replayed: a record changed between two
    /// executions stops this one before it writes anything.
    pub fn set_signer(&mut self, signer: Signer, run: &RunRecord) {
        self.chain.check = match signer.replay_check(run) {
            None => None,
            Some(Ok(check)) if check.sealed_calls() > self.history.len() as u64 => {
                let broken = crate::chain::Broken {
                    seq: None,
                    reason: format!(
                        "the run was sealed with {} linked call(s) and the ledger holds {}: \
                         calls were dropped",
                        check.sealed_calls(),
                        self.history.len()
                    ),
                    needs_key: false,
                };
                self.set_stop(Stop::integrity(run.run_id.as_str(), &broken));
                None
            }
            Some(Ok(check)) => Some(check),
            Some(Err(broken)) => {
                self.set_stop(Stop::integrity(run.run_id.as_str(), &broken));
                None
            }
        };
        self.chain.signer = signer;
        self.chain.run = Some(Box::new(run.clone()));
    }

    /// What seals the run's row at this execution's end, with the chain as
    /// the execution leaves it (see [`crate::chain`]).
    pub fn end_sealer(&mut self) -> EndSealer {
        self.follow_recorded_chain();
        EndSealer {
            signer: self.chain.signer.clone(),
            head: self.chain.head.clone(),
            run: self.chain.run.take(),
        }
    }

    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    pub fn limits(&self) -> &Limits {
        &self.budget.limits
    }

    /// The first condition that stopped the run, if any.
    pub fn stop(&self) -> Option<&Stop> {
        self.stop.as_ref()
    }

    /// Records a stop found outside a call (for instance by a WASI adapter
    /// that cannot trap), so that the run ends with it.
    pub fn set_stop(&mut self, stop: Stop) {
        if self.stop.is_none() {
            self.stop = Some(stop);
        }
    }

    /// Whether the next call will be performed live: the execution may act
    /// and the recording holds no such call.
    pub fn next_goes_live(&mut self) -> bool {
        matches!(self.mode, Mode::Live { .. })
            && self.stop.is_none()
            && matches!(self.history.get(self.next_seq as usize - 1), Ok(None))
    }

    /// The secrets no text this journal records may hold (the
    /// configuration's keys and injected header values).
    pub fn set_scrub(&mut self, scrub: Scrub) {
        self.call_scrub = scrub.clone();
        self.scrub = scrub;
    }

    /// Calls made so far in this execution.
    pub fn calls_made(&self) -> u64 {
        self.next_seq - 1
    }

    pub fn history_len(&self) -> u64 {
        self.history.len() as u64
    }

    /// The first recorded call this execution has not reached, if any.
    pub fn unreached(&mut self) -> Result<Option<Divergence>, StoreError> {
        let next = self.history.get(self.next_seq as usize - 1)?;
        Ok(next.map(|next| Divergence {
            seq: next.seq,
            recorded: Some(summary(next)),
            new: None,
        }))
    }

    /// The recorded writes from `seq` on that were left `started` (sent or
    /// not, nobody knows): a run that diverges before settling them must
    /// not leave them looking as if they might still be resumed.
    pub fn in_flight_writes_from(&mut self, seq: u64) -> Result<Vec<u64>, StoreError> {
        Ok(self
            .history
            .all()?
            .filter(|c| {
                c.seq >= seq && c.class == CallClass::Write && c.state == CallState::Started
            })
            .map(|c| c.seq)
            .collect())
    }

    /// The counters this execution accumulated.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    pub fn into_mode(self) -> Mode {
        self.mode
    }

    /// Adds one to a metric counter.
    pub fn count(&mut self, name: &'static str) {
        self.add(name, 1);
    }

    /// Adds `n` to the counter `name`, committed with the run's next commit.
    pub fn add(&mut self, name: &'static str, n: i64) {
        *self.counters.entry(name).or_insert(0) += n;
    }

    /// Passes one import call through the ledger. See the module docs.
    /// A write whose `started` commit the ledger leaves pending (a
    /// worker's) is waited for here, this thread blocked; the effects import
    /// splits the call instead ([`Journal::begin`], then [`Journal::send`]),
    /// so that a run executed as a task awaits it.
    pub fn call(&mut self, spec: &CallSpec<'_>, live: &mut dyn LiveCall) -> Result<Outcome, Stop> {
        match self.begin(spec, live)? {
            Call::Done(outcome) => Ok(outcome),
            Call::Durable(pending) => {
                let (write, commit) = pending.into_parts();
                let answered = commit.wait();
                self.send(write, answered, live)
            }
        }
    }

    /// [`Journal::call`] up to a write's durable `started` commit, if the
    /// ledger leaves it pending: then the caller waits for it (or awaits
    /// it) and hands its answer to [`Journal::send`], which sends the
    /// request. Nothing else may go through the journal in between.
    pub fn begin(&mut self, spec: &CallSpec<'_>, live: &mut dyn LiveCall) -> Result<Call, Stop> {
        if let Some(stop) = &self.stop {
            return Err(stop.clone());
        }
        // Clock and random readings get no span: they are not timed.
        let timed = (self.timings.is_some() && spec.class != CallClass::Observe)
            .then(|| (self.next_seq, self.stats.replayed, crate::trace::unix_ns()));
        let result = self
            .budget
            .check_wall()
            .and_then(|()| self.budget.charge(spec.request.len() as u64))
            .and_then(|()| {
                let call = self.call_inner(spec, live)?;
                if let Call::Done(outcome) = &call {
                    self.budget.charge(outcome.recorded_bytes())?;
                }
                Ok(call)
            });
        let result = self.stopping(result);
        if let Some((seq, replayed_before, start)) = timed {
            match &result {
                Ok(Call::Durable(_)) => self.timing_open = Some((seq, start)),
                _ => self.timed(seq, self.stats.replayed > replayed_before, start),
            }
        }
        result
    }

    /// The rest of a write that [`Journal::begin`] left pending, once its
    /// `started` commit is answered: sends the request (if the commit
    /// succeeded) and records the outcome.
    pub fn send(
        &mut self,
        write: WriteStarted,
        answered: Result<(), StoreError>,
        live: &mut dyn LiveCall,
    ) -> Result<Outcome, Stop> {
        let seq = write.0.seq;
        // The wait for the commit may have been long (a task waits for its
        // turn on a thread too): a lease lost meanwhile stops the run before
        // the request leaves; the call stays `started`, for the run's next
        // owner to settle.
        let result = answered
            .map_err(Stop::from)
            .and_then(|()| self.check_lease(seq))
            .and_then(|()| self.perform_write(write.0, live))
            .and_then(|outcome| {
                self.budget.charge(outcome.recorded_bytes())?;
                Ok(outcome)
            });
        let result = self.stopping(result);
        if let Some((seq, start)) = self.timing_open.take() {
            self.timed(seq, false, start);
        }
        result
    }

    /// Keeps the first error that stopped the run: every later call fails
    /// with it.
    fn stopping<T>(&mut self, result: Result<T, Stop>) -> Result<T, Stop> {
        if let Err(stop) = &result {
            self.stop = Some(stop.clone());
        }
        result
    }

    fn call_inner(&mut self, spec: &CallSpec<'_>, live: &mut dyn LiveCall) -> Result<Call, Stop> {
        let seq = match self.next_call(spec, live)? {
            Next::Replayed(call) => return Ok(call),
            Next::Live(seq) => seq,
        };
        let record = self.new_record(spec, seq);
        match spec.class {
            // Observe calls: one buffered row, durable with the next durable
            // commit.
            CallClass::Observe => {
                let outcome = self.perform_buffered(record, live, false)?;
                self.call_done()?;
                Ok(Call::Done(outcome))
            }
            // Reads: buffered too; if the process dies first, the read is
            // simply performed again.
            CallClass::Read => {
                self.before_read_leaves()?;
                crash::point("after-started", seq);
                let outcome = self.perform_buffered(record, live, true)?;
                if spec.paid && outcome.state() == CallState::Succeeded {
                    self.commit_answer()?;
                }
                crash::point("after-outcome", seq);
                self.call_done()?;
                Ok(Call::Done(outcome))
            }
            // Suspensions: recorded durably, then asked whether they can
            // complete now; if not, the run leaves memory.
            CallClass::Suspend => {
                self.pending.push(WriteOp::Started(record.clone()));
                self.flush_now()?;
                crash::point("after-started", seq);
                self.wait_for(&record, live).map(Call::Done)
            }
            // Writes: `started` is durable (one fsync, carrying everything
            // buffered before it) before the request leaves (see
            // `perform_write`).
            CallClass::Write => {
                self.pending.push(WriteOp::Started(record.clone()));
                self.outcome_pending = false;
                if crash::broken("send-before-started") {
                    return self.perform_write(record, live).map(Call::Done);
                }
                let Mode::Live { writer, claim } = &mut self.mode else {
                    unreachable!("checked live above")
                };
                let ops = Self::take_ops(&mut self.pending, claim);
                match writer.commit(claim, ops) {
                    Commit::Done(result) => {
                        result?;
                        self.perform_write(record, live).map(Call::Done)
                    }
                    Commit::Pending(commit) => Ok(Call::Durable(Box::new(PendingWrite {
                        started: record,
                        commit,
                    }))),
                }
            }
        }
    }

    /// The next call: its recorded outcome if the recording holds it (or
    /// its reconciliation), else its sequence number, the execution cleared
    /// to perform it live.
    fn next_call(&mut self, spec: &CallSpec<'_>, live: &mut dyn LiveCall) -> Result<Next, Stop> {
        let seq = self.next_seq;
        self.budget.check_calls(seq)?;
        let recorded = self
            .history
            .get(seq as usize - 1)
            .map_err(Stop::reading_history)?
            .is_some();
        if recorded {
            return self.replayed(spec, live, seq).map(Next::Replayed);
        }
        let Mode::Live { .. } = &self.mode else {
            if self.recording_complete {
                return Err(Stop::Diverged(Box::new(Divergence {
                    seq,
                    recorded: None,
                    new: Some(new_side(spec)),
                })));
            }
            return Err(Stop::ReplayEnd {
                seq,
                reason: format!(
                    "the recording has {} call(s) and the module makes another: {} {} {}",
                    self.history.len(),
                    spec.interface,
                    spec.function,
                    spec.request
                ),
            });
        };
        self.going_live(seq)?;
        check_sendable(spec, seq)?;
        // A run found cancelled when it was claimed begins no new call
        // (what it had in flight was settled above, as it replayed).
        if let Some(error) = &self.cancelled {
            return Err(Stop::Cancelled(error.clone()));
        }
        self.next_seq += 1;
        Ok(Next::Live(seq))
    }

    /// A call the recording holds: its outcome, or its reconciliation if
    /// it was left in flight.
    fn replayed(
        &mut self,
        spec: &CallSpec<'_>,
        live: &mut dyn LiveCall,
        seq: u64,
    ) -> Result<Call, Stop> {
        let index = seq as usize - 1;
        let recorded = self
            .history
            .arrived(index)
            .expect("the caller found the call recorded");
        // The same request text has the same hash; only a difference
        // needs the hash to decide (a fixture may carry hashes only).
        // A redacted request no longer holds what its hash covers: its
        // markers are compared by their keyed hashes.
        let same_request = recorded.request == spec.request
            || recorded.request_hash
                == ids::request_hash(spec.interface, spec.function, spec.request)
            || spec.redact.is_some_and(|r| {
                crate::redact::is_redacted(&recorded.request)
                    && r.matches(&recorded.request, spec.request)
            });
        if recorded.interface != spec.interface
            || recorded.function != spec.function
            || !same_request
        {
            return Err(Stop::Diverged(Box::new(Divergence {
                seq,
                recorded: Some(summary(recorded)),
                new: Some(new_side(spec)),
            })));
        }
        let recorded = if spec.paid
            && crash::broken("ask-model-again")
            && matches!(self.mode, Mode::Live { .. })
        {
            let record = recorded.clone();
            self.ask_again(&record, live);
            self.history
                .arrived(index)
                .expect("the caller found the call recorded")
        } else {
            recorded
        };
        self.next_seq += 1;
        match recorded.state {
            CallState::Succeeded | CallState::Failed => {
                if let Some(check) = &self.chain.check {
                    let previous = match index.checked_sub(1) {
                        Some(before) => self
                            .history
                            .arrived(before)
                            .and_then(|c| c.chain.as_deref())
                            .unwrap_or(""),
                        None => "",
                    };
                    check
                        .replayed(&self.run_id, previous, recorded)
                        .map_err(|broken| Stop::integrity(&self.run_id, &broken))?;
                }
                self.stats.replayed += 1;
                self.chain_at = Some(index);
                let outcome = parse_outcome(recorded)?;
                if recorded.class == CallClass::Write && matches!(self.mode, Mode::Live { .. }) {
                    self.count("side_effect_duplicate_prevented_total");
                }
                Ok(Call::Done(outcome))
            }
            CallState::Unknown => Err(Stop::Parked {
                seq,
                name: spec.function.to_string(),
                reason: "it was parked as unknown and has not been resolved".to_string(),
            }),
            CallState::Started => {
                let recorded = recorded.clone();
                self.follow_recorded_chain();
                if !matches!(self.mode, Mode::Live { .. }) {
                    return Err(in_flight_in_replay(seq));
                }
                self.going_live(seq)?;
                check_sendable(spec, seq)?;
                self.redacting = spec.redact.map(|r| (seq, r.clone()));
                self.call_scrub = self.scrub.for_call(spec.redact, spec.request);
                if recorded.class == CallClass::Suspend {
                    return self.wait_for(&recorded, live).map(Call::Done);
                }
                self.reconcile(&recorded, live).map(Call::Done)
            }
        }
    }

    /// Before the first live I/O of a call: may this execution still act,
    /// and is its lease fresh?
    fn going_live(&mut self, seq: u64) -> Result<(), Stop> {
        self.check_control(seq)?;
        self.keep_lease()?;
        self.first_live_after
            .get_or_insert_with(|| self.budget.elapsed());
        self.follow_recorded_chain();
        Ok(())
    }

    /// The `started` row of live call `seq`.
    fn new_record(&mut self, spec: &CallSpec<'_>, seq: u64) -> CallRecord {
        self.redacting = spec.redact.map(|r| (seq, r.clone()));
        if spec.class != CallClass::Observe {
            self.call_scrub = self.scrub.for_call(spec.redact, spec.request);
        }
        // The hash is of what the ledger keeps (markers in place of
        // redacted values): it proves the kept text, and gives away
        // nothing the text does not.
        let request = spec.kept_request();
        let mut request_hash = String::new();
        Self::request_hash(&mut self.request_hashes, spec, &request, &mut request_hash);
        // An observe call (a clock, a random number) acts on nothing outside
        // the host, so nothing outside needs to know it again: it has no
        // operation id, which saves a hash on the step's most frequent call.
        let operation_id = if spec.class == CallClass::Observe {
            String::new()
        } else {
            ids::operation_id(&self.operations, spec.function, seq, spec.key)
        };
        CallRecord {
            seq,
            class: spec.class,
            interface: spec.interface.to_string(),
            function: spec.function.to_string(),
            operation_id,
            request,
            request_hash,
            state: CallState::Started,
            outcome: None,
            started_at_ms: crate::clock::now_ms(),
            finished_at_ms: None,
            fence: self.fence(),
            resolved_by: None,
            chain: None,
        }
    }

    /// An observe or read call, performed and buffered finished (with its
    /// attempts, for a read): it rides on the next commit.
    fn perform_buffered(
        &mut self,
        mut record: CallRecord,
        live: &mut dyn LiveCall,
        with_attempts: bool,
    ) -> Result<Outcome, Stop> {
        let fence = self.fence();
        let seq = record.seq;
        let mut attempts = Attempts {
            sink: with_attempts.then_some(&mut self.pending),
            seq,
            next: 1,
            counters: &mut self.counters,
            scrub: &self.call_scrub,
            control: self.control.as_deref(),
            halted: None,
        };
        let performed = live.perform(
            &OpContext::of(
                &self.run_id,
                &self.operations,
                self.trace.as_ref(),
                &record,
                fence,
            ),
            &mut attempts,
        );
        attempts.halted(&self.run_id)?;
        let outcome = match performed {
            Performed::Done(outcome) => outcome,
            // Only a write's outcome can be unknown: a read that could not
            // be established failed.
            Performed::Unknown(reason) => Outcome::error(CallErrorKind::Exhausted, reason),
        };
        let outcome = self.call_scrub.outcome(outcome);
        if with_attempts {
            crash::point("after-send", seq);
        }
        record.state = outcome.state();
        record.outcome = Some(self.kept(seq, &outcome));
        record.finished_at_ms = Some(if with_attempts {
            crate::clock::now_ms()
        } else {
            record.started_at_ms
        });
        record.chain = self
            .chain
            .extend(&record, record.state, record.outcome.as_deref());
        self.pending.push(WriteOp::Call(record));
        Ok(outcome)
    }

    /// Commits the buffer with the paid read just performed (the last
    /// buffered call) durably: one fsync, far cheaper than the tokens.
    fn commit_answer(&mut self) -> Result<(), Stop> {
        let last = self
            .pending
            .iter()
            .rposition(|op| matches!(op, WriteOp::Call(_)));
        if let Some(at) = last
            && let WriteOp::Call(call) = self.pending.remove(at)
        {
            self.pending.insert(at, WriteOp::Answer(call));
        }
        self.flush_now()
    }

    /// Before a read leaves the host (it may take long: an LLM, a slow
    /// API): a write's outcome waiting in memory is committed, so that a
    /// crash during the read does not lose it (were it lost, resume would
    /// resend the write, which its receiver deduplicates); so is a new
    /// run's own row, which must be in before the read leaves: the run is
    /// listed while it waits, and another process that started the same
    /// id stops this one first.
    fn before_read_leaves(&mut self) -> Result<(), Stop> {
        let creates = Self::creates_run(&self.pending);
        if self.outcome_pending || creates {
            self.flush()?;
            if creates {
                self.landed()?;
            }
        }
        Ok(())
    }

    fn fence(&self) -> i64 {
        match &self.mode {
            Mode::Live { claim, .. } => claim.fence,
            Mode::Replay => 0,
        }
    }

    /// A write whose `started` row is durable: sends the request, and
    /// records the outcome, committed without an fsync of its own, so it
    /// survives the process and becomes durable with the next durable
    /// commit.
    fn perform_write(
        &mut self,
        started: CallRecord,
        live: &mut dyn LiveCall,
    ) -> Result<Outcome, Stop> {
        let seq = started.seq;
        crash::point("after-started", seq);
        let fence = self.fence();
        let mut attempts = Attempts {
            sink: Some(&mut self.pending),
            seq,
            next: 1,
            counters: &mut self.counters,
            scrub: &self.call_scrub,
            control: self.control.as_deref(),
            halted: None,
        };
        let performed = live.perform(
            &OpContext::of(
                &self.run_id,
                &self.operations,
                self.trace.as_ref(),
                &started,
                fence,
            ),
            &mut attempts,
        );
        attempts.halted(&self.run_id)?;
        crash::point("after-send", seq);
        let outcome = match performed {
            Performed::Done(outcome) => self.call_scrub.outcome(outcome),
            Performed::Unknown(reason) if crash::broken("doubt-as-failed") => {
                Outcome::error(CallErrorKind::Rejected, reason)
            }
            Performed::Unknown(_) if crash::broken("doubt-as-succeeded") => {
                Outcome::Ok(serde_json::json!({}))
            }
            Performed::Unknown(reason) => {
                let reason = self.call_scrub.text(&reason).into_owned();
                self.pending.push(WriteOp::Outcome {
                    seq,
                    state: CallState::Unknown,
                    outcome: None,
                    now_ms: crate::clock::now_ms(),
                    chain: None,
                });
                self.flush_now()?;
                self.count("side_effect_unknown_total");
                return Err(Stop::Parked {
                    seq,
                    name: started.function,
                    reason,
                });
            }
        };
        let kept = self.kept(seq, &outcome);
        Self::push_outcome(
            &mut self.chain,
            &mut self.pending,
            &started,
            outcome.state(),
            Some(kept),
        );
        // To a deduplicating receiver, the outcome rides on the next
        // commit (the next write's fsync'd `started`, a read, the run's
        // end). Anything that depends on it and leaves the host goes after
        // that commit; a crash before it leaves the call `started`, and
        // resume resends it with the same operation id. Otherwise it is
        // committed now (no fsync): it survives the process, so resume
        // finds it recorded.
        if live.resend_is_harmless() {
            self.outcome_pending = true;
        } else {
            self.flush()?;
            self.landed()?;
        }
        crash::point("after-outcome", seq);
        self.call_done()?;
        Ok(outcome)
    }

    /// A test build told to break the rule (`STEPHOST_BREAK=ask-model-again`):
    /// a paid read already answered is sent again, its answer dropped.
    fn ask_again(&mut self, record: &CallRecord, live: &mut dyn LiveCall) {
        let fence = self.fence();
        let mut attempts = Attempts {
            sink: None,
            seq: record.seq,
            next: 1,
            counters: &mut self.counters,
            scrub: &self.call_scrub,
            control: self.control.as_deref(),
            halted: None,
        };
        let context = OpContext::of(
            &self.run_id,
            &self.operations,
            self.trace.as_ref(),
            record,
            fence,
        );
        let _ = live.perform(&context, &mut attempts);
    }

    /// After a live call: commits the buffer once it is full, and counts
    /// the call.
    fn call_done(&mut self) -> Result<(), Stop> {
        if self.pending.len() >= PENDING_WRITES_MAX
            || self.budget.unflushed_bytes() >= PENDING_BYTES_MAX
        {
            self.flush()?;
        }
        self.stats.live += 1;
        Ok(())
    }

    /// The hash of `request`, as a live call of `spec` keeps it, into `out`.
    fn request_hash(
        memo: &mut Option<RequestHashes>,
        spec: &CallSpec<'_>,
        request: &str,
        out: &mut String,
    ) {
        let hashes = match memo {
            Some(hashes)
                if hashes.interface == spec.interface && hashes.function == spec.function =>
            {
                hashes
            }
            _ => {
                let hasher = ids::RequestHasher::new(spec.interface, spec.function);
                let mut empty = String::new();
                hasher.hash_into(&mut empty, "");
                memo.insert(RequestHashes {
                    interface: spec.interface.to_string(),
                    function: spec.function.to_string(),
                    hasher,
                    empty,
                })
            }
        };
        if request.is_empty() {
            out.clone_from(&hashes.empty);
        } else {
            hashes.hasher.hash_into(out, request);
        }
    }

    /// Makes the link of the last replayed call the one the next call follows.
    fn follow_recorded_chain(&mut self) {
        if let Some(index) = self.chain_at.take()
            && let Some(call) = self.history.arrived(index)
        {
            self.chain.head = Head {
                seq: call.seq,
                link: call.chain.clone().unwrap_or_default(),
            };
        }
    }

    /// Buffers the outcome of `call`, finished in `state` (with `outcome`,
    /// its JSON, if any): it rides on the next commit.
    /// What the ledger keeps of call `seq`'s outcome: redacted if the call
    /// asked for it.
    fn kept(&self, seq: u64, outcome: &Outcome) -> String {
        match &self.redacting {
            Some((at, redaction)) if *at == seq => redaction.outcome(outcome),
            _ => outcome.to_json(),
        }
    }

    fn push_outcome(
        chain: &mut ChainState,
        pending: &mut Vec<WriteOp>,
        call: &CallRecord,
        state: CallState,
        outcome: Option<String>,
    ) {
        let chain = chain.extend(call, state, outcome.as_deref());
        pending.push(WriteOp::Outcome {
            seq: call.seq,
            state,
            outcome,
            now_ms: crate::clock::now_ms(),
            chain,
        });
    }

    /// Renews the claim's lease (and checks its fence) once half of it has
    /// passed since the last renewal, so a long stretch of buffered reads and
    /// observes does not let the lease lapse unnoticed. The renewal rides on
    /// a commit of its own, with the buffered calls.
    fn keep_lease(&mut self) -> Result<(), Stop> {
        let Mode::Live { claim, .. } = &self.mode else {
            return Ok(());
        };
        if (self.lease_checked.elapsed().as_millis() as i64).saturating_mul(2) < claim.lease_ms {
            return Ok(());
        }
        let until_ms = crate::lifecycle::renewed_lease(claim, crate::clock::now_ms());
        self.pending.push(WriteOp::Lease { until_ms });
        self.flush()?;
        self.lease_checked = std::time::Instant::now();
        if let Some(control) = &self.control {
            control.renewed(until_ms);
        }
        Ok(())
    }

    /// Asks a suspend call whether it can complete; records the outcome if
    /// so, or stops the run until it can.
    fn wait_for(
        &mut self,
        recorded: &CallRecord,
        live: &mut dyn LiveCall,
    ) -> Result<Outcome, Stop> {
        let seq = recorded.seq;
        let op = OpContext::of(
            &self.run_id,
            &self.operations,
            self.trace.as_ref(),
            recorded,
            self.fence(),
        );
        match live.wait(&op, recorded.started_at_ms) {
            Wait::Ready(outcome) => {
                let kept = self.kept(recorded.seq, &outcome);
                Self::push_outcome(
                    &mut self.chain,
                    &mut self.pending,
                    recorded,
                    outcome.state(),
                    Some(kept),
                );
                self.flush_now()?;
                self.stats.live += 1;
                Ok(outcome)
            }
            Wait::Until { wake_at_ms, reason } => Err(Stop::Suspended {
                seq,
                wake_at_ms,
                reason,
            }),
        }
    }

    /// Commits the buffered writes (no fsync unless one of them is
    /// durable). A writer that applies them on another thread may answer
    /// later (with a later commit, or [`Journal::landed`]).
    pub fn flush(&mut self) -> Result<(), Stop> {
        self.outcome_pending = false;
        self.budget.flushed();
        if self.pending.is_empty() {
            return Ok(());
        }
        match &mut self.mode {
            Mode::Live { writer, claim } => {
                let ops = Self::take_ops(&mut self.pending, claim);
                Ok(writer.commit(claim, ops).wait()?)
            }
            Mode::Replay => Ok(()),
        }
    }

    /// [`Journal::flush`], and waits until the commit is applied.
    pub fn flush_now(&mut self) -> Result<(), Stop> {
        self.flush()?;
        self.landed()
    }

    /// Waits until every commit handed to the writer is applied.
    fn landed(&mut self) -> Result<(), Stop> {
        match &mut self.mode {
            Mode::Live { writer, .. } => Ok(writer.landed()?),
            Mode::Replay => Ok(()),
        }
    }

    /// The buffered writes, for the runner to commit with the run's end.
    pub fn take_pending(&mut self) -> Vec<WriteOp> {
        match &self.mode {
            Mode::Live { claim, .. } => Self::take_ops(&mut self.pending, claim),
            Mode::Replay => std::mem::take(&mut self.pending),
        }
    }

    /// The buffered writes, to commit now. A new run's row, if they record
    /// it, gets a lease from now: not from when its execution began.
    fn take_ops(pending: &mut Vec<WriteOp>, claim: &Claim) -> Vec<WriteOp> {
        let mut ops = std::mem::take(pending);
        if let Some(WriteOp::Create(run)) = ops.first_mut() {
            let until = crate::lifecycle::renewed_lease(claim, crate::clock::now_ms());
            run.lease_until_ms = Some(run.lease_until_ms.unwrap_or(until).max(until));
        }
        ops
    }

    /// A call recorded as started with no outcome: the previous execution
    /// died between recording it and recording its outcome (see
    /// docs/durability.md, "No recorded I/O twice").
    fn reconcile(
        &mut self,
        recorded: &CallRecord,
        live: &mut dyn LiveCall,
    ) -> Result<Outcome, Stop> {
        let seq = recorded.seq;
        let op = OpContext::of(
            &self.run_id,
            &self.operations,
            self.trace.as_ref(),
            recorded,
            self.fence(),
        );
        // Attempt numbers go on from those of the executions before. An
        // execution that ended between `started` and its outcome may have
        // sent the request with no attempt recorded: that attempt is
        // recorded now, as what it is, so the call's history shows it.
        let mut next = self.history.last_attempts() + 1;
        if next == 1 {
            self.pending.push(WriteOp::Attempt(AttemptRecord {
                seq,
                attempt: 1,
                kind: "interrupted".to_string(),
                started_at_ms: recorded.started_at_ms,
                finished_at_ms: crate::clock::now_ms(),
                result: "unrecorded".to_string(),
                detail: Some(format!(
                    "the execution under fencing token {} ended after recording this call \
                     started and before its answer: the request may or may not have reached \
                     the receiver",
                    recorded.fence
                )),
            }));
            next = 2;
        }
        let mut attempts = Attempts {
            sink: Some(&mut self.pending),
            seq,
            next,
            counters: &mut self.counters,
            scrub: &self.call_scrub,
            control: self.control.as_deref(),
            halted: None,
        };
        let reconciled = if recorded.class == CallClass::Write && !live.reconciles_writes() {
            Reconciled::Unknown(format!(
                "the write's effect `{}` is not configured now, so its receiver cannot be \
                 asked; grant it again and resume, or resolve the call",
                recorded.function
            ))
        } else {
            live.reconcile(&op, &mut attempts)
        };
        let (state, outcome) = match reconciled {
            Reconciled::Outcome(outcome) => (outcome.state(), Ok(outcome)),
            Reconciled::PerformAgain => {
                let performed = live.perform(&op, &mut attempts);
                attempts.halted(&self.run_id)?;
                crash::point("after-send", seq);
                match performed {
                    Performed::Done(outcome) => (outcome.state(), Ok(outcome)),
                    Performed::Unknown(reason) => (CallState::Unknown, Err(reason)),
                }
            }
            Reconciled::Unknown(reason) => (CallState::Unknown, Err(reason)),
        };
        let outcome = match outcome {
            Ok(outcome) => Ok(self.call_scrub.outcome(outcome)),
            Err(reason) => Err(self.call_scrub.text(&reason).into_owned()),
        };
        let kept = outcome.as_ref().ok().map(|o| self.kept(recorded.seq, o));
        Self::push_outcome(&mut self.chain, &mut self.pending, recorded, state, kept);
        self.flush_now()?;
        match outcome {
            Ok(outcome) => {
                crash::point("after-outcome", seq);
                self.stats.live += 1;
                Ok(outcome)
            }
            Err(reason) => {
                self.count("side_effect_unknown_total");
                Err(Stop::Parked {
                    seq,
                    name: recorded.function.clone(),
                    reason,
                })
            }
        }
    }

    /// A line from the step's log. Not a ledger call: lines already in the
    /// ledger (from an earlier execution of the same prefix) are not written
    /// again, and are passed to the sink marked as replayed.
    pub fn log(&mut self, level: &str, message: &str) -> Result<(), Stop> {
        if let Some(stop) = &self.stop {
            return Err(stop.clone());
        }
        let after_seq = self.next_seq - 1;
        let max = self.budget.limits.payload_bytes_max as usize;
        let message = truncate(message, max);
        let charged = self.budget.charge_log(message.len() as u64);
        self.stopping(charged)?;
        let record = LogRecord {
            after_seq,
            level: level.to_string(),
            message: message.to_string(),
            at_ms: crate::clock::now_ms(),
        };
        let replayed = match self.logs_recorded.get_mut(&after_seq) {
            Some(n) if *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        };
        if !replayed && matches!(self.mode, Mode::Live { .. }) {
            self.pending.push(WriteOp::Log(record.clone()));
        }
        let replayed = replayed || matches!(self.mode, Mode::Replay);
        if let Some(sink) = self.log_sink.as_mut() {
            sink(&record, replayed);
        }
        Ok(())
    }
}

/// A replay reached a call the recording holds as in flight or waiting.
fn in_flight_in_replay(seq: u64) -> Stop {
    Stop::ReplayEnd {
        seq,
        reason: "the recording ends with this call in flight or waiting".to_string(),
    }
}

fn summary(call: &CallRecord) -> CallSummary {
    CallSummary {
        interface: call.interface.clone(),
        function: call.function.clone(),
        request: call.request.clone(),
    }
}

/// The new side of a divergence, redacted as its record would be (it is
/// printed and logged).
fn new_side(spec: &CallSpec<'_>) -> CallSummary {
    CallSummary {
        interface: spec.interface.to_string(),
        function: spec.function.to_string(),
        request: spec.kept_request(),
    }
}

fn parse_outcome(call: &CallRecord) -> Result<Outcome, Stop> {
    Outcome::parse(call.outcome.as_deref().unwrap_or("null")).map_err(|e| {
        Stop::Corrupt(format!(
            "call #{} has an unreadable outcome ({e}); the ledger is damaged",
            call.seq
        ))
    })
}

/// Cuts `s` to at most `max` bytes on a character boundary.
pub fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

mod budget;
mod children;
pub use children::{EndNotes, MakeChild};
#[cfg(test)]
mod tests;
