//! Flow control of a model's calls. Calls in flight at once
//! (`concurrency_max`) are bounded per process. Requests and tokens a
//! minute (`requests_per_minute`, `tokens_per_minute`) and a pause the
//! provider asks for (a 429's `retry-after`, or rate-limit headers saying
//! nothing is left until a reset) follow the rule of
//! [`stephost_core::flow`], kept by the ledger ([`Flows`]) so that every
//! process on it shares them: a pause one worker is told to take holds
//! back every worker's calls of the model.
//!
//! A call is admitted before it is sent, with the tokens it may spend (its
//! input, about four bytes a token, and its `max_tokens`); when its answer
//! comes, the tokens it did spend are settled. A call waiting for capacity
//! waits in its thread; it is not a failure.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use stephost_core::flow::{FlowCaps, FlowOp, FlowState, Flows};

/// A model's limits (none set: no flow control but a provider's pause).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct FlowLimits {
    pub concurrency_max: Option<usize>,
    pub caps: FlowCaps,
}

/// Longest single wait before the shared state is looked at again, so a
/// pause lifted or a bucket refilled by a settle is seen.
const RECHECK: Duration = Duration::from_secs(1);

/// The flow of one model in this process.
pub struct Flow {
    key: String,
    limits: FlowLimits,
    in_flight: Mutex<usize>,
    freed: Condvar,
    /// The state when there is no ledger to keep it (a host without one).
    local: Mutex<Option<FlowState>>,
}

impl Flow {
    /// The flow of the model `key` (alias, URL, provider model) with
    /// `limits` in this process: however many times the configuration is
    /// loaded (each worker task, each host), its runs share it.
    pub fn shared(key: &str, limits: FlowLimits) -> Arc<Flow> {
        static SHARED: OnceLock<Mutex<HashMap<String, Arc<Flow>>>> = OnceLock::new();
        let mut shared = SHARED
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        shared
            .entry(format!("{key}\n{limits:?}"))
            .or_insert_with(|| {
                Arc::new(Flow {
                    key: key.to_string(),
                    limits,
                    in_flight: Mutex::new(0),
                    freed: Condvar::new(),
                    local: Mutex::new(None),
                })
            })
            .clone()
    }

    /// Applies `op` to the model's state: the ledger's if there is one,
    /// else this process's. A ledger that cannot be reached holds nothing
    /// back (the call goes on; the provider's own limits still hold).
    fn apply(&self, flows: Option<&dyn Flows>, op: FlowOp) -> Result<(), i64> {
        let caps = self.limits.caps;
        match flows {
            Some(flows) => flows.flow(&self.key, caps, op).unwrap_or_else(|e| {
                eprintln!("stephost: model flow state of {} not kept: {e}", self.key);
                Ok(())
            }),
            None => {
                let now_ms = stephost_core::clock::now_ms();
                let mut local = self.local.lock().unwrap_or_else(PoisonError::into_inner);
                local
                    .get_or_insert_with(|| FlowState::full(&caps, now_ms))
                    .apply(&caps, op, now_ms)
            }
        }
    }

    /// Waits until a call that may spend `tokens` can be sent; `waiting` is
    /// told why, each time it starts to wait.
    pub fn admit<'a>(
        &'a self,
        flows: Option<&'a dyn Flows>,
        tokens: u64,
        waiting: &mut dyn FnMut(&str),
    ) -> Admitted<'a> {
        if let Some(max) = self.limits.concurrency_max {
            let mut in_flight = self
                .in_flight
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if *in_flight >= max {
                waiting(&format!(
                    "all {max} of the model's calls in flight at once (concurrency_max) are taken"
                ));
            }
            while *in_flight >= max {
                in_flight = self
                    .freed
                    .wait(in_flight)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            *in_flight += 1;
        }
        let admitted = Admitted {
            flow: self,
            flows,
            tokens,
        };
        while let Err(wait_ms) = self.apply(flows, FlowOp::Take { tokens }) {
            waiting(&format!(
                "the model's rate limit or the provider's pause: about {wait_ms} ms more"
            ));
            std::thread::sleep(Duration::from_millis(wait_ms.max(1) as u64).min(RECHECK));
        }
        admitted
    }

    /// How long a call of `tokens` would wait for the rate limits or a
    /// pause now, in ms, if at all (the slots are not counted: they free up
    /// as calls end).
    pub fn expected_wait(&self, flows: Option<&dyn Flows>, tokens: u64) -> Option<i64> {
        self.apply(flows, FlowOp::Peek { tokens }).err()
    }

    /// Holds back every call of the model for `wait`, from now (what the
    /// provider asked of one of them).
    pub fn pause(&self, flows: Option<&dyn Flows>, wait: Duration) {
        let for_ms = wait.as_millis().min(i64::MAX as u128) as i64;
        let _ = self.apply(flows, FlowOp::Pause { for_ms });
    }
}

/// A call admitted, in flight until dropped.
pub struct Admitted<'a> {
    flow: &'a Flow,
    flows: Option<&'a dyn Flows>,
    tokens: u64,
}

impl Admitted<'_> {
    /// The call spent `used` tokens, not the `tokens` it was admitted with:
    /// the difference goes back to the bucket (or is owed to it).
    pub fn settle(&mut self, used: u64) {
        if self.flow.limits.caps.tokens_per_minute.is_some() {
            let taken = self.tokens;
            let _ = self.flow.apply(self.flows, FlowOp::Settle { taken, used });
        }
        self.tokens = used;
    }
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        if self.flow.limits.concurrency_max.is_some() {
            let mut in_flight = self
                .flow
                .in_flight
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            *in_flight = in_flight.saturating_sub(1);
            drop(in_flight);
            self.flow.freed.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_bound_calls_in_flight_and_are_given_back() {
        let flow = Flow::shared(
            "test-slots",
            FlowLimits {
                concurrency_max: Some(1),
                caps: FlowCaps::default(),
            },
        );
        let first = flow.admit(None, 0, &mut |_| {});
        assert_eq!(*flow.in_flight.lock().unwrap(), 1);
        drop(first);
        let _second = flow.admit(None, 0, &mut |_| {});
        assert_eq!(*flow.in_flight.lock().unwrap(), 1);
    }

    #[test]
    fn without_a_ledger_the_state_is_kept_in_the_process() {
        let flow = Flow::shared(
            "test-local",
            FlowLimits {
                concurrency_max: None,
                caps: FlowCaps {
                    requests_per_minute: Some(1),
                    tokens_per_minute: None,
                },
            },
        );
        drop(flow.admit(None, 0, &mut |_| {}));
        assert!(flow.apply(None, FlowOp::Take { tokens: 0 }).is_err());
    }
}
