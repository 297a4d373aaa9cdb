//! The conformance suite every ledger backend passes, written once. A
//! backend runs all of it with one line in its tests:
//!
//! ```text
//! stephost_conformance::conformance_tests!(my_backend::test_ledger);
//! ```
//!
//! where `test_ledger()` returns a [`TestLedger`]: a pool over a new,
//! empty ledger, and whatever must live as long as it. Each case is a
//! public function here, so a failing one names what broke.

use std::any::Any;
use std::sync::{Arc, Barrier};

use stephost_core::approvals::{self, Decision, Verdict};
use stephost_core::chain::Signer;
use stephost_core::lifecycle::Repin;
use stephost_core::lifecycle::{self, ClaimMode};
use stephost_core::notices::{self, Notice, NoticeAttempt, NoticeEvent, NoticeState};
use stephost_core::records::{
    AttemptRecord, CallClass, CallRecord, CallState, Claim, Counters, LogRecord, NewRun, RunEnd,
    RunRecord, RunStatus,
};
use stephost_core::retention::{self, Rule};
use stephost_core::settle::{self, Resolution};
use stephost_core::store::{Outbox, Pool, RunQuery, Store, StoreError, WriteOp};

/// A pool over a new, empty ledger, and what must outlive it.
pub struct TestLedger {
    pub pool: Arc<dyn Pool>,
    pub guard: Box<dyn Any + Send>,
}

impl TestLedger {
    pub fn store(&self) -> Box<dyn Store> {
        self.pool.store().expect("a store from the pool")
    }

    pub fn outbox(&self) -> Box<dyn Outbox> {
        self.pool.outbox().expect("an outbox from the pool")
    }
}

/// Expands into one `#[test]` per conformance case, each on a new ledger
/// from `$make` (a function returning a [`TestLedger`]).
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::conformance_tests!(@cases $make;
            modules_are_kept_once_by_digest_and_an_unknown_one_is_refused,
            a_run_is_inserted_once_and_listed_by_its_filters,
            sixteen_racing_claimants_have_one_winner_per_version,
            a_live_lease_refuses_a_claim_until_it_runs_out_or_its_owner_is_gone,
            a_stale_writer_is_refused_on_every_write_path,
            due_runs_come_earliest_first_and_workers_claim_only_due_ones,
            a_durable_commit_is_visible_to_another_store_once_answered,
            an_execution_creating_its_run_fails_whole_if_the_id_exists,
            calls_are_only_appended_and_outcomes_land_on_their_calls,
            attempts_and_logs_read_back_in_order,
            a_person_approves_a_waiting_call_once_and_the_run_is_due_with_a_new_fence,
            an_expired_or_misaimed_approval_is_refused,
            a_persons_decision_supersedes_a_concurrent_execution,
            a_decision_racing_an_executions_commit_on_its_call_never_deadlocks,
            an_unknown_call_is_resolved_once_and_only_if_unknown,
            a_timer_waits_out_of_memory_until_it_is_due,
            renewal_extends_a_live_claim_and_release_makes_the_run_due,
            repin_moves_an_unheld_run_and_refuses_a_held_or_finished_one,
            a_long_history_streams_back_whole_and_in_order,
            large_bodies_and_conversations_read_back_byte_for_byte,
            counters_add_up_across_commits_and_stores,
            notices_are_owed_once_taken_by_one_taker_and_settled_by_attempts,
            notices_are_taken_earliest_due_first_whatever_their_creation_order,
            a_runs_last_call_is_read_alone,
            a_models_flow_state_is_kept_by_the_ledger_for_every_handle,
            a_trees_model_spend_is_one_total_that_racing_holds_never_pass,
            schedules_move_by_compare_and_set_and_only_due_ones_are_listed,
            a_promise_is_completed_once_into_its_runs_inbox_and_wakes_it_if_it_waits,
            a_runs_own_budget_is_kept_raised_sealed_and_listed,
            a_runs_trace_is_kept_from_its_record_through_its_claims_and_end,
            a_child_is_started_with_its_parents_call_in_one_commit_or_not_at_all,
            a_childs_end_reaches_its_parents_inbox_once_and_wakes_it_if_it_waits,
            a_parent_that_waits_after_a_child_ended_unseen_is_due_at_once,
            a_cancel_marks_a_tree_at_once_and_a_marked_run_begins_nothing,
            no_child_escapes_a_cancel_racing_its_starts,
            a_parents_end_cancels_its_attached_children_only,
            retention_deletes_finished_trees_with_what_they_owned_and_nothing_else
        );
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::$case(&$make);
            }
        )*
    };
}

type Make = dyn Fn() -> TestLedger;

const WORLD: &str = "stephost:step/step@0.1.0";
const T0: i64 = 1_800_000_000_000;
const LEASE_MS: i64 = 30_000;
const ALIVE: &dyn Fn(&str) -> bool = &|_| true;
const DEAD: &dyn Fn(&str) -> bool = &|_| false;

fn new_run(store: &dyn Store, run_id: &str, created_at_ms: i64) -> RunRecord {
    let run = NewRun {
        run_id,
        module_digest: "module-a",
        step: Some("step@1"),
        world: WORLD,
        input: "{\"n\":1}",
        now_ms: created_at_ms,
        budget: Default::default(),
    }
    .record(None);
    store.insert_run(&run).expect("insert a run")
}

fn claim(store: &dyn Store, run_id: &str, owner: &str, now_ms: i64) -> Claim {
    lifecycle::claim(store, run_id, owner, LEASE_MS, now_ms, ClaimMode::Any, DEAD)
        .expect("claim the run")
}

fn call(seq: u64, class: CallClass, state: CallState) -> CallRecord {
    let request = format!("{{\"i\":{seq}}}");
    CallRecord {
        seq,
        class,
        interface: "stephost:step/effects".into(),
        function: "orders".into(),
        operation_id: stephost_core::ids::operation_id("r", "orders", seq, None),
        request_hash: stephost_core::ids::request_hash("stephost:step/effects", "orders", &request),
        request,
        state,
        outcome: state.has_outcome().then(|| format!("{{\"ok\":{seq}}}")),
        started_at_ms: T0 + seq as i64,
        finished_at_ms: state.has_outcome().then_some(T0 + seq as i64),
        // The first claim's fence: a call is kept under its claim's.
        fence: 1,
        resolved_by: None,
        chain: None,
    }
}

fn finished(seq: u64) -> WriteOp {
    WriteOp::Call(call(seq, CallClass::Observe, CallState::Succeeded))
}

fn commit(pool: &dyn Pool, claim: &Claim, ops: Vec<WriteOp>) -> Result<(), StoreError> {
    let mut writer = pool.writer().expect("a writer");
    writer.commit(claim, ops).wait()?;
    writer.landed()
}

/// A run's end with `output`, no exit code.
fn completed(output: &str) -> RunEnd {
    RunEnd::Completed {
        output: output.into(),
        exit_code: None,
    }
}

fn end(end: RunEnd, now_ms: i64) -> WriteOp {
    WriteOp::End(lifecycle::ended(&end, now_ms))
}

fn calls_of(store: &dyn Store, run_id: &str) -> Vec<CallRecord> {
    store.calls(run_id, 1, usize::MAX).expect("read calls")
}

/// The sha256 of the details in [`waiting_for_approval`]'s request.
const DETAILS_SHA256: &str = "5feceb66ffc86f38d952786c6d696c79c2dbc239dd4e91b46729d73a27fb57e9";

/// A person's decision, naming the details they were shown.
fn decision<'a>(verdict: Verdict, by: &'a str, note: Option<&'a str>) -> Decision<'a> {
    Decision {
        verdict,
        by,
        note,
        details_sha256: Some(&DETAILS_SHA256[..12]),
    }
}

/// A run waiting at an approval (call #1) that expires after `ttl_seconds`.
fn waiting_for_approval(ledger: &TestLedger, run_id: &str, ttl_seconds: u64) -> Claim {
    let store = ledger.store();
    new_run(store.as_ref(), run_id, T0);
    let claimed = claim(store.as_ref(), run_id, "w1", T0);
    let request = serde_json::json!({
        "subject": "refund 40 EUR",
        "details": {"amount": 40},
        "details_sha256": DETAILS_SHA256,
        "ttl_seconds": ttl_seconds,
    })
    .to_string();
    let mut asked = call(1, CallClass::Suspend, CallState::Started);
    asked.interface = approvals::INTERFACE.into();
    asked.function = "request".into();
    asked.request_hash =
        stephost_core::ids::request_hash(approvals::INTERFACE, "request", &request);
    asked.request = request;
    commit(
        ledger.pool.as_ref(),
        &claimed,
        vec![WriteOp::Started(asked)],
    )
    .expect("ask");
    claimed
}

pub fn modules_are_kept_once_by_digest_and_an_unknown_one_is_refused(make: &Make) {
    let ledger = make();
    let store = ledger.store();
    store.put_module("d1", b"\0asm bytes").unwrap();
    store.put_module("d1", b"\0asm bytes").unwrap();
    assert_eq!(store.module("d1").unwrap(), b"\0asm bytes");
    assert!(matches!(
        store.module("d2"),
        Err(StoreError::UnknownModule(d)) if d == "d2"
    ));
}

pub fn a_run_is_inserted_once_and_listed_by_its_filters(make: &Make) {
    let ledger = make();
    let store = ledger.store();
    let first = new_run(store.as_ref(), "r1", T0);
    assert_eq!(store.run("r1").unwrap(), first);
    // Inserting the same id again returns the run that is there.
    let mut other = first.clone();
    other.input = "{\"n\":2}".into();
    assert_eq!(store.insert_run(&other).unwrap(), first);
    assert!(matches!(store.run("nope"), Err(StoreError::UnknownRun(_))));
    for i in 2..=5 {
        new_run(store.as_ref(), &format!("r{i}"), T0 + i);
    }
    let mut moved = store.run("r5").unwrap();
    moved.module_digest = "module-b".into();
    moved.version += 1;
    store.swap_run(moved.version - 1, &moved, true).unwrap();
    claim(store.as_ref(), "r4", "w", T0);
    let ids = |query: &RunQuery| -> Vec<String> {
        store
            .runs(query)
            .unwrap()
            .into_iter()
            .map(|r| r.run_id)
            .collect()
    };
    assert_eq!(ids(&RunQuery::default()), ["r5", "r4", "r3", "r2", "r1"]);
    let page = RunQuery {
        limit: Some(2),
        ..RunQuery::default()
    };
    assert_eq!(ids(&page), ["r5", "r4"]);
    let next = RunQuery {
        after_run_id: Some("r4".into()),
        ..page.clone()
    };
    assert_eq!(ids(&next), ["r3", "r2"]);
    // A filter no stored text can equal (a NUL) matches nothing, on
    // every backend, rather than failing.
    for query in [
        RunQuery {
            module_digest: Some("module-\0b".into()),
            ..RunQuery::default()
        },
        RunQuery {
            step: Some("step\0".into()),
            ..RunQuery::default()
        },
        RunQuery {
            after_run_id: Some("r\u{0}4".into()),
            ..RunQuery::default()
        },
    ] {
        assert!(ids(&query).is_empty(), "{query:?}");
    }
    let pending = RunQuery {
        status: Some(RunStatus::Pending),
        ..RunQuery::default()
    };
    assert_eq!(ids(&pending), ["r5", "r3", "r2", "r1"]);
    let module_b = RunQuery {
        module_digest: Some("module-b".into()),
        ..RunQuery::default()
    };
    assert_eq!(ids(&module_b), ["r5"]);
    let window = RunQuery {
        created_after_ms: Some(T0 + 1),
        created_before_ms: Some(T0 + 4),
        step: Some("step@1".into()),
        ..RunQuery::default()
    };
    assert_eq!(ids(&window), ["r3", "r2"]);
    let mut counts = store.status_counts().unwrap();
    counts.sort_by_key(|(s, _)| s.as_str());
    assert_eq!(counts, [(RunStatus::Pending, 4), (RunStatus::Running, 1)]);
    // A filter or an id no stored value can be (a NUL byte) finds nothing,
    // or is refused as bad input: never "the ledger is unavailable".
    let nul = RunQuery {
        step: Some("st\0ep".into()),
        after_run_id: Some("r\0".into()),
        ..RunQuery::default()
    };
    match store.runs(&nul) {
        Ok(found) => assert!(found.is_empty()),
        Err(e) => assert!(matches!(e, StoreError::Config(_)), "{e:?}"),
    }
    match store.run("r\0") {
        Err(StoreError::UnknownRun(_) | StoreError::Config(_)) => {}
        other => panic!("{other:?}"),
    }
}

pub fn sixteen_racing_claimants_have_one_winner_per_version(make: &Make) {
    const CLAIMANTS: usize = 16;
    const ROUNDS: i64 = 4;
    let ledger = make();
    new_run(ledger.store().as_ref(), "race", T0);
    let mut fences = Vec::new();
    for round in 0..ROUNDS {
        // Each round starts after the last winner's lease has run out.
        let now = T0 + round * (LEASE_MS + 1);
        let barrier = Arc::new(Barrier::new(CLAIMANTS));
        let results: Vec<Result<Claim, StoreError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..CLAIMANTS)
                .map(|i| {
                    let pool = ledger.pool.clone();
                    let barrier = barrier.clone();
                    scope.spawn(move || {
                        let store = pool.store().expect("a store");
                        let run = store.run("race").expect("read the run");
                        barrier.wait();
                        lifecycle::claim_read(
                            store.as_ref(),
                            &run,
                            &format!("claimant-{i}"),
                            LEASE_MS,
                            now,
                            ClaimMode::Due,
                            ALIVE,
                        )
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let winners: Vec<&Claim> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
        assert_eq!(winners.len(), 1, "round {round}: {results:?}");
        for lost in results.iter().filter_map(|r| r.as_ref().err()) {
            assert!(
                matches!(
                    lost,
                    StoreError::VersionConflict { .. } | StoreError::Unavailable(_)
                ),
                "round {round}: {lost:?}"
            );
        }
        let run = ledger.store().run("race").unwrap();
        assert_eq!(run.fence, winners[0].fence);
        assert_eq!(run.owner.as_deref(), Some(winners[0].owner.as_str()));
        fences.push(run.fence);
    }
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
}

pub fn a_live_lease_refuses_a_claim_until_it_runs_out_or_its_owner_is_gone(make: &Make) {
    let ledger = make();
    let store = ledger.store();
    new_run(store.as_ref(), "held", T0);
    let first = claim(store.as_ref(), "held", "w1", T0);
    let try_claim = |now: i64, alive: &dyn Fn(&str) -> bool| {
        lifecycle::claim(
            store.as_ref(),
            "held",
            "w2",
            LEASE_MS,
            now,
            ClaimMode::Due,
            alive,
        )
    };
    assert!(matches!(
        try_claim(T0 + 1, ALIVE),
        Err(StoreError::ClaimedElsewhere { owner, .. }) if owner == "w1"
    ));
    let second = try_claim(first.lease_until_ms, ALIVE).expect("the lease ran out");
    assert_eq!(second.fence, first.fence + 1);
    let third = lifecycle::claim(
        store.as_ref(),
        "held",
        "w3",
        LEASE_MS,
        T0 + 2,
        ClaimMode::Due,
        DEAD,
    )
    .expect("the owner is gone");
    assert_eq!(third.fence, second.fence + 1);
}

pub fn a_stale_writer_is_refused_on_every_write_path(make: &Make) {
    let ledger = make();
    let pool = ledger.pool.as_ref();
    let store = ledger.store();
    new_run(store.as_ref(), "f", T0);
    let stale = claim(store.as_ref(), "f", "w1", T0);
    commit(pool, &stale, vec![finished(1)]).unwrap();
    let newest = claim(store.as_ref(), "f", "w2", T0 + 1);
    commit(
        pool,
        &newest,
        vec![WriteOp::Started(call(
            2,
            CallClass::Write,
            CallState::Started,
        ))],
    )
    .unwrap();
    // Each call is kept under the fence of the claim that recorded it.
    let fences: Vec<i64> = store
        .calls("f", 1, 10)
        .unwrap()
        .iter()
        .map(|c| c.fence)
        .collect();
    assert_eq!(fences, vec![stale.fence, newest.fence]);
    assert!(stale.fence < newest.fence);
    let paths: Vec<(&str, WriteOp)> = vec![
        ("a finished call", finished(3)),
        (
            "a started write",
            WriteOp::Started(call(3, CallClass::Write, CallState::Started)),
        ),
        (
            "an outcome",
            WriteOp::Outcome {
                seq: 2,
                state: CallState::Succeeded,
                outcome: Some("{\"ok\":1}".into()),
                now_ms: T0,
                chain: None,
            },
        ),
        (
            "an attempt",
            WriteOp::Attempt(AttemptRecord {
                seq: 2,
                attempt: 1,
                kind: "send".into(),
                started_at_ms: T0,
                finished_at_ms: T0,
                result: "ok".into(),
                detail: None,
            }),
        ),
        (
            "a log line",
            WriteOp::Log(LogRecord {
                after_seq: 2,
                level: "info".into(),
                message: "zombie".into(),
                at_ms: T0,
            }),
        ),
        (
            "a lease",
            WriteOp::Lease {
                until_ms: T0 + 99_999,
            },
        ),
        ("the run's end", end(completed("{}"), T0)),
        (
            "counters",
            WriteOp::Counters(Counters::from([("zombie_total", 1)])),
        ),
    ];
    let before = store.run("f").unwrap();
    for (what, op) in paths {
        let err = commit(pool, &stale, vec![op]).expect_err(what);
        assert_eq!(
            err,
            StoreError::Fenced {
                run_id: "f".into(),
                held: stale.fence,
                newest: newest.fence,
            },
            "{what}"
        );
    }
    // A commit whose first ops would apply fails whole.
    let err = commit(pool, &stale, vec![finished(3), finished(4)]).unwrap_err();
    assert!(matches!(err, StoreError::Fenced { .. }));
    assert_eq!(store.run("f").unwrap(), before);
    let calls = calls_of(store.as_ref(), "f");
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[1].state, CallState::Started);
    assert!(store.logs("f").unwrap().is_empty());
    assert!(store.attempts("f", None).unwrap().is_empty());
    assert!(
        !store
            .counters()
            .unwrap()
            .iter()
            .any(|(n, _)| n == "zombie_total")
    );
    // Renewal and release through the store refuse or ignore the stale claim.
    assert!(matches!(
        lifecycle::renew(store.as_ref(), &stale, T0 + 5),
        Err(StoreError::Fenced { .. })
    ));
    lifecycle::release(store.as_ref(), &stale, T0 + 5).unwrap();
    assert_eq!(store.run("f").unwrap().owner.as_deref(), Some("w2"));
}

pub fn due_runs_come_earliest_first_and_workers_claim_only_due_ones(make: &Make) {
    let ledger = make();
    let pool = ledger.pool.as_ref();
    let store = ledger.store();
    let now = T0 + 100_000;
    // pending (due since creation), a released run (due at its release),
    // a timer due, one not due, a held run, and runs never due.
    new_run(store.as_ref(), "pending", T0 + 10);
    for id in [
        "released",
        "timer-due",
        "timer-later",
        "held",
        "renewed",
        "parked",
        "done",
    ] {
        new_run(store.as_ref(), id, T0);
    }
    // A lease renewed inside a commit: due when the new lease ends, not
    // when the first one did.
    let renewed = claim(store.as_ref(), "renewed", "w-live", T0);
    commit(
        pool,
        &renewed,
        vec![
            finished(1),
            WriteOp::Lease {
                until_ms: now + 10_000,
            },
        ],
    )
    .unwrap();
    let released = claim(store.as_ref(), "released", "w", T0 + 20);
    lifecycle::release(store.as_ref(), &released, T0 + 30).unwrap();
    for (id, wake) in [("timer-due", now - 5), ("timer-later", now + 60_000)] {
        let c = claim(store.as_ref(), id, "w", T0);
        commit(
            pool,
            &c,
            vec![end(
                RunEnd::Waiting {
                    wake_at_ms: Some(wake),
                },
                T0,
            )],
        )
        .unwrap();
    }
    claim(store.as_ref(), "held", "w-live", now - 1_000);
    let c = claim(store.as_ref(), "parked", "w", T0);
    commit(
        pool,
        &c,
        vec![end(RunEnd::Parked { error: "e".into() }, T0)],
    )
    .unwrap();
    let c = claim(store.as_ref(), "done", "w", T0);
    commit(pool, &c, vec![end(completed("{}"), T0)]).unwrap();
    let listed: Vec<String> = store
        .due_runs(100)
        .unwrap()
        .into_iter()
        .map(|r| r.run_id)
        .collect();
    assert_eq!(
        listed,
        [
            "pending",
            "released",
            "timer-due",
            "renewed",
            "held",
            "timer-later"
        ]
    );
    assert_eq!(store.due_runs(2).unwrap().len(), 2);
    let claimable: Vec<&str> = listed
        .iter()
        .filter(|id| {
            let run = store.run(id).unwrap();
            lifecycle::check_claimable(&run, "w2", now, ClaimMode::Due, ALIVE).is_ok()
        })
        .map(String::as_str)
        .collect();
    assert_eq!(claimable, ["pending", "released", "timer-due"]);
    for id in ["parked", "done", "timer-later"] {
        let err = lifecycle::claim(
            store.as_ref(),
            id,
            "w2",
            LEASE_MS,
            now,
            ClaimMode::Due,
            ALIVE,
        )
        .unwrap_err();
        assert!(
            matches!(err, StoreError::NotClaimable { .. }),
            "{id}: {err:?}"
        );
    }
}

pub fn a_durable_commit_is_visible_to_another_store_once_answered(make: &Make) {
    let ledger = make();
    let store = ledger.store();
    new_run(store.as_ref(), "d", T0);
    let c = claim(store.as_ref(), "d", "w", T0);
    let mut writer = ledger.pool.writer().unwrap();
    // Buffered calls ride on the durable `started` row's commit.
    writer
        .commit(
            &c,
            vec![
                finished(1),
                finished(2),
                WriteOp::Started(call(3, CallClass::Write, CallState::Started)),
            ],
        )
        .wait()
        .unwrap();
    // Before the request would leave: a store opened now sees all of it.
    let other = ledger.store();
    let calls = calls_of(other.as_ref(), "d");
    assert_eq!(calls.len(), 3);
    assert_eq!(calls[2].state, CallState::Started);
    assert_eq!(
        calls[2].operation_id,
        call(3, CallClass::Write, CallState::Started).operation_id
    );
}

/// A new run `run_id` of module-a on `{}` at T0, with no declared step.
fn bare(run_id: &str) -> NewRun<'_> {
    NewRun {
        run_id,
        module_digest: "module-a",
        step: None,
        world: WORLD,
        input: "{}",
        now_ms: T0,
        budget: Default::default(),
    }
}

pub fn an_execution_creating_its_run_fails_whole_if_the_id_exists(make: &Make) {
    let ledger = make();
    let store = ledger.store();
    let new = bare("c");
    let first = lifecycle::first_claim("c", "w1", LEASE_MS, T0);
    commit(
        ledger.pool.as_ref(),
        &first,
        vec![
            WriteOp::Create(Box::new(new.record(Some(&first)))),
            finished(1),
        ],
    )
    .unwrap();
    let run = store.run("c").unwrap();
    assert_eq!(
        (run.status, run.fence, run.owner.as_deref()),
        (RunStatus::Running, 1, Some("w1"))
    );
    assert_eq!(calls_of(store.as_ref(), "c").len(), 1);
    let other = lifecycle::first_claim("c", "w2", LEASE_MS, T0);
    let err = commit(
        ledger.pool.as_ref(),
        &other,
        vec![
            WriteOp::Create(Box::new(new.record(Some(&other)))),
            finished(2),
        ],
    )
    .unwrap_err();
    assert!(
        matches!(err, StoreError::ClaimedElsewhere { .. }),
        "{err:?}"
    );
    assert_eq!(store.run("c").unwrap(), run);
    assert_eq!(calls_of(store.as_ref(), "c").len(), 1);
}

pub fn calls_are_only_appended_and_outcomes_land_on_their_calls(make: &Make) {
    let ledger = make();
    let pool = ledger.pool.as_ref();
    let store = ledger.store();
    new_run(store.as_ref(), "a", T0);
    let c = claim(store.as_ref(), "a", "w", T0);
    commit(
        pool,
        &c,
        vec![
            finished(1),
            WriteOp::Started(call(2, CallClass::Write, CallState::Started)),
        ],
    )
    .unwrap();
    for (what, seq) in [("again", 2), ("a gap", 4), ("before the last", 1)] {
        let err = commit(pool, &c, vec![finished(seq)]).unwrap_err();
        assert!(
            matches!(err, StoreError::NotAppended { .. }),
            "{what}: {err:?}"
        );
    }
    commit(
        pool,
        &c,
        vec![WriteOp::Outcome {
            seq: 2,
            state: CallState::Succeeded,
            outcome: Some("{\"ok\":\"R-1\"}".into()),
            now_ms: T0 + 50,
            chain: Some("link-2".into()),
        }],
    )
    .unwrap();
    let calls = calls_of(store.as_ref(), "a");
    let expected = CallRecord {
        state: CallState::Succeeded,
        outcome: Some("{\"ok\":\"R-1\"}".into()),
        finished_at_ms: Some(T0 + 50),
        chain: Some("link-2".into()),
        ..call(2, CallClass::Write, CallState::Started)
    };
    assert_eq!(calls[1], expected);
    assert_eq!(calls[0], call(1, CallClass::Observe, CallState::Succeeded));
    commit(pool, &c, vec![finished(3)]).unwrap();
    let page = store.calls("a", 2, 1).unwrap();
    assert_eq!(page.len(), 1);
    assert_eq!(page[0].seq, 2);
}

pub fn attempts_and_logs_read_back_in_order(make: &Make) {
    let ledger = make();
    let pool = ledger.pool.as_ref();
    let store = ledger.store();
    new_run(store.as_ref(), "t", T0);
    let c = claim(store.as_ref(), "t", "w", T0);
    let attempt = |seq: u64, attempt: u32, result: &str| {
        WriteOp::Attempt(AttemptRecord {
            seq,
            attempt,
            kind: if attempt == 1 { "send" } else { "lookup" }.into(),
            started_at_ms: T0 + attempt as i64,
            finished_at_ms: T0 + attempt as i64 + 1,
            result: result.into(),
            detail: (result != "ok").then(|| format!("detail {attempt}")),
        })
    };
    let log = |after_seq: u64, message: &str| {
        WriteOp::Log(LogRecord {
            after_seq,
            level: "info".into(),
            message: message.into(),
            at_ms: T0,
        })
    };
    // A read's attempts come before its row in the commit; a write's
    // after its `started` row, in a later commit.
    commit(
        pool,
        &c,
        vec![
            attempt(1, 1, "retryable"),
            attempt(1, 2, "ok"),
            WriteOp::Call(call(1, CallClass::Read, CallState::Succeeded)),
            log(1, "first"),
            WriteOp::Started(call(2, CallClass::Write, CallState::Started)),
        ],
    )
    .unwrap();
    commit(pool, &c, vec![attempt(2, 1, "retryable"), log(1, "second")]).unwrap();
    commit(
        pool,
        &c,
        vec![
            attempt(2, 2, "ok"),
            WriteOp::Outcome {
                seq: 2,
                state: CallState::Succeeded,
                outcome: Some("{\"ok\":2}".into()),
                now_ms: T0,
                chain: None,
            },
            log(2, "third"),
        ],
    )
    .unwrap();
    let all: Vec<(u64, u32, String)> = store
        .attempts("t", None)
        .unwrap()
        .into_iter()
        .map(|a| (a.seq, a.attempt, a.result))
        .collect();
    assert_eq!(
        all,
        [
            (1, 1, "retryable".to_string()),
            (1, 2, "ok".to_string()),
            (2, 1, "retryable".to_string()),
            (2, 2, "ok".to_string())
        ]
    );
    let second = store.attempts("t", Some(2)).unwrap();
    assert_eq!(second.len(), 2);
    assert_eq!(second[0].detail.as_deref(), Some("detail 1"));
    assert_eq!(second[1].kind, "lookup");
    let logs: Vec<(u64, String)> = store
        .logs("t")
        .unwrap()
        .into_iter()
        .map(|l| (l.after_seq, l.message))
        .collect();
    assert_eq!(
        logs,
        [
            (1, "first".to_string()),
            (1, "second".to_string()),
            (2, "third".to_string())
        ]
    );
}

pub fn a_person_approves_a_waiting_call_once_and_the_run_is_due_with_a_new_fence(make: &Make) {
    let ledger = make();
    let store = ledger.store();
    let asked = waiting_for_approval(&ledger, "ap", 3_600);
    commit(
        ledger.pool.as_ref(),
        &asked,
        vec![end(
            RunEnd::Waiting {
                wake_at_ms: Some(T0 + 3_600_000),
            },
            T0,
        )],
    )
    .unwrap();
    let open = store
        .open_calls(CallState::Started, Some(approvals::INTERFACE))
        .unwrap();
    assert_eq!(open.len(), 1);
    assert_eq!((open[0].run.run_id.as_str(), open[0].call.seq), ("ap", 1));
    let before = store.run("ap").unwrap();
    assert!(!lifecycle::is_due(&before, T0 + 10));
    // Approving needs the details' sha256 the person was shown: none, too
    // short a prefix, or another's is refused and changes nothing.
    for seen in [None, Some(&DETAILS_SHA256[..4]), Some("0123456789ab")] {
        let blind = settle::decide_approval(
            store.as_ref(),
            &Signer::plain(),
            "ap",
            1,
            &Decision {
                details_sha256: seen,
                ..decision(Verdict::Approved, "ana", None)
            },
            T0 + 10,
        );
        assert!(
            matches!(blind, Err(StoreError::NotDecidable { .. })),
            "{seen:?}: {blind:?}"
        );
    }
    assert_eq!(store.run("ap").unwrap().version, before.version);
    settle::decide_approval(
        store.as_ref(),
        &Signer::plain(),
        "ap",
        1,
        &decision(Verdict::Approved, "ana", Some("ok")),
        T0 + 10,
    )
    .unwrap();
    let run = store.run("ap").unwrap();
    assert_eq!(run.status, RunStatus::Running);
    assert_eq!(run.owner, None);
    assert_eq!(run.fence, before.fence + 1);
    assert!(lifecycle::is_due(&run, T0 + 10));
    let decided = &calls_of(store.as_ref(), "ap")[0];
    assert_eq!(decided.state, CallState::Succeeded);
    assert_eq!(decided.resolved_by.as_deref(), Some("ana"));
    // The decision is linked with who made it, and the run's row sealed
    // with it as the chain's head.
    let link = Signer::plain().link("ap", "", &stephost_core::chain::Finished::recorded(decided));
    assert_eq!(decided.chain.as_deref(), Some(link.as_str()));
    Signer::plain()
        .verify(&calls_of(store.as_ref(), "ap"), &run)
        .unwrap_or_else(|broken| {
            panic!("the backend dropped or changed the seal ({broken}): {run:?}")
        });
    let outcome: serde_json::Value =
        serde_json::from_str(decided.outcome.as_deref().unwrap()).unwrap();
    let decided: serde_json::Value = serde_json::from_str(outcome["ok"].as_str().unwrap()).unwrap();
    assert_eq!(decided["verdict"], "approved");
    assert_eq!(decided["by"], "ana");
    assert!(
        store
            .open_calls(CallState::Started, Some(approvals::INTERFACE))
            .unwrap()
            .is_empty()
    );
    let again = settle::decide_approval(
        store.as_ref(),
        &Signer::plain(),
        "ap",
        1,
        &decision(Verdict::Rejected, "bo", None),
        T0 + 11,
    );
    assert!(
        matches!(again, Err(StoreError::NotDecidable { .. })),
        "{again:?}"
    );
    let counted = store
        .counters()
        .unwrap()
        .into_iter()
        .find(|(n, _)| n == "approvals_decided_total");
    assert_eq!(counted, Some(("approvals_decided_total".to_string(), 1)));
}

pub fn an_expired_or_misaimed_approval_is_refused(make: &Make) {
    let ledger = make();
    let store = ledger.store();
    waiting_for_approval(&ledger, "ex", 1);
    let late = settle::decide_approval(
        store.as_ref(),
        &Signer::plain(),
        "ex",
        1,
        &decision(Verdict::Approved, "ana", None),
        T0 + 1_001,
    );
    assert!(
        matches!(late, Err(StoreError::NotDecidable { ref reason, .. }) if reason.contains("expired")),
        "{late:?}"
    );
    let missing = settle::decide_approval(
        store.as_ref(),
        &Signer::plain(),
        "ex",
        9,
        &decision(Verdict::Approved, "ana", None),
        T0,
    );
    assert!(
        matches!(missing, Err(StoreError::NotDecidable { .. })),
        "{missing:?}"
    );
    let nobody = settle::decide_approval(
        store.as_ref(),
        &Signer::plain(),
        "ex",
        1,
        &decision(Verdict::Approved, " ", None),
        T0,
    );
    assert!(
        matches!(nobody, Err(StoreError::NotDecidable { .. })),
        "{nobody:?}"
    );
    assert_eq!(calls_of(store.as_ref(), "ex")[0].state, CallState::Started);
    // A call that is not an approval is not decided as one.
    new_run(store.as_ref(), "w", T0);
    let c = claim(store.as_ref(), "w", "w", T0);
    commit(
        ledger.pool.as_ref(),
        &c,
        vec![WriteOp::Started(call(
            1,
            CallClass::Write,
            CallState::Started,
        ))],
    )
    .unwrap();
    let misaimed = settle::decide_approval(
        store.as_ref(),
        &Signer::plain(),
        "w",
        1,
        &decision(Verdict::Approved, "ana", None),
        T0,
    );
    assert!(
        matches!(misaimed, Err(StoreError::NotDecidable { .. })),
        "{misaimed:?}"
    );
}

pub fn a_persons_decision_supersedes_a_concurrent_execution(make: &Make) {
    let ledger = make();
    let store = ledger.store();
    // The execution is still running (it has not suspended yet).
    let running = waiting_for_approval(&ledger, "sup", 3_600);
    settle::decide_approval(
        store.as_ref(),
        &Signer::plain(),
        "sup",
        1,
        &decision(Verdict::Rejected, "ana", None),
        T0 + 5,
    )
    .unwrap();
    let stale = commit(
        ledger.pool.as_ref(),
        &running,
        vec![end(RunEnd::Waiting { wake_at_ms: None }, T0 + 6)],
    );
    assert!(matches!(stale, Err(StoreError::Fenced { .. })), "{stale:?}");
    let run = store.run("sup").unwrap();
    assert_eq!(run.status, RunStatus::Running);
    assert!(lifecycle::is_due(&run, T0 + 6));
}

/// A person decides an approval while the execution that asked it commits
/// its outcome (it expired, say) and its end: one of them wins, the other is
/// refused as stale or already decided. Both lock the run's row before its
/// call's, so they never wait on each other in a cycle.
pub fn a_decision_racing_an_executions_commit_on_its_call_never_deadlocks(make: &Make) {
    let ledger = make();
    for round in 0..24 {
        let run_id = format!("race-{round}");
        let running = waiting_for_approval(&ledger, &run_id, 3_600);
        let pool = ledger.pool.as_ref();
        let barrier = Barrier::new(2);
        let (committed, decided) = std::thread::scope(|scope| {
            let execution = scope.spawn(|| {
                barrier.wait();
                commit(
                    pool,
                    &running,
                    vec![
                        WriteOp::Outcome {
                            seq: 1,
                            state: CallState::Succeeded,
                            outcome: Some("{\"ok\":\"expired\"}".into()),
                            now_ms: T0 + 7,
                            chain: None,
                        },
                        end(completed("{}"), T0 + 7),
                    ],
                )
            });
            let person = scope.spawn(|| {
                let store = pool.store().expect("a store");
                barrier.wait();
                settle::decide_approval(
                    store.as_ref(),
                    &Signer::plain(),
                    &run_id,
                    1,
                    &decision(Verdict::Approved, "ana", None),
                    T0 + 7,
                )
            });
            (execution.join().unwrap(), person.join().unwrap())
        });
        match (&committed, &decided) {
            (Ok(()), Err(StoreError::NotDecidable { .. } | StoreError::NotClaimable { .. }))
            | (Err(StoreError::Fenced { .. }), Ok(())) => {}
            other => panic!("round {round}: {other:?}"),
        }
    }
}

pub fn an_unknown_call_is_resolved_once_and_only_if_unknown(make: &Make) {
    let ledger = make();
    let pool = ledger.pool.as_ref();
    let store = ledger.store();
    new_run(store.as_ref(), "u", T0);
    let c = claim(store.as_ref(), "u", "w", T0);
    commit(
        pool,
        &c,
        vec![
            finished(1),
            WriteOp::Started(call(2, CallClass::Write, CallState::Started)),
        ],
    )
    .unwrap();
    let early = settle::resolve(
        store.as_ref(),
        &Signer::plain(),
        "u",
        2,
        &Resolution::Succeeded("{}".into()),
        "ana",
        T0,
    );
    assert!(
        matches!(early, Err(StoreError::NotUnknown { .. })),
        "{early:?}"
    );
    commit(
        pool,
        &c,
        vec![
            WriteOp::Outcome {
                seq: 2,
                state: CallState::Unknown,
                outcome: None,
                now_ms: T0,
                chain: None,
            },
            end(
                RunEnd::Parked {
                    error: "unknown_outcome".into(),
                },
                T0,
            ),
        ],
    )
    .unwrap();
    let open = store.open_calls(CallState::Unknown, None).unwrap();
    assert_eq!(open.len(), 1);
    assert_eq!(open[0].run.status, RunStatus::Parked);
    settle::resolve(
        store.as_ref(),
        &Signer::plain(),
        "u",
        2,
        &Resolution::Failed("the supplier never got it".into()),
        "ana",
        T0 + 9,
    )
    .unwrap();
    let call = &calls_of(store.as_ref(), "u")[1];
    assert_eq!(call.state, CallState::Failed);
    assert_eq!(call.resolved_by.as_deref(), Some("ana"));
    assert!(
        call.outcome
            .as_deref()
            .unwrap()
            .contains("the supplier never got it")
    );
    let run = store.run("u").unwrap();
    assert_eq!(
        (run.status, run.error.as_deref()),
        (RunStatus::Running, None)
    );
    assert_eq!(run.fence, c.fence + 1);
    let again = settle::resolve(
        store.as_ref(),
        &Signer::plain(),
        "u",
        2,
        &Resolution::Succeeded("{}".into()),
        "bo",
        T0 + 10,
    );
    assert!(
        matches!(again, Err(StoreError::NotUnknown { ref state, .. }) if state == "failed"),
        "{again:?}"
    );
    assert!(
        store
            .open_calls(CallState::Unknown, None)
            .unwrap()
            .is_empty()
    );
}

pub fn a_timer_waits_out_of_memory_until_it_is_due(make: &Make) {
    let ledger = make();
    let store = ledger.store();
    new_run(store.as_ref(), "sleep", T0);
    let c = claim(store.as_ref(), "sleep", "w", T0);
    let wake = T0 + 60_000;
    commit(
        ledger.pool.as_ref(),
        &c,
        vec![
            WriteOp::Started(call(1, CallClass::Suspend, CallState::Started)),
            end(
                RunEnd::Waiting {
                    wake_at_ms: Some(wake),
                },
                T0,
            ),
        ],
    )
    .unwrap();
    let run = store.run("sleep").unwrap();
    assert_eq!(
        (run.status, run.owner.as_deref(), run.wake_at_ms),
        (RunStatus::Waiting, None, Some(wake))
    );
    let early = lifecycle::claim(
        store.as_ref(),
        "sleep",
        "w2",
        LEASE_MS,
        wake - 1,
        ClaimMode::Due,
        ALIVE,
    );
    assert!(
        matches!(early, Err(StoreError::NotClaimable { .. })),
        "{early:?}"
    );
    let woken = lifecycle::claim(
        store.as_ref(),
        "sleep",
        "w2",
        LEASE_MS,
        wake,
        ClaimMode::Due,
        ALIVE,
    )
    .expect("due at its wake time");
    let run = store.run("sleep").unwrap();
    assert_eq!(
        (run.status, run.wake_at_ms, run.fence),
        (RunStatus::Running, None, woken.fence)
    );
}

pub fn renewal_extends_a_live_claim_and_release_makes_the_run_due(make: &Make) {
    let ledger = make();
    let store = ledger.store();
    new_run(store.as_ref(), "l", T0);
    let c = claim(store.as_ref(), "l", "w", T0);
    assert!(lifecycle::renew(store.as_ref(), &c, T0 + 20_000).unwrap());
    let run = store.run("l").unwrap();
    assert_eq!(run.lease_until_ms, Some(T0 + 20_000 + LEASE_MS));
    // A renewal inside a commit, as an execution makes it.
    commit(
        ledger.pool.as_ref(),
        &c,
        vec![
            finished(1),
            WriteOp::Lease {
                until_ms: T0 + 90_000,
            },
        ],
    )
    .unwrap();
    let run = store.run("l").unwrap();
    assert_eq!(run.lease_until_ms, Some(T0 + 90_000));
    assert!(!lifecycle::is_due(&run, T0 + 89_999));
    lifecycle::release(store.as_ref(), &c, T0 + 30_000).unwrap();
    let run = store.run("l").unwrap();
    assert_eq!((run.owner.as_deref(), run.lease_until_ms), (None, None));
    assert!(lifecycle::is_due(&run, T0 + 30_000));
    // Once given up, there is nothing to renew.
    assert!(!lifecycle::renew(store.as_ref(), &c, T0 + 31_000).unwrap());
}

pub fn repin_moves_an_unheld_run_and_refuses_a_held_or_finished_one(make: &Make) {
    let ledger = make();
    let store = ledger.store();
    new_run(store.as_ref(), "p", T0);
    lifecycle::repin(
        store.as_ref(),
        &Signer::plain(),
        "p",
        &Repin {
            from: "module-a",
            to: "module-b",
            step: Some("step@2"),
        },
        T0,
        ALIVE,
    )
    .unwrap();
    let run = store.run("p").unwrap();
    assert_eq!(
        (run.module_digest.as_str(), run.step.as_deref()),
        ("module-b", Some("step@2"))
    );
    let stale = lifecycle::repin(
        store.as_ref(),
        &Signer::plain(),
        "p",
        &Repin {
            from: "module-a",
            to: "module-c",
            step: None,
        },
        T0,
        ALIVE,
    );
    assert!(
        matches!(stale, Err(StoreError::RepinConflict { .. })),
        "{stale:?}"
    );
    // A claim whose lease lapsed (its holder stalled, not dead) loses its
    // fence to a repin: its next commit is refused.
    let stalled = claim(store.as_ref(), "p", "w", T0);
    lifecycle::repin(
        store.as_ref(),
        &Signer::plain(),
        "p",
        &Repin {
            from: "module-b",
            to: "module-b2",
            step: None,
        },
        stalled.lease_until_ms + 1,
        ALIVE,
    )
    .unwrap();
    let run = store.run("p").unwrap();
    assert_eq!(run.fence, stalled.fence + 1);
    assert_eq!(run.owner, None);
    let late = commit(ledger.pool.as_ref(), &stalled, vec![finished(1)]);
    assert!(
        matches!(late, Err(StoreError::Fenced { .. })),
        "a stalled execution wrote under the new pin: {late:?}"
    );
    claim(store.as_ref(), "p", "w", stalled.lease_until_ms + 2);
    let held = lifecycle::repin(
        store.as_ref(),
        &Signer::plain(),
        "p",
        &Repin {
            from: "module-b2",
            to: "module-c",
            step: None,
        },
        stalled.lease_until_ms + 3,
        ALIVE,
    );
    assert!(
        matches!(held, Err(StoreError::RepinConflict { .. })),
        "{held:?}"
    );
    new_run(store.as_ref(), "q", T0);
    let c = claim(store.as_ref(), "q", "w", T0);
    commit(
        ledger.pool.as_ref(),
        &c,
        vec![end(
            RunEnd::Failed {
                error: "e".into(),
                exit_code: None,
            },
            T0,
        )],
    )
    .unwrap();
    let finished = lifecycle::repin(
        store.as_ref(),
        &Signer::plain(),
        "q",
        &Repin {
            from: "module-a",
            to: "module-b",
            step: None,
        },
        T0,
        ALIVE,
    );
    assert!(
        matches!(finished, Err(StoreError::RepinConflict { .. })),
        "{finished:?}"
    );
}

pub fn a_long_history_streams_back_whole_and_in_order(make: &Make) {
    const CALLS: u64 = 10_000;
    let ledger = make();
    let store = ledger.store();
    new_run(store.as_ref(), "long", T0);
    let c = claim(store.as_ref(), "long", "w", T0);
    let mut writer = ledger.pool.writer().unwrap();
    let mut seq = 0;
    while seq < CALLS - 1 {
        let ops: Vec<WriteOp> = (seq + 1..=(seq + 1000).min(CALLS - 1))
            .map(finished)
            .collect();
        seq += ops.len() as u64;
        writer.commit(&c, ops).wait().unwrap();
    }
    let last = call(CALLS, CallClass::Write, CallState::Started);
    writer
        .commit(
            &c,
            vec![
                WriteOp::Started(last.clone()),
                WriteOp::Attempt(AttemptRecord {
                    seq: CALLS,
                    attempt: 1,
                    kind: "send".into(),
                    started_at_ms: T0,
                    finished_at_ms: T0,
                    result: "retryable".into(),
                    detail: None,
                }),
            ],
        )
        .wait()
        .unwrap();
    writer.landed().unwrap();
    let mut history = store.history("long").unwrap();
    assert_eq!(history.len() as u64, CALLS);
    assert_eq!(
        history.last_attempts(),
        1,
        "the last call, in flight, has one attempt"
    );
    for i in 0..CALLS as usize {
        let got = history.get(i).unwrap().expect("every call arrives");
        assert_eq!(got.seq, i as u64 + 1);
    }
    assert!(history.get(CALLS as usize).unwrap().is_none());
    assert_eq!(history.into_calls().unwrap().pop(), Some(last));
    let middle = store.calls("long", 5_000, 3).unwrap();
    assert_eq!(
        middle.iter().map(|c| c.seq).collect::<Vec<_>>(),
        [5_000, 5_001, 5_002]
    );
}

pub fn large_bodies_and_conversations_read_back_byte_for_byte(make: &Make) {
    let ledger = make();
    let store = ledger.store();
    new_run(store.as_ref(), "big", T0);
    let c = claim(store.as_ref(), "big", "w", T0);
    let large = |seq: u64, request: String, outcome: String| {
        let mut call = call(seq, CallClass::Read, CallState::Succeeded);
        call.request_hash =
            stephost_core::ids::request_hash(&call.interface, &call.function, &request);
        call.request = request;
        call.outcome = Some(outcome);
        call
    };
    let answer = format!("{{\"ok\":\"{}\"}}", "a long answer ".repeat(300));
    let mut conversation = Vec::new();
    let mut expected = Vec::new();
    for seq in 1..=6u64 {
        conversation.push(format!(
            "{{\"role\":\"user\",\"content\":\"{} {seq}\"}}",
            "tell me more ".repeat(40)
        ));
        let request = format!(
            "{{\"messages\": [{}],\n\"max_tokens\": 9}}",
            conversation.join(",")
        );
        expected.push(large(seq, request, answer.clone()));
    }
    // A body that holds the part mark is kept whole.
    expected.push(large(
        7,
        format!("\"\u{1}{}\"", "m".repeat(2_000)),
        "{\"ok\":1}".into(),
    ));
    commit(
        ledger.pool.as_ref(),
        &c,
        expected.iter().cloned().map(WriteOp::Call).collect(),
    )
    .unwrap();
    assert_eq!(calls_of(store.as_ref(), "big"), expected);
    assert_eq!(
        store.history("big").unwrap().into_calls().unwrap(),
        expected
    );
}

pub fn counters_add_up_across_commits_and_stores(make: &Make) {
    let ledger = make();
    let store = ledger.store();
    new_run(store.as_ref(), "n", T0);
    let c = claim(store.as_ref(), "n", "w", T0);
    store
        .add_counters(&Counters::from([("a_total", 2), ("b_total", 1)]))
        .unwrap();
    commit(
        ledger.pool.as_ref(),
        &c,
        vec![WriteOp::Counters(Counters::from([("a_total", 3)]))],
    )
    .unwrap();
    ledger
        .store()
        .add_counters(&Counters::from([("b_total", 4)]))
        .unwrap();
    let mut counters = store.counters().unwrap();
    counters.sort();
    assert_eq!(
        counters,
        [("a_total".to_string(), 5), ("b_total".to_string(), 5)]
    );
}

fn notice(webhook: &str, event: NoticeEvent, run_id: &str, seq: Option<u64>) -> Notice {
    Notice {
        delivery_id: notices::delivery_id(webhook, event, run_id, seq),
        webhook: webhook.to_string(),
        event,
        run_id: run_id.to_string(),
        body: format!(r#"{{"run_id":"{run_id}"}}"#),
        created_at_ms: T0,
        state: NoticeState::Owed,
        next_at_ms: T0,
        attempts: 0,
        delivered_at_ms: None,
        last_error: None,
    }
}

pub fn notices_are_owed_once_taken_by_one_taker_and_settled_by_attempts(make: &Make) {
    let ledger = make();
    let (a, b) = (ledger.outbox(), ledger.outbox());
    let views = ledger.store();
    let parked = notice("ops", NoticeEvent::Parked, "r1", Some(2));
    let failed = notice("ops", NoticeEvent::Failed, "r2", None);
    assert_eq!(a.owe_notices(&[parked.clone(), failed.clone()]).unwrap(), 2);
    // Owing the same event again, from another store, adds nothing.
    let mut again = parked.clone();
    again.body = "changed".into();
    assert_eq!(b.owe_notices(&[again]).unwrap(), 0);
    assert_eq!(
        views.notices(None, 10).unwrap(),
        vec![parked.clone(), failed.clone()]
    );
    assert_eq!(views.notices(Some("r2"), 10).unwrap(), vec![failed.clone()]);

    let ops = vec!["ops".to_string()];
    // Another server's webhooks are not taken.
    assert!(
        a.take_notices(&["dev".to_string()], T0, T0 + 1_000, 10)
            .unwrap()
            .is_empty()
    );
    // Nothing is due before its time; a taker holds what it takes.
    assert!(
        a.take_notices(&ops, T0 - 1, T0 + 1_000, 10)
            .unwrap()
            .is_empty()
    );
    let taken = a.take_notices(&ops, T0, T0 + 1_000, 1).unwrap();
    assert_eq!(taken.len(), 1);
    assert_eq!(
        taken[0].delivery_id, parked.delivery_id,
        "the first owed first"
    );
    assert_eq!(taken[0].next_at_ms, T0 + 1_000);
    let other = b.take_notices(&ops, T0, T0 + 1_000, 10).unwrap();
    assert_eq!(other.len(), 1, "the other taker gets only the one not held");
    assert_ne!(other[0].delivery_id, taken[0].delivery_id);
    assert!(
        a.take_notices(&ops, T0 + 999, T0 + 2_000, 10)
            .unwrap()
            .is_empty()
    );

    // Attempts: a retry moves the time, a delivery ends it.
    let id = &parked.delivery_id;
    let retry = NoticeAttempt::Retry {
        next_at_ms: T0 + 5_000,
        error: "HTTP 500".into(),
    };
    // A taker whose hold lapsed records nothing.
    assert!(!a.notice_tried(id, T0 + 7, &retry).unwrap());
    assert!(a.notice_tried(id, T0 + 1_000, &retry).unwrap());
    let mut expected = parked.clone();
    notices::apply(&mut expected, &retry);
    let now = |store: &dyn Store| {
        store
            .notices(Some("r1"), 10)
            .unwrap()
            .into_iter()
            .next()
            .unwrap()
    };
    assert_eq!(now(views.as_ref()), expected);
    // Not due again before its time: only the other (its hold lapsed) is.
    let lapsed = b.take_notices(&ops, T0 + 4_999, T0 + 9_000, 10).unwrap();
    assert_eq!(lapsed.len(), 1);
    assert_eq!(lapsed[0].delivery_id, failed.delivery_id);
    let delivered = NoticeAttempt::Delivered { at_ms: T0 + 5_001 };
    // Taken again once due, then delivered.
    let again = a.take_notices(&ops, T0 + 5_000, T0 + 6_000, 10).unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].delivery_id, *id);
    assert!(a.notice_tried(id, T0 + 6_000, &delivered).unwrap());
    expected.next_at_ms = T0 + 6_000;
    notices::apply(&mut expected, &delivered);
    let found = now(views.as_ref());
    assert_eq!(found, expected);
    assert_eq!(
        (found.state, found.attempts, found.last_error.as_deref()),
        (NoticeState::Delivered, 2, Some("HTTP 500"))
    );
    let last = b.take_notices(&ops, i64::MAX, i64::MAX, 10).unwrap();
    assert_eq!(
        last.iter().map(|n| &n.delivery_id).collect::<Vec<_>>(),
        vec![&failed.delivery_id],
        "a delivered notice is not sent again"
    );

    // An abandoned one is not taken again either.
    assert!(
        a.notice_tried(
            &failed.delivery_id,
            i64::MAX,
            &NoticeAttempt::Abandoned {
                error: "HTTP 410".into(),
            },
        )
        .unwrap()
    );
    // A late answer of a lapsed taker does not undo a settled notice.
    assert!(!b.notice_tried(id, T0 + 6_000, &retry).unwrap());
    assert!(
        b.take_notices(&ops, i64::MAX, i64::MAX, 10)
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        views.notices(Some("r2"), 10).unwrap()[0].state,
        NoticeState::Abandoned
    );
}

pub fn notices_are_taken_earliest_due_first_whatever_their_creation_order(make: &Make) {
    let ledger = make();
    let store = ledger.outbox();
    // Owed first but due last, and the other way round.
    let mut late = notice("ops", NoticeEvent::Parked, "r1", Some(1));
    late.next_at_ms = T0 + 500;
    let mut early = notice("ops", NoticeEvent::Failed, "r2", None);
    early.created_at_ms = T0 + 1;
    early.next_at_ms = T0;
    let mut middle = notice("ops", NoticeEvent::Diverged, "r3", None);
    middle.created_at_ms = T0 + 2;
    middle.next_at_ms = T0 + 200;
    assert_eq!(
        store
            .owe_notices(&[late.clone(), early.clone(), middle.clone()])
            .unwrap(),
        3
    );
    let ops = vec!["ops".to_string()];
    let first = store.take_notices(&ops, T0 + 500, T0 + 1_000, 1).unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].delivery_id, early.delivery_id, "the earliest due");
    let rest: Vec<String> = store
        .take_notices(&ops, T0 + 500, T0 + 1_000, 10)
        .unwrap()
        .into_iter()
        .map(|n| n.delivery_id)
        .collect();
    assert_eq!(rest, [middle.delivery_id, late.delivery_id]);
}

pub fn a_runs_last_call_is_read_alone(make: &Make) {
    let ledger = make();
    let store = ledger.store();
    new_run(store.as_ref(), "a", T0);
    assert_eq!(store.last_call("a").unwrap(), None, "no call yet");
    let c = claim(store.as_ref(), "a", "w", T0);
    commit(
        ledger.pool.as_ref(),
        &c,
        vec![
            finished(1),
            finished(2),
            WriteOp::Started(call(3, CallClass::Write, CallState::Started)),
        ],
    )
    .unwrap();
    assert_eq!(
        store.last_call("a").unwrap(),
        Some(call(3, CallClass::Write, CallState::Started))
    );
    assert!(matches!(
        store.last_call("nope"),
        Err(StoreError::UnknownRun(_))
    ));
}

/// A promise's completion ([`stephost_core::promises`]) is kept once, with
/// an arrival in its run's inbox: a running run keeps its claim and fence;
/// a waiting one is due at once; an unknown or finished run is refused.
pub fn a_promise_is_completed_once_into_its_runs_inbox_and_wakes_it_if_it_waits(make: &Make) {
    use stephost_core::promises::{Completion, Kept, PromiseState};
    let ledger = make();
    let store = ledger.store();
    new_run(store.as_ref(), "r", T0);
    let run = claim(store.as_ref(), "r", "w", T0);
    let paid = |at_ms| Completion {
        state: PromiseState::Resolved,
        value: r#"{"paid":true}"#.into(),
        by: "acme".into(),
        at_ms,
    };
    assert_eq!(store.promise("r", 1).unwrap(), None);
    assert_eq!(
        store.complete_promise("r", 1, &paid(T0 + 1)).unwrap(),
        Kept::Now
    );
    assert_eq!(store.promise("r", 1).unwrap(), Some(paid(T0 + 1)));
    let declined = Completion {
        state: PromiseState::Rejected,
        value: "declined".into(),
        by: "bank".into(),
        at_ms: T0 + 2,
    };
    assert_eq!(
        store.complete_promise("r", 1, &declined).unwrap(),
        Kept::Already(paid(T0 + 1)),
        "the first completion stands"
    );
    let row = store.run("r").unwrap();
    assert_eq!(
        (row.status, row.fence, row.wake_at_ms),
        (RunStatus::Running, run.fence, None)
    );
    // The run waits (for a timer, say): the next completion makes it due.
    commit(
        ledger.pool.as_ref(),
        &run,
        vec![
            WriteOp::Started(call(1, CallClass::Suspend, CallState::Started)),
            end(
                RunEnd::Waiting {
                    wake_at_ms: Some(T0 + 60_000),
                },
                T0 + 3,
            ),
        ],
    )
    .unwrap();
    assert_eq!(
        store.complete_promise("r", 2, &declined).unwrap(),
        Kept::Now
    );
    let row = store.run("r").unwrap();
    assert_eq!(row.status, RunStatus::Waiting);
    assert_eq!(lifecycle::due_at(&row), Some(T0 + 2));
    assert_eq!(
        store
            .inbox("r")
            .unwrap()
            .iter()
            .map(|e| (e.arrival, e.child_run_id.as_str(), e.status))
            .collect::<Vec<_>>(),
        [
            (1, "promise:1", RunStatus::Completed),
            (2, "promise:2", RunStatus::Failed)
        ]
    );
    assert!(matches!(
        store.complete_promise("nope", 1, &paid(T0)),
        Err(StoreError::UnknownRun(_))
    ));
    new_run(store.as_ref(), "done", T0);
    let done = claim(store.as_ref(), "done", "w", T0);
    commit(
        ledger.pool.as_ref(),
        &done,
        vec![end(completed("1"), T0 + 1)],
    )
    .unwrap();
    assert!(matches!(
        store.complete_promise("done", 1, &paid(T0 + 2)),
        Err(StoreError::Ended { .. })
    ));
}

/// Trees' model spend ([`stephost_core::tree_spend`]): each run's figure
/// is written whole, what one handle writes another counts, trees are
/// apart, a hold past the cap is refused with what the rest of the tree
/// spent, and sixteen runs racing to hold never pass it together.
pub fn a_trees_model_spend_is_one_total_that_racing_holds_never_pass(make: &Make) {
    use stephost_core::Spent;
    let ledger = make();
    let (a, b) = (
        ledger.pool.tree_spends().expect("tree spends"),
        ledger.pool.tree_spends().expect("tree spends"),
    );
    let spent = |tokens, micro_usd| Spent { tokens, micro_usd };
    let cap = Some(spent(1_000, 100));
    assert_eq!(a.tree_spent("root").unwrap(), Spent::default());
    a.set_spent("root", "root", spent(300, 10), None)
        .unwrap()
        .unwrap();
    b.set_spent("root", "child-1", spent(500, 10), cap)
        .unwrap()
        .unwrap();
    // Written whole: the same figure again changes nothing; a smaller one
    // (a hold given back) replaces it.
    b.set_spent("root", "child-1", spent(500, 10), cap)
        .unwrap()
        .unwrap();
    assert_eq!(b.tree_spent("root").unwrap(), spent(800, 20));
    assert_eq!(
        a.set_spent("root", "child-2", spent(201, 0), cap).unwrap(),
        Err(spent(800, 20)),
        "past the tokens cap"
    );
    assert_eq!(
        a.set_spent("root", "child-2", spent(0, 81), cap).unwrap(),
        Err(spent(800, 20)),
        "past the cost cap"
    );
    a.set_spent("root", "child-2", spent(200, 80), cap)
        .unwrap()
        .unwrap();
    assert_eq!(a.tree_spent("root").unwrap(), spent(1_000, 100));
    b.set_spent("root", "child-1", spent(400, 10), None)
        .unwrap()
        .unwrap();
    assert_eq!(a.tree_spent("root").unwrap(), spent(900, 100));
    assert_eq!(a.tree_spent("other").unwrap(), Spent::default());
    // Racing holds of 100 tokens each, on a tree with room for 5.
    let won = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|scope| {
        for i in 0..16 {
            let spends = ledger.pool.tree_spends().expect("tree spends");
            let won = &won;
            scope.spawn(move || {
                let fits = spends
                    .set_spent(
                        "race",
                        &format!("run-{i}"),
                        spent(100, 0),
                        Some(spent(500, 0)),
                    )
                    .expect("a hold");
                if fits.is_ok() {
                    won.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            });
        }
    });
    assert_eq!(won.into_inner(), 5);
    assert_eq!(a.tree_spent("race").unwrap(), spent(500, 0));
}

/// Models' flow state ([`stephost_core::flow`]) is kept by the ledger: what one
/// handle takes, another sees; keys are apart; a pause holds every handle;
/// a slot one handle holds is held for all until given back.
pub fn a_models_flow_state_is_kept_by_the_ledger_for_every_handle(make: &Make) {
    use stephost_core::flow::{FlowCaps, FlowOp};
    let ledger = make();
    let (a, b) = (
        ledger.pool.flows().expect("flows"),
        ledger.pool.flows().expect("flows"),
    );
    let caps = FlowCaps {
        concurrency_max: None,
        requests_per_minute: Some(2),
        tokens_per_minute: None,
    };
    let take = |tokens| FlowOp::Take { tokens, holder: 1 };
    assert_eq!(a.flow("m", caps, take(1)).unwrap(), Ok(()));
    assert_eq!(b.flow("m", caps, take(1)).unwrap(), Ok(()));
    // The minute's two requests are taken: the third waits about 30 s.
    let wait = a.flow("m", caps, take(1)).unwrap().unwrap_err();
    assert!((20_000..=30_000).contains(&wait), "waits {wait} ms");
    // Another model is not held back by it.
    assert_eq!(b.flow("n", caps, take(1)).unwrap(), Ok(()));
    // Tokens: taken as estimated, settled as spent.
    let tokens = FlowCaps {
        concurrency_max: None,
        requests_per_minute: None,
        tokens_per_minute: Some(10_000),
    };
    assert_eq!(a.flow("t", tokens, take(8_000)).unwrap(), Ok(()));
    assert!(b.flow("t", tokens, take(8_000)).unwrap().is_err());
    a.flow(
        "t",
        tokens,
        FlowOp::Settle {
            taken: 8_000,
            used: 1_000,
        },
    )
    .unwrap()
    .unwrap();
    assert_eq!(b.flow("t", tokens, take(8_000)).unwrap(), Ok(()));
    // A pause one handle sets holds the other.
    b.flow("p", FlowCaps::default(), FlowOp::Pause { for_ms: 60_000 })
        .unwrap()
        .unwrap();
    let wait = a
        .flow("p", FlowCaps::default(), take(1))
        .unwrap()
        .unwrap_err();
    assert!((50_000..=60_000).contains(&wait), "waits {wait} ms");
    // One call in flight at once, whichever handle sends it.
    let one = FlowCaps {
        concurrency_max: Some(1),
        ..FlowCaps::default()
    };
    let take_for = |holder| FlowOp::Take { tokens: 1, holder };
    assert_eq!(a.flow("s", one, take_for(7)).unwrap(), Ok(()));
    let wait = b.flow("s", one, take_for(8)).unwrap().unwrap_err();
    assert!(
        (1..=stephost_core::flow::SLOT_LEASE_MS).contains(&wait),
        "waits {wait} ms"
    );
    a.flow("s", one, FlowOp::Renew { holder: 7 })
        .unwrap()
        .unwrap();
    assert!(b.flow("s", one, take_for(8)).unwrap().is_err());
    a.flow("s", one, FlowOp::Release { holder: 7 })
        .unwrap()
        .unwrap();
    assert_eq!(b.flow("s", one, take_for(8)).unwrap(), Ok(()));
}

/// A run's own model budget ([`stephost_core::limits::RunBudget`]) is kept with its
/// row, in every read of it; a raise replaces the bounds it gives, reseals
/// the row, and is refused once the run has finished.
pub fn a_runs_own_budget_is_kept_raised_sealed_and_listed(make: &Make) {
    use stephost_core::limits::RunBudget;
    let ledger = make();
    let store = ledger.store();
    let store = store.as_ref();
    let signer =
        stephost_core::chain::Signer::keyed(b"conformance-key-of-32-bytes-or-so").expect("a key");
    let budget = RunBudget {
        model_tokens_max: Some(500),
        model_cost_micro_usd_max: None,
    };
    let run = NewRun {
        run_id: "b",
        module_digest: "module-a",
        step: None,
        world: WORLD,
        input: "{}",
        now_ms: T0,
        budget,
    }
    .record(None);
    let run = RunRecord {
        seal: Some(signer.seal(&run, &stephost_core::chain::Head::default())),
        ..run
    };
    assert_eq!(store.insert_run(&run).unwrap().budget, budget);
    assert_eq!(store.run("b").unwrap().budget, budget);
    assert_eq!(store.due_runs(10).unwrap()[0].budget, budget);
    let raised = RunBudget {
        model_tokens_max: None,
        model_cost_micro_usd_max: Some(9_000),
    };
    lifecycle::set_budget(store, &signer, "b", &raised, T0 + 1).unwrap();
    let now = store.run("b").unwrap();
    assert_eq!(
        now.budget,
        RunBudget {
            model_tokens_max: Some(500),
            model_cost_micro_usd_max: Some(9_000),
        }
    );
    stephost_core::settle::check_record(store, &signer, &now).expect("resealed");
    // Raised behind the host's back, the seal no longer holds.
    let forged = RunRecord {
        budget: RunBudget::default(),
        version: now.version + 1,
        ..now.clone()
    };
    store.swap_run(now.version, &forged, true).unwrap();
    assert!(stephost_core::settle::check_record(store, &signer, &forged).is_err());
    // A new run without one has none.
    assert!(new_run(store, "n", T0).budget.is_empty());
}

/// A run's trace ([`stephost_core::trace::RunTrace`]) is kept as it was recorded,
/// by a plain insert or an execution's first commit, in every read of the
/// run, through claims, commits and its end; a run recorded without one
/// reads back without one.
pub fn a_runs_trace_is_kept_from_its_record_through_its_claims_and_end(make: &Make) {
    use stephost_core::trace::RunTrace;
    let ledger = make();
    let store = ledger.store();
    let store = store.as_ref();
    let trace = RunTrace::from_traceparent(
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        Some("vendor=a b"),
    )
    .unwrap();
    let new = bare("t");
    let inserted = RunRecord {
        trace: Some(trace.clone()),
        ..new.record(None)
    };
    assert_eq!(
        store.insert_run(&inserted).unwrap().trace.as_ref(),
        Some(&trace)
    );
    assert_eq!(store.due_runs(10).unwrap()[0].trace.as_ref(), Some(&trace));
    let listed = store
        .runs(&stephost_core::store::RunQuery::default())
        .unwrap();
    assert_eq!(listed[0].trace.as_ref(), Some(&trace));
    let claim = claim(store, "t", "w1", T0 + 1);
    commit(
        ledger.pool.as_ref(),
        &claim,
        vec![WriteOp::End(lifecycle::ended(&completed("{}"), T0 + 2))],
    )
    .unwrap();
    let ended = store.run("t").unwrap();
    assert_eq!(ended.status, RunStatus::Completed);
    assert_eq!(ended.trace.as_ref(), Some(&trace));
    // Recorded by an execution's first commit.
    let created = bare("u");
    let first = lifecycle::first_claim("u", "w1", LEASE_MS, T0);
    let own = RunTrace::new(false);
    commit(
        ledger.pool.as_ref(),
        &first,
        vec![WriteOp::Create(Box::new(RunRecord {
            trace: Some(own.clone()),
            ..created.record(Some(&first))
        }))],
    )
    .unwrap();
    assert_eq!(store.run("u").unwrap().trace, Some(own));
    // A run recorded without one: none kept, one derived from its id.
    let old = new_run(store, "v", T0);
    assert_eq!(old.trace, None);
    assert_eq!(
        store.run("v").unwrap().trace().trace_id,
        RunTrace::of_run_id("v").trace_id
    );
}

/// Call `seq` of run `parent` starting child `child` in join set `set`:
/// the call (finished) and the child's row.
fn spawn(parent: &str, seq: u64, child: &str, set: &str) -> WriteOp {
    let mut started = call(seq, CallClass::Write, CallState::Succeeded);
    started.interface = "stephost:step/runs".into();
    started.function = "start".into();
    started.outcome = Some(serde_json::json!({ "run_id": child }).to_string());
    let mut row = bare(child).record(None);
    row.parent = Some(stephost_core::ParentRef {
        run_id: parent.into(),
        seq,
        join_set: set.into(),
        detached: false,
    });
    row.root_run_id = Some(parent.into());
    WriteOp::Spawn {
        call: started,
        child: Box::new(row),
    }
}

/// A child's end, as its execution commits it.
fn child_end(parent: &str, child: &str, set: &str, end: RunEnd, now_ms: i64) -> WriteOp {
    let mut row = lifecycle::ended(&end, now_ms);
    row.arrival = Some(stephost_core::ChildArrival {
        parent_run_id: parent.into(),
        child_run_id: child.into(),
        join_set: set.into(),
        status: row.status,
        at_ms: now_ms,
    });
    WriteOp::End(row)
}

pub fn a_child_is_started_with_its_parents_call_in_one_commit_or_not_at_all(make: &Make) {
    let ledger = make();
    let store = ledger.store();
    new_run(store.as_ref(), "p", T0);
    let c = claim(store.as_ref(), "p", "w", T0);
    commit(ledger.pool.as_ref(), &c, vec![spawn("p", 1, "c1", "s")]).unwrap();
    let child = store.run("c1").expect("the child is recorded");
    assert_eq!(child.status, RunStatus::Pending);
    assert_eq!(
        child
            .parent
            .as_ref()
            .map(|p| (p.run_id.as_str(), p.seq, p.join_set.as_str())),
        Some(("p", 1, "s"))
    );
    assert_eq!(child.root_run_id.as_deref(), Some("p"));
    assert_eq!(calls_of(store.as_ref(), "p")[0].state, CallState::Succeeded);
    assert_eq!(
        store
            .children("p")
            .unwrap()
            .iter()
            .map(|r| r.run_id.clone())
            .collect::<Vec<_>>(),
        ["c1"]
    );
    assert!(store.children("c1").unwrap().is_empty());
    assert!(
        lifecycle::due_at(&child).is_some(),
        "a new child is due for a worker"
    );

    // A start under a stale fence writes neither the call nor the child.
    let stale = Claim {
        fence: c.fence - 1,
        ..c.clone()
    };
    let refused = commit(ledger.pool.as_ref(), &stale, vec![spawn("p", 2, "c2", "s")]);
    assert!(
        matches!(refused, Err(StoreError::Fenced { .. })),
        "{refused:?}"
    );
    assert!(matches!(store.run("c2"), Err(StoreError::UnknownRun(_))));
    // A child id that exists fails the commit whole: the call is not kept.
    new_run(store.as_ref(), "taken", T0);
    let refused = commit(ledger.pool.as_ref(), &c, vec![spawn("p", 2, "taken", "s")]);
    assert!(
        matches!(refused, Err(StoreError::RunExists { .. })),
        "{refused:?}"
    );
    assert_eq!(calls_of(store.as_ref(), "p").len(), 1);
    commit(ledger.pool.as_ref(), &c, vec![spawn("p", 2, "c2", "s")]).unwrap();
    assert_eq!(store.children("p").unwrap().len(), 2);
}

pub fn a_childs_end_reaches_its_parents_inbox_once_and_wakes_it_if_it_waits(make: &Make) {
    let ledger = make();
    let store = ledger.store();
    new_run(store.as_ref(), "p", T0);
    let parent = claim(store.as_ref(), "p", "w", T0);
    commit(
        ledger.pool.as_ref(),
        &parent,
        vec![spawn("p", 1, "a", "s"), spawn("p", 2, "b", "s")],
    )
    .unwrap();
    // Child a ends while its parent runs: the parent keeps its claim and
    // its fence, and finds the end in its inbox.
    let a = claim(store.as_ref(), "a", "w2", T0 + 1);
    commit(
        ledger.pool.as_ref(),
        &a,
        vec![child_end("p", "a", "s", completed("1"), T0 + 2)],
    )
    .unwrap();
    let row = store.run("p").unwrap();
    assert_eq!(
        (row.status, row.fence, row.wake_at_ms),
        (RunStatus::Running, parent.fence, None)
    );
    let inbox = store.inbox("p").unwrap();
    assert_eq!(
        inbox
            .iter()
            .map(|e| (e.arrival, e.child_run_id.as_str(), e.status))
            .collect::<Vec<_>>(),
        [(1, "a", RunStatus::Completed)]
    );
    // The parent still writes under its claim, and waits.
    commit(
        ledger.pool.as_ref(),
        &parent,
        vec![
            WriteOp::Started(call(3, CallClass::Suspend, CallState::Started)),
            end(RunEnd::Waiting { wake_at_ms: None }, T0 + 3),
        ],
    )
    .unwrap();
    assert_eq!(
        lifecycle::due_at(&store.run("p").unwrap()),
        None,
        "waits for b"
    );
    // Child b fails: the waiting parent is due at once, its fence kept.
    let b = claim(store.as_ref(), "b", "w2", T0 + 4);
    commit(
        ledger.pool.as_ref(),
        &b,
        vec![child_end(
            "p",
            "b",
            "s",
            RunEnd::Failed {
                error: "no".into(),
                exit_code: None,
            },
            T0 + 5,
        )],
    )
    .unwrap();
    let row = store.run("p").unwrap();
    assert_eq!(row.status, RunStatus::Waiting);
    assert_eq!(
        row.fence, parent.fence,
        "a child's end never moves the fence"
    );
    assert_eq!(lifecycle::due_at(&row), Some(T0 + 5));
    let inbox = store.inbox("p").unwrap();
    assert_eq!(
        inbox
            .iter()
            .map(|e| (e.arrival, e.child_run_id.as_str(), e.status))
            .collect::<Vec<_>>(),
        [(1, "a", RunStatus::Completed), (2, "b", RunStatus::Failed)]
    );
    assert!(matches!(
        store.inbox("nobody"),
        Err(StoreError::UnknownRun(_))
    ));
}

pub fn a_parent_that_waits_after_a_child_ended_unseen_is_due_at_once(make: &Make) {
    let ledger = make();
    let store = ledger.store();
    new_run(store.as_ref(), "p", T0);
    let parent = claim(store.as_ref(), "p", "w", T0);
    commit(ledger.pool.as_ref(), &parent, vec![spawn("p", 1, "a", "s")]).unwrap();
    // The parent looked at its inbox (empty) and decides to wait; the
    // child ends before the parent's end commits.
    let a = claim(store.as_ref(), "a", "w2", T0 + 1);
    commit(
        ledger.pool.as_ref(),
        &a,
        vec![child_end("p", "a", "s", completed("1"), T0 + 2)],
    )
    .unwrap();
    let mut waits = lifecycle::ended(&RunEnd::Waiting { wake_at_ms: None }, T0 + 3);
    waits.inbox_seen = Some(0);
    commit(
        ledger.pool.as_ref(),
        &parent,
        vec![
            WriteOp::Started(call(2, CallClass::Suspend, CallState::Started)),
            WriteOp::End(waits),
        ],
    )
    .unwrap();
    let row = store.run("p").unwrap();
    assert_eq!(row.status, RunStatus::Waiting);
    assert_eq!(
        lifecycle::due_at(&row),
        Some(T0 + 3),
        "the end it had not seen makes it due: no wake-up is lost"
    );
    // Having seen it, it would wait.
    new_run(store.as_ref(), "q", T0);
    let q = claim(store.as_ref(), "q", "w", T0);
    let mut waits = lifecycle::ended(&RunEnd::Waiting { wake_at_ms: None }, T0 + 3);
    waits.inbox_seen = Some(0);
    commit(ledger.pool.as_ref(), &q, vec![WriteOp::End(waits)]).unwrap();
    assert_eq!(lifecycle::due_at(&store.run("q").unwrap()), None);
}

fn cancel_request(by: &str) -> stephost_core::CancelRequest {
    stephost_core::CancelRequest {
        at_ms: T0 + 100,
        by: by.into(),
        reason: Some("test".into()),
    }
}

pub fn a_cancel_marks_a_tree_at_once_and_a_marked_run_begins_nothing(make: &Make) {
    let ledger = make();
    let store = ledger.store();
    new_run(store.as_ref(), "p", T0);
    let p = claim(store.as_ref(), "p", "w", T0);
    commit(
        ledger.pool.as_ref(),
        &p,
        vec![spawn("p", 1, "a", "s"), spawn("p", 2, "b", "s")],
    )
    .unwrap();
    let b = claim(store.as_ref(), "b", "w2", T0 + 1);
    commit(ledger.pool.as_ref(), &b, vec![spawn("b", 1, "b1", "t")]).unwrap();
    // b1 waits (for a child it never started: any wait will do).
    let b1 = claim(store.as_ref(), "b1", "w3", T0 + 2);
    commit(
        ledger.pool.as_ref(),
        &b1,
        vec![
            WriteOp::Started(call(1, CallClass::Suspend, CallState::Started)),
            end(RunEnd::Waiting { wake_at_ms: None }, T0 + 3),
        ],
    )
    .unwrap();
    assert_eq!(lifecycle::due_at(&store.run("b1").unwrap()), None);

    let marked = store.cancel("p", &cancel_request("ops")).unwrap();
    assert_eq!(marked, ["p", "a", "b", "b1"], "the tree, top down");
    for id in ["p", "a", "b", "b1"] {
        let run = store.run(id).unwrap();
        assert_eq!(run.cancel, Some(cancel_request("ops")), "{id}");
    }
    // Held runs keep their claim; idle ones are due at once for a worker.
    assert_eq!(store.run("p").unwrap().owner.as_deref(), Some("w"));
    assert_eq!(
        store.run("p").unwrap().fence,
        p.fence,
        "the mark moves no fence"
    );
    assert_eq!(lifecycle::due_at(&store.run("b1").unwrap()), Some(T0 + 100));
    assert!(lifecycle::due_at(&store.run("a").unwrap()).is_some());

    // A held run begins nothing more: no write or wait, no child. What the
    // refused commit records of a call already made lands all the same.
    let refused = commit(
        ledger.pool.as_ref(),
        &p,
        vec![
            finished(3),
            WriteOp::Started(call(4, CallClass::Write, CallState::Started)),
        ],
    );
    assert!(
        matches!(refused, Err(StoreError::Cancelled { .. })),
        "{refused:?}"
    );
    assert_eq!(
        calls_of(store.as_ref(), "p").len(),
        3,
        "the finished call is recorded, the start is not"
    );
    let refused = commit(ledger.pool.as_ref(), &p, vec![spawn("p", 4, "c", "s")]);
    assert!(
        matches!(refused, Err(StoreError::Cancelled { .. })),
        "{refused:?}"
    );
    assert!(matches!(store.run("c"), Err(StoreError::UnknownRun(_))));
    // The end lands, through a writer whose commit was just refused.
    let mut writer = ledger.pool.writer().unwrap();
    let refused = writer
        .commit(
            &p,
            vec![WriteOp::Started(call(
                4,
                CallClass::Write,
                CallState::Started,
            ))],
        )
        .wait();
    assert!(
        matches!(refused, Err(StoreError::Cancelled { .. })),
        "{refused:?}"
    );
    let ended = writer.commit(
        &p,
        vec![end(
            RunEnd::Cancelled {
                error: "cancelled by ops: test".into(),
            },
            T0 + 200,
        )],
    );
    ended.wait().unwrap();
    writer.landed().unwrap();
    let run = store.run("p").unwrap();
    assert_eq!(
        (run.status, calls_of(store.as_ref(), "p").len()),
        (RunStatus::Cancelled, 3)
    );
    // A finished run is not cancelled; a marked tree is not marked twice.
    let ended = store.cancel("p", &cancel_request("ops"));
    assert!(matches!(ended, Err(StoreError::Ended { .. })), "{ended:?}");
    assert!(
        store
            .cancel("b", &cancel_request("again"))
            .unwrap()
            .is_empty()
    );
    assert!(matches!(
        store.cancel("nobody", &cancel_request("ops")),
        Err(StoreError::UnknownRun(_))
    ));
}

pub fn no_child_escapes_a_cancel_racing_its_starts(make: &Make) {
    let ledger = make();
    for round in 0..8 {
        let store = ledger.store();
        let parent = format!("p{round}");
        new_run(store.as_ref(), &parent, T0);
        let claimed = claim(store.as_ref(), &parent, "w", T0);
        let pool = ledger.pool.clone();
        let starter = {
            let parent = parent.clone();
            std::thread::spawn(move || {
                for seq in 1..=200u64 {
                    let child = format!("{parent}-c{seq}");
                    match commit(
                        pool.as_ref(),
                        &claimed,
                        vec![spawn(&parent, seq, &child, "s")],
                    ) {
                        Ok(()) => {}
                        Err(StoreError::Cancelled { .. }) => return seq - 1,
                        Err(e) => panic!("start {seq}: {e}"),
                    }
                }
                200
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(round * 3));
        store.cancel(&parent, &cancel_request("ops")).unwrap();
        let started = starter.join().unwrap();
        let children = store.children(&parent).unwrap();
        assert_eq!(children.len() as u64, started, "round {round}");
        for child in children {
            assert!(
                child.cancel.is_some(),
                "round {round}: child {} escaped the cancel",
                child.run_id
            );
        }
    }
}

pub fn a_parents_end_cancels_its_attached_children_only(make: &Make) {
    let ledger = make();
    let store = ledger.store();
    new_run(store.as_ref(), "p", T0);
    let p = claim(store.as_ref(), "p", "w", T0);
    let detached = match spawn("p", 2, "d", "s") {
        WriteOp::Spawn { call, mut child } => {
            if let Some(parent) = child.parent.as_mut() {
                parent.detached = true;
            }
            WriteOp::Spawn { call, child }
        }
        other => other,
    };
    commit(
        ledger.pool.as_ref(),
        &p,
        vec![spawn("p", 1, "a", "s"), detached],
    )
    .unwrap();
    assert!(store.run("d").unwrap().parent.unwrap().detached);
    let a = claim(store.as_ref(), "a", "w2", T0 + 1);
    commit(ledger.pool.as_ref(), &a, vec![spawn("a", 1, "a1", "t")]).unwrap();
    let mut ended = lifecycle::ended(&completed("{}"), T0 + 5);
    ended.cancel_children = Some(cancel_request("run p"));
    commit(ledger.pool.as_ref(), &p, vec![WriteOp::End(ended)]).unwrap();
    assert_eq!(store.run("p").unwrap().status, RunStatus::Completed);
    assert_eq!(store.run("p").unwrap().cancel, None);
    assert!(store.run("a").unwrap().cancel.is_some());
    assert!(
        store.run("a1").unwrap().cancel.is_some(),
        "and the runs below it"
    );
    assert_eq!(
        store.run("d").unwrap().cancel,
        None,
        "a detached child goes on"
    );
}

/// Schedules ([`stephost_core::schedules`]): a name is added once, a swap
/// on a stale version changes nothing (one of two racing workers moves a
/// schedule past a slot), and only due schedules (a slot come, or one
/// buffered) that are not paused are listed as due.
pub fn schedules_move_by_compare_and_set_and_only_due_ones_are_listed(make: &Make) {
    use stephost_core::schedules::{Overlap, Schedule};
    let ledger = make();
    let (a, b) = (
        ledger.pool.schedules().expect("schedules"),
        ledger.pool.schedules().expect("schedules"),
    );
    let schedule = |name: &str, next_at_ms: i64| Schedule {
        name: name.into(),
        cron: "* * * * *".into(),
        timezone: "UTC".into(),
        module_digest: "d1".into(),
        world: "w".into(),
        step: Some("s@1".into()),
        input: "{}".into(),
        overlap: Overlap::BufferOne,
        catch_up_ms: 60_000,
        paused: false,
        next_at_ms,
        last_run_id: None,
        buffered_at_ms: None,
        created_at_ms: T0,
        updated_at_ms: T0,
        version: 1,
    };
    assert!(a.add(&schedule("due", T0)).unwrap());
    assert!(
        !b.add(&schedule("due", T0 + 5)).unwrap(),
        "a name is added once"
    );
    assert!(a.add(&schedule("later", T0 + 60_000)).unwrap());
    assert_eq!(b.get("due").unwrap(), Some(schedule("due", T0)));
    assert_eq!(b.get("none").unwrap(), None);
    let due: Vec<String> = b.due(T0, 10).unwrap().into_iter().map(|s| s.name).collect();
    assert_eq!(due, ["due"]);
    assert_eq!(a.next_at().unwrap(), Some(T0));
    // Two workers move it past the slot: one wins.
    let mut moved = schedule("due", T0 + 60_000);
    moved.last_run_id = Some("due@slot".into());
    assert!(a.swap(1, &moved, false).unwrap());
    assert!(!b.swap(1, &moved, false).unwrap(), "a stale version");
    let found = b.get("due").unwrap().unwrap();
    assert_eq!(
        (found.version, found.last_run_id.as_deref()),
        (2, Some("due@slot"))
    );
    assert!(b.due(T0 + 1, 10).unwrap().is_empty());
    // A buffered slot is due whatever the next slot; a paused schedule is
    // never due.
    let mut buffered = found.clone();
    buffered.buffered_at_ms = Some(T0);
    assert!(b.swap(2, &buffered, false).unwrap());
    assert_eq!(a.due(T0 + 1, 10).unwrap().len(), 1);
    let mut paused = b.get("later").unwrap().unwrap();
    paused.paused = true;
    assert!(a.swap(1, &paused, true).unwrap());
    assert!(
        a.due(T0 + 120_000, 10)
            .unwrap()
            .iter()
            .all(|s| s.name != "later")
    );
    assert_eq!(b.next_at().unwrap(), Some(T0 + 60_000));
    let listed: Vec<String> = a.list().unwrap().into_iter().map(|s| s.name).collect();
    assert_eq!(listed, ["due", "later"]);
    assert!(a.remove("due").unwrap());
    assert!(!b.remove("due").unwrap());
    assert!(!a.swap(3, &buffered, false).unwrap(), "gone");
}

/// A run of module `module` that made `calls` and completed at `ended_at`.
fn finished_run(
    ledger: &TestLedger,
    run_id: &str,
    module: &str,
    calls: &[CallRecord],
    ended_at: i64,
) {
    let store = ledger.store();
    let run = NewRun {
        module_digest: module,
        ..bare(run_id)
    }
    .record(None);
    store.insert_run(&run).expect("insert a run");
    let c = claim(store.as_ref(), run_id, "w", T0);
    let mut ops: Vec<WriteOp> = calls.iter().cloned().map(WriteOp::Call).collect();
    ops.push(WriteOp::Log(LogRecord {
        after_seq: calls.len() as u64,
        level: "info".into(),
        message: "done".into(),
        at_ms: ended_at,
    }));
    ops.push(end(completed("{\"ok\":true}"), ended_at));
    commit(ledger.pool.as_ref(), &c, ops).unwrap();
}

pub fn retention_deletes_finished_trees_with_what_they_owned_and_nothing_else(make: &Make) {
    let ledger = make();
    let store = ledger.store();
    store.put_module("module-a", b"a").unwrap();
    store.put_module("module-b", b"bb").unwrap();
    // Two runs carrying the same large part (a conversation's message).
    let shared = |seq: u64| {
        let mut call = call(seq, CallClass::Read, CallState::Succeeded);
        call.request = format!(
            "{{\"messages\": [{{\"role\":\"user\",\"content\":\"{}\"}}]}}",
            "the same long question ".repeat(80)
        );
        call.request_hash =
            stephost_core::ids::request_hash(&call.interface, &call.function, &call.request);
        call.outcome = Some(format!("{{\"answer\":\"{}\"}}", "long ".repeat(400)));
        call
    };
    let cutoff = T0 + 1_000;
    finished_run(
        &ledger,
        "old",
        "module-b",
        &[shared(1), call(2, CallClass::Observe, CallState::Succeeded)],
        T0 + 10,
    );
    finished_run(&ledger, "recent", "module-a", &[shared(1)], cutoff + 10);
    finished_run(&ledger, "noticed", "module-a", &[], T0 + 10);
    ledger
        .outbox()
        .owe_notices(&[notice("ops", NoticeEvent::Failed, "noticed", None)])
        .unwrap();
    new_run(store.as_ref(), "pending", T0);
    new_run(store.as_ref(), "running", T0);
    claim(store.as_ref(), "running", "w", T0);
    // A finished parent whose child still runs.
    new_run(store.as_ref(), "p", T0);
    let c = claim(store.as_ref(), "p", "w", T0);
    commit(ledger.pool.as_ref(), &c, vec![spawn("p", 1, "c1", "s")]).unwrap();
    commit(
        ledger.pool.as_ref(),
        &c,
        vec![end(completed("{}"), T0 + 10)],
    )
    .unwrap();

    let mut rule = Rule::new(cutoff, &[]).unwrap();
    rule.module_kept_ms = 0;
    let retention = ledger.pool.retention().unwrap();
    // A dry run says which, and deletes nothing.
    let dry = retention::prune_all(retention.as_ref(), &rule, true).unwrap();
    assert_eq!(dry.pruned.run_ids, ["old"]);
    assert!(dry.pruned.bytes > 0);
    assert_eq!(store.run("old").unwrap().status, RunStatus::Completed);
    assert_eq!(calls_of(store.as_ref(), "old").len(), 2);

    let done = retention::prune_all(retention.as_ref(), &rule, false).unwrap();
    assert_eq!(done.pruned.run_ids, ["old"]);
    assert!(done.pruned.bytes >= dry.pruned.bytes, "{done:?} {dry:?}");
    assert!(matches!(store.run("old"), Err(StoreError::UnknownRun(_))));
    assert!(store.logs("old").map_or(true, |logs| logs.is_empty()));
    // The part the other run refers to stays, byte for byte.
    assert_eq!(calls_of(store.as_ref(), "recent"), [shared(1)]);
    // The module only the deleted run pinned goes; the other stays.
    assert!(
        store.module("module-b").is_err(),
        "module-b is pinned by no run"
    );
    assert_eq!(store.module("module-a").unwrap(), b"a");
    for kept in ["recent", "noticed", "pending", "running", "p", "c1"] {
        store
            .run(kept)
            .unwrap_or_else(|e| panic!("{kept} is kept: {e}"));
    }
    let counters: std::collections::BTreeMap<String, i64> =
        store.counters().unwrap().into_iter().collect();
    assert_eq!(counters.get(retention::RUNS_PRUNED_COUNTER), Some(&1));
    assert_eq!(
        counters.get(retention::BYTES_PRUNED_COUNTER),
        Some(&(done.pruned.bytes as i64))
    );
    // Once nothing is left, a pass deletes nothing.
    let again = retention::prune_all(retention.as_ref(), &rule, false).unwrap();
    assert!(again.pruned.run_ids.is_empty());

    // The child ends: its tree goes whole, the child with its parent.
    let child = claim(store.as_ref(), "c1", "w", T0 + 20);
    commit(
        ledger.pool.as_ref(),
        &child,
        vec![child_end("p", "c1", "s", completed("{}"), T0 + 20)],
    )
    .unwrap();
    let tree = retention::prune_all(retention.as_ref(), &rule, false).unwrap();
    let mut ids = tree.pruned.run_ids.clone();
    ids.sort();
    assert_eq!(ids, ["c1", "p"]);
    assert!(matches!(store.run("c1"), Err(StoreError::UnknownRun(_))));
    assert!(store.inbox("p").map_or(true, |inbox| inbox.is_empty()));
    // A rule naming other statuses, or a later cutoff, leaves the rest.
    let failed_only = Rule::new(cutoff, &[RunStatus::Failed]).unwrap();
    let none = retention::prune_all(retention.as_ref(), &failed_only, false).unwrap();
    assert!(none.pruned.run_ids.is_empty());
    store.run("recent").unwrap();
}
