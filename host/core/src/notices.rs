//! Notifications owed to webhooks: a run that needs a person (a call whose
//! outcome is unknown, an approval) or that failed or diverged. A notice is
//! recorded in the ledger before it is sent, under a delivery id derived
//! from what it is about, so the same event is owed once however many
//! servers see it, and a notice owed when a process dies is sent after it
//! restarts. Delivery is at least once: receivers deduplicate by the id.

use serde::{Deserialize, Serialize};

/// What a notice is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NoticeEvent {
    /// A call's outcome is unknown; the run is parked for a person.
    Parked,
    /// A run waits for a person's approval.
    Approval,
    /// A run failed.
    Failed,
    /// A run diverged from its recording.
    Diverged,
}

impl NoticeEvent {
    pub const ALL: [NoticeEvent; 4] = [
        NoticeEvent::Parked,
        NoticeEvent::Approval,
        NoticeEvent::Failed,
        NoticeEvent::Diverged,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            NoticeEvent::Parked => "parked",
            NoticeEvent::Approval => "approval",
            NoticeEvent::Failed => "failed",
            NoticeEvent::Diverged => "diverged",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.as_str() == s)
    }
}

/// Where a notice's delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NoticeState {
    /// Not yet accepted by the receiver; sent when `next_at_ms` is due.
    Owed,
    /// The receiver answered 2xx.
    Delivered,
    /// Every attempt the webhook allows failed.
    Abandoned,
}

impl NoticeState {
    pub fn as_str(self) -> &'static str {
        match self {
            NoticeState::Owed => "owed",
            NoticeState::Delivered => "delivered",
            NoticeState::Abandoned => "abandoned",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [
            NoticeState::Owed,
            NoticeState::Delivered,
            NoticeState::Abandoned,
        ]
        .into_iter()
        .find(|e| e.as_str() == s)
    }
}

/// One notification to one webhook, as the ledger holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notice {
    /// [`delivery_id`] of what it is about; the receiver deduplicates by it.
    pub delivery_id: String,
    /// The webhook's name in the configuration.
    pub webhook: String,
    pub event: NoticeEvent,
    pub run_id: String,
    /// The JSON body sent.
    pub body: String,
    pub created_at_ms: i64,
    pub state: NoticeState,
    /// When it is next sent (while owed); a taker holds it until then.
    pub next_at_ms: i64,
    pub attempts: u32,
    pub delivered_at_ms: Option<i64>,
    /// The last failed attempt's error.
    pub last_error: Option<String>,
}

/// The result of one delivery attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoticeAttempt {
    Delivered {
        at_ms: i64,
    },
    /// Failed; sent again at `next_at_ms`.
    Retry {
        next_at_ms: i64,
        error: String,
    },
    /// Failed, and no attempt is left.
    Abandoned {
        error: String,
    },
}

impl NoticeAttempt {
    /// The columns an attempt sets besides one more attempt: the state,
    /// and the next time, delivery time and error where it sets them.
    pub fn columns(&self) -> (NoticeState, Option<i64>, Option<i64>, Option<&str>) {
        match self {
            NoticeAttempt::Delivered { at_ms } => {
                (NoticeState::Delivered, None, Some(*at_ms), None)
            }
            NoticeAttempt::Retry { next_at_ms, error } => {
                (NoticeState::Owed, Some(*next_at_ms), None, Some(error))
            }
            NoticeAttempt::Abandoned { error } => (NoticeState::Abandoned, None, None, Some(error)),
        }
    }
}

/// The delivery id of `event` of run `run_id` (at call `seq`, for events
/// about a call) for `webhook`: the same event always gets the same id.
pub fn delivery_id(webhook: &str, event: NoticeEvent, run_id: &str, seq: Option<u64>) -> String {
    let seq = seq.map(|s| s.to_string()).unwrap_or_default();
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    crate::ids::feed_fields(
        &mut h,
        &[webhook, event.as_str(), run_id, seq.as_str()].map(str::as_bytes),
    );
    format!("dlv_{}", &crate::ids::to_hex(&h.finalize())[..32])
}

/// When attempt `attempts + 1` is sent after attempt `attempts` failed at
/// `now_ms`: doubling from `first_ms`, at most `max_ms` apart.
pub fn next_attempt_at(now_ms: i64, attempts: u32, first_ms: u64, max_ms: u64) -> i64 {
    let factor = 1u64 << attempts.saturating_sub(1).min(32);
    let wait = first_ms.saturating_mul(factor).min(max_ms);
    now_ms.saturating_add(wait.min(i64::MAX as u64) as i64)
}

/// What applying `attempt` makes of `notice` (what every backend's update
/// does).
pub fn apply(notice: &mut Notice, attempt: &NoticeAttempt) {
    let (state, next_at, delivered_at, error) = attempt.columns();
    notice.attempts = notice.attempts.saturating_add(1);
    notice.state = state;
    notice.next_at_ms = next_at.unwrap_or(notice.next_at_ms);
    notice.delivered_at_ms = delivered_at.or(notice.delivered_at_ms);
    notice.last_error = error.map(str::to_string).or(notice.last_error.take());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_event_has_the_same_id_and_another_event_another() {
        let a = delivery_id("ops", NoticeEvent::Parked, "r1", Some(3));
        assert_eq!(a, delivery_id("ops", NoticeEvent::Parked, "r1", Some(3)));
        for other in [
            delivery_id("ops", NoticeEvent::Parked, "r1", Some(4)),
            delivery_id("ops", NoticeEvent::Parked, "r2", Some(3)),
            delivery_id("dev", NoticeEvent::Parked, "r1", Some(3)),
            delivery_id("ops", NoticeEvent::Approval, "r1", Some(3)),
            delivery_id("ops", NoticeEvent::Failed, "r1", None),
        ] {
            assert_ne!(a, other);
        }
    }

    #[test]
    fn retries_back_off_doubling_up_to_the_maximum() {
        assert_eq!(next_attempt_at(0, 1, 1_000, 60_000), 1_000);
        assert_eq!(next_attempt_at(0, 2, 1_000, 60_000), 2_000);
        assert_eq!(next_attempt_at(0, 4, 1_000, 60_000), 8_000);
        assert_eq!(next_attempt_at(0, 40, 1_000, 60_000), 60_000);
        assert_eq!(
            next_attempt_at(i64::MAX - 1, 3, u64::MAX, u64::MAX),
            i64::MAX
        );
    }
}
