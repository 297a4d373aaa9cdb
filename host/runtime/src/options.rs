//! How a host runs steps.

use std::sync::Arc;

use stephost_core::{Limits, LogRecord};

use crate::effects::Effects;
use crate::engine::InstancePool;

/// Receives each log line of a run: the run, the line, whether it is a
/// replay of a line already written.
pub type RunLogSink = Arc<dyn Fn(&RunOfLine<'_>, &LogRecord, bool) + Send + Sync>;

/// The run a step's log line is of.
#[derive(Debug, Clone, Copy)]
pub struct RunOfLine<'a> {
    pub run_id: &'a str,
    /// The trace the run reports into (32 hex digits).
    pub trace_id: &'a str,
}

/// Where what a live model call is doing goes while it does it: its answer
/// so far as it streams in (at most a few times a second), or what it waits
/// for before it is sent. Nothing of it is recorded.
#[derive(Clone)]
pub struct StreamSink(pub Arc<StreamFn>);

/// What a model call is doing.
#[derive(Debug, Clone, Copy)]
pub enum ModelProgress<'a> {
    /// Its answer so far.
    Text(&'a str),
    /// Why it is not sent yet.
    Waiting(&'a str),
}

/// A stream sink's function: run id, sequence number, progress.
pub type StreamFn = dyn Fn(&str, u64, ModelProgress<'_>) + Send + Sync;

impl std::fmt::Debug for StreamSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StreamSink(..)")
    }
}

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

/// What live calls use besides their effect.
#[derive(Clone, Default)]
pub struct Services {
    /// Where models' answers go while they stream in, and what a model call
    /// waits for (`stephost serve`'s event stream).
    pub stream_sink: Option<StreamSink>,
    /// Models' flow state, shared by every process on the ledger (filled
    /// in from the ledger's pool by [`crate::runner::Host`]).
    pub flows: Option<Arc<dyn stephost_core::flow::Flows>>,
}

impl Services {
    /// None of them.
    pub const NONE: Services = Services {
        stream_sink: None,
        flows: None,
    };
}

impl std::fmt::Debug for Services {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Services")
            .field("stream_sink", &self.stream_sink.is_some())
            .field("flows", &self.flows.is_some())
            .finish()
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
        }
    }
}
