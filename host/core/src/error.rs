//! What went wrong in a ledger, in storage-neutral words: every backend's
//! errors become one of these, carrying what was expected and what was
//! found.

use crate::records::CallState;

/// What went wrong in a ledger, in words that name no driver.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error(
        "{location} is not a stephost ledger ({detail}); point --ledger at a stephost ledger or \
         at a new one"
    )]
    NotALedger { location: String, detail: String },
    #[error(
        "ledger {location} has schema version {found}, newer than this stephost understands \
         ({supported}), and may be used by builds of schema version {compatible_from} or later \
         only; upgrade stephost"
    )]
    TooNew {
        location: String,
        found: i64,
        supported: i64,
        /// The oldest schema version whose builds may use the ledger (its
        /// own version when it does not say).
        compatible_from: i64,
    },
    #[error(
        "ledger {location} was written by an earlier development format of stephost (format \
         {found}), which this release does not read; no release ever wrote it: keep it for the \
         build that made it, and start a new ledger for this one"
    )]
    OldFormat { location: String, found: String },
    #[error("no run {0} in the ledger (list runs with `stephost runs`)")]
    UnknownRun(String),
    #[error("run {run_id} already exists with another module or input; choose another --run-id")]
    RunExists { run_id: String },
    #[error(
        "run {run_id} is claimed by {owner} until {}; wait for that worker, or for its lease to \
         run out",
        crate::clock::format_time(*lease_until_ms)
    )]
    ClaimedElsewhere {
        run_id: String,
        owner: String,
        lease_until_ms: i64,
    },
    #[error(
        "run {run_id}: fencing token {held} is stale (newest is {newest}); another worker owns \
         the run, this one stops"
    )]
    Fenced {
        run_id: String,
        held: i64,
        newest: i64,
    },
    #[error(
        "run {run_id} changed meanwhile (version {expected} expected, {found} found); try again"
    )]
    VersionConflict {
        run_id: String,
        expected: i64,
        found: i64,
    },
    #[error(
        "call #{seq} of run {run_id} changed meanwhile ({} expected, {found} found)",
        expected.as_str()
    )]
    CallConflict {
        run_id: String,
        seq: u64,
        expected: CallState,
        found: String,
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
        "run {run_id} could not be repinned: it finished, changed module, or is held by a live \
         worker; try again"
    )]
    RepinConflict { run_id: String },
    #[error("run {run_id} is {status}; there is nothing to claim")]
    NotClaimable { run_id: String, status: String },
    #[error("run {run_id} is {status}: it has ended, and its budget no longer changes")]
    Ended { run_id: String, status: String },
    /// The run was cancelled: it may begin nothing more (no write, wait
    /// or child). Its execution ends it `cancelled`.
    #[error("run {run_id} is cancelled ({reason}): it begins nothing more")]
    Cancelled { run_id: String, reason: String },
    #[error("module {0} is not stored in the ledger")]
    UnknownModule(String),
    #[error("no schedule {0} in the ledger (list them with `stephost schedule list`)")]
    UnknownSchedule(String),
    #[error(
        "a schedule named {0} exists; remove it first (`stephost schedule remove {0}`) or choose \
         another name"
    )]
    ScheduleExists(String),
    #[error(
        "call #{seq} of run {run_id} is already recorded: a run's calls are only ever appended, \
         by one execution at a time"
    )]
    NotAppended { run_id: String, seq: u64 },
    #[error("ledger data is corrupt: {0}")]
    Corrupt(String),
    /// The run's record does not verify against the chain key: it was
    /// changed after it was written, and is not claimed, decided or
    /// repinned (which would sign the change).
    #[error(
        "run {run_id}'s record does not verify ({reason}): it was changed after it was written; \
         check it with `stephost verify {run_id}` and restore the ledger from a backup"
    )]
    Integrity { run_id: String, reason: String },
    /// The ledger could not be reached or written (I/O, a lost connection,
    /// a lock held too long): the operation may succeed if tried again.
    #[error("ledger unavailable: {0}")]
    Unavailable(String),
    /// The ledger URL or its options are wrong.
    #[error("{0}")]
    Config(String),
}

pub type StoreResult<T> = Result<T, StoreError>;
