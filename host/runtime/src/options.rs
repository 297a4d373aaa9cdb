//! How a host runs steps.

use std::sync::Arc;

use stephost_core::{Limits, LogRecord};

use crate::engine::InstancePool;
pub use crate::logs::RunOfLine;
use stephost_effects::Effects;
use stephost_effects::Services;

/// Receives each log line of a run: the run, the line, whether it is a
/// replay of a line already written.
pub type RunLogSink = Arc<dyn Fn(&RunOfLine<'_>, &LogRecord, bool) + Send + Sync>;

/// How a host runs steps. A clone shares the effects (and so the
/// connections to MCP servers) and models of the original.
#[derive(Clone)]
pub struct HostOptions {
    pub limits: Limits,
    pub effects: Effects,
    /// How long a claim lasts without a renewal, in milliseconds.
    pub lease_ms: i64,
    /// Who claims runs (see [`crate::owner`]).
    pub owner: String,
    /// Where the step's log lines go besides the ledger.
    pub log_sink: Option<RunLogSink>,
    /// Where compiled components are kept between processes (`None`: only
    /// in memory).
    pub cache_dir: Option<std::path::PathBuf>,
    /// Instances to keep in a pool for reuse (see [`InstancePool`]); 0
    /// allocates each run's instance on its own, which suits a process that
    /// executes one run.
    pub instance_pool: u32,
    /// Signs chain links and run seals (plain SHA-256 without a key).
    pub signer: stephost_core::chain::Signer,
    /// What live calls use besides their effect: where models' answers go
    /// while they stream in, the ledger's shared flow state.
    pub services: Services,
    /// Where runs' spans are exported (`None`: nowhere, at no cost).
    pub telemetry: Option<Arc<crate::telemetry::Telemetry>>,
    /// The steps runs may start as children, by name (`[steps.NAME]`):
    /// their module files.
    pub steps: std::collections::BTreeMap<String, std::path::PathBuf>,
    /// What starts and joins children use (set by the host from `steps`).
    pub children: Option<Arc<crate::imports::runs::ChildSteps>>,
}

/// What a new run is given besides its module and input.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Its own model budget (each bound it sets replaces `[limits]`'s).
    pub budget: stephost_core::RunBudget,
    /// The caller's trace it continues (from a `traceparent`); else it
    /// starts a trace of its own.
    pub trace: Option<stephost_core::RunTrace>,
}

/// Most whole inputs a process holds at once; past it, the oldest run's
/// executions get its input as the ledger keeps it.
pub const HELD_INPUTS_MAX: usize = 4096;

/// The whole inputs of runs this process accepted whose ledger copy has
/// values redacted (`[redact."input"]`), held in memory only, by run id,
/// oldest first out: what their executions in this process are given
/// (any other execution gets the input as the ledger keeps it).
#[derive(Debug, Default)]
pub struct HeldInputs(std::sync::Mutex<std::collections::VecDeque<(String, String)>>);

/// This process's held inputs.
pub fn held_inputs() -> &'static HeldInputs {
    static HELD: std::sync::OnceLock<HeldInputs> = std::sync::OnceLock::new();
    HELD.get_or_init(HeldInputs::default)
}

impl HeldInputs {
    pub fn hold(&self, run_id: &str, input: &str) {
        let mut held = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        held.retain(|(id, _)| id != run_id);
        if held.len() >= HELD_INPUTS_MAX {
            held.pop_front();
        }
        held.push_back((run_id.to_string(), input.to_string()));
    }

    pub fn get(&self, run_id: &str) -> Option<String> {
        let held = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        held.iter()
            .find(|(id, _)| id == run_id)
            .map(|(_, input)| input.clone())
    }

    pub fn release(&self, run_id: &str) {
        let mut held = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        held.retain(|(id, _)| id != run_id);
    }
}

impl HostOptions {
    /// The instance pool these options ask for, if any.
    pub fn instance_pool(&self) -> Option<InstancePool> {
        InstancePool::for_limits(self.instance_pool, &self.limits)
    }
}

impl Default for HostOptions {
    fn default() -> Self {
        HostOptions {
            limits: Limits::default(),
            effects: Effects::default(),
            lease_ms: 60_000,
            owner: crate::owner::this_process(),
            log_sink: None,
            cache_dir: None,
            instance_pool: 0,
            signer: stephost_core::chain::Signer::plain(),
            services: Services::default(),
            telemetry: None,
            steps: Default::default(),
            children: None,
        }
    }
}
