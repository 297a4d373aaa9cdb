//! Portable recorded runs (fixtures) and replay reports.

use serde::{Deserialize, Serialize};

use crate::journal::Divergence;
use crate::ledger::{CallRecord, RunRecord, RunStatus};

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
            calls,
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
