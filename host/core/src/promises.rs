//! Promises: a run waits for another system, which completes the promise
//! with a token the run handed it.
//!
//! - `create` is an observe call recording `{"expires_at_ms"}`; the promise's
//!   id is the call's number in the run. Its token is
//!   `RUN_ID~ID~MAC`, the MAC an HMAC under the operator's key of the
//!   call's operation id ([`operation_id`]): a resumed or replayed run makes
//!   the same token, the ledger never keeps it, and no one without the key
//!   can make one.
//! - A completion ([`complete`]) checks the token, finds the `create` call
//!   recorded and not expired, and keeps the first completion of the
//!   promise ([`crate::Store::complete_promise`]); in the same transaction
//!   it appends to the run's inbox, as a child's end does, so a run waiting
//!   for it is due at once and a run about to wait sees it.
//! - `wait` is a suspend call: it ends with the completion, or `expired`
//!   once the promise's time is up (an execution that finds it so records
//!   it; a completion is refused from then on).

use serde::{Deserialize, Serialize};

use crate::chain::Signer;
use crate::error::StoreError;
use crate::outcome::Outcome;
use crate::store::{Store, Views};

pub const INTERFACE: &str = "stephost:step/promises";

/// What joins a promise's completion in its run's inbox, beside children's
/// ends: the promise's entry is `promise:ID`.
pub const INBOX_SET: &str = "promise";

/// A promise's entry in its run's inbox.
pub fn inbox_entry(id: u64) -> String {
    format!("promise:{id}")
}

/// A completion as its run's inbox receives it.
pub fn arrival(run_id: &str, id: u64, completion: &Completion) -> crate::records::ChildArrival {
    crate::records::ChildArrival {
        parent_run_id: run_id.to_string(),
        child_run_id: inbox_entry(id),
        join_set: INBOX_SET.to_string(),
        status: match completion.state {
            PromiseState::Resolved => crate::RunStatus::Completed,
            PromiseState::Rejected => crate::RunStatus::Failed,
        },
        at_ms: completion.at_ms,
    }
}

/// The operation id of the `create` call numbered `seq` of run `run_id`.
pub fn operation_id(run_id: &str, seq: u64) -> String {
    crate::ids::operation_id(run_id, "promises.create", seq, None)
}

const TOKEN_MAC_HEX: usize = 32;
const SEPARATOR: char = '~';

/// The token that completes promise `id` of run `run_id`; none without the
/// operator's key.
pub fn token(signer: &Signer, run_id: &str, id: u64) -> Option<String> {
    Some(format!(
        "{run_id}{SEPARATOR}{id}{SEPARATOR}{}",
        mac_hex(signer, run_id, id)?
    ))
}

fn mac_hex(signer: &Signer, run_id: &str, id: u64) -> Option<String> {
    let key = signer.mac_key()?;
    let mac = key.mac(format!("stephost/promise/v1\0{}", operation_id(run_id, id)).as_bytes());
    let mut hex = crate::ids::to_hex(&mac);
    hex.truncate(TOKEN_MAC_HEX);
    Some(hex)
}

/// The run and promise a token names, if it is one the operator's key made.
pub fn verify(signer: &Signer, token: &str) -> Option<(String, u64)> {
    let mut parts = token.rsplitn(3, SEPARATOR);
    let (mac, id, run_id) = (parts.next()?, parts.next()?, parts.next()?);
    let id: u64 = id.parse().ok()?;
    let expected = mac_hex(signer, run_id, id)?;
    crate::mac::ct_eq(expected.as_bytes(), mac.as_bytes()).then(|| (run_id.to_string(), id))
}

/// How a promise was completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PromiseState {
    /// With a JSON value.
    Resolved,
    /// With a message.
    Rejected,
}

impl PromiseState {
    pub fn as_str(self) -> &'static str {
        match self {
            PromiseState::Resolved => "resolved",
            PromiseState::Rejected => "rejected",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "resolved" => Some(PromiseState::Resolved),
            "rejected" => Some(PromiseState::Rejected),
            _ => None,
        }
    }
}

/// A promise's completion, as the ledger keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Completion {
    pub state: PromiseState,
    /// Resolved: the value (JSON); rejected: the message.
    pub value: String,
    pub by: String,
    pub at_ms: i64,
}

impl Completion {
    /// The outcome of a `wait` that found it.
    pub fn outcome(&self) -> Outcome {
        Outcome::Ok(serde_json::json!({
            "state": self.state.as_str(),
            "value": self.value,
            "by": self.by,
            "at_ms": self.at_ms,
        }))
    }

    /// Whether `other` completes the promise the same way (who and when
    /// aside).
    pub fn same_as(&self, other: &Completion) -> bool {
        if self.state != other.state {
            return false;
        }
        match self.state {
            // The same JSON value, however it is spaced.
            PromiseState::Resolved => {
                serde_json::from_str::<serde_json::Value>(&self.value).ok()
                    == serde_json::from_str::<serde_json::Value>(&other.value).ok()
            }
            PromiseState::Rejected => self.value == other.value,
        }
    }
}

/// The outcome of a `wait` that found its promise expired at `at_ms`.
pub fn expired(at_ms: i64) -> Outcome {
    Outcome::Ok(serde_json::json!({ "state": "expired", "at_ms": at_ms }))
}

/// What [`crate::Store::complete_promise`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kept {
    /// The completion is the promise's.
    Now,
    /// The promise had this completion already.
    Already(Completion),
}

/// What [`complete`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Completed {
    /// This completion is the promise's.
    Completed,
    /// The promise had been completed the same way: nothing changed.
    Again,
}

/// Why a completion was refused.
#[derive(Debug, thiserror::Error)]
pub enum PromiseError {
    #[error(
        "this host has no operator key, so it can check no promise's token; configure the key \
         the runs were made under (STEPHOST_CHAIN_KEY_FILE)"
    )]
    NoKey,
    /// A token the key did not make, or for a promise no run created: one
    /// answer for both, so a caller learns nothing by guessing.
    #[error("no promise has this token; check that it was copied whole")]
    NotFound,
    #[error("the promise expired at {}; it can no longer be completed", time(.0))]
    Expired(i64),
    #[error(
        "the promise was {} by {} at {}; a completion is kept once, and this one differs",
        .0.state.as_str(), .0.by, time(&.0.at_ms)
    )]
    Conflict(Completion),
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn time(ms: &i64) -> String {
    crate::clock::format_time(*ms)
}

/// Completes the promise `token` names with `completion`, if the token is
/// the operator key's, its `create` is recorded and it has not expired at
/// `completion.at_ms`; the first completion wins, the same one again is
/// accepted.
pub fn complete(
    store: &dyn Store,
    signer: &Signer,
    token: &str,
    completion: &Completion,
) -> Result<Completed, PromiseError> {
    signer.mac_key().ok_or(PromiseError::NoKey)?;
    let (run_id, id) = verify(signer, token).ok_or(PromiseError::NotFound)?;
    let expires_at_ms = made(store, &run_id, id)?
        .ok_or(PromiseError::NotFound)?
        .expires_at_ms;
    if completion.at_ms >= expires_at_ms {
        return Err(PromiseError::Expired(expires_at_ms));
    }
    match store.complete_promise(&run_id, id, completion)? {
        Kept::Now => Ok(Completed::Completed),
        Kept::Already(kept) if kept.same_as(completion) => Ok(Completed::Again),
        Kept::Already(kept) => Err(PromiseError::Conflict(kept)),
    }
}

/// A promise as its `create` call recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Made {
    pub name: String,
    pub expires_at_ms: i64,
}

/// Promise `id` of run `run_id`, if its `create` call is recorded and
/// succeeded.
pub fn made(views: &dyn Views, run_id: &str, id: u64) -> Result<Option<Made>, StoreError> {
    let calls = match views.calls(run_id, id, 1) {
        Ok(calls) => calls,
        Err(StoreError::UnknownRun(_)) => return Ok(None),
        Err(e) => return Err(e),
    };
    let Some(call) = calls
        .into_iter()
        .find(|c| c.seq == id && c.interface == INTERFACE && c.function == "create")
    else {
        return Ok(None);
    };
    let outcome = call
        .outcome
        .as_deref()
        .and_then(|text| serde_json::from_str::<Outcome>(text).ok());
    let expires_at_ms = match outcome {
        Some(Outcome::Ok(value)) => value.get("expires_at_ms").and_then(|v| v.as_i64()),
        _ => None,
    };
    let name = serde_json::from_str::<serde_json::Value>(&call.request)
        .ok()
        .and_then(|r| r.get("name").and_then(|n| n.as_str()).map(str::to_string))
        .unwrap_or_default();
    Ok(expires_at_ms.map(|expires_at_ms| Made {
        name,
        expires_at_ms,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_the_keys_and_names_its_run_and_promise() {
        let signer = Signer::keyed(b"a test chain key of enough bytes, 0123456789").unwrap();
        let token = token(&signer, "run-1.a~b", 7).unwrap();
        assert_eq!(verify(&signer, &token), Some(("run-1.a~b".to_string(), 7)));
        assert_eq!(
            token,
            super::token(&signer, "run-1.a~b", 7).unwrap(),
            "derived"
        );
        assert_ne!(token, super::token(&signer, "run-1.a~b", 8).unwrap());
        // Another key, a changed MAC, another promise: not the key's.
        let other = Signer::keyed(b"another chain key of enough bytes, 98765").unwrap();
        assert_eq!(verify(&other, &token), None);
        let mut forged = token.clone();
        let last = forged.pop().unwrap();
        forged.push(if last == '0' { '1' } else { '0' });
        assert_eq!(verify(&signer, &forged), None);
        let moved = token.replacen("~7~", "~8~", 1);
        assert_eq!(verify(&signer, &moved), None);
        assert_eq!(verify(&signer, "nonsense"), None);
        assert_eq!(super::token(&Signer::plain(), "r", 1), None);
    }

    #[test]
    fn a_completion_is_the_same_when_its_state_and_value_are() {
        let c = |state, value: &str, by: &str| Completion {
            state,
            value: value.into(),
            by: by.into(),
            at_ms: 1,
        };
        let paid = c(PromiseState::Resolved, r#"{"paid": true}"#, "acme");
        assert!(paid.same_as(&c(PromiseState::Resolved, r#"{"paid":true}"#, "bank")));
        assert!(!paid.same_as(&c(PromiseState::Resolved, r#"{"paid":false}"#, "acme")));
        assert!(!paid.same_as(&c(PromiseState::Rejected, r#"{"paid": true}"#, "acme")));
    }
}
