//! The rules of an approval call (`stephost:step/approvals`), shared by the
//! import that asks and the people who decide: how its request is recorded,
//! when it expires, and how a decision is stored as its outcome.
//!
//! The call is recorded as `started` with `{"subject", "details",
//! "details_sha256", "ttl_seconds"}`, so that a decision is tied to the exact
//! object approved. It stays `started` until a person decides (see
//! [`crate::settle`]) or it expires, when the execution that finds it
//! expired records `expired`.

use serde_json::Value;

use crate::records::CallRecord;

pub const INTERFACE: &str = "stephost:step/approvals";

/// When an approval call expires: its recorded start plus its TTL.
pub fn expires_at_ms(call: &CallRecord) -> i64 {
    let ttl = serde_json::from_str::<Value>(&call.request)
        .ok()
        .and_then(|v| v.get("ttl_seconds").and_then(Value::as_u64))
        .unwrap_or(0);
    call.started_at_ms
        .saturating_add(i64::try_from(ttl.saturating_mul(1000)).unwrap_or(i64::MAX))
}

/// Whether `call` is an approval still waiting for a decision.
pub fn is_waiting(call: &CallRecord) -> bool {
    call.interface == INTERFACE && call.state == crate::records::CallState::Started
}

/// A person's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Approved,
    Rejected,
    Expired,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Approved => "approved",
            Verdict::Rejected => "rejected",
            Verdict::Expired => "expired",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "approved" => Some(Verdict::Approved),
            "rejected" => Some(Verdict::Rejected),
            "expired" => Some(Verdict::Expired),
            _ => None,
        }
    }
}

/// The decision as the ledger stores it (the call's outcome value).
pub fn decision_json(verdict: Verdict, by: &str, note: Option<&str>, at_ms: i64) -> Value {
    serde_json::json!({ "verdict": verdict.as_str(), "by": by, "note": note, "at_ms": at_ms })
}
