//! Limits on what one run may consume. Each is a named field with its unit
//! last; `[limits]` in `stephost.toml` overrides the defaults.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Memory a run's memories and tables may hold together, in bytes.
    pub memory_bytes_max: u64,
    /// How long one execution may take, computing and waiting in calls
    /// alike, in milliseconds.
    pub wall_ms_max: u64,
    /// Wasm instructions (roughly) a run may execute, across resumes.
    /// 10 billion is about 5 to 10 seconds of guest compute.
    pub fuel_max: u64,
    /// Largest input, output, effect request or response, in bytes.
    pub payload_bytes_max: u64,
    /// Most import calls one run may make.
    pub calls_max: u64,
    /// Most bytes a step may print (stdout and stderr together) in one
    /// execution; they are recorded in its log, and the rest is dropped.
    pub guest_output_bytes_max: u64,
    /// Bytes a run may record in its calls (requests and outcomes) and log
    /// lines, across resumes.
    pub recorded_bytes_max: u64,
    /// Longest effect name a step may call, in bytes.
    pub effect_name_bytes_max: u64,
    /// Longest approval subject, in bytes.
    pub approval_subject_bytes_max: u64,
    /// Most log lines a run may write, across resumes.
    pub log_lines_max: u64,
    /// Most bytes of log lines a run may write, across resumes.
    pub log_bytes_max: u64,
    /// Longest error message a step may end with, in bytes; the rest is
    /// cut (its size is kept).
    pub error_bytes_max: u64,
    /// Model tokens (input and output) a run may spend, across resumes. A
    /// model call is sent only if what the run has spent plus the call's
    /// input (estimated from its size) and `max_tokens` stays within it;
    /// otherwise it answers `budget`. What a call spent is the provider's
    /// usage, estimated where the provider reported none, plus what its
    /// failed attempts may have cost (a stream cut after it began).
    pub model_tokens_max: u64,
    /// What a run's model calls may cost, in millionths of a US dollar
    /// (from each model's price table), across resumes; checked as
    /// `model_tokens_max` is, a call's worst case (its input and
    /// `max_tokens`) priced at its model's output price.
    pub model_cost_micro_usd_max: u64,
    /// What a model call that would take the run past its budget does:
    /// `refuse` (the step gets `budget`) or `park` (the run is parked, the
    /// call not recorded, for a person to raise the budget and resume it).
    pub model_budget_exceeded: OverBudget,
    /// Most outgoing HTTP bodies a step's own client (wasi:http) may hold
    /// open at once, granted or not: each buffers what the step writes
    /// (two 64 KiB chunks, then up to `payload_bytes_max` once its request
    /// is sent) in the host's memory, outside `memory_bytes_max`.
    pub http_bodies_open_max: u64,
    /// Most child runs one run may start (`runs.start`), across resumes;
    /// past it, a start answers `budget` and starts nothing.
    pub children_per_run_max: u64,
    /// Deepest a tree of runs may grow: a root is at depth 0, its children
    /// at 1. A start that would make a run deeper answers `budget`.
    pub child_depth_max: u64,
    /// Most children one run may have started and not joined yet; past
    /// it, a start answers `budget` (join one first).
    pub children_pending_max: u64,
    /// Most runs a tree may hold, its root with them; a start that would
    /// pass it answers `budget`. Counted as the start is made: runs of the
    /// tree started at that moment by other processes may pass it by as
    /// many.
    pub runs_per_tree_max: u64,
}

/// What a model call over its run's budget does (`[limits]
/// model_budget_exceeded`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OverBudget {
    /// The call is not sent; the step gets `budget`, recorded.
    #[default]
    Refuse,
    /// The call is not sent nor recorded; the run is parked until a person
    /// raises the budget and resumes it.
    Park,
}

/// A run's own model budget, given when it is submitted (or raised for a
/// run parked over it): each bound it sets replaces `[limits]`'s for that
/// run; a bound it leaves out is `[limits]`'s.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunBudget {
    /// Replaces `model_tokens_max`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_tokens_max: Option<u64>,
    /// Replaces `model_cost_micro_usd_max`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_cost_micro_usd_max: Option<u64>,
}

impl RunBudget {
    /// Sets no bound.
    pub fn is_empty(&self) -> bool {
        *self == RunBudget::default()
    }

    /// `limits` with this budget's bounds in place of theirs.
    pub fn applied_to(&self, limits: &Limits) -> Limits {
        Limits {
            model_tokens_max: self.model_tokens_max.unwrap_or(limits.model_tokens_max),
            model_cost_micro_usd_max: self
                .model_cost_micro_usd_max
                .unwrap_or(limits.model_cost_micro_usd_max),
            ..limits.clone()
        }
    }

    /// This budget with `raised`'s bounds where it sets them.
    pub fn with(&self, raised: &RunBudget) -> RunBudget {
        RunBudget {
            model_tokens_max: raised.model_tokens_max.or(self.model_tokens_max),
            model_cost_micro_usd_max: raised
                .model_cost_micro_usd_max
                .or(self.model_cost_micro_usd_max),
        }
    }

    /// As kept in a run's row (JSON), `None` when it sets no bound.
    pub fn to_column(&self) -> Option<String> {
        (!self.is_empty()).then(|| serde_json::to_string(self).expect("a budget serializes"))
    }

    /// A budget kept by [`RunBudget::to_column`].
    pub fn from_column(text: Option<&str>) -> Result<RunBudget, String> {
        text.map_or(Ok(RunBudget::default()), |t| {
            serde_json::from_str(t).map_err(|e| format!("a run's budget {t:?} is unreadable: {e}"))
        })
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_bytes_max: 256 * 1024 * 1024,
            wall_ms_max: 3_600_000,
            fuel_max: 10_000_000_000,
            payload_bytes_max: 1024 * 1024,
            calls_max: 100_000,
            guest_output_bytes_max: 64 * 1024,
            recorded_bytes_max: 64 * 1024 * 1024,
            effect_name_bytes_max: 256,
            approval_subject_bytes_max: 1024,
            log_lines_max: 10_000,
            log_bytes_max: 1024 * 1024,
            error_bytes_max: 64 * 1024,
            model_tokens_max: 10_000_000,
            model_cost_micro_usd_max: 100_000_000,
            model_budget_exceeded: OverBudget::Refuse,
            http_bodies_open_max: 16,
            children_per_run_max: 1_000,
            child_depth_max: 8,
            children_pending_max: 1_000,
            runs_per_tree_max: 10_000,
        }
    }
}
