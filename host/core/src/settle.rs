//! A person's decisions, written once for every backend: approving or
//! rejecting an approval call, and resolving a call whose outcome is
//! unknown. Each records the call's outcome with who decided and its chain
//! link, and makes the run runnable with a new fencing token
//! ([`crate::lifecycle::settled`]), by compare-and-set on the call's state
//! and the run's version; a run that changed in between (a renewal, an
//! execution's end) is read again and the rules checked again.

use crate::approvals::{self, Decision, Verdict};
use crate::chain::{Finished, Head, Signer};
use crate::lifecycle::{self, CAS_TRIES_MAX};
use crate::outcome::{CallErrorKind, Outcome};
use crate::records::{CallRecord, CallState, Counters, RunRecord};
use crate::store::{Settlement, Store, StoreError, StoreResult};

/// A person's decision on a call whose outcome is unknown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// The operation happened; the guest sees this response (JSON text).
    Succeeded(String),
    /// The operation did not happen; the guest sees `rejected` with this message.
    Failed(String),
}

/// Records `verdict` (approved or rejected) on approval call `seq` of
/// `run_id`, which must still wait for a decision and not have expired.
pub fn decide_approval(
    store: &dyn Store,
    signer: &Signer,
    run_id: &str,
    seq: u64,
    decision: &Decision<'_>,
    now_ms: i64,
) -> StoreResult<()> {
    let Decision {
        verdict,
        by,
        note,
        details_sha256,
    } = *decision;
    let refuse = |reason: String| StoreError::NotDecidable {
        run_id: run_id.to_string(),
        seq,
        reason,
    };
    if verdict == Verdict::Expired {
        return Err(refuse(
            "a person approves or rejects; expiry is the clock's".into(),
        ));
    }
    if by.trim().is_empty() {
        return Err(refuse("the decision must name who made it".into()));
    }
    let decision = approvals::decision_json(verdict, by, note, now_ms);
    let outcome = Outcome::Ok(serde_json::Value::String(decision.to_string()));
    let check = |call: &CallRecord| {
        if call.interface != approvals::INTERFACE {
            return Err(refuse(format!(
                "it is a {} {} call, not an approval",
                call.interface, call.function
            )));
        }
        if call.state != CallState::Started {
            return Err(refuse(format!(
                "it was already decided ({})",
                call.resolved_by
                    .as_deref()
                    .map(|b| format!("by {b}"))
                    .unwrap_or_else(|| "expired".to_string())
            )));
        }
        approvals::check_seen(call, verdict, details_sha256).map_err(refuse)?;
        let expires = approvals::expires_at_ms(call);
        if now_ms >= expires {
            return Err(refuse(format!(
                "it expired at {}",
                crate::clock::format_time(expires)
            )));
        }
        Ok(())
    };
    let missing = || refuse("the run has no such call".into());
    let mut counters = Counters::new();
    counters.insert("approvals_decided_total", 1);
    settle(
        store,
        signer,
        Decided {
            run_id,
            seq,
            expected: CallState::Started,
            outcome: &outcome,
            by,
            now_ms,
            counters,
        },
        &check,
        &missing,
    )
}

/// Records a person's resolution of call `seq` of `run_id`, which must be
/// `unknown`.
pub fn resolve(
    store: &dyn Store,
    signer: &Signer,
    run_id: &str,
    seq: u64,
    resolution: &Resolution,
    by: &str,
    now_ms: i64,
) -> StoreResult<()> {
    let not_unknown = |state: &str| StoreError::NotUnknown {
        run_id: run_id.to_string(),
        seq,
        state: state.to_string(),
    };
    if by.trim().is_empty() {
        return Err(StoreError::NotDecidable {
            run_id: run_id.to_string(),
            seq,
            reason: "the resolution must name who made it".into(),
        });
    }
    let outcome = match resolution {
        Resolution::Succeeded(response) => Outcome::Ok(serde_json::Value::String(response.clone())),
        Resolution::Failed(message) => Outcome::error(
            CallErrorKind::Rejected,
            format!("resolved as failed by {by}: {message}"),
        ),
    };
    let check = |call: &CallRecord| match call.state {
        CallState::Unknown => Ok(()),
        other => Err(not_unknown(other.as_str())),
    };
    let missing = || not_unknown("not recorded");
    settle(
        store,
        signer,
        Decided {
            run_id,
            seq,
            expected: CallState::Unknown,
            outcome: &outcome,
            by,
            now_ms,
            counters: Counters::new(),
        },
        &check,
        &missing,
    )
}

struct Decided<'a> {
    run_id: &'a str,
    seq: u64,
    expected: CallState,
    outcome: &'a Outcome,
    by: &'a str,
    now_ms: i64,
    counters: Counters,
}

fn settle(
    store: &dyn Store,
    signer: &Signer,
    decided: Decided<'_>,
    check: &dyn Fn(&CallRecord) -> StoreResult<()>,
    missing: &dyn Fn() -> StoreError,
) -> StoreResult<()> {
    let Decided {
        run_id,
        seq,
        expected,
        outcome,
        by,
        now_ms,
        counters,
    } = decided;
    let mut last = None;
    for _ in 0..CAS_TRIES_MAX {
        let run = store.run(run_id)?;
        check_record(store, signer, &run)?;
        let (previous, call) = call_and_previous(store, &run, seq)?;
        let call = call.ok_or_else(missing)?;
        check(&call)?;
        let state = outcome.state();
        let text = outcome.to_json();
        let chain = signer.link(
            run_id,
            &previous,
            &Finished {
                call: &call,
                state,
                outcome: Some(&text),
                resolved_by: Some(by),
            },
        );
        let mut row = lifecycle::settled(&run, now_ms);
        row.seal = Some(signer.seal(
            &row,
            &Head {
                seq,
                link: chain.clone(),
            },
        ));
        let settlement = Settlement {
            run_id: run_id.to_string(),
            seq,
            expected_state: expected,
            state,
            outcome: text,
            chain: Some(chain),
            by: by.to_string(),
            at_ms: now_ms,
            expected_version: run.version,
            run: row,
            counters: counters.clone(),
        };
        match store.settle(&settlement) {
            Ok(()) => return Ok(()),
            // Read again: the run moved on, or the call was decided by
            // someone else (then `check` says so).
            Err(e @ (StoreError::VersionConflict { .. } | StoreError::CallConflict { .. })) => {
                last = Some(e);
            }
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| StoreError::Unavailable("settlement kept conflicting".into())))
}

/// With a key, refuses to decide on (and so to sign) a run whose record
/// does not verify: an edit made since its last event would be sealed with
/// the real key. Without one the chain is plain, and checking it stops no
/// one.
pub fn check_record(store: &dyn Store, signer: &Signer, run: &RunRecord) -> StoreResult<()> {
    if !signer.is_keyed() {
        return Ok(());
    }
    let calls = store.calls(&run.run_id, 1, usize::MAX)?;
    signer
        .verify(&calls, run)
        .map(|_| ())
        .map_err(|broken| StoreError::Integrity {
            run_id: run.run_id.clone(),
            reason: broken.to_string(),
        })
}

/// Call `seq` of `run` and the chain link of the call before it.
fn call_and_previous(
    store: &dyn Store,
    run: &RunRecord,
    seq: u64,
) -> StoreResult<(String, Option<CallRecord>)> {
    if seq == 0 {
        return Ok((String::new(), None));
    }
    let from = seq.saturating_sub(1).max(1);
    let calls = store.calls(&run.run_id, from, (seq - from + 1) as usize)?;
    let call = calls.iter().find(|c| c.seq == seq).cloned();
    let previous = calls
        .iter()
        .find(|c| c.seq + 1 == seq)
        .and_then(|c| c.chain.clone())
        .unwrap_or_default();
    Ok((previous, call))
}
