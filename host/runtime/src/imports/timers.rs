//! `stephost:step/timers`: durable sleeps.
//!
//! The call is recorded as `started` with its request `{"ms": N}`; its wake
//! time is the recorded start plus N, so a restart or a clock jump neither
//! loses nor repeats the wake-up. Short remainders are slept in place; longer
//! ones release the run until a worker wakes it when due. Replay returns the
//! recorded outcome at once.

use crate::bindings::stephost::step::timers::Host;
use crate::imports::{StepState, lock, trap};
use std::sync::Mutex;
use stephost_core::CallClass;

use stephost_core::journal::{
    Attempts, CallSpec, Journal, LiveCall, OpContext, Outcome, Performed, Stop, Wait,
};

pub const INTERFACE: &str = "stephost:step/timers";

/// Remainders up to this long are slept in place instead of releasing the run.
pub const SLEEP_IN_PLACE_MS_MAX: i64 = 2_000;

struct Sleep {
    ms: u64,
}

impl LiveCall for Sleep {
    fn perform(&mut self, _op: &OpContext<'_>, _attempts: &mut Attempts<'_>) -> Performed {
        Outcome::Ok(serde_json::Value::Null).into()
    }

    fn wait(&mut self, _op: &OpContext<'_>, started_at_ms: i64) -> Wait {
        let wake_at = started_at_ms.saturating_add(i64::try_from(self.ms).unwrap_or(i64::MAX));
        let remaining = wake_at - stephost_core::clock::now_ms();
        if remaining <= 0 {
            return Wait::Ready(Outcome::Ok(serde_json::Value::Null));
        }
        if remaining <= SLEEP_IN_PLACE_MS_MAX {
            std::thread::sleep(std::time::Duration::from_millis(remaining as u64));
            return Wait::Ready(Outcome::Ok(serde_json::Value::Null));
        }
        Wait::Until {
            wake_at_ms: Some(wake_at),
            reason: format!(
                "sleeping until {}",
                stephost_core::clock::format_time(wake_at)
            ),
        }
    }
}

/// Records a durable sleep of `ms` as call `interface` `function` and
/// waits it out: in place when short, else the run leaves memory until a
/// worker wakes it when due. A replay returns at once.
pub fn durable_sleep(
    journal: &Mutex<Journal>,
    interface: &str,
    function: &str,
    ms: u64,
) -> Result<(), Stop> {
    let request = serde_json::json!({ "ms": ms }).to_string();
    let spec = CallSpec {
        class: CallClass::Suspend,
        interface,
        function,
        request: &request,
        key: None,
        paid: false,
        redact: None,
    };
    // Durable, and it may sleep in place: as a task, the thread's other
    // runs go on meanwhile.
    stephost_effects::blocking(|| lock(journal).call(&spec, &mut Sleep { ms })).map(|_| ())
}

/// A WASI wait of `nanos` (a clock subscription, a `poll_oneoff`) as a
/// durable sleep recorded as call `function`; a wait of zero is none, and
/// is not recorded.
pub fn durable_wait(journal: &Mutex<Journal>, function: &str, nanos: u64) -> wasmtime::Result<()> {
    if nanos == 0 {
        return Ok(());
    }
    let ms = nanos.div_ceil(1_000_000);
    durable_sleep(journal, crate::imports::wasi::WAIT_INTERFACE, function, ms).map_err(trap)
}

impl Host for StepState {
    fn sleep(&mut self, ms: u64) -> wasmtime::Result<()> {
        durable_sleep(&self.journal, INTERFACE, "sleep", ms).map_err(trap)
    }
}
