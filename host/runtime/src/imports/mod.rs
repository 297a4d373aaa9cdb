//! Host side of the step world: one module per WIT interface, plus the WASI
//! adapters that route the guest's clocks and randomness through the ledger.
//! Every function here goes through [`stephost_core::journal::Journal::call`].

pub mod approvals;
pub mod clock;
pub mod effects;
pub mod http;
pub mod llm;
pub mod log;
pub mod models;
pub mod policy;
pub mod promises;
pub mod random;
pub mod runs;
pub mod stdio;
pub mod timers;
pub mod types;
pub mod v0_2;
pub mod v0_3;
pub mod wasi;

use std::sync::{Arc, Mutex, MutexGuard};

use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use stephost_core::CallClass;
use stephost_core::journal::{CallSpec, Compute, Journal, Outcome, Stop};
use stephost_effects::Effects;

/// The data of a run's `wasmtime::Store`.
pub struct StepState {
    pub journal: Arc<Mutex<Journal>>,
    pub effects: Effects,
    pub wasi: WasiCtx,
    pub table: ResourceTable,
    pub limits: crate::limiter::RunLimiter,
    /// The clock WASI reads (shared with the WASI context), for waits
    /// given as an instant.
    pub monotonic: crate::imports::wasi::RecordedMonotonicClock,
    /// How the retry loop waits between attempts.
    pub sleep: fn(std::time::Duration),
    /// What the run's model calls have spent, as its budget counts it.
    pub models_spent: models::Spent,
    /// This execution's last chat call: the next one is recorded as what
    /// is new since it.
    pub last_chat: Option<models::LastChat>,
    /// What live calls use besides their effect.
    pub services: stephost_effects::Services,
    /// The step's own HTTP client's exchanges (`wasi:http`).
    pub http: http::HttpState,
    /// The children it started and joined (`runs`).
    pub runs: runs::RunsState,
    /// The promises it made (`promises`).
    pub promises: promises::PromisesState,
    /// The operator's key: promises' tokens are made under it.
    pub signer: stephost_core::chain::Signer,
    /// The steps it may start as children, and what starts and joins use.
    pub children: Option<Arc<runs::ChildSteps>>,
}

impl WasiView for StepState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// Locks a journal; a poisoned lock (a panic elsewhere) still yields it,
/// since every write it guards is transactional.
pub fn lock(journal: &Mutex<Journal>) -> MutexGuard<'_, Journal> {
    journal.lock().unwrap_or_else(|p| p.into_inner())
}

/// A stop turned into a trap of the guest.
pub fn trap(stop: Stop) -> wasmtime::Error {
    wasmtime::Error::new(stop)
}

impl StepState {
    /// A stop found by an import after its journal call (a recorded value
    /// of the wrong shape, a limit): kept in the journal so the run ends
    /// with it, and trapped.
    pub fn fail(&self, stop: Stop) -> wasmtime::Error {
        lock(&self.journal).set_stop(stop.clone());
        trap(stop)
    }
}

/// Records an observe call whose value `f` computes in-process.
pub fn observe(
    journal: &Mutex<Journal>,
    interface: &str,
    function: &str,
    request: &str,
    mut f: impl FnMut() -> serde_json::Value,
) -> Result<serde_json::Value, Stop> {
    let spec = CallSpec {
        class: CallClass::Observe,
        interface,
        function,
        request,
        key: None,
        paid: false,
        redact: None,
    };
    match lock(journal).call(&spec, &mut Compute(|| Outcome::Ok(f())))? {
        Outcome::Ok(value) => Ok(value),
        Outcome::Err(e) => Err(Stop::Corrupt(format!(
            "{interface} {function} has a recorded error ({}) where a value belongs",
            e.message
        ))),
    }
}

/// Reads a recorded u64 value.
pub fn as_u64(value: &serde_json::Value, what: &str) -> Result<u64, Stop> {
    value
        .as_u64()
        .ok_or_else(|| Stop::Corrupt(format!("recorded {what} is not a u64: {value}")))
}
