//! The ledger: runs, their calls, every attempt, and the module bytes they are
//! pinned to. Storage sits behind the [`Ledger`] trait; [`sqlite`] is the
//! embedded default.
//!
//! Durability contract of every implementation:
//! - [`Ledger::record_started`] and [`Ledger::finish_run`] are durable when
//!   they return (one fsync): nothing leaves the host before them.
//! - [`Ledger::record_observed`], [`Ledger::record_outcome`],
//!   [`Ledger::record_attempt`] and [`Ledger::append_log`] are ordered before
//!   the next durable write but need not be durable on their own: nothing
//!   outside the process has seen their effect until a later durable write.
//! - Every write for a run names the writer's fencing token and fails with
//!   [`LedgerError::Fenced`] without writing anything if a newer claim exists.

pub mod attempts;
pub mod chain;
pub mod checkpoint;
pub mod group;
pub mod history;
pub(crate) mod known;
pub(crate) mod reply;
pub mod schema;
pub mod spans;
pub mod spare;
pub mod sqlite;

use serde::{Deserialize, Serialize};

pub use group::{Answered, CommitCounts, GroupCommitter, GroupLedger, PendingCommit};
pub use history::History;
pub use sqlite::SqliteLedger;

/// The most calls one run can record: the SQLite ledger keys a call by its
/// run's number and a 32-bit sequence number (schema v5). `calls_max` is
/// capped at it.
pub const CALLS_PER_RUN_MAX: u64 = u32::MAX as u64;

/// The class of a call decides how it is recorded and how it is resumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallClass {
    /// Clock, random, host values: recorded in one write, no external effect.
    Observe,
    /// External reads: safe to perform again if interrupted.
    Read,
    /// External side effects: `started` durably before the request leaves.
    Write,
    /// Approvals and durable timers: the run may leave memory until they
    /// resolve. Recorded as `started` durably, like a write.
    Suspend,
}

impl CallClass {
    pub fn as_str(self) -> &'static str {
        match self {
            CallClass::Observe => "observe",
            CallClass::Read => "read",
            CallClass::Write => "write",
            CallClass::Suspend => "suspend",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "observe" => Some(CallClass::Observe),
            "read" => Some(CallClass::Read),
            "write" => Some(CallClass::Write),
            "suspend" => Some(CallClass::Suspend),
            _ => None,
        }
    }
}

/// Where a call stands in the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallState {
    /// Recorded before the request left; no outcome yet.
    Started,
    /// The guest saw a successful result.
    Succeeded,
    /// The guest saw an error result (`call-error`).
    Failed,
    /// The outcome could not be established; a person must resolve it.
    Unknown,
}

impl CallState {
    pub fn as_str(self) -> &'static str {
        match self {
            CallState::Started => "started",
            CallState::Succeeded => "succeeded",
            CallState::Failed => "failed",
            CallState::Unknown => "unknown",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "started" => Some(CallState::Started),
            "succeeded" => Some(CallState::Succeeded),
            "failed" => Some(CallState::Failed),
            "unknown" => Some(CallState::Unknown),
            _ => None,
        }
    }

    pub fn has_outcome(self) -> bool {
        matches!(self, CallState::Succeeded | CallState::Failed)
    }
}

/// One import call as the ledger holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallRecord {
    pub seq: u64,
    pub class: CallClass,
    /// WIT interface, e.g. `stephost:step/effects` or `wasi:clocks/wall-clock`.
    pub interface: String,
    /// Function within the interface; for effects, the effect name.
    pub function: String,
    /// The stable operation id (hex sha256); also the Idempotency-Key.
    pub operation_id: String,
    /// The request as the guest made it (JSON text).
    pub request: String,
    /// sha256 over interface, function and request.
    pub request_hash: String,
    pub state: CallState,
    /// The guest-visible result as JSON text (see `journal::Outcome`), once known.
    pub outcome: Option<String>,
    pub started_at_ms: i64,
    pub finished_at_ms: Option<i64>,
    /// Who decided the outcome of a call that was `unknown`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_by: Option<String>,
    /// The tamper-evident link over this call and all before it (see
    /// [`chain`]); set once the call is finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain: Option<String>,
}

/// The lifecycle of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Submitted, never claimed yet.
    Pending,
    /// Claimed and executing, or interrupted (its owner died) and resumable.
    Running,
    /// Out of memory until a timer is due or a person decides an approval.
    Waiting,
    /// The step returned output.
    Completed,
    /// The step returned an error, trapped, or hit a limit.
    Failed,
    /// A call's outcome is unknown; a person must resolve it.
    Parked,
    /// Resuming found the step making different calls than recorded.
    Diverged,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Pending => "pending",
            RunStatus::Running => "running",
            RunStatus::Waiting => "waiting",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Parked => "parked",
            RunStatus::Diverged => "diverged",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "pending" => Some(RunStatus::Pending),
            "running" => Some(RunStatus::Running),
            "waiting" => Some(RunStatus::Waiting),
            "completed" => Some(RunStatus::Completed),
            "failed" => Some(RunStatus::Failed),
            "parked" => Some(RunStatus::Parked),
            "diverged" => Some(RunStatus::Diverged),
            _ => None,
        }
    }

    /// Whether the run has reached a state no resume will change.
    pub fn is_final(self) -> bool {
        matches!(self, RunStatus::Completed | RunStatus::Failed)
    }
}

/// A run as the ledger holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    pub run_id: String,
    pub module_digest: String,
    pub input: String,
    pub status: RunStatus,
    pub output: Option<String>,
    /// For failed, parked and diverged runs: what happened (`kind: message`).
    pub error: Option<String>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// Compare-and-set version, bumped by every claim.
    pub version: i64,
    pub owner: Option<String>,
    pub lease_until_ms: Option<i64>,
    /// The newest fencing token; only its holder may write.
    pub fence: i64,
    /// For a waiting run: when a worker should look at it again.
    pub wake_at_ms: Option<i64>,
    /// The step world (WIT package and version) the run was started under.
    pub world: String,
    /// The step's declared `name@version`, when its module declares one.
    pub step: Option<String>,
    /// For a finished run of a WASI command: its exit status.
    #[serde(default)]
    pub exit_code: Option<i32>,
}

impl RunRecord {
    /// The row of `run`, new: pending, or claimed by `claim` (its first).
    pub fn new(run: &NewRun<'_>, claim: Option<&Claim>) -> Self {
        let (status, fence) = match claim {
            Some(claim) => (RunStatus::Running, claim.fence),
            None => (RunStatus::Pending, 0),
        };
        RunRecord {
            run_id: run.run_id.to_string(),
            module_digest: run.module_digest.to_string(),
            input: run.input.to_string(),
            status,
            output: None,
            error: None,
            created_at_ms: run.now_ms,
            updated_at_ms: run.now_ms,
            version: fence,
            owner: claim.map(|c| c.owner.clone()),
            lease_until_ms: claim.map(|c| c.lease_until_ms),
            fence,
            wake_at_ms: None,
            world: run.world.to_string(),
            step: run.step.map(str::to_string),
            exit_code: None,
        }
    }

    /// The row of `run`, new and claimed by `claim` (its first claim).
    pub fn claimed(run: &NewRun<'_>, claim: &Claim) -> Self {
        Self::new(run, Some(claim))
    }
}

/// The right to write a run's rows, as granted by [`Ledger::claim`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub run_id: String,
    pub owner: String,
    pub fence: i64,
    /// A renewal extends the lease to now + `lease_ms` (the journal renews
    /// once half of it has passed; a worker renews in the background).
    pub lease_ms: i64,
    pub lease_until_ms: i64,
}

impl Claim {
    /// The first claim of a new run, by `owner`, from `now_ms`.
    pub fn first(run_id: &str, owner: &str, lease_ms: i64, now_ms: i64) -> Self {
        Claim {
            run_id: run_id.to_string(),
            owner: owner.to_string(),
            fence: 1,
            lease_ms,
            lease_until_ms: now_ms + lease_ms,
        }
    }
}

/// One attempt at performing a call (retries and reconciliation lookups).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptRecord {
    pub seq: u64,
    pub attempt: u32,
    /// `send` or `lookup` (a name the host spells, not allocated for
    /// every attempt it records).
    pub kind: std::borrow::Cow<'static, str>,
    pub started_at_ms: i64,
    pub finished_at_ms: i64,
    /// `ok`, `rejected`, `retryable`, `invalid`, `found`, `not_found`.
    pub result: std::borrow::Cow<'static, str>,
    pub detail: Option<String>,
}

/// A line the step logged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogRecord {
    /// The number of calls the run had made when it logged.
    pub after_seq: u64,
    pub level: String,
    pub message: String,
    pub at_ms: i64,
}

/// How a run ended, for [`Ledger::finish_run`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunEnd {
    /// `exit_code` is a WASI command's exit status (`None` for a step).
    Completed {
        output: String,
        exit_code: Option<i32>,
    },
    Failed {
        error: String,
        exit_code: Option<i32>,
    },
    Parked {
        error: String,
    },
    Diverged {
        error: String,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error(
        "{path} is not a stephost ledger ({detail}); point --db at a stephost ledger or at a new file"
    )]
    NotALedger { path: String, detail: String },
    #[error(
        "ledger {path} has schema version {found}, newer than this stephost understands ({supported}); upgrade stephost"
    )]
    TooNew {
        path: String,
        found: i64,
        supported: i64,
    },
    #[error("no run {0} in the ledger (list runs with `stephost runs`)")]
    UnknownRun(String),
    #[error("run {run_id} already exists with another module or input; choose another --run-id")]
    RunExists { run_id: String },
    #[error(
        "run {run_id} is claimed by {owner} until {}; wait for that worker, or for its lease to run out",
        crate::clock::format_time(*lease_until_ms)
    )]
    ClaimedElsewhere {
        run_id: String,
        owner: String,
        lease_until_ms: i64,
    },
    #[error(
        "run {run_id}: fencing token {held} is stale (newest is {newest}); another worker owns the run, this one stops"
    )]
    Fenced {
        run_id: String,
        held: i64,
        newest: i64,
    },
    #[error("run {run_id} changed while claiming it (version {expected} expected, {found} found)")]
    VersionConflict {
        run_id: String,
        expected: i64,
        found: i64,
    },
    #[error(
        "call #{seq} of run {run_id} is {state}, not unknown; only an unknown call can be resolved"
    )]
    NotUnknown {
        run_id: String,
        seq: u64,
        state: String,
    },
    #[error("call #{seq} of run {run_id} cannot be decided: {reason}")]
    NotDecidable {
        run_id: String,
        seq: u64,
        reason: String,
    },
    #[error(
        "run {run_id} could not be repinned: it finished, changed module, or is held by a live worker; try again"
    )]
    RepinConflict { run_id: String },
    #[error("run {run_id} is {status}; there is nothing to claim")]
    NotClaimable { run_id: String, status: String },
    #[error("module {0} is not stored in the ledger")]
    UnknownModule(String),
    #[error("group commit failed: {0}")]
    Batch(String),
    #[error(
        "run {run_id} cannot record call #{seq}: a run records at most {max} calls, and a \
         ledger at most 2,147,483,647 runs"
    )]
    KeysExhausted { run_id: String, seq: u64, max: u64 },
    #[error(
        "call #{seq} of run {run_id} is already recorded, or older than the run's last calls: \
         a run's calls are only ever appended, by one execution at a time"
    )]
    NotAppended { run_id: String, seq: u64 },
    #[error("ledger data is corrupt: {0}")]
    Corrupt(String),
    #[error("ledger I/O failed: {0}")]
    Sqlite(#[from] rusqlite::Error),
}

/// A new run to insert.
#[derive(Debug, Clone)]
pub struct NewRun<'a> {
    pub run_id: &'a str,
    pub module_digest: &'a str,
    pub step: Option<&'a str>,
    /// The world the module targets ([`crate::engine::WORLD`] or
    /// [`crate::engine::COMMAND_WORLD`]).
    pub world: &'a str,
    pub input: &'a str,
    /// Commit the new run with an fsync: a run submitted for a worker must
    /// survive a power loss once its id is handed out. A run executed at
    /// once needs none: its first durable write or its end carries it.
    pub durable: bool,
    pub now_ms: i64,
}

#[cfg(test)]
impl<'a> NewRun<'a> {
    /// A run of the module `digest` on `{}`, for the ledger's tests.
    pub(crate) fn for_test(run_id: &'a str, digest: &'a str, now_ms: i64) -> Self {
        NewRun {
            run_id,
            module_digest: digest,
            step: None,
            world: crate::engine::WORLD,
            input: "{}",
            durable: false,
            now_ms,
        }
    }
}

/// A write under a claim: one unit of (group) commit.
#[derive(Debug, Clone)]
pub enum WriteOp {
    /// A run started in this process, claimed by the commit's writer, which
    /// this commit records (always its first write; see
    /// [`RunRecord::claimed`]). Fails the commit as claimed elsewhere if
    /// the run exists by then.
    Create(Box<RunRecord>),
    /// A call row: an observe call with its value, or a read as started; not
    /// durable on its own.
    Call(CallRecord),
    /// A read or write call, before it leaves the host: durable.
    Started(CallRecord),
    Outcome {
        seq: u64,
        state: CallState,
        outcome: Option<String>,
        now_ms: i64,
        /// The call's chain link, when the state is final.
        chain: Option<String>,
    },
    Attempt(AttemptRecord),
    Log(LogRecord),
    /// The run's end: durable.
    Finish(RunEnd, i64),
    /// The run leaves memory until `wake_at_ms` (or a decision): durable.
    Suspend {
        wake_at_ms: Option<i64>,
        now_ms: i64,
    },
    /// Metric counters of an execution, added in the commit that records
    /// how it ended (so an execution is counted once, with its end).
    Counters(crate::journal::Counters),
}

/// The storage interface of the ledger. One implementation per database.
pub trait Ledger: Send {
    /// Stores module bytes under their digest (idempotent).
    fn put_module(&mut self, digest: &str, bytes: &[u8]) -> Result<(), LedgerError>;
    fn module(&self, digest: &str) -> Result<Vec<u8>, LedgerError>;

    /// Inserts a run with status `pending` and no owner. Inserting the same
    /// run id with the same module and input again returns the existing run.
    fn create_run(&mut self, run: NewRun<'_>) -> Result<RunRecord, LedgerError>;

    /// Creates a run and claims it for `owner` (see [`Ledger::claim`]): a
    /// new run is inserted already claimed, in one transaction instead of
    /// two. A finished run is returned without a claim.
    fn create_claimed(
        &mut self,
        run: NewRun<'_>,
        owner: &str,
        lease_ms: i64,
        owner_alive: &dyn Fn(&str) -> bool,
    ) -> Result<(RunRecord, Option<Claim>), LedgerError> {
        let now_ms = run.now_ms;
        let record = self.create_run(run)?;
        if record.status.is_final() {
            return Ok((record, None));
        }
        let claim = self.claim(&record.run_id, owner, lease_ms, now_ms, owner_alive)?;
        Ok((record, Some(claim)))
    }

    fn run(&self, run_id: &str) -> Result<RunRecord, LedgerError>;
    fn runs(&self, status: Option<RunStatus>) -> Result<Vec<RunRecord>, LedgerError>;

    /// Claims a run by compare-and-set on its version: succeeds when the run
    /// has no live owner (`owner_alive` decides about an unexpired lease held
    /// by another owner), bumping version and fencing token.
    fn claim(
        &mut self,
        run_id: &str,
        owner: &str,
        lease_ms: i64,
        now_ms: i64,
        owner_alive: &dyn Fn(&str) -> bool,
    ) -> Result<Claim, LedgerError>;
    /// Gives a claim up (owner and lease cleared) if it is still the newest.
    fn release(&mut self, claim: &Claim) -> Result<(), LedgerError>;
    /// Extends a claim's lease; fails with `Fenced` if the claim was lost.
    fn renew(&mut self, claim: &Claim, now_ms: i64) -> Result<(), LedgerError>;
    /// Runs a worker may claim: pending, or running with no owner or an
    /// expired lease, oldest first. (Owners that died before their lease
    /// ran out are the caller's to filter with `owner_alive`.)
    fn runnable(&self, now_ms: i64, limit: usize) -> Result<Vec<RunRecord>, LedgerError>;

    fn calls(&self, run_id: &str) -> Result<Vec<CallRecord>, LedgerError>;

    /// The run's calls as an execution consumes them: the same rows as
    /// [`Ledger::calls`], which an implementation may deliver while the
    /// first of them are being replayed.
    fn history(&self, run_id: &str) -> Result<History, LedgerError> {
        Ok(History::loaded(run_id, self.calls(run_id)?))
    }

    fn attempts(&self, run_id: &str) -> Result<Vec<AttemptRecord>, LedgerError>;

    /// The attempts of call `seq` alone.
    fn call_attempts(&self, run_id: &str, seq: u64) -> Result<Vec<AttemptRecord>, LedgerError> {
        let mut all = self.attempts(run_id)?;
        all.retain(|a| a.seq == seq);
        Ok(all)
    }
    fn logs(&self, run_id: &str) -> Result<Vec<LogRecord>, LedgerError>;

    /// Applies `ops` for the claim's run in one transaction: durable (one
    /// fsync) when any op is durable, otherwise ordered before the next
    /// durable commit. Fails without writing anything if the claim is stale.
    fn commit(&mut self, claim: &Claim, ops: &[WriteOp]) -> Result<(), LedgerError>;

    /// Like [`Ledger::commit`], leaving `ops` empty once it succeeds: a
    /// ledger that hands them to another thread takes them instead of
    /// copying them. After a failure, `ops` may have been taken too.
    fn commit_taking(&mut self, claim: &Claim, ops: &mut Vec<WriteOp>) -> Result<(), LedgerError> {
        self.commit(claim, ops)?;
        ops.clear();
        Ok(())
    }

    /// Like [`Ledger::commit_taking`], for a commit that must be durable
    /// (a write's `started` row), except that a ledger whose commits
    /// another thread applies may hand it back pending instead of waiting
    /// for it: the caller waits for it (a thread blocks, a task awaits),
    /// then settles its answer with [`Ledger::settle_durable`] before it
    /// uses the ledger again.
    fn commit_durable(
        &mut self,
        claim: &Claim,
        ops: &mut Vec<WriteOp>,
    ) -> Result<Option<PendingCommit>, LedgerError> {
        self.commit_taking(claim, ops).map(|()| None)
    }

    /// The result of a commit [`Ledger::commit_durable`] left pending, once
    /// it is answered.
    fn settle_durable(&mut self, claim: &Claim, answered: Answered) -> Result<(), LedgerError> {
        let _ = claim;
        answered.into_result()
    }

    /// Returns once every write committed before is in the database (not
    /// necessarily on disk): for an outcome that must survive the process,
    /// the write of a receiver that does not deduplicate. A ledger that
    /// applies each commit before `commit` returns has nothing to wait for.
    fn landed(&mut self) -> Result<(), LedgerError> {
        Ok(())
    }

    /// An observe call and its value (not fsync'd on its own).
    fn record_observed(&mut self, claim: &Claim, call: &CallRecord) -> Result<(), LedgerError> {
        self.commit(claim, &[WriteOp::Call(call.clone())])
    }
    /// A read or write call as started: durable before it returns.
    fn record_started(&mut self, claim: &Claim, call: &CallRecord) -> Result<(), LedgerError> {
        self.commit(claim, &[WriteOp::Started(call.clone())])
    }
    /// The outcome of a started call (state succeeded, failed or unknown).
    fn record_outcome(
        &mut self,
        claim: &Claim,
        seq: u64,
        state: CallState,
        outcome: Option<&str>,
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        self.commit(
            claim,
            &[WriteOp::Outcome {
                seq,
                state,
                outcome: outcome.map(str::to_string),
                now_ms,
                chain: None,
            }],
        )
    }
    fn record_attempt(
        &mut self,
        claim: &Claim,
        attempt: &AttemptRecord,
    ) -> Result<(), LedgerError> {
        self.commit(claim, &[WriteOp::Attempt(attempt.clone())])
    }
    fn append_log(&mut self, claim: &Claim, log: &LogRecord) -> Result<(), LedgerError> {
        self.commit(claim, &[WriteOp::Log(log.clone())])
    }

    /// A person's decision on an approval call that is still `started` and
    /// not expired: records the outcome with who decided and makes the
    /// waiting run runnable. Durable before it returns.
    fn decide_approval(
        &mut self,
        run_id: &str,
        seq: u64,
        outcome: &str,
        by: &str,
        now_ms: i64,
    ) -> Result<(), LedgerError>;

    /// Pins an unfinished run that no live owner holds to another module
    /// (after a replay proved it compatible). Compare-and-set on the old digest.
    fn repin(
        &mut self,
        run_id: &str,
        from: &str,
        to: &str,
        step: Option<&str>,
        now_ms: i64,
        owner_alive: &dyn Fn(&str) -> bool,
    ) -> Result<(), LedgerError>;

    /// Approval calls still waiting for a decision, with their runs.
    fn pending_approvals(&self) -> Result<Vec<(RunRecord, CallRecord)>, LedgerError>;

    /// A person's decision on an `unknown` call: records the outcome with who
    /// decided, and makes the parked run resumable. Durable before it returns.
    fn resolve_call(
        &mut self,
        run_id: &str,
        seq: u64,
        state: CallState,
        outcome: &str,
        by: &str,
        now_ms: i64,
    ) -> Result<(), LedgerError>;

    /// Adds to the metric counters (kept in the ledger across restarts).
    fn add_counters(&mut self, counters: &crate::journal::Counters) -> Result<(), LedgerError>;
    fn counters(&self) -> Result<Vec<(String, i64)>, LedgerError>;

    /// Ends (or parks) the run and releases the claim: durable before it returns.
    fn finish_run(&mut self, claim: &Claim, end: &RunEnd, now_ms: i64) -> Result<(), LedgerError> {
        self.commit(claim, &[WriteOp::Finish(end.clone(), now_ms)])
    }
}
