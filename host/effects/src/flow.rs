//! Flow control of a model's calls: calls in flight at once
//! (`concurrency_max`), requests and tokens a minute (`requests_per_minute`,
//! `tokens_per_minute`) and a pause the provider asks for (a 429's
//! `retry-after`, or rate-limit headers saying nothing is left until a
//! reset) follow the rule of [`stephost_core::flow`], kept by the ledger
//! ([`Flows`]) so that every process on it shares them: a slot one worker
//! holds is held for all, and a pause one worker is told to take holds back
//! every worker's calls of the model.
//!
//! A call is admitted before it is sent, with the tokens it may spend (its
//! input, about four bytes a token, and its `max_tokens`); when its answer
//! comes, the tokens it did spend are settled. While it runs, its slot is
//! renewed every third of [`SLOT_LEASE_MS`], so a slot of a process that
//! died frees itself within that lease. A call waiting for capacity waits
//! in its thread; it is not a failure.

use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use stephost_core::flow::{FlowCaps, FlowOp, FlowState, Flows, SLOT_LEASE_MS};

/// Longest single wait before the shared state is looked at again, so a
/// slot given back by another process, a pause lifted or a bucket refilled
/// by a settle is seen (a slot given back in this process wakes its
/// waiters at once).
const RECHECK: Duration = Duration::from_millis(250);

/// The flow of one model in this process.
pub struct Flow {
    key: String,
    caps: FlowCaps,
    /// Bumped, and its waiters woken, when a call of this process gives
    /// its slot back.
    freed: (Mutex<u64>, Condvar),
    /// The state when there is no ledger to keep it (a host without one).
    local: Mutex<Option<FlowState>>,
}

impl Flow {
    /// The flow of the model `key` (alias, URL, provider model) with `caps`
    /// in this process: however many times the configuration is loaded
    /// (each worker task, each host), its runs share it.
    pub fn shared(key: &str, caps: FlowCaps) -> Arc<Flow> {
        static SHARED: OnceLock<Mutex<HashMap<String, Arc<Flow>>>> = OnceLock::new();
        let mut shared = SHARED
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        shared
            .entry(format!("{key}\n{caps:?}"))
            .or_insert_with(|| {
                Arc::new(Flow {
                    key: key.to_string(),
                    caps,
                    freed: (Mutex::new(0), Condvar::new()),
                    local: Mutex::new(None),
                })
            })
            .clone()
    }

    /// Applies `op` to the model's state: the ledger's if there is one,
    /// else this process's. A ledger that cannot be reached holds nothing
    /// back (the call goes on; the provider's own limits still hold).
    fn apply(&self, flows: Option<&dyn Flows>, op: FlowOp) -> Result<(), i64> {
        let caps = self.caps;
        match flows {
            Some(flows) => flows.flow(&self.key, caps, op).unwrap_or_else(|e| {
                crate::services::host().line(
                    crate::services::Level::Warn,
                    "stephost",
                    &format!("model flow state of {} not kept: {e}", self.key),
                );
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
    /// told why, each time it looks again. Past `deadline` (the call's, or
    /// its run's wall time) it gives up, saying why.
    pub fn admit(
        self: &Arc<Self>,
        flows: Option<Arc<dyn Flows>>,
        tokens: u64,
        deadline: Option<Instant>,
        waiting: &mut dyn FnMut(&str),
    ) -> Result<Admitted, String> {
        let holder = crate::services::host().random_u64();
        loop {
            let seen = *self.freed.0.lock().unwrap_or_else(PoisonError::into_inner);
            let Err(wait_ms) = self.apply(flows.as_deref(), FlowOp::Take { tokens, holder }) else {
                break;
            };
            let why = format!(
                "the model has no capacity now (its calls in flight at once, its rate limits \
                 or the provider's pause): up to {wait_ms} ms more"
            );
            let mut wait = Duration::from_millis(wait_ms.max(1) as u64).min(RECHECK);
            if let Some(deadline) = deadline {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(format!("{why}, past the call's deadline"));
                }
                wait = wait.min(left);
            }
            waiting(&why);
            let freed = self.freed.0.lock().unwrap_or_else(PoisonError::into_inner);
            if *freed == seen {
                let _ = self
                    .freed
                    .1
                    .wait_timeout(freed, wait)
                    .unwrap_or_else(PoisonError::into_inner);
            }
        }
        let heartbeat = self.caps.concurrency_max.map(|_| {
            let (stop, stopped) = mpsc::channel::<()>();
            let (flow, flows) = (self.clone(), flows.clone());
            let renew = Duration::from_millis(SLOT_LEASE_MS as u64 / 3);
            let thread = std::thread::spawn(move || {
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(renew) {
                    let _ = flow.apply(flows.as_deref(), FlowOp::Renew { holder });
                }
            });
            (stop, thread)
        });
        Ok(Admitted {
            flow: self.clone(),
            flows,
            tokens,
            holder,
            heartbeat,
        })
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

/// A call admitted, in flight (its slot held and renewed) until dropped.
pub struct Admitted {
    flow: Arc<Flow>,
    flows: Option<Arc<dyn Flows>>,
    tokens: u64,
    holder: u64,
    /// Renews the slot while the call runs; stopped by dropping its sender.
    heartbeat: Option<(mpsc::Sender<()>, std::thread::JoinHandle<()>)>,
}

impl Admitted {
    /// The call spent `used` tokens, not the `tokens` it was admitted with:
    /// the difference goes back to the bucket (or is owed to it).
    pub fn settle(&mut self, used: u64) {
        if self.flow.caps.tokens_per_minute.is_some() {
            let taken = self.tokens;
            let _ = self
                .flow
                .apply(self.flows.as_deref(), FlowOp::Settle { taken, used });
        }
        self.tokens = used;
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let Some((stop, thread)) = self.heartbeat.take() else {
            return;
        };
        drop(stop);
        let _ = thread.join();
        let holder = self.holder;
        let _ = self
            .flow
            .apply(self.flows.as_deref(), FlowOp::Release { holder });
        let (freed, woken) = &self.flow.freed;
        *freed.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        woken.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(key: &str, caps: FlowCaps) -> Arc<Flow> {
        Flow::shared(key, caps)
    }

    #[test]
    fn slots_bound_calls_in_flight_and_are_given_back() {
        let flow = local(
            "test-slots",
            FlowCaps {
                concurrency_max: Some(1),
                ..FlowCaps::default()
            },
        );
        let first = flow.admit(None, 0, None, &mut |_| {}).unwrap();
        let next = FlowOp::Take {
            tokens: 0,
            holder: 0,
        };
        assert!(flow.apply(None, next).is_err(), "the slot is held");
        drop(first);
        let _second = flow.admit(None, 0, None, &mut |_| {}).unwrap();
        // A waiter waits until the slot is given back.
        let flow2 = flow.clone();
        let waiter = std::thread::spawn(move || {
            let mut waited = false;
            drop(flow2.admit(None, 0, None, &mut |_| waited = true));
            waited
        });
        std::thread::sleep(Duration::from_millis(50));
        drop(_second);
        assert!(waiter.join().unwrap(), "the waiter waited for the slot");
    }

    #[test]
    fn a_wait_for_a_slot_ends_at_the_calls_deadline() {
        let flow = local(
            "test-deadline",
            FlowCaps {
                concurrency_max: Some(1),
                ..FlowCaps::default()
            },
        );
        let _held = flow.admit(None, 0, None, &mut |_| {}).unwrap();
        let deadline = Instant::now() + Duration::from_millis(20);
        let waited = flow.admit(None, 0, Some(deadline), &mut |_| {});
        let why = waited.err().expect("the slot stays held past the deadline");
        assert!(why.contains("deadline"), "{why}");
    }

    #[test]
    fn without_a_ledger_the_state_is_kept_in_the_process() {
        let flow = local(
            "test-local",
            FlowCaps {
                requests_per_minute: Some(1),
                ..FlowCaps::default()
            },
        );
        drop(flow.admit(None, 0, None, &mut |_| {}));
        let next = FlowOp::Take {
            tokens: 0,
            holder: 0,
        };
        assert!(flow.apply(None, next).is_err());
    }
}
