//! One execution's instance: a store with the run's limits, WASI wired to
//! the journal (clocks and randomness recorded, no network, no files), and
//! the call of the step's `run` (or a WASI command's `wasi:cli/run`).

use std::sync::{Arc, Mutex};

use stephost_core::Limits;
use stephost_core::journal::Journal;
use wasmtime::component::{InstancePre as ComponentPre, ResourceTable};
use wasmtime::{Store, Trap};

use crate::limiter::RunLimiter;
use wasmtime_wasi::WasiCtxBuilder;

use crate::imports::stdio::{Budget, GuestOutput};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;

use crate::command::{self, Preview1State};
use crate::engine::{Entry, Loaded, StepEngine};
use crate::error::HostError;
use crate::imports::wasi::{RecordedMonotonicClock, RecordedRng, RecordedWallClock};
use crate::imports::{StepState, lock};
use crate::options::HostOptions;

/// What a step returned (its output or error message), or the trap that
/// ended it.
pub type GuestResult = Result<Result<String, String>, wasmtime::Error>;

/// Fuel a step run as a task burns between yields to the runtime's other
/// runs: one that computes for long does not hold its thread.
const TASK_YIELD_FUEL: u64 = 10_000_000;

/// [`invoke`] of a step as a task (see
/// [`crate::runner::Host::execute_claimed_task`]).
pub async fn invoke_task(
    engine: &StepEngine,
    pre: &ComponentPre<StepState>,
    journal: &Arc<Mutex<Journal>>,
    input: &str,
    options: &HostOptions,
) -> GuestResult {
    let mut store = new_store(engine, journal, wasi_builder(journal, options), options)?;
    store.fuel_async_yield_interval(Some(TASK_YIELD_FUEL))?;
    let instance = pre.instantiate_async(&mut store).await?;
    let run = instance.get_typed_func::<(&str,), (Result<String, String>,)>(&mut store, "run")?;
    let (result,) = run.call_async(&mut store, (input,)).await?;
    Ok(result)
}

/// Instantiates the step in a fresh store and calls `run` (a step) or
/// `wasi:cli/run` (a command, whose exit status comes back too).
pub fn invoke(
    engine: &StepEngine,
    loaded: &Loaded,
    journal: &Arc<Mutex<Journal>>,
    input: &str,
    options: &HostOptions,
) -> (GuestResult, Option<i32>) {
    match &loaded.entry {
        Entry::Step { pre, .. } => {
            let result = new_store(engine, journal, wasi_builder(journal, options), options)
                .and_then(|mut store| {
                    let instance = pre.instantiate(&mut store)?;
                    let run = instance
                        .get_typed_func::<(&str,), (Result<String, String>,)>(&mut store, "run")?;
                    let (result,) = run.call(&mut store, (input,))?;
                    Ok(result)
                });
            (result, None)
        }
        Entry::Command(pre) => {
            let (mut wasi, monotonic) = wasi_builder(journal, options);
            let stdout = command::wire_stdio(&mut wasi, input, options.limits.payload_bytes_max);
            let ran = new_store(engine, journal, (wasi, monotonic), options)
                .and_then(|mut store| command::run_component(pre, &mut store));
            command_end(ran, &stdout)
        }
        Entry::Preview1(pre) => {
            let (mut wasi, monotonic) = wasi_builder(journal, options);
            let stdout = command::wire_stdio(&mut wasi, input, options.limits.payload_bytes_max);
            let state = Preview1State {
                wasi: wasi.build_p1(),
                limits: store_limits(&options.limits),
                journal: journal.clone(),
                monotonic,
            };
            let mut store = Store::new(engine.engine(), state);
            store.limiter(|s| &mut s.limits);
            interrupt_on_tick(&mut store, |s: &Preview1State| s.journal.clone());
            let ran = store
                .set_fuel(options.limits.fuel_max)
                .and_then(|()| command::run_preview1(pre, &mut store));
            command_end(ran, &stdout)
        }
    }
}

/// A command's end: its result and exit status, or the trap that ended it.
fn command_end(
    ran: Result<i32, wasmtime::Error>,
    stdout: &MemoryOutputPipe,
) -> (GuestResult, Option<i32>) {
    match ran {
        Ok(code) => (Ok(command::result(code, &stdout.contents())), Some(code)),
        Err(trap) => (Err(trap), None),
    }
}

/// WASI for a run: clocks, randomness and printed output recorded in its
/// journal, no network.
fn wasi_builder(
    journal: &Arc<Mutex<Journal>>,
    options: &HostOptions,
) -> (WasiCtxBuilder, RecordedMonotonicClock) {
    let run_id = lock(journal).run_id().to_string();
    let limits = &options.limits;
    let mut wasi = WasiCtxBuilder::new();
    // Printed output is recorded in the run's log (and so printed once,
    // live, by the log sink), never sent to the host's terminal directly.
    let budget = Budget::new(limits.guest_output_bytes_max);
    let monotonic = RecordedMonotonicClock::new(journal.clone());
    wasi.stdout(GuestOutput::stdout(journal, &budget))
        .stderr(GuestOutput::stderr(journal, &budget));
    wasi.wall_clock(RecordedWallClock(journal.clone()))
        .monotonic_clock(monotonic.clone())
        .secure_random(RecordedRng {
            journal: journal.clone(),
            interface: "wasi:random/random",
        })
        .insecure_random(RecordedRng {
            journal: journal.clone(),
            interface: "wasi:random/insecure",
        })
        .insecure_random_seed(stephost_core::ids::insecure_seed(&run_id))
        .max_random_size(limits.payload_bytes_max)
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false);
    (wasi, monotonic)
}

/// A store for one execution, with the run's limits.
fn new_store(
    engine: &StepEngine,
    journal: &Arc<Mutex<Journal>>,
    (mut wasi, monotonic): (WasiCtxBuilder, RecordedMonotonicClock),
    options: &HostOptions,
) -> Result<Store<StepState>, wasmtime::Error> {
    let limits = &options.limits;
    let state = StepState {
        journal: journal.clone(),
        effects: options.effects.clone(),
        wasi: wasi.build(),
        table: ResourceTable::new(),
        limits: store_limits(limits),
        monotonic,
        sleep: std::thread::sleep,
        models_spent: Default::default(),
        last_chat: None,
        services: options.services.clone(),
        http: crate::imports::http::HttpState::new(&options.effects, journal, limits),
        runs: Default::default(),
        promises: Default::default(),
        signer: options.signer.clone(),
        children: options.children.clone(),
    };
    let mut store = Store::new(engine.engine(), state);
    store.limiter(|s| &mut s.limits);
    store.set_fuel(limits.fuel_max)?;
    interrupt_on_tick(&mut store, |s: &StepState| s.journal.clone());
    Ok(store)
}

/// Every epoch tick ([`crate::limiter::EPOCH_TICK_MS`]) while the step
/// computes, asks its journal whether the execution must stop (its worker
/// drains or lost the lease, or it ran past `wall_ms_max`), and traps it
/// with that stop if so: a step that never calls cannot hold a worker.
fn interrupt_on_tick<T: 'static>(
    store: &mut Store<T>,
    journal_of: impl Fn(&T) -> Arc<Mutex<Journal>> + Send + Sync + 'static,
) {
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(move |ctx| {
        let journal = journal_of(ctx.data());
        let stop = lock(&journal).interrupted();
        match stop {
            Some(stop) => Err(crate::imports::trap(stop)),
            None => Ok(wasmtime::UpdateDeadline::Continue(1)),
        }
    });
}

/// The memory and table limits of one execution.
fn store_limits(limits: &Limits) -> RunLimiter {
    RunLimiter::new(limits.memory_bytes_max)
}

/// A typed description of a trap: `kind: message`.
pub fn classify_trap(err: &wasmtime::Error, limits: &Limits) -> String {
    if let Some(trap) = err.downcast_ref::<Trap>() {
        return match trap {
            Trap::OutOfFuel => format!(
                "fuel_exhausted: the step executed more than fuel_max = {} instructions; \
                 raise [limits] fuel_max if it is meant to compute this long",
                limits.fuel_max
            ),
            Trap::UnreachableCodeReached => "trap: the guest executed `unreachable` \
                (a Rust step panicked or aborted; its message is on stderr)"
                .to_string(),
            other => format!("trap: {other}"),
        };
    }
    let text = format!("{err:#}");
    if text.contains("forcing trap when growing memory") {
        return format!(
            "memory_limit: the step tried to grow its memory past memory_bytes_max = {} bytes",
            limits.memory_bytes_max
        );
    }
    format!("trap: {text}")
}

/// Checks that `text` is JSON within the payload limit.
pub fn check_json(text: &str, what: &str, limits: &Limits) -> Result<(), HostError> {
    if text.len() as u64 > limits.payload_bytes_max {
        return Err(HostError::BadInput(format!(
            "{what} is {} bytes; payload_bytes_max is {}",
            text.len(),
            limits.payload_bytes_max
        )));
    }
    serde_json::from_str::<serde::de::IgnoredAny>(text)
        .map(|_| ())
        .map_err(|e| HostError::BadInput(format!("{what} is not valid JSON: {e}")))
}
