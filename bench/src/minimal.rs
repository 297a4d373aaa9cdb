//! The part of a host's work that a write cannot go without, as the
//! models of a minimal host do it (`alone.rs`, `tasks.rs`): the operation
//! id, the request hash and the chain link, with the ledger's own
//! functions.

use stephost::ids::{self, RequestHasher};
use stephost::ledger::chain;
use stephost::ledger::{CallClass, CallRecord, CallState};
use wasmtime::component::Component;
use wasmtime::{Config, Engine};

/// The interface of the effects a model's guest calls, and its instance's
/// name in the guest's imports.
pub const INTERFACE: &str = "stephost:step/effects";
pub const EFFECTS: &str = "stephost:step/effects@0.1.0";

/// An engine as the models run the guest in (fuel on, as the host's), and
/// the guest (a component's bytes) compiled in it.
pub fn compile(guest: &[u8]) -> wasmtime::Result<(Engine, Component)> {
    let mut config = Config::new();
    config.consume_fuel(true);
    config.wasm_component_model(true);
    let engine = Engine::new(&config)?;
    let component = Component::new(&engine, guest)?;
    Ok((engine, component))
}

/// One run's calls: their numbers, hashes and chain.
pub struct Calls {
    run_id: String,
    seq: u64,
    chain: String,
    /// The request hasher of the function called last.
    hasher: Option<(String, RequestHasher)>,
}

impl Calls {
    pub fn new(run_id: String) -> Self {
        Calls {
            run_id,
            seq: 0,
            chain: String::new(),
            hasher: None,
        }
    }

    /// The run's next call, of `name` with `request`, started at `at_ms`:
    /// its operation id and request hash computed.
    pub fn start(
        &mut self,
        name: &str,
        request: String,
        key: Option<&str>,
        at_ms: i64,
    ) -> CallRecord {
        self.seq += 1;
        let mut operation_id = String::with_capacity(64);
        ids::operation_id_into(&mut operation_id, &self.run_id, name, self.seq, key);
        if self
            .hasher
            .as_ref()
            .is_none_or(|(for_name, _)| for_name != name)
        {
            self.hasher = Some((name.to_string(), RequestHasher::new(INTERFACE, name)));
        }
        let mut request_hash = String::with_capacity(64);
        if let Some((_, hasher)) = &self.hasher {
            hasher.hash_into(&mut request_hash, &request);
        }
        CallRecord {
            seq: self.seq,
            class: CallClass::Write,
            interface: INTERFACE.to_string(),
            function: name.to_string(),
            operation_id,
            request,
            request_hash,
            state: CallState::Started,
            outcome: None,
            started_at_ms: at_ms,
            finished_at_ms: None,
            resolved_by: None,
            chain: None,
        }
    }

    /// The chain link of `call` succeeded with `outcome`, which the run's
    /// chain now ends with.
    pub fn link(&mut self, call: &CallRecord, outcome: &str) -> String {
        let mut link = String::with_capacity(64);
        chain::link_finished_into(
            &mut link,
            &self.chain,
            call,
            CallState::Succeeded,
            Some(outcome),
        );
        self.chain.clone_from(&link);
        link
    }
}

/// Call `seq` as a model's row holds it (its columns `function`,
/// `operation_id`, `request`, `request_hash`, `outcome` and `chain`), in
/// `state`: for the models' tests.
#[cfg(test)]
pub fn call_from_row(
    r: &rusqlite::Row<'_>,
    seq: u64,
    state: CallState,
) -> rusqlite::Result<CallRecord> {
    Ok(CallRecord {
        seq,
        class: CallClass::Write,
        interface: INTERFACE.to_string(),
        function: r.get("function")?,
        operation_id: r.get("operation_id")?,
        request: r.get("request")?,
        request_hash: r.get("request_hash")?,
        state,
        outcome: r.get("outcome")?,
        started_at_ms: 0,
        finished_at_ms: None,
        resolved_by: None,
        chain: r.get("chain")?,
    })
}
