//! Forks: a new run that keeps a run's calls before a chosen one, with
//! their outcomes, and goes live from there, usually with a new build.
//!
//! The rules, written once here:
//! - a fork of run S at call `at` copies S's calls `1..at` (the prefix),
//!   each with its outcome and operation id; none may be `started` or
//!   `unknown` (an outcome in doubt is settled on S, or the fork is made
//!   from before it);
//! - the fork's calls carry operation ids derived from S's (its
//!   [`ForkRef::operations`]): a write the fork makes again where S made it
//!   reaches the receiver as the same operation, and is deduplicated there;
//! - a child started in the prefix must be joined in the prefix, and a
//!   promise made there waited for there: its end reaches only S's inbox,
//!   so a fork could not join it; such children are shared (the fork keeps
//!   the recorded joins), never run again;
//! - the fork's row is written with the prefix as a run's first execution
//!   (fencing token 1) would leave it: pending, its kept calls recorded
//!   under that token, so a worker's claim reads them as any history;
//! - the prefix is relinked under the fork's own run id, so the fork's
//!   chain verifies like any run's; the fork's row names S, `at` and S's
//!   link of call `at - 1`, sealed with its input, so `verify` checks the
//!   prefix against S's chain where S is still in the ledger;
//! - the build the fork is pinned to must replay the prefix with no
//!   divergence (the runtime checks it before anything is written).

use std::collections::BTreeMap;

use crate::chain::{Finished, Signer};
use crate::records::{CallRecord, CallState, ForkRef, RunRecord};

/// The interface of child runs, as calls record it.
pub const RUNS_INTERFACE: &str = "stephost:step/runs";
/// The interface of promises, as calls record it.
pub const PROMISES_INTERFACE: &str = "stephost:step/promises";

/// Checks that `calls` (all of a run's, in order) may be forked at `at`;
/// the error says which call stands in the way and what to do.
pub fn check_prefix(source: &RunRecord, calls: &[CallRecord], at: u64) -> Result<(), String> {
    let run_id = &source.run_id;
    let last = calls.len() as u64;
    if at == 0 || at > last + 1 {
        return Err(format!(
            "run {run_id} has {last} call(s): a fork goes live from a call 1 to {} (the one \
             after the last)",
            last + 1
        ));
    }
    let prefix = &calls[..(at - 1) as usize];
    // Children started and not joined yet; promises made and not waited
    // for yet: by the call that began them.
    let mut children: BTreeMap<String, u64> = BTreeMap::new();
    let mut promises: BTreeMap<u64, u64> = BTreeMap::new();
    for call in prefix {
        match call.state {
            CallState::Started | CallState::Unknown => {
                return Err(format!(
                    "call #{} ({} {}) of run {run_id} is {}: its outcome is not known, so a fork \
                     cannot keep it; settle it on run {run_id} (a person's decision or \
                     `stephost resolve`), or fork from #{} or before",
                    call.seq,
                    call.interface,
                    call.function,
                    call.state.as_str(),
                    call.seq
                ));
            }
            CallState::Succeeded | CallState::Failed => {}
        }
        let ok = call
            .outcome
            .as_deref()
            .and_then(|o| serde_json::from_str::<serde_json::Value>(o).ok())
            .map(|o| o["ok"].clone())
            .unwrap_or_default();
        match (call.interface.as_str(), call.function.as_str()) {
            (RUNS_INTERFACE, "start") => {
                if let Some(child) = ok["run_id"].as_str() {
                    children.insert(child.to_string(), call.seq);
                }
            }
            (RUNS_INTERFACE, "join-next" | "join-try-next") => {
                if let Some(child) = ok["run_id"].as_str() {
                    children.remove(child);
                }
            }
            (PROMISES_INTERFACE, "create") if !ok.is_null() => {
                promises.insert(call.seq, call.seq);
            }
            (PROMISES_INTERFACE, "wait") => {
                let request: serde_json::Value =
                    serde_json::from_str(&call.request).unwrap_or_default();
                if let Some(id) = request["id"].as_u64() {
                    promises.remove(&id);
                }
            }
            _ => {}
        }
    }
    if let Some((child, seq)) = children.iter().min_by_key(|(_, seq)| **seq) {
        return Err(format!(
            "call #{seq} of run {run_id} started child run {child}, which no call before #{at} \
             joins: its end reaches only run {run_id}, so a fork could not join it; fork from \
             #{seq} or before, or from after its join"
        ));
    }
    if let Some((_, seq)) = promises.iter().min_by_key(|(_, seq)| **seq) {
        return Err(format!(
            "call #{seq} of run {run_id} made a promise that no call before #{at} waits for: its \
             token completes run {run_id}, not a fork; fork from #{seq} or before, or from after \
             its wait"
        ));
    }
    Ok(())
}

/// Where a fork of `source` at `at` comes from, given the source's prefix.
pub fn fork_ref(source: &RunRecord, prefix: &[CallRecord], at: u64) -> ForkRef {
    ForkRef {
        run_id: source.run_id.clone(),
        seq: at,
        link: prefix.last().and_then(|c| c.chain.clone()),
        operations: source.operations().to_string(),
    }
}

/// The prefix as the fork keeps it: each call linked under the fork's run
/// id, in order, with its content unchanged.
pub fn relink(signer: &Signer, fork_run_id: &str, prefix: &[CallRecord]) -> Vec<CallRecord> {
    let mut previous = String::new();
    prefix
        .iter()
        .map(|call| {
            let link = signer.link(fork_run_id, &previous, &Finished::recorded(call));
            previous.clone_from(&link);
            CallRecord {
                chain: Some(link),
                ..call.clone()
            }
        })
        .collect()
}

/// Whether the fork's copy of a call is the source's: the same call, with
/// the same outcome (links differ: each run links its own).
pub fn same_call(fork: &CallRecord, source: &CallRecord) -> bool {
    fork.seq == source.seq
        && fork.class == source.class
        && fork.interface == source.interface
        && fork.function == source.function
        && fork.operation_id == source.operation_id
        && fork.request_hash == source.request_hash
        && fork.state == source.state
        && fork.outcome == source.outcome
        && fork.resolved_by == source.resolved_by
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::CallClass;

    fn call(seq: u64, interface: &str, function: &str, request: &str, ok: &str) -> CallRecord {
        CallRecord {
            seq,
            class: CallClass::Write,
            interface: interface.into(),
            function: function.into(),
            operation_id: format!("op{seq}"),
            request: request.into(),
            request_hash: crate::ids::request_hash(interface, function, request),
            state: CallState::Succeeded,
            outcome: Some(format!("{{\"ok\": {ok}}}")),
            started_at_ms: 0,
            finished_at_ms: Some(0),
            fence: 1,
            resolved_by: None,
            chain: Some(format!("h3:{seq}")),
        }
    }

    fn source() -> RunRecord {
        crate::records::NewRun {
            run_id: "s",
            module_digest: "d",
            step: None,
            world: "w",
            input: "{}",
            now_ms: 0,
            budget: Default::default(),
        }
        .record(None)
    }

    #[test]
    fn a_fork_goes_live_from_a_call_up_to_the_one_after_the_last() {
        let calls = vec![call(1, "stephost:step/effects", "orders", "{}", "{}")];
        assert!(check_prefix(&source(), &calls, 1).is_ok());
        assert!(check_prefix(&source(), &calls, 2).is_ok());
        assert!(check_prefix(&source(), &calls, 0).is_err());
        assert!(check_prefix(&source(), &calls, 3).is_err());
    }

    #[test]
    fn a_prefix_with_an_outcome_in_doubt_is_refused_naming_the_call() {
        let mut calls = vec![
            call(1, "stephost:step/effects", "orders", "{}", "{}"),
            call(2, "stephost:step/effects", "orders", "{}", "{}"),
        ];
        calls[1].state = CallState::Unknown;
        let refused = check_prefix(&source(), &calls, 3).unwrap_err();
        assert!(
            refused.contains("call #2") && refused.contains("unknown"),
            "{refused}"
        );
        assert!(check_prefix(&source(), &calls, 2).is_ok());
    }

    #[test]
    fn a_child_not_joined_or_a_promise_not_waited_for_before_the_fork_is_refused() {
        let start = call(1, RUNS_INTERFACE, "start", "{}", r#"{"run_id": "c-1"}"#);
        let join = call(2, RUNS_INTERFACE, "join-next", "{}", r#"{"run_id": "c-1"}"#);
        let calls = vec![start, join];
        let refused = check_prefix(&source(), &calls, 2).unwrap_err();
        assert!(
            refused.contains("c-1") && refused.contains("#1"),
            "{refused}"
        );
        assert!(check_prefix(&source(), &calls, 3).is_ok());
        assert!(check_prefix(&source(), &calls, 1).is_ok());
        let create = call(1, PROMISES_INTERFACE, "create", "{}", r#"{"id": 1}"#);
        let wait = call(2, PROMISES_INTERFACE, "wait", r#"{"id": 1}"#, "{}");
        let calls = vec![create, wait];
        assert!(
            check_prefix(&source(), &calls, 2)
                .unwrap_err()
                .contains("promise")
        );
        assert!(check_prefix(&source(), &calls, 3).is_ok());
    }

    #[test]
    fn a_relinked_prefix_verifies_under_the_forks_id_and_keeps_its_content() {
        let signer = Signer::plain();
        let calls = vec![
            call(1, "stephost:step/effects", "orders", "{}", "{}"),
            call(2, "stephost:step/effects", "orders", "{\"n\": 2}", "{}"),
        ];
        let relinked = relink(&signer, "f", &calls);
        assert!(signer.verify_chain("f", &relinked).is_ok());
        assert!(signer.verify_chain("g", &relinked).is_err());
        assert!(relinked.iter().zip(&calls).all(|(f, s)| same_call(f, s)));
        let r = fork_ref(&source(), &calls, 3);
        assert_eq!(
            (r.seq, r.link.as_deref(), r.operations.as_str()),
            (3, Some("h3:2"), "s")
        );
    }
}
