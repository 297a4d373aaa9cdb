//! What the ledger holds: runs, their calls, each call's attempts, and the
//! lines a step logged. Plain data, the same for every backend.

use serde::{Deserialize, Serialize};

/// The most calls one run can record (a sequence number fits 32 bits in
/// every backend). `calls_max` is capped at it.
pub const CALLS_PER_RUN_MAX: u64 = u32::MAX as u64;

/// The class of a call decides how it is recorded and how it is resumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
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

    /// Whether the guest has seen (or will see) a result for the call.
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
    /// Empty for observe calls, which act on nothing outside the host.
    pub operation_id: String,
    /// The request as the guest made it (JSON text).
    pub request: String,
    /// sha256 over interface, function and request.
    pub request_hash: String,
    pub state: CallState,
    /// The guest-visible result as JSON text (see [`crate::Outcome`]), once known.
    pub outcome: Option<String>,
    pub started_at_ms: i64,
    pub finished_at_ms: Option<i64>,
    /// The fencing token of the execution that recorded the call: it was
    /// performed live under this fence, and every execution under a later
    /// one replayed it (0 in runs exported before it was kept).
    #[serde(default)]
    pub fence: i64,
    /// Who decided the outcome of a call that waited for a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_by: Option<String>,
    /// The tamper-evident link over this call and all before it (see
    /// [`crate::chain`]); set once the call is finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain: Option<String>,
}

/// The lifecycle of a run (the transitions are in [`crate::lifecycle`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
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
    /// A person (or its parent's end) cancelled it: it started nothing
    /// more, and nothing it had in flight was guessed.
    Cancelled,
}

impl RunStatus {
    pub const ALL: [RunStatus; 8] = [
        RunStatus::Pending,
        RunStatus::Running,
        RunStatus::Waiting,
        RunStatus::Completed,
        RunStatus::Failed,
        RunStatus::Parked,
        RunStatus::Diverged,
        RunStatus::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Pending => "pending",
            RunStatus::Running => "running",
            RunStatus::Waiting => "waiting",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Parked => "parked",
            RunStatus::Diverged => "diverged",
            RunStatus::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.as_str() == s)
    }

    /// Whether a caller waiting for the run's end (`submit --wait`,
    /// `POST /api/runs?wait=`) is answered now: the run finished, was
    /// parked, or waits for a person, a timer or a model's capacity (an
    /// answer that could take hours is not waited for). Only a run pending
    /// or running is waited on.
    pub fn answers_a_wait(self) -> bool {
        !matches!(self, RunStatus::Pending | RunStatus::Running)
    }

    /// Whether no execution will change the run again: it completed,
    /// failed, diverged from its recording, or was cancelled.
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            RunStatus::Completed | RunStatus::Failed | RunStatus::Diverged | RunStatus::Cancelled
        )
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
    /// Compare-and-set version: every change of the run's row bumps it.
    pub version: i64,
    pub owner: Option<String>,
    pub lease_until_ms: Option<i64>,
    /// The newest fencing token; only its holder may write the run's calls.
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
    /// The seal over the row and its chain's head ([`crate::chain`]).
    #[serde(default)]
    pub seal: Option<String>,
    /// The run's own model budget, if it was given one.
    #[serde(default, skip_serializing_if = "crate::limits::RunBudget::is_empty")]
    pub budget: crate::limits::RunBudget,
    /// The trace the run reports into ([`crate::trace`]); none for a run
    /// recorded before traces were kept (see [`RunRecord::trace`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<crate::trace::RunTrace>,
    /// For a child run: the parent's call that started it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentRef>,
    /// For a child run: the run at the top of its tree (none for a root,
    /// which is its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_run_id: Option<String>,
    /// Set once the run (or a run above it) is cancelled: it starts nothing
    /// more, and ends `cancelled` at its next write, wait or start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel: Option<CancelRequest>,
    /// For a fork: the run and call it was forked from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fork: Option<ForkRef>,
}

/// Where a fork came from ([`crate::fork`]): its source run, the call it
/// went live from, the source's link before that call, and whose operation
/// ids its calls carry. Set when the fork is recorded, never changed, and
/// sealed with its input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkRef {
    pub run_id: String,
    /// The first call the fork made live; calls before it are the source's.
    pub seq: u64,
    /// The source's chain link of call `seq - 1` (none when `seq` is 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<String>,
    /// The run whose id the fork's operation ids are derived from: the
    /// source's (its own source's, for a fork of a fork), so a receiver
    /// sees a write the source made as the same operation.
    pub operations: String,
}

impl ForkRef {
    /// The column a ledger keeps it in.
    pub fn to_column(&self) -> String {
        serde_json::to_string(self).expect("a fork reference serializes")
    }

    pub fn from_column(text: Option<&str>) -> Result<Option<Self>, String> {
        text.map(|t| {
            serde_json::from_str(t).map_err(|e| format!("a run's fork column is not one: {e}"))
        })
        .transpose()
    }
}

/// Who cancelled a run, when and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelRequest {
    pub at_ms: i64,
    pub by: String,
    pub reason: Option<String>,
}

impl CancelRequest {
    /// The error a run cancelled by this request ends with.
    pub fn error(&self) -> String {
        match &self.reason {
            Some(reason) => format!("cancelled by {}: {reason}", self.by),
            None => format!("cancelled by {}", self.by),
        }
    }
}

/// Where a child run was started: its parent's run, the parent's `start`
/// call, and the join set the parent joins it in. Set when the child is
/// recorded, never changed, and sealed with its input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentRef {
    pub run_id: String,
    pub seq: u64,
    pub join_set: String,
    /// Whether the child goes on when its parent ends before joining it
    /// (else it is cancelled with its parent's end).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub detached: bool,
}

/// What a child's end leaves in its parent's inbox, in the commit of the
/// end: the arrival number (1, 2, 3 … per parent, in commit order) is the
/// ledger's to give.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildArrival {
    pub parent_run_id: String,
    pub child_run_id: String,
    pub join_set: String,
    /// The child's final status (completed, failed or diverged).
    pub status: RunStatus,
    pub at_ms: i64,
}

/// One child's end as its parent's inbox holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InboxEntry {
    /// 1, 2, 3 … per parent, gapless, in the order the ends committed.
    pub arrival: u64,
    pub child_run_id: String,
    pub join_set: String,
    pub status: RunStatus,
    pub at_ms: i64,
}

impl RunRecord {
    /// The run whose id this run's operation ids are derived from: its
    /// own, or for a fork its source's ([`ForkRef::operations`]).
    pub fn operations(&self) -> &str {
        self.fork
            .as_ref()
            .map_or(self.run_id.as_str(), |f| f.operations.as_str())
    }

    /// The run's trace: the one kept with it, or one derived from its id.
    pub fn trace(&self) -> crate::trace::RunTrace {
        self.trace
            .clone()
            .unwrap_or_else(|| crate::trace::RunTrace::of_run_id(&self.run_id))
    }
}

/// The right to write a run's rows, as granted by a claim
/// ([`crate::lifecycle::claim`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub run_id: String,
    pub owner: String,
    pub fence: i64,
    /// A renewal extends the lease to now + `lease_ms`.
    pub lease_ms: i64,
    pub lease_until_ms: i64,
    /// What the run's row was before this claim (none for a run's first,
    /// made with its record).
    pub from: Option<ClaimedFrom>,
}

/// The row a claim replaced: how the run's last execution left it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimedFrom {
    /// `running` when the last execution never ended its claim: its
    /// process died, or its lease ran out.
    pub status: RunStatus,
    /// The last execution's fencing token (0: none yet).
    pub fence: i64,
    /// When the row last changed: the last execution's end, or its claim
    /// or last renewal.
    pub updated_at_ms: i64,
    pub owner: Option<String>,
    pub error: Option<String>,
}

/// One attempt at performing a call (retries and reconciliation lookups).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptRecord {
    pub seq: u64,
    pub attempt: u32,
    /// `send` or `lookup`.
    pub kind: String,
    pub started_at_ms: i64,
    pub finished_at_ms: i64,
    /// `ok`, `rejected`, `retryable`, `invalid`, `found`, `not_found`.
    pub result: String,
    pub detail: Option<String>,
}

/// One attempt as a call's stored `attempts` array holds it (the call's
/// `seq` is its row's).
#[derive(Serialize, Deserialize)]
struct StoredAttempt<'a> {
    attempt: u32,
    #[serde(borrow)]
    kind: std::borrow::Cow<'a, str>,
    started_at: i64,
    finished_at: i64,
    #[serde(borrow)]
    result: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    detail: Option<std::borrow::Cow<'a, str>>,
}

impl AttemptRecord {
    /// `attempts` as the JSON array a call's row keeps them in, in every
    /// backend.
    pub fn to_stored_json(attempts: &[&AttemptRecord]) -> String {
        let stored: Vec<StoredAttempt<'_>> = attempts
            .iter()
            .map(|a| StoredAttempt {
                attempt: a.attempt,
                kind: a.kind.as_str().into(),
                started_at: a.started_at_ms,
                finished_at: a.finished_at_ms,
                result: a.result.as_str().into(),
                detail: a.detail.as_deref().map(Into::into),
            })
            .collect();
        serde_json::to_string(&stored).unwrap_or_else(|_| "[]".into())
    }

    /// The attempts of call `seq` from the JSON array its row keeps.
    pub fn from_stored_json(
        seq: u64,
        text: &str,
    ) -> Result<Vec<AttemptRecord>, crate::error::StoreError> {
        let stored: Vec<StoredAttempt<'_>> = serde_json::from_str(text).map_err(|e| {
            crate::error::StoreError::Corrupt(format!(
                "the attempts of call #{seq} are unreadable: {e}"
            ))
        })?;
        Ok(stored
            .into_iter()
            .map(|a| AttemptRecord {
                seq,
                attempt: a.attempt,
                kind: a.kind.into_owned(),
                started_at_ms: a.started_at,
                finished_at_ms: a.finished_at,
                result: a.result.into_owned(),
                detail: a.detail.map(std::borrow::Cow::into_owned),
            })
            .collect())
    }
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

/// A new run, as a caller asks for it.
#[derive(Debug, Clone)]
pub struct NewRun<'a> {
    pub run_id: &'a str,
    pub module_digest: &'a str,
    pub step: Option<&'a str>,
    /// The world the module targets.
    pub world: &'a str,
    pub input: &'a str,
    pub now_ms: i64,
    pub budget: crate::limits::RunBudget,
}

impl NewRun<'_> {
    /// The run's first row: pending, or running under `claim` (its first
    /// claim: version and fencing token 1).
    pub fn record(&self, claim: Option<&Claim>) -> RunRecord {
        let (status, fence) = match claim {
            Some(claim) => (RunStatus::Running, claim.fence),
            None => (RunStatus::Pending, 0),
        };
        RunRecord {
            run_id: self.run_id.to_string(),
            module_digest: self.module_digest.to_string(),
            input: self.input.to_string(),
            status,
            output: None,
            error: None,
            created_at_ms: self.now_ms,
            updated_at_ms: self.now_ms,
            version: fence,
            owner: claim.map(|c| c.owner.clone()),
            lease_until_ms: claim.map(|c| c.lease_until_ms),
            fence,
            wake_at_ms: None,
            world: self.world.to_string(),
            step: self.step.map(str::to_string),
            exit_code: None,
            seal: None,
            budget: self.budget,
            trace: None,
            parent: None,
            root_run_id: None,
            cancel: None,
            fork: None,
        }
    }
}

/// How an execution left its run.
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
    /// Cancelled: `error` says by whom and why.
    Cancelled {
        error: String,
    },
    /// Out of memory until `wake_at_ms` (or until a person decides).
    Waiting {
        wake_at_ms: Option<i64>,
    },
}

/// The columns an execution's end writes into its run's row (the claim is
/// given up with it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndRow {
    pub status: RunStatus,
    pub output: Option<String>,
    pub error: Option<String>,
    pub exit_code: Option<i32>,
    pub wake_at_ms: Option<i64>,
    pub due_at_ms: Option<i64>,
    pub updated_at_ms: i64,
    /// The run's seal after its end ([`crate::chain::Signer::seal`]).
    pub seal: Option<String>,
    /// A child run's end, for its parent's inbox (written in the same
    /// transaction; the parent is made due if it waits).
    pub arrival: Option<ChildArrival>,
    /// A finished run's children not joined and not detached, and theirs,
    /// are cancelled with its end (in the same transaction).
    pub cancel_children: Option<CancelRequest>,
    /// For a run that waits for a child: how many arrivals its inbox had
    /// when it looked. If more have arrived by the end's commit, the run
    /// is due at once instead (a child that ended in between is not
    /// missed).
    pub inbox_seen: Option<u64>,
}

impl EndRow {
    /// `run`'s row once this end is applied (its claim let go).
    pub fn applied_to(&self, run: &RunRecord) -> RunRecord {
        RunRecord {
            status: self.status,
            output: self.output.clone(),
            error: self.error.clone(),
            exit_code: self.exit_code,
            wake_at_ms: self.wake_at_ms,
            updated_at_ms: self.updated_at_ms,
            owner: None,
            lease_until_ms: None,
            version: run.version + 1,
            seal: self.seal.clone().or_else(|| run.seal.clone()),
            ..run.clone()
        }
    }
}

/// Metric counters accumulated during an execution, added to the ledger's
/// with its end.
pub type Counters = std::collections::BTreeMap<&'static str, i64>;
