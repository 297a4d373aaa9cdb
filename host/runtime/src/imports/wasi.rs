//! WASI clocks and randomness, routed through the ledger so that
//! `SystemTime::now()`, `Instant::now()` and `getrandom` inside a guest are
//! recorded and replay exactly. These WASI functions cannot trap, so a stop
//! (ledger failure, divergence) is kept in the journal, a neutral value is
//! returned, and the run ends with the stop at its next import or its end.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use wasmtime::component::{Linker, Resource};

use crate::imports::random::recorded_random;
use crate::imports::{StepState, as_u64, lock, observe};
use stephost_core::journal::{Journal, Stop};

/// The WASI random interfaces as this build's wasmtime-wasi links them
/// (guests importing older 0.2 versions are matched to them by semver).
const RANDOM: &str = "wasi:random/random@0.2.12";
const MONOTONIC_CLOCK: &str = "wasi:clocks/monotonic-clock@0.2.12";
/// What a WASI wait is recorded as.
pub const WAIT_INTERFACE: &str = "wasi:clocks/monotonic-clock";
const INSECURE: &str = "wasi:random/insecure@0.2.12";

/// Replaces WASI's `get-random-bytes` and `get-insecure-random-bytes` with
/// versions that record one ledger call per guest call. (wasmtime-wasi draws
/// each byte from the context's generator separately, which would record a
/// call per byte: a language runtime seeding itself with 2,500 bytes at
/// start-up would write 2,500 rows.)
pub fn record_random_bytes_per_call(linker: &mut Linker<StepState>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    for (instance, function, interface) in [
        (RANDOM, "get-random-bytes", "wasi:random/random"),
        (
            INSECURE,
            "get-insecure-random-bytes",
            "wasi:random/insecure",
        ),
    ] {
        linker.instance(instance)?.func_wrap(
            function,
            move |store: wasmtime::StoreContextMut<'_, StepState>, (len,): (u64,)| {
                let state = store.data();
                recorded_random(&state.journal, interface, len)
                    .map(|bytes| (bytes,))
                    .map_err(|s| state.fail(s))
            },
        )?;
    }
    linker.allow_shadowing(false);
    Ok(())
}

/// Replaces WASI's `subscribe-duration` and `subscribe-instant` (the waits
/// behind `std::thread::sleep`, a runtime's timers and `poll` timeouts) with
/// durable sleeps recorded in the journal, like `timers.sleep`: a short wait
/// is slept and recorded, a long one releases the run until it is due, and a
/// replay returns at once. The pollable handed back is ready: the wait is
/// over by then. A wait of zero is not a wait, and is not recorded.
pub fn record_waits(linker: &mut Linker<StepState>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let mut clock = linker.instance(MONOTONIC_CLOCK)?;
    clock.func_wrap(
        "subscribe-duration",
        |mut store: wasmtime::StoreContextMut<'_, StepState>, (nanos,): (u64,)| {
            wait(store.data_mut(), "subscribe-duration", nanos).map(|p| (p,))
        },
    )?;
    clock.func_wrap(
        "subscribe-instant",
        |mut store: wasmtime::StoreContextMut<'_, StepState>, (when,): (u64,)| {
            let state = store.data_mut();
            let now = wasmtime_wasi::HostMonotonicClock::now(&state.monotonic);
            let nanos = when.saturating_sub(now);
            wait(state, "subscribe-instant", nanos).map(|p| (p,))
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

/// A pollable that is ready at once.
struct Ready;

#[async_trait::async_trait]
impl wasmtime_wasi::p2::Pollable for Ready {
    async fn ready(&mut self) {}
}

fn wait(
    state: &mut StepState,
    function: &str,
    nanos: u64,
) -> wasmtime::Result<Resource<wasmtime_wasi::p2::DynPollable>> {
    crate::imports::timers::durable_wait(&state.journal, function, nanos)?;
    let ready = state.table.push(Ready)?;
    wasmtime_wasi::p2::subscribe(&mut state.table, ready)
}

fn keep<T>(journal: &Mutex<Journal>, result: Result<T, Stop>, neutral: T) -> T {
    result.unwrap_or_else(|stop| {
        lock(journal).set_stop(stop);
        neutral
    })
}

/// `wasi:clocks/wall-clock`, recorded.
pub struct RecordedWallClock(pub Arc<Mutex<Journal>>);

impl wasmtime_wasi::HostWallClock for RecordedWallClock {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(1)
    }

    fn now(&self) -> Duration {
        let nanos = observe(&self.0, "wasi:clocks/wall-clock", "now", "", || {
            stephost_core::clock::now_ns().into()
        })
        .and_then(|v| as_u64(&v, "wall-clock.now"));
        Duration::from_nanos(keep(&self.0, nanos, 0))
    }
}

/// `wasi:clocks/monotonic-clock`, recorded. Live readings continue from
/// the last recorded one instead of going backwards: an execution replays
/// every recorded call before it makes a live one, so the last reading it
/// replayed is the last one recorded.
#[derive(Clone)]
pub struct RecordedMonotonicClock(Arc<MonotonicState>);

pub struct MonotonicState {
    journal: Arc<Mutex<Journal>>,
    origin: std::time::Instant,
    /// The last reading replayed so far.
    replayed: std::sync::atomic::AtomicU64,
    /// Where live readings start: the last replayed one, fixed at the
    /// first live reading.
    base: std::sync::OnceLock<u64>,
}

impl RecordedMonotonicClock {
    pub fn new(journal: Arc<Mutex<Journal>>) -> Self {
        RecordedMonotonicClock(Arc::new(MonotonicState {
            journal,
            origin: std::time::Instant::now(),
            replayed: 0.into(),
            base: std::sync::OnceLock::new(),
        }))
    }
}

impl wasmtime_wasi::HostMonotonicClock for RecordedMonotonicClock {
    fn resolution(&self) -> u64 {
        1
    }

    fn now(&self) -> u64 {
        use std::sync::atomic::Ordering::Relaxed;
        let clock = &self.0;
        let nanos = observe(
            &clock.journal,
            "wasi:clocks/monotonic-clock",
            "now",
            "",
            || {
                let base = *clock.base.get_or_init(|| clock.replayed.load(Relaxed));
                (base + clock.origin.elapsed().as_nanos() as u64).into()
            },
        )
        .and_then(|v| as_u64(&v, "monotonic-clock.now"));
        let nanos = keep(&clock.journal, nanos, 0);
        if clock.base.get().is_none() {
            clock.replayed.store(nanos, Relaxed);
        }
        nanos
    }
}

/// `wasi:random/random` or `wasi:random/insecure`, recorded.
pub struct RecordedRng {
    pub journal: Arc<Mutex<Journal>>,
    pub interface: &'static str,
}

impl RecordedRng {
    fn bytes(&self, len: usize) -> Vec<u8> {
        let result = recorded_random(&self.journal, self.interface, len as u64);
        keep(&self.journal, result, vec![0; len])
    }
}

impl rand_core::TryRng for RecordedRng {
    type Error = Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        let b = self.bytes(4);
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        let b = self.bytes(8);
        let mut a = [0u8; 8];
        a.copy_from_slice(&b);
        Ok(u64::from_le_bytes(a))
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        let b = self.bytes(dst.len());
        dst.copy_from_slice(&b);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stephost_core::journal::Mode;
    use stephost_core::lifecycle::{self, ClaimMode};
    use stephost_core::memory::MemoryPool;
    use stephost_core::{CallClass, CallRecord, CallState, History, NewRun, Pool};
    use wasmtime_wasi::HostMonotonicClock;

    #[test]
    fn live_monotonic_readings_go_on_from_the_last_replayed_one() {
        let pool = MemoryPool::new();
        let store = pool.store().unwrap();
        let run = NewRun {
            run_id: "r",
            module_digest: "d",
            step: None,
            world: crate::bindings::WORLD,
            input: "{}",
            now_ms: 1,
            budget: Default::default(),
        };
        store.insert_run(&run.record(None)).unwrap();
        let claim = lifecycle::claim(
            store.as_ref(),
            "r",
            "me",
            60_000,
            2,
            ClaimMode::Any,
            &|_| true,
        )
        .unwrap();
        // The previous execution's reading, far ahead of this process's clock.
        const RECORDED: u64 = 1 << 60;
        let recorded = CallRecord {
            seq: 1,
            class: CallClass::Observe,
            interface: "wasi:clocks/monotonic-clock".into(),
            function: "now".into(),
            operation_id: "op1".into(),
            request: String::new(),
            request_hash: "h".into(),
            state: CallState::Succeeded,
            outcome: Some(format!("{{\"ok\":{RECORDED}}}")),
            started_at_ms: 1,
            finished_at_ms: Some(1),
            fence: 1,
            resolved_by: None,
            chain: Some("c1".into()),
        };
        let journal = Journal::new(
            "r",
            Mode::Live {
                writer: pool.writer().unwrap(),
                claim,
            },
            History::loaded("r", vec![recorded]),
            &[],
            stephost_core::Limits::default(),
        );
        let clock = RecordedMonotonicClock::new(Arc::new(Mutex::new(journal)));
        assert_eq!(clock.now(), RECORDED, "the first reading is replayed");
        let first_live = clock.now();
        let second_live = clock.now();
        assert!(
            (RECORDED..RECORDED + 60_000_000_000).contains(&first_live),
            "{first_live}"
        );
        assert!(second_live >= first_live, "{second_live} < {first_live}");
        assert!(
            second_live - first_live < 60_000_000_000,
            "the base was counted twice: {first_live} then {second_live}"
        );
        assert!(lock(&clock.0.journal).stop().is_none());
    }
}
