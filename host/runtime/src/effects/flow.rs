//! Flow control of a model's calls, shared by every run of a process: calls
//! in flight at once (`concurrency_max`), requests and tokens a minute
//! (`requests_per_minute`, `tokens_per_minute`, token buckets that fill at
//! that rate and hold a minute's worth), and a pause that the provider asks
//! for (a 429's `retry-after`, or a rate-limit header saying nothing is left
//! until a reset), which holds back every run that shares the model, not
//! only the one that was told.
//!
//! A call is admitted before it is sent, with the tokens it may spend (its
//! input, about four bytes a token, and its `max_tokens`); when its answer
//! comes, the tokens it did spend are settled.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// A model's limits (none set: no flow control).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct FlowLimits {
    pub concurrency_max: Option<usize>,
    pub requests_per_minute: Option<u32>,
    pub tokens_per_minute: Option<u64>,
}

impl FlowLimits {
    pub fn is_none(&self) -> bool {
        *self == FlowLimits::default()
    }
}

/// The flow state of one model in this process.
pub struct Flow {
    limits: FlowLimits,
    state: Mutex<State>,
    changed: Condvar,
}

struct State {
    in_flight: usize,
    requests: Option<Bucket>,
    tokens: Option<Bucket>,
    paused_until: Option<Instant>,
}

/// A token bucket: holds up to `capacity`, fills at `capacity` a minute.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    level: f64,
    capacity: f64,
    at: Instant,
}

const MINUTE: f64 = 60.0;

impl Bucket {
    fn full(capacity: f64, now: Instant) -> Self {
        Bucket {
            level: capacity,
            capacity,
            at: now,
        }
    }

    fn fill(&mut self, now: Instant) {
        let secs = now.saturating_duration_since(self.at).as_secs_f64();
        self.level = (self.level + secs * self.capacity / MINUTE).min(self.capacity);
        self.at = now;
    }

    /// How long until `n` can be taken (a call larger than the bucket
    /// waits for a full one).
    fn wait_for(&self, n: f64) -> Option<Duration> {
        let n = n.min(self.capacity);
        (self.level < n).then(|| Duration::from_secs_f64((n - self.level) * MINUTE / self.capacity))
    }
}

/// Why a call cannot be admitted yet.
#[derive(Debug, PartialEq)]
enum Held {
    /// Until this long has passed.
    For(Duration),
    /// Until a call in flight ends.
    ForASlot,
}

impl State {
    fn new(limits: &FlowLimits, now: Instant) -> Self {
        State {
            in_flight: 0,
            requests: limits
                .requests_per_minute
                .map(|n| Bucket::full(f64::from(n), now)),
            tokens: limits
                .tokens_per_minute
                .map(|n| Bucket::full(n as f64, now)),
            paused_until: None,
        }
    }

    /// Admits a call of `tokens` at `now`, or says what holds it.
    fn try_admit(&mut self, limits: &FlowLimits, tokens: u64, now: Instant) -> Result<(), Held> {
        if let Some(until) = self.paused_until {
            if until > now {
                return Err(Held::For(until - now));
            }
            self.paused_until = None;
        }
        if limits.concurrency_max.is_some_and(|n| self.in_flight >= n) {
            return Err(Held::ForASlot);
        }
        for (bucket, n) in [(&mut self.requests, 1.0), (&mut self.tokens, tokens as f64)] {
            if let Some(bucket) = bucket {
                bucket.fill(now);
                if let Some(wait) = bucket.wait_for(n) {
                    return Err(Held::For(wait));
                }
            }
        }
        if let Some(bucket) = &mut self.requests {
            bucket.level -= 1.0;
        }
        if let Some(bucket) = &mut self.tokens {
            bucket.level -= tokens as f64;
        }
        self.in_flight += 1;
        Ok(())
    }
}

impl Flow {
    /// The flow of the model `key` (alias, URL, provider model and limits)
    /// in this process: however many times the configuration is loaded
    /// (each worker task, each host), its runs share it.
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
                    limits,
                    state: Mutex::new(State::new(&limits, Instant::now())),
                    changed: Condvar::new(),
                })
            })
            .clone()
    }

    /// Waits until a call that may spend `tokens` can be sent.
    pub fn admit(&self, tokens: u64) -> Admitted<'_> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            match state.try_admit(&self.limits, tokens, Instant::now()) {
                Ok(()) => {
                    return Admitted { flow: self, tokens };
                }
                Err(Held::For(wait)) => {
                    state = self
                        .changed
                        .wait_timeout(state, wait)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
                Err(Held::ForASlot) => {
                    state = self
                        .changed
                        .wait(state)
                        .unwrap_or_else(PoisonError::into_inner);
                }
            }
        }
    }

    /// Holds back every call of the model for `wait`, from now (what the
    /// provider asked of one of them).
    pub fn pause(&self, wait: Duration) {
        let until = Instant::now() + wait;
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.paused_until.is_none_or(|at| at < until) {
            state.paused_until = Some(until);
        }
    }
}

/// A call admitted, in flight until dropped.
pub struct Admitted<'a> {
    flow: &'a Flow,
    tokens: u64,
}

impl Admitted<'_> {
    /// The call spent `used` tokens, not the `tokens` it was admitted with:
    /// the difference goes back to the bucket (or is owed to it).
    pub fn settle(&mut self, used: u64) {
        let mut state = self
            .flow
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(bucket) = &mut state.tokens {
            bucket.level = (bucket.level + self.tokens as f64 - used as f64).min(bucket.capacity);
        }
        self.tokens = used;
    }
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        let mut state = self
            .flow
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        state.in_flight = state.in_flight.saturating_sub(1);
        drop(state);
        self.flow.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(c: Option<usize>, r: Option<u32>, t: Option<u64>) -> FlowLimits {
        FlowLimits {
            concurrency_max: c,
            requests_per_minute: r,
            tokens_per_minute: t,
        }
    }

    #[test]
    fn requests_a_minute_are_a_bucket_that_refills_at_that_rate() {
        let l = limits(None, Some(2), None);
        let t0 = Instant::now();
        let mut s = State::new(&l, t0);
        assert_eq!(s.try_admit(&l, 0, t0), Ok(()));
        assert_eq!(s.try_admit(&l, 0, t0), Ok(()));
        // Empty: the next request in 30 s (2 a minute).
        assert_eq!(
            s.try_admit(&l, 0, t0),
            Err(Held::For(Duration::from_secs(30)))
        );
        assert_eq!(s.try_admit(&l, 0, t0 + Duration::from_secs(30)), Ok(()));
    }

    #[test]
    fn tokens_are_taken_as_estimated_and_settled_as_spent() {
        let l = limits(None, None, Some(6_000));
        let flow = Flow {
            limits: l,
            state: Mutex::new(State::new(&l, Instant::now())),
            changed: Condvar::new(),
        };
        let mut call = flow.admit(5_000);
        call.settle(1_000);
        drop(call);
        // 5,000 back (up to the minute's 6,000, less what refilled).
        let now = Instant::now();
        let mut state = flow.state.lock().unwrap();
        assert!(state.try_admit(&l, 5_000, now).is_ok());
        // Nothing like 5,000 left: held about 50 s.
        match state.try_admit(&l, 5_000, now) {
            Err(Held::For(wait)) => assert!(wait > Duration::from_secs(40), "{wait:?}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_call_larger_than_a_minute_waits_for_a_full_bucket() {
        let l = limits(None, None, Some(1_000));
        let t0 = Instant::now();
        let mut s = State::new(&l, t0);
        assert_eq!(s.try_admit(&l, 5_000, t0), Ok(()));
        assert!(s.tokens.unwrap().level < 0.0);
        assert!(matches!(s.try_admit(&l, 5_000, t0), Err(Held::For(_))));
    }

    #[test]
    fn slots_and_pauses_hold_every_call() {
        let l = limits(Some(1), None, None);
        let t0 = Instant::now();
        let mut s = State::new(&l, t0);
        assert_eq!(s.try_admit(&l, 0, t0), Ok(()));
        assert_eq!(s.try_admit(&l, 0, t0), Err(Held::ForASlot));
        s.in_flight = 0;
        s.paused_until = Some(t0 + Duration::from_secs(2));
        assert_eq!(
            s.try_admit(&l, 0, t0),
            Err(Held::For(Duration::from_secs(2)))
        );
        assert_eq!(s.try_admit(&l, 0, t0 + Duration::from_secs(2)), Ok(()));
    }
}
