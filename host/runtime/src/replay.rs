//! Portable recorded runs (fixtures) and replay reports.

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use stephost_core::journal::{Divergence, Journal, Mode, Stop};
use stephost_core::{CallRecord, History, Limits, RunBudget, RunRecord, RunStatus, StoreError};

use crate::engine::{Loaded, StepEngine};
use crate::error::HostError;
use crate::imports::lock;
use crate::instance::{classify_trap, invoke};
use crate::options::HostOptions;

/// The fixture format's name and version.
pub const FIXTURE_FORMAT: &str = "stephost-run/1";

/// A recorded run that needs no database: `stephost export` writes it,
/// `stephost replay --fixture` reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fixture {
    pub format: String,
    pub run_id: String,
    pub module_digest: String,
    pub input: String,
    pub status: RunStatus,
    pub output: Option<String>,
    pub error: Option<String>,
    /// The rest of the run's row, for its seal ([`stephost_core::chain`]).
    #[serde(default)]
    pub world: String,
    #[serde(default)]
    pub step: Option<String>,
    #[serde(default)]
    pub exit_code: Option<i32>,
    #[serde(default)]
    pub seal: Option<String>,
    /// The run's own model budget, if it had one (its seal covers it).
    #[serde(default, skip_serializing_if = "RunBudget::is_empty")]
    pub budget: RunBudget,
    /// For a child run: where it was started (sealed with its input).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<stephost_core::ParentRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_run_id: Option<String>,
    /// For a fork: where it was forked from (sealed with its input).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fork: Option<stephost_core::ForkRef>,
    pub calls: Vec<CallRecord>,
}

impl Fixture {
    pub fn new(run: &RunRecord, calls: Vec<CallRecord>) -> Self {
        Fixture {
            format: FIXTURE_FORMAT.to_string(),
            run_id: run.run_id.clone(),
            module_digest: run.module_digest.clone(),
            input: run.input.clone(),
            status: run.status,
            output: run.output.clone(),
            error: run.error.clone(),
            world: run.world.clone(),
            step: run.step.clone(),
            exit_code: run.exit_code,
            seal: run.seal.clone(),
            budget: run.budget,
            parent: run.parent.clone(),
            root_run_id: run.root_run_id.clone(),
            fork: run.fork.clone(),
            calls,
        }
    }

    /// The run's row as far as the fixture keeps it: what its seal covers.
    pub fn run_record(&self) -> RunRecord {
        RunRecord {
            run_id: self.run_id.clone(),
            module_digest: self.module_digest.clone(),
            input: self.input.clone(),
            status: self.status,
            output: self.output.clone(),
            error: self.error.clone(),
            created_at_ms: 0,
            updated_at_ms: 0,
            version: 0,
            owner: None,
            lease_until_ms: None,
            fence: 0,
            wake_at_ms: None,
            world: self.world.clone(),
            step: self.step.clone(),
            exit_code: self.exit_code,
            seal: self.seal.clone(),
            budget: self.budget,
            trace: None,
            parent: self.parent.clone(),
            root_run_id: self.root_run_id.clone(),
            cancel: None,
            fork: self.fork.clone(),
        }
    }

    /// Parses a fixture, checking its format and the order of its calls.
    pub fn parse(text: &str) -> Result<Self, String> {
        let fixture: Fixture =
            serde_json::from_str(text).map_err(|e| format!("not a stephost run fixture: {e}"))?;
        if fixture.format != FIXTURE_FORMAT {
            return Err(format!(
                "fixture format is {:?}; this stephost reads {FIXTURE_FORMAT:?}",
                fixture.format
            ));
        }
        for (index, call) in fixture.calls.iter().enumerate() {
            if call.seq != index as u64 + 1 {
                return Err(format!(
                    "fixture call #{} stands where #{} belongs",
                    call.seq,
                    index + 1
                ));
            }
        }
        Ok(fixture)
    }
}

/// The result of replaying a recording against a module.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum ReplayVerdict {
    /// Every recorded call matched; for a finished run, so did its end.
    Consistent { calls: u64, output: Option<String> },
    /// The recording ends (the run is unfinished) and every call up to
    /// there matched.
    Incomplete { calls: u64, reason: String },
    /// The first call that differs.
    Diverged { divergence: Divergence },
    /// Same calls, different output.
    OutputDiffers { recorded: String, new: String },
    /// Same calls, but the run ended differently (failed vs completed).
    EndDiffers { recorded: String, new: String },
    /// The step failed during the replay where the recording did not.
    StepFailed { error: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplayReport {
    pub run_id: String,
    pub recorded_status: RunStatus,
    /// The digest of the module replayed (may differ from the recording's).
    pub module_digest: String,
    #[serde(flatten)]
    pub verdict: ReplayVerdict,
}

impl ReplayReport {
    /// The CLI exit code for this verdict.
    pub fn exit_code(&self) -> i32 {
        use crate::error::exit;
        match self.verdict {
            ReplayVerdict::Consistent { .. } | ReplayVerdict::Incomplete { .. } => exit::OK,
            ReplayVerdict::Diverged { .. }
            | ReplayVerdict::OutputDiffers { .. }
            | ReplayVerdict::EndDiffers { .. } => exit::DIVERGED,
            ReplayVerdict::StepFailed { .. } => exit::STEP_FAILED,
        }
    }
}

/// Replays `fixture` against `module` with no I/O.
pub fn replay_fixture(
    engine: &StepEngine,
    fixture: Fixture,
    module: &[u8],
    what: &str,
    options: &HostOptions,
) -> Result<ReplayReport, HostError> {
    let loaded = engine.load(module, what)?;
    let mut fixture = fixture;
    // The recorded calls move into the journal: no copy of the history.
    let history = History::loaded(&fixture.run_id, std::mem::take(&mut fixture.calls));
    replay_loaded(engine, &fixture, history, &loaded, options)
}

/// Replays the run `fixture` describes, whose calls are `history`, against
/// a loaded module with no I/O.
pub fn replay_loaded(
    engine: &StepEngine,
    fixture: &Fixture,
    history: History,
    loaded: &Loaded,
    options: &HostOptions,
) -> Result<ReplayReport, HostError> {
    let complete = matches!(fixture.status, RunStatus::Completed | RunStatus::Failed);
    let mut journal = Journal::new(
        &fixture.run_id,
        Mode::Replay,
        history,
        &[],
        options.limits.clone(),
    );
    journal.set_recording_complete(complete);
    let journal = Arc::new(Mutex::new(journal));
    let (guest, _exit_code) = invoke(engine, loaded, &journal, &fixture.input, options);
    let mut journal = lock(&journal);
    let calls = journal.calls_made();
    let verdict = match (journal.stop().cloned(), guest) {
        // The recording could not be read: no verdict on the module.
        (Some(Stop::LedgerRead { message, corrupt }), _) => {
            return Err(HostError::reading_calls(message, corrupt));
        }
        (Some(Stop::Diverged(d)), _) => ReplayVerdict::Diverged { divergence: *d },
        (Some(Stop::ReplayEnd { seq, reason }), _) => ReplayVerdict::Incomplete {
            calls: seq - 1,
            reason,
        },
        (Some(other), _) => ReplayVerdict::StepFailed {
            error: other.to_string(),
        },
        (None, guest) => match journal.unreached().map_err(|e| match e {
            StoreError::Corrupt(_) => HostError::from(e),
            other => HostError::LedgerRead(other.to_string()),
        })? {
            Some(divergence) => ReplayVerdict::Diverged { divergence },
            None => verdict_for_end(fixture, guest, calls, &options.limits),
        },
    };
    Ok(ReplayReport {
        run_id: fixture.run_id.clone(),
        recorded_status: fixture.status,
        module_digest: loaded.digest.clone(),
        verdict,
    })
}

fn verdict_for_end(
    fixture: &Fixture,
    guest: Result<Result<String, String>, wasmtime::Error>,
    calls: u64,
    limits: &Limits,
) -> ReplayVerdict {
    let new_end = match guest {
        Ok(Ok(output)) => Ok(output),
        Ok(Err(message)) => Err(format!("step_error: {message}")),
        Err(trap) => Err(classify_trap(&trap, limits)),
    };
    match (fixture.status, new_end) {
        (RunStatus::Completed, Ok(new)) => {
            let recorded = fixture.output.clone().unwrap_or_default();
            if same_json(&recorded, &new) {
                ReplayVerdict::Consistent {
                    calls,
                    output: Some(new),
                }
            } else {
                ReplayVerdict::OutputDiffers { recorded, new }
            }
        }
        (RunStatus::Failed, Err(new)) if fixture.error.as_deref() == Some(new.as_str()) => {
            ReplayVerdict::Consistent {
                calls,
                output: None,
            }
        }
        (RunStatus::Completed | RunStatus::Failed, new) => ReplayVerdict::EndDiffers {
            recorded: fixture
                .output
                .clone()
                .or_else(|| fixture.error.clone())
                .unwrap_or_default(),
            new: new.unwrap_or_else(|e| e),
        },
        // The recording stops before the end (interrupted or parked run):
        // every recorded call matched.
        (_, Ok(output)) => ReplayVerdict::Consistent {
            calls,
            output: Some(output),
        },
        (_, Err(error)) => ReplayVerdict::StepFailed { error },
    }
}

fn same_json(a: &str, b: &str) -> bool {
    match (
        serde_json::from_str::<serde_json::Value>(a),
        serde_json::from_str::<serde_json::Value>(b),
    ) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

/// A portable copy of run `run_id`: module digest, input, calls, output.
pub fn export(
    store: &dyn stephost_core::Views,
    run_id: &str,
) -> Result<Fixture, crate::error::HostError> {
    let run = store.run(run_id)?;
    let calls = store.calls(run_id, 1, usize::MAX)?;
    Ok(Fixture::new(&run, calls))
}
