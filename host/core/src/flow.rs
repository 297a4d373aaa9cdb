//! Flow control of a model's calls: requests and tokens a minute (token
//! buckets that hold a minute's worth and fill at that rate) and a pause a
//! provider asked for, which holds back every call of the model. The rule
//! is here once; a process keeps a model's state in memory, and a ledger
//! that can share it between processes (PostgreSQL's) keeps it in a row
//! ([`Flows`]), updated under a lock with its server's clock.

use crate::error::StoreResult;

/// A model's limits a minute (none: unbounded).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct FlowCaps {
    pub requests_per_minute: Option<u32>,
    pub tokens_per_minute: Option<u64>,
}

impl FlowCaps {
    pub fn is_none(&self) -> bool {
        *self == FlowCaps::default()
    }
}

/// A model's flow state: what its buckets hold, when they were last
/// filled, and until when its calls are paused (all times in ms).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FlowState {
    pub requests: f64,
    pub tokens: f64,
    pub at_ms: i64,
    pub paused_until_ms: i64,
}

const MINUTE_MS: f64 = 60_000.0;

impl FlowState {
    /// Full buckets at `now_ms`.
    pub fn full(caps: &FlowCaps, now_ms: i64) -> Self {
        FlowState {
            requests: caps.requests_per_minute.map_or(0.0, f64::from),
            tokens: caps.tokens_per_minute.map_or(0.0, |n| n as f64),
            at_ms: now_ms,
            paused_until_ms: 0,
        }
    }

    fn fill(&mut self, caps: &FlowCaps, now_ms: i64) {
        if caps.is_none() {
            return;
        }
        let elapsed = (now_ms - self.at_ms).max(0) as f64;
        if let Some(cap) = caps.requests_per_minute.map(f64::from) {
            self.requests = (self.requests + elapsed * cap / MINUTE_MS).min(cap);
        }
        if let Some(cap) = caps.tokens_per_minute.map(|n| n as f64) {
            self.tokens = (self.tokens + elapsed * cap / MINUTE_MS).min(cap);
        }
        self.at_ms = self.at_ms.max(now_ms);
    }

    /// Takes a call of `tokens` at `now_ms`, or says how many ms until it
    /// can be taken (a call larger than a minute's tokens waits for a full
    /// bucket, then takes it all and more).
    pub fn take(&mut self, caps: &FlowCaps, tokens: u64, now_ms: i64) -> Result<(), i64> {
        if self.paused_until_ms > now_ms {
            return Err(self.paused_until_ms - now_ms);
        }
        self.fill(caps, now_ms);
        let wait = |level: f64, n: f64, cap: f64| -> Option<i64> {
            let n = n.min(cap);
            (level < n).then(|| ((n - level) * MINUTE_MS / cap).ceil().max(1.0) as i64)
        };
        if let Some(cap) = caps.requests_per_minute.map(f64::from)
            && let Some(ms) = wait(self.requests, 1.0, cap)
        {
            return Err(ms);
        }
        if let Some(cap) = caps.tokens_per_minute.map(|n| n as f64)
            && let Some(ms) = wait(self.tokens, tokens as f64, cap)
        {
            return Err(ms);
        }
        if caps.requests_per_minute.is_some() {
            self.requests -= 1.0;
        }
        if caps.tokens_per_minute.is_some() {
            self.tokens -= tokens as f64;
        }
        Ok(())
    }

    /// A call taken with `taken` tokens spent `used`: the difference goes
    /// back to the bucket (or is owed to it).
    pub fn settle(&mut self, caps: &FlowCaps, taken: u64, used: u64) {
        if let Some(cap) = caps.tokens_per_minute.map(|n| n as f64) {
            self.tokens = (self.tokens + taken as f64 - used as f64).min(cap);
        }
    }

    /// Holds every call back until `until_ms` (a later pause wins).
    pub fn pause(&mut self, until_ms: i64) {
        self.paused_until_ms = self.paused_until_ms.max(until_ms);
    }
}

/// What a call does to its model's flow state.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FlowOp {
    /// Take a call that may spend `tokens` ([`FlowState::take`]).
    Take { tokens: u64 },
    /// A call taken with `taken` tokens spent `used` ([`FlowState::settle`]).
    Settle { taken: u64, used: u64 },
    /// Hold every call back for `for_ms` from now ([`FlowState::pause`]).
    Pause { for_ms: i64 },
    /// How long a call of `tokens` would wait now, taking nothing.
    Peek { tokens: u64 },
}

impl FlowState {
    /// Applies `op` at `now_ms`: `Err(ms)` when a call must wait that long.
    pub fn apply(&mut self, caps: &FlowCaps, op: FlowOp, now_ms: i64) -> Result<(), i64> {
        match op {
            FlowOp::Take { tokens } => self.take(caps, tokens, now_ms),
            FlowOp::Settle { taken, used } => {
                self.settle(caps, taken, used);
                Ok(())
            }
            FlowOp::Pause { for_ms } => {
                self.pause(now_ms.saturating_add(for_ms));
                Ok(())
            }
            FlowOp::Peek { tokens } => {
                let mut copy = *self;
                copy.take(caps, tokens, now_ms)
            }
        }
    }
}

/// Applies `op` to `found` (a model's state as read without a lock, if
/// any) at `now_ms`: its answer, and the state to keep if the op changed it
/// (`None`: nothing to write, as for a call of a model without limits and
/// not paused). A backend writes under a lock only then, reading again.
pub fn unchanged(
    found: Option<FlowState>,
    caps: &FlowCaps,
    op: FlowOp,
    now_ms: i64,
) -> Option<Result<(), i64>> {
    let before = found.unwrap_or_else(|| FlowState::full(caps, now_ms));
    let mut after = before;
    let answer = after.apply(caps, op, now_ms);
    (after == before).then_some(answer)
}

/// Flow state shared by every process on a ledger (a storage role; see
/// [`crate::store::Pool::flows`]).
pub trait Flows: Send + Sync {
    /// Applies `op` to model `key`'s state under a lock, at the ledger's
    /// clock (a key not seen yet starts with full buckets, per `caps`), and
    /// keeps the result: `Ok(Err(ms))` when a call must wait that long.
    fn flow(&self, key: &str, caps: FlowCaps, op: FlowOp) -> StoreResult<Result<(), i64>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(r: Option<u32>, t: Option<u64>) -> FlowCaps {
        FlowCaps {
            requests_per_minute: r,
            tokens_per_minute: t,
        }
    }

    #[test]
    fn requests_a_minute_are_a_bucket_that_refills_at_that_rate() {
        let c = caps(Some(2), None);
        let mut s = FlowState::full(&c, 0);
        assert_eq!(s.take(&c, 0, 0), Ok(()));
        assert_eq!(s.take(&c, 0, 0), Ok(()));
        // Empty: the next request in 30 s (2 a minute).
        assert_eq!(s.take(&c, 0, 0), Err(30_000));
        assert_eq!(s.take(&c, 0, 30_000), Ok(()));
    }

    #[test]
    fn tokens_are_taken_as_estimated_and_settled_as_spent() {
        let c = caps(None, Some(6_000));
        let mut s = FlowState::full(&c, 0);
        assert_eq!(s.take(&c, 5_000, 0), Ok(()));
        s.settle(&c, 5_000, 1_000);
        assert_eq!(s.take(&c, 5_000, 0), Ok(()));
        assert_eq!(s.take(&c, 5_000, 0), Err(50_000));
    }

    #[test]
    fn a_call_larger_than_a_minute_waits_for_a_full_bucket() {
        let c = caps(None, Some(1_000));
        let mut s = FlowState::full(&c, 0);
        assert_eq!(s.take(&c, 5_000, 0), Ok(()));
        assert!(s.tokens < 0.0);
        assert!(s.take(&c, 5_000, 0).is_err());
    }

    #[test]
    fn a_call_of_a_model_without_limits_changes_nothing_to_write() {
        let none = FlowCaps::default();
        let take = FlowOp::Take { tokens: 10 };
        assert_eq!(unchanged(None, &none, take, 5), Some(Ok(())));
        let mut paused = FlowState::full(&none, 0);
        paused.pause(1_000);
        assert_eq!(unchanged(Some(paused), &none, take, 5), Some(Err(995)));
        // A peek changes nothing, whatever the limits.
        let limited_peek = FlowCaps {
            requests_per_minute: Some(1),
            tokens_per_minute: None,
        };
        let mut empty = FlowState::full(&limited_peek, 0);
        empty.requests = 0.0;
        assert_eq!(
            unchanged(Some(empty), &limited_peek, FlowOp::Peek { tokens: 1 }, 0),
            Some(Err(60_000))
        );
        assert_eq!(
            unchanged(None, &limited_peek, FlowOp::Peek { tokens: 1 }, 0),
            Some(Ok(()))
        );
        // A pause, or a limited model's take, is written.
        assert_eq!(
            unchanged(None, &none, FlowOp::Pause { for_ms: 10 }, 5),
            None
        );
        let limited = FlowCaps {
            requests_per_minute: Some(10),
            tokens_per_minute: None,
        };
        assert_eq!(unchanged(None, &limited, take, 5), None);
    }

    #[test]
    fn a_pause_holds_every_call_and_a_later_one_wins() {
        let c = FlowCaps::default();
        let mut s = FlowState::full(&c, 0);
        s.pause(2_000);
        s.pause(1_000);
        assert_eq!(s.take(&c, 0, 500), Err(1_500));
        assert_eq!(s.take(&c, 0, 2_000), Ok(()));
    }
}
