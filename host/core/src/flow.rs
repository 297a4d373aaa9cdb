//! Flow control of a model's calls: calls in flight at once (slots, each
//! leased to its holder for [`SLOT_LEASE_MS`] and renewed while its call
//! runs, so a slot held by a process that died frees itself), requests and
//! tokens a minute (token buckets that hold a minute's worth and fill at
//! that rate) and a pause a provider asked for, which holds back every call
//! of the model. The rule is here once; a process without a ledger keeps a
//! model's state in memory, and a ledger keeps it in a row ([`Flows`]),
//! updated under a lock, so every process on it shares it.

use crate::error::StoreResult;

/// A model's limits (none: unbounded).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct FlowCaps {
    /// Calls in flight at once.
    pub concurrency_max: Option<u32>,
    pub requests_per_minute: Option<u32>,
    pub tokens_per_minute: Option<u64>,
}

/// A model's flow state: what its buckets hold, when they were last
/// filled, until when its calls are paused, and the slots its calls in
/// flight hold (all times in ms).
#[derive(Debug, Clone, PartialEq)]
pub struct FlowState {
    pub requests: f64,
    pub tokens: f64,
    pub at_ms: i64,
    pub paused_until_ms: i64,
    pub slots: Vec<Slot>,
}

/// A call in flight's slot: its holder (a number the caller draws at
/// random) and when the slot frees itself unless renewed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Slot {
    pub holder: u64,
    pub until_ms: i64,
}

/// How long a slot is held without a renewal, in ms: the longest a slot
/// of a process that died holds back the others. Holders renew theirs
/// every third of it.
pub const SLOT_LEASE_MS: i64 = 30_000;

const MINUTE_MS: f64 = 60_000.0;

impl FlowState {
    /// Full buckets at `now_ms`.
    pub fn full(caps: &FlowCaps, now_ms: i64) -> Self {
        FlowState {
            requests: caps.requests_per_minute.map_or(0.0, f64::from),
            tokens: caps.tokens_per_minute.map_or(0.0, |n| n as f64),
            at_ms: now_ms,
            paused_until_ms: 0,
            slots: Vec::new(),
        }
    }

    /// The slots as kept in a ledger's row (JSON).
    pub fn slots_text(&self) -> String {
        serde_json::to_string(&self.slots).expect("slots serialize")
    }

    /// Slots as kept by [`FlowState::slots_text`] (none, if unreadable: a
    /// slot lost frees a call, it holds none back).
    pub fn parse_slots(text: &str) -> Vec<Slot> {
        serde_json::from_str(text).unwrap_or_default()
    }

    fn fill(&mut self, caps: &FlowCaps, now_ms: i64) {
        if caps.requests_per_minute.is_none() && caps.tokens_per_minute.is_none() {
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

    /// Takes a call of `tokens` for `holder` at `now_ms` (a slot, if the
    /// model bounds its calls in flight, and its share of the buckets), or
    /// says how many ms until it can be taken at the latest (a slot given
    /// back frees it sooner). A call larger than a minute's tokens waits
    /// for a full bucket, then takes it all and more.
    pub fn take(
        &mut self,
        caps: &FlowCaps,
        tokens: u64,
        holder: u64,
        now_ms: i64,
    ) -> Result<(), i64> {
        if self.paused_until_ms > now_ms {
            return Err(self.paused_until_ms - now_ms);
        }
        let Some(max) = caps.concurrency_max else {
            return self.take_buckets(caps, tokens, now_ms);
        };
        self.slots
            .retain(|s| s.until_ms > now_ms && s.holder != holder);
        if self.slots.len() >= max as usize {
            let first_free = self.slots.iter().map(|s| s.until_ms).min();
            return Err(first_free.map_or(1, |until| (until - now_ms).max(1)));
        }
        self.take_buckets(caps, tokens, now_ms)?;
        self.slots.push(Slot {
            holder,
            until_ms: now_ms.saturating_add(SLOT_LEASE_MS),
        });
        Ok(())
    }

    fn take_buckets(&mut self, caps: &FlowCaps, tokens: u64, now_ms: i64) -> Result<(), i64> {
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
    /// Take a call that may spend `tokens`, for `holder` ([`FlowState::take`]).
    Take { tokens: u64, holder: u64 },
    /// A call taken with `taken` tokens spent `used` ([`FlowState::settle`]).
    Settle { taken: u64, used: u64 },
    /// Hold every call back for `for_ms` from now ([`FlowState::pause`]).
    Pause { for_ms: i64 },
    /// How long a call of `tokens` would wait now for the buckets or a
    /// pause, taking nothing (slots free up as calls end: not counted).
    Peek { tokens: u64 },
    /// `holder`'s call still runs: its slot is held [`SLOT_LEASE_MS`] more.
    Renew { holder: u64 },
    /// `holder`'s call ended: its slot is given back.
    Release { holder: u64 },
}

impl FlowState {
    /// Applies `op` at `now_ms`: `Err(ms)` when a call must wait that long.
    pub fn apply(&mut self, caps: &FlowCaps, op: FlowOp, now_ms: i64) -> Result<(), i64> {
        match op {
            FlowOp::Take { tokens, holder } => self.take(caps, tokens, holder, now_ms),
            FlowOp::Settle { taken, used } => {
                self.settle(caps, taken, used);
                Ok(())
            }
            FlowOp::Pause { for_ms } => {
                self.pause(now_ms.saturating_add(for_ms));
                Ok(())
            }
            FlowOp::Peek { tokens } => self.clone().take_buckets(caps, tokens, now_ms),
            FlowOp::Renew { holder } => {
                for slot in self.slots.iter_mut().filter(|s| s.holder == holder) {
                    slot.until_ms = now_ms.saturating_add(SLOT_LEASE_MS);
                }
                Ok(())
            }
            FlowOp::Release { holder } => {
                self.slots.retain(|s| s.holder != holder);
                Ok(())
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
    let mut after = before.clone();
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
            concurrency_max: None,
            requests_per_minute: r,
            tokens_per_minute: t,
        }
    }

    #[test]
    fn requests_a_minute_are_a_bucket_that_refills_at_that_rate() {
        let c = caps(Some(2), None);
        let mut s = FlowState::full(&c, 0);
        assert_eq!(s.take(&c, 0, 1, 0), Ok(()));
        assert_eq!(s.take(&c, 0, 1, 0), Ok(()));
        // Empty: the next request in 30 s (2 a minute).
        assert_eq!(s.take(&c, 0, 1, 0), Err(30_000));
        assert_eq!(s.take(&c, 0, 1, 30_000), Ok(()));
    }

    #[test]
    fn tokens_are_taken_as_estimated_and_settled_as_spent() {
        let c = caps(None, Some(6_000));
        let mut s = FlowState::full(&c, 0);
        assert_eq!(s.take(&c, 5_000, 1, 0), Ok(()));
        s.settle(&c, 5_000, 1_000);
        assert_eq!(s.take(&c, 5_000, 1, 0), Ok(()));
        assert_eq!(s.take(&c, 5_000, 1, 0), Err(50_000));
    }

    #[test]
    fn a_call_larger_than_a_minute_waits_for_a_full_bucket() {
        let c = caps(None, Some(1_000));
        let mut s = FlowState::full(&c, 0);
        assert_eq!(s.take(&c, 5_000, 1, 0), Ok(()));
        assert!(s.tokens < 0.0);
        assert!(s.take(&c, 5_000, 1, 0).is_err());
    }

    #[test]
    fn a_call_of_a_model_without_limits_changes_nothing_to_write() {
        let none = FlowCaps::default();
        let take = FlowOp::Take {
            tokens: 10,
            holder: 1,
        };
        assert_eq!(unchanged(None, &none, take, 5), Some(Ok(())));
        let mut paused = FlowState::full(&none, 0);
        paused.pause(1_000);
        assert_eq!(unchanged(Some(paused), &none, take, 5), Some(Err(995)));
        // A peek changes nothing, whatever the limits.
        let limited_peek = FlowCaps {
            concurrency_max: None,
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
            concurrency_max: None,
            requests_per_minute: Some(10),
            tokens_per_minute: None,
        };
        assert_eq!(unchanged(None, &limited, take, 5), None);
    }

    #[test]
    fn slots_bound_calls_in_flight_until_given_back_or_their_lease_runs_out() {
        let c = FlowCaps {
            concurrency_max: Some(2),
            ..FlowCaps::default()
        };
        let mut s = FlowState::full(&c, 0);
        assert_eq!(s.take(&c, 0, 1, 0), Ok(()));
        assert_eq!(s.take(&c, 0, 2, 0), Ok(()));
        // Both slots held: the third waits at most until the first lease ends.
        assert_eq!(s.take(&c, 0, 3, 1_000), Err(SLOT_LEASE_MS - 1_000));
        // A slot given back frees one.
        s.apply(&c, FlowOp::Release { holder: 1 }, 1_000).unwrap();
        assert_eq!(s.take(&c, 0, 3, 1_000), Ok(()));
        // Renewed, holder 2's slot outlives its first lease; holder 3's
        // (not renewed) frees itself.
        s.apply(&c, FlowOp::Renew { holder: 2 }, 20_000).unwrap();
        assert_eq!(s.take(&c, 0, 4, SLOT_LEASE_MS + 1_500), Ok(()));
        assert!(s.take(&c, 0, 5, SLOT_LEASE_MS + 1_500).is_err());
        // The slots survive their ledger's row.
        let kept = FlowState::parse_slots(&s.slots_text());
        assert_eq!(kept, s.slots);
        // A peek does not count slots.
        assert_eq!(
            s.apply(&c, FlowOp::Peek { tokens: 0 }, SLOT_LEASE_MS + 1_500),
            Ok(())
        );
    }

    #[test]
    fn a_pause_holds_every_call_and_a_later_one_wins() {
        let c = FlowCaps::default();
        let mut s = FlowState::full(&c, 0);
        s.pause(2_000);
        s.pause(1_000);
        assert_eq!(s.take(&c, 0, 1, 500), Err(1_500));
        assert_eq!(s.take(&c, 0, 1, 2_000), Ok(()));
    }
}
