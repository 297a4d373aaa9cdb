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

/// The fewest hex characters of the details' sha256 a person must name to
/// approve: enough that approving something other than what was shown
/// cannot happen by accident.
pub const DETAILS_PREFIX_MIN_CHARS: usize = 8;

/// A person's decision on an approval call.
#[derive(Debug, Clone, Copy)]
pub struct Decision<'a> {
    pub verdict: Verdict,
    /// Who decided.
    pub by: &'a str,
    pub note: Option<&'a str>,
    /// A prefix of the sha256 of the details the person was shown (as
    /// listed by `stephost approvals`): required to approve, checked when
    /// given to reject.
    pub details_sha256: Option<&'a str>,
}

/// Checks that `seen` names the details `call` asks about: a prefix of at
/// least [`DETAILS_PREFIX_MIN_CHARS`] of their sha256. Approving needs it.
pub fn check_seen(call: &CallRecord, verdict: Verdict, seen: Option<&str>) -> Result<(), String> {
    let recorded = serde_json::from_str::<Value>(&call.request)
        .ok()
        .and_then(|v| {
            v.get("details_sha256")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .unwrap_or_default();
    let Some(seen) = seen else {
        if verdict == Verdict::Approved {
            return Err(format!(
                "approving names the sha256 of the details approved (at least \
                 {DETAILS_PREFIX_MIN_CHARS} characters, as `stephost approvals` lists it: {recorded})"
            ));
        }
        return Ok(());
    };
    let seen = seen.trim().to_ascii_lowercase();
    if seen.len() < DETAILS_PREFIX_MIN_CHARS {
        return Err(format!(
            "the details' sha256 {seen:?} is shorter than {DETAILS_PREFIX_MIN_CHARS} characters"
        ));
    }
    if recorded.is_empty() || !recorded.starts_with(&seen) {
        return Err(format!(
            "the details shown ({seen}) are not those asked about ({recorded}); list the \
             approvals again and decide on what they show"
        ));
    }
    Ok(())
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
