//! `stephost:step/approvals`: a person approves or rejects, out of band.
//!
//! The call is recorded as `started` with `{"subject", "details",
//! "details_sha256", "ttl_seconds"}`, so the approval is tied to the exact
//! object approved. The run leaves memory (status `waiting`) until a person
//! records the decision as the call's outcome
//! ([`stephost_core::settle::decide_approval`]), or until it expires, when
//! the execution that finds it expired records `expired`.

use crate::bindings::CallError;
use crate::bindings::stephost::step::approvals::{Decision, Host, Verdict};
use crate::imports::effects::to_guest;
use crate::imports::{StepState, lock, trap};
use stephost_core::CallClass;
use stephost_core::approvals::{self, INTERFACE, decision_json};
use stephost_core::journal::{
    Attempts, CallErrorKind, CallSpec, Compute, LiveCall, OpContext, Outcome, Performed, Wait,
};

struct Approval {
    ttl_ms: i64,
    expired: bool,
}

impl LiveCall for Approval {
    fn perform(&mut self, _op: &OpContext<'_>, _attempts: &mut Attempts<'_>) -> Performed {
        Outcome::error(CallErrorKind::Invalid, "an approval is decided by a person").into()
    }

    fn wait(&mut self, _op: &OpContext<'_>, started_at_ms: i64) -> Wait {
        let expires = started_at_ms.saturating_add(self.ttl_ms);
        let now = stephost_core::clock::now_ms();
        if now >= expires {
            self.expired = true;
            return Wait::Ready(Outcome::Ok(decision_json(
                approvals::Verdict::Expired,
                "",
                None,
                now,
            )));
        }
        Wait::Until {
            wake_at_ms: Some(expires),
            reason: format!(
                "waiting for a person to approve or reject (expires {})",
                stephost_core::clock::format_time(expires)
            ),
        }
    }
}

fn to_decision(value: &serde_json::Value) -> Result<Decision, String> {
    let verdict = match value.get("verdict").and_then(|v| v.as_str()) {
        Some("approved") => Verdict::Approved,
        Some("rejected") => Verdict::Rejected,
        Some("expired") => Verdict::Expired,
        other => return Err(format!("recorded decision has verdict {other:?}")),
    };
    Ok(Decision {
        verdict,
        by: value
            .get("by")
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string(),
        note: value
            .get("note")
            .and_then(|v| v.as_str())
            .map(str::to_string),
        at_ms: value.get("at_ms").and_then(|v| v.as_u64()).unwrap_or(0),
    })
}

impl Host for StepState {
    fn request(
        &mut self,
        subject: String,
        details: String,
        ttl_seconds: u64,
    ) -> wasmtime::Result<Result<Decision, CallError>> {
        let mut journal = lock(&self.journal);
        let limits = journal.limits();
        // Sizes are checked before anything is parsed or copied again; the
        // recorded request is then bounded by the two limits.
        let too_large = if subject.len() as u64 > limits.approval_subject_bytes_max {
            Some(format!(
                "an approval subject of {} bytes; approval_subject_bytes_max = {}",
                subject.len(),
                limits.approval_subject_bytes_max
            ))
        } else if details.len() as u64 > limits.payload_bytes_max {
            Some(format!(
                "approval details of {} bytes; payload_bytes_max = {}",
                details.len(),
                limits.payload_bytes_max
            ))
        } else {
            None
        };
        if let Some(what) = too_large {
            let stop = stephost_core::journal::Stop::Limit(format!("the step asked for {what}"));
            journal.set_stop(stop.clone());
            return Err(trap(stop));
        }
        let parsed = serde_json::from_str::<serde_json::Value>(&details);
        let request = serde_json::json!({
            "subject": subject,
            "details": parsed.as_ref().ok(),
            "details_sha256": stephost_effects::payload_sha256(&details),
            "ttl_seconds": ttl_seconds,
        })
        .to_string();
        let refusal = match &parsed {
            Err(e) => Some(format!("details are not JSON: {e}")),
            Ok(_) if ttl_seconds == 0 => Some("ttl-seconds must be at least 1".to_string()),
            Ok(_) => None,
        };
        let spec = CallSpec {
            class: CallClass::Suspend,
            interface: INTERFACE,
            function: "request",
            request: &request,
            key: None,
            paid: false,
            redact: None,
        };
        let outcome = match refusal {
            Some(message) => {
                let refused = Outcome::error(CallErrorKind::Invalid, message);
                let spec = CallSpec {
                    class: CallClass::Observe,
                    ..spec
                };
                journal.call(&spec, &mut Compute(|| refused.clone()))
            }
            None => {
                let mut approval = Approval {
                    ttl_ms: i64::try_from(ttl_seconds.saturating_mul(1000)).unwrap_or(i64::MAX),
                    expired: false,
                };
                // Durable: as a task, the thread's other runs go on while
                // its commit is made.
                let outcome = stephost_effects::blocking(|| journal.call(&spec, &mut approval));
                if approval.expired {
                    journal.count("approvals_expired_total");
                }
                outcome
            }
        }
        .map_err(trap)?;
        match to_guest(outcome) {
            Ok(text) => {
                let value: serde_json::Value = serde_json::from_str(&text)
                    .map_err(|e| self.fail(stephost_core::journal::Stop::Corrupt(e.to_string())))?;
                let decision = to_decision(&value)
                    .map_err(|e| self.fail(stephost_core::journal::Stop::Corrupt(e)))?;
                Ok(Ok(decision))
            }
            Err(e) => Ok(Err(e)),
        }
    }
}
