//! The journal's replay/live state machine, against the in-memory ledger.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::*;
use crate::lifecycle::{self, ClaimMode};
use crate::memory::MemoryPool;
use crate::records::{NewRun, RunEnd, RunStatus};
use crate::store::{Pool, Store};

const RUN: &str = "run-1";
const EFFECTS: &str = "stephost:step/effects";

/// A ledger with run `RUN`, and a way to open executions of it.
struct Fixture {
    pool: MemoryPool,
    store: Box<dyn Store>,
}

impl Fixture {
    fn new() -> Self {
        let pool = MemoryPool::new();
        let store = pool.store().unwrap();
        let run = NewRun {
            run_id: RUN,
            module_digest: "m",
            step: None,
            world: "w",
            input: "{}",
            now_ms: crate::clock::now_ms(),
            budget: Default::default(),
        }
        .record(None);
        store.insert_run(&run).unwrap();
        Fixture { pool, store }
    }

    /// A live execution over the recorded history, under a new claim.
    fn execution(&self) -> Journal {
        self.execution_with(Limits::default())
    }

    fn execution_with(&self, limits: Limits) -> Journal {
        let claim = lifecycle::claim(
            self.store.as_ref(),
            RUN,
            "me",
            60_000,
            crate::clock::now_ms(),
            ClaimMode::Any,
            &|_| false,
        )
        .unwrap();
        let history = self.store.history(RUN).unwrap();
        let logs = self.store.logs(RUN).unwrap();
        Journal::new(
            RUN,
            Mode::Live {
                writer: self.pool.writer().unwrap(),
                claim,
            },
            history,
            &logs,
            limits,
        )
    }

    /// An offline replay of what is recorded.
    fn replay(&self, complete: bool) -> Journal {
        let history = self.store.history(RUN).unwrap();
        let mut journal = Journal::new(RUN, Mode::Replay, history, &[], Limits::default());
        journal.set_recording_complete(complete);
        journal
    }

    /// Ends an execution as the runner does: its buffered writes with its end.
    fn end(&self, journal: Journal, end: RunEnd) {
        let mut journal = journal;
        let mut ops = journal.take_pending();
        ops.push(WriteOp::End(lifecycle::ended(&end, crate::clock::now_ms())));
        let Mode::Live { mut writer, claim } = journal.into_mode() else {
            panic!("a live execution")
        };
        writer.commit(&claim, ops).wait().unwrap();
    }

    /// Ends an execution as a crash does: what it committed stays, the
    /// run stays running under its claim (taken over by the next one).
    fn crash(&self, journal: Journal) {
        let mut journal = journal;
        journal.flush().unwrap();
    }

    fn calls(&self) -> Vec<CallRecord> {
        self.store.calls(RUN, 1, usize::MAX).unwrap()
    }
}

fn completed() -> RunEnd {
    RunEnd::Completed {
        output: "{}".into(),
        exit_code: None,
    }
}

fn spec<'a>(class: CallClass, function: &'a str, request: &'a str) -> CallSpec<'a> {
    CallSpec {
        class,
        interface: EFFECTS,
        function,
        request,
        key: None,
        paid: false,
        redact: None,
    }
}

/// Live I/O that counts what it is asked to do.
#[derive(Default)]
struct Receiver {
    performed: u32,
    reconciled: u32,
    answer: Option<Reconciled>,
    deduplicates: bool,
    unknown: Option<String>,
    /// Whether the write's `started` row was in the ledger when it was sent.
    saw_started: Option<bool>,
    store: Option<Box<dyn Store>>,
}

impl LiveCall for Receiver {
    fn perform(&mut self, op: &OpContext<'_>, attempts: &mut Attempts<'_>) -> Performed {
        self.performed += 1;
        if let Some(store) = &self.store {
            let calls = store.calls(op.run_id, op.seq, 1).unwrap();
            self.saw_started = Some(calls.first().is_some_and(|c| {
                c.state == CallState::Started && c.operation_id == op.operation_id
            }));
        }
        attempts.record("send", 0, "ok", None);
        match self.unknown.take() {
            Some(reason) => Performed::Unknown(reason),
            None => Outcome::Ok(serde_json::json!(format!("receipt-{}", op.seq))).into(),
        }
    }

    fn reconcile(&mut self, _op: &OpContext<'_>, attempts: &mut Attempts<'_>) -> Reconciled {
        self.reconciled += 1;
        attempts.record("lookup", 0, "not_found", None);
        self.answer.clone().unwrap_or(Reconciled::PerformAgain)
    }

    fn reconciles_writes(&self) -> bool {
        true
    }

    fn resend_is_harmless(&self) -> bool {
        self.deduplicates
    }
}

fn observe(journal: &mut Journal, value: u64) -> Outcome {
    let spec = CallSpec {
        class: CallClass::Observe,
        interface: "stephost:step/clock",
        function: "now",
        request: "",
        key: None,
        paid: false,
        redact: None,
    };
    journal
        .call(&spec, &mut Compute(|| Outcome::Ok(value.into())))
        .unwrap()
}

#[test]
fn live_calls_are_recorded_and_a_resume_replays_them_without_performing() {
    let fx = Fixture::new();
    let mut first = fx.execution();
    let mut receiver = Receiver::default();
    assert_eq!(observe(&mut first, 7), Outcome::Ok(7.into()));
    first
        .call(&spec(CallClass::Read, "stock", "{}"), &mut receiver)
        .unwrap();
    let written = first
        .call(
            &spec(CallClass::Write, "orders", "{\"n\":1}"),
            &mut receiver,
        )
        .unwrap();
    assert_eq!(receiver.performed, 2);
    assert_eq!(
        first.stats,
        Stats {
            replayed: 0,
            live: 3
        }
    );
    fx.crash(first);

    let mut resumed = fx.execution();
    let mut again = Receiver::default();
    // A clock read again returns the recorded value, not the new one.
    assert_eq!(observe(&mut resumed, 99), Outcome::Ok(7.into()));
    resumed
        .call(&spec(CallClass::Read, "stock", "{}"), &mut again)
        .unwrap();
    let replayed = resumed
        .call(&spec(CallClass::Write, "orders", "{\"n\":1}"), &mut again)
        .unwrap();
    assert_eq!(replayed, written);
    assert_eq!(
        again.performed + again.reconciled,
        0,
        "no I/O for recorded calls"
    );
    assert_eq!(
        resumed.stats,
        Stats {
            replayed: 3,
            live: 0
        }
    );
    assert_eq!(
        resumed.counters()["side_effect_duplicate_prevented_total"],
        1
    );
    assert_eq!(
        crate::chain::Signer::plain()
            .verify_chain(RUN, &fx.calls())
            .map(|v| v.links),
        Ok(3)
    );
}

#[test]
fn a_write_is_recorded_started_in_the_ledger_before_its_request_leaves() {
    let fx = Fixture::new();
    let mut journal = fx.execution();
    observe(&mut journal, 1);
    let mut receiver = Receiver {
        store: Some(fx.pool.store().unwrap()),
        ..Receiver::default()
    };
    journal
        .call(&spec(CallClass::Write, "orders", "{}"), &mut receiver)
        .unwrap();
    assert_eq!(receiver.saw_started, Some(true));
    // The observe call before it rode on the same durable commit.
    assert_eq!(fx.calls()[0].state, CallState::Succeeded);
}

#[test]
fn a_deduplicated_writes_outcome_rides_on_the_next_commit_and_any_other_is_committed_at_once() {
    for deduplicates in [true, false] {
        let fx = Fixture::new();
        let mut journal = fx.execution();
        let mut receiver = Receiver {
            deduplicates,
            ..Receiver::default()
        };
        journal
            .call(&spec(CallClass::Write, "orders", "{}"), &mut receiver)
            .unwrap();
        let state = fx.calls()[0].state;
        let expected = if deduplicates {
            CallState::Started
        } else {
            CallState::Succeeded
        };
        assert_eq!(state, expected, "deduplicates: {deduplicates}");
        // A read leaving the host commits it first.
        journal
            .call(&spec(CallClass::Read, "stock", "{}"), &mut receiver)
            .unwrap();
        assert_eq!(fx.calls()[0].state, CallState::Succeeded);
    }
}

#[test]
fn a_different_request_at_a_recorded_call_is_a_divergence_naming_both_sides() {
    let fx = Fixture::new();
    let mut journal = fx.execution();
    let mut receiver = Receiver::default();
    journal
        .call(
            &spec(CallClass::Write, "orders", "{\"qty\":1}"),
            &mut receiver,
        )
        .unwrap();
    fx.crash(journal);
    let mut resumed = fx.execution();
    let stop = resumed
        .call(
            &spec(CallClass::Write, "orders", "{\"qty\":2}"),
            &mut receiver,
        )
        .unwrap_err();
    let Stop::Diverged(d) = &stop else {
        panic!("{stop:?}")
    };
    assert_eq!(d.seq, 1);
    assert_eq!(d.recorded.as_ref().unwrap().request, "{\"qty\":1}");
    assert_eq!(d.new.as_ref().unwrap().request, "{\"qty\":2}");
    assert_eq!(receiver.performed, 1, "nothing sent for the divergent call");
    // The first stop sticks: every later call fails with it.
    assert_eq!(
        resumed.call(&spec(CallClass::Read, "x", "{}"), &mut receiver),
        Err(stop)
    );
}

#[test]
fn a_replay_past_the_recording_ends_there_or_diverges_if_the_run_had_finished() {
    let fx = Fixture::new();
    let mut journal = fx.execution();
    observe(&mut journal, 1);
    fx.end(journal, completed());
    for (complete, diverges) in [(false, false), (true, true)] {
        let mut replay = fx.replay(complete);
        observe(&mut replay, 5);
        let stop = replay
            .call(
                &spec(CallClass::Write, "orders", "{}"),
                &mut Receiver::default(),
            )
            .unwrap_err();
        assert_eq!(matches!(stop, Stop::Diverged(_)), diverges, "{stop:?}");
        assert_eq!(
            matches!(stop, Stop::ReplayEnd { .. }),
            !diverges,
            "{stop:?}"
        );
    }
    // A replay that stops before a recorded call names it.
    let mut short = fx.replay(true);
    let unreached = short.unreached().unwrap().expect("call #1 unreached");
    assert_eq!(unreached.seq, 1);
}

/// A run whose execution died with write #1 `started` and no outcome.
fn write_left_in_flight() -> Fixture {
    let fx = Fixture::new();
    let journal = fx.execution();
    let Mode::Live { mut writer, claim } = journal.into_mode() else {
        unreachable!()
    };
    let mut started = Journal::new(
        RUN,
        Mode::Replay,
        History::empty(RUN),
        &[],
        Limits::default(),
    )
    .new_record(&spec(CallClass::Write, "orders", "{}"), 1);
    started.operation_id = ids::operation_id(RUN, "orders", 1, None);
    writer
        .commit(&claim, vec![WriteOp::Started(started)])
        .wait()
        .unwrap();
    fx
}

#[test]
fn a_write_left_in_flight_is_settled_by_its_receiver_or_sent_again_or_parked() {
    let found = Outcome::Ok(serde_json::json!("receipt-from-lookup"));
    let cases = [
        (Some(Reconciled::Outcome(found.clone())), Ok(found), 0),
        (
            Some(Reconciled::PerformAgain),
            Ok(Outcome::Ok(serde_json::json!("receipt-1"))),
            1,
        ),
        (Some(Reconciled::Unknown("no lookup".into())), Err(()), 0),
    ];
    for (answer, expected, sends) in cases {
        let fx = write_left_in_flight();
        let mut journal = fx.execution();
        let mut receiver = Receiver {
            answer: answer.clone(),
            ..Receiver::default()
        };
        let result = journal.call(&spec(CallClass::Write, "orders", "{}"), &mut receiver);
        assert_eq!(receiver.reconciled, 1, "{answer:?}");
        assert_eq!(receiver.performed, sends, "{answer:?}");
        let call = &fx.calls()[0];
        match expected {
            Ok(outcome) => {
                assert_eq!(result.unwrap(), outcome);
                assert_eq!(call.state, CallState::Succeeded);
            }
            Err(()) => {
                assert!(
                    matches!(result, Err(Stop::Parked { seq: 1, .. })),
                    "{result:?}"
                );
                assert_eq!(call.state, CallState::Unknown);
                assert_eq!(journal.counters()["side_effect_unknown_total"], 1);
            }
        }
        // The send the execution before may have made is recorded as what
        // it is (an interruption, its answer unrecorded), then the lookup.
        let attempts = fx.store.attempts(RUN, Some(1)).unwrap();
        assert_eq!(
            (attempts[0].kind.as_str(), attempts[0].result.as_str()),
            ("interrupted", "unrecorded")
        );
        assert_eq!(attempts[1].kind, "lookup");
    }
}

#[test]
fn a_write_whose_effect_is_no_longer_configured_is_parked_not_guessed() {
    let fx = write_left_in_flight();
    let mut journal = fx.execution();
    // A call that cannot ask the receiver (the effect was removed).
    let stop = journal
        .call(
            &spec(CallClass::Write, "orders", "{}"),
            &mut Compute(|| Outcome::Ok(1.into())),
        )
        .unwrap_err();
    assert!(matches!(stop, Stop::Parked { ref reason, .. } if reason.contains("not configured")));
    assert_eq!(fx.calls()[0].state, CallState::Unknown);
}

#[test]
fn a_call_parked_as_unknown_parks_the_run_again_until_a_person_resolves_it() {
    let fx = write_left_in_flight();
    let mut journal = fx.execution();
    let mut receiver = Receiver {
        answer: Some(Reconciled::Unknown("lost".into())),
        ..Receiver::default()
    };
    let _ = journal.call(&spec(CallClass::Write, "orders", "{}"), &mut receiver);
    fx.end(
        journal,
        RunEnd::Parked {
            error: "unknown".into(),
        },
    );
    let mut again = fx.execution();
    let mut receiver = Receiver::default();
    let stop = again
        .call(&spec(CallClass::Write, "orders", "{}"), &mut receiver)
        .unwrap_err();
    assert!(matches!(stop, Stop::Parked { seq: 1, .. }), "{stop:?}");
    assert_eq!(receiver.performed + receiver.reconciled, 0);
    crate::settle::resolve(
        fx.store.as_ref(),
        &crate::chain::Signer::plain(),
        RUN,
        1,
        &crate::settle::Resolution::Succeeded("{\"order\":1}".into()),
        "ana",
        crate::clock::now_ms(),
    )
    .unwrap();
    let mut resolved = fx.execution();
    let outcome = resolved
        .call(&spec(CallClass::Write, "orders", "{}"), &mut receiver)
        .unwrap();
    assert_eq!(outcome, Outcome::Ok(serde_json::json!("{\"order\":1}")));
    assert_eq!(receiver.performed, 0);
}

struct Timer {
    ready: bool,
}

impl LiveCall for Timer {
    fn perform(&mut self, _op: &OpContext<'_>, _attempts: &mut Attempts<'_>) -> Performed {
        Outcome::Ok(serde_json::Value::Null).into()
    }

    fn wait(&mut self, _op: &OpContext<'_>, started_at_ms: i64) -> Wait {
        if self.ready {
            Wait::Ready(Outcome::Ok(serde_json::Value::Null))
        } else {
            Wait::Until {
                wake_at_ms: Some(started_at_ms + 1_000),
                reason: "sleeping".into(),
            }
        }
    }
}

#[test]
fn a_suspend_call_stops_the_run_until_it_is_ready_then_records_its_outcome_once() {
    let fx = Fixture::new();
    let sleep = spec(CallClass::Suspend, "sleep", "{\"ms\":1000}");
    let mut journal = fx.execution();
    let stop = journal
        .call(&sleep, &mut Timer { ready: false })
        .unwrap_err();
    let Stop::Suspended {
        seq: 1, wake_at_ms, ..
    } = stop
    else {
        panic!("{stop:?}")
    };
    assert_eq!(
        fx.calls()[0].state,
        CallState::Started,
        "durable before it waits"
    );
    fx.end(journal, RunEnd::Waiting { wake_at_ms });
    assert_eq!(fx.store.run(RUN).unwrap().status, RunStatus::Waiting);
    let mut woken = fx.execution();
    woken.call(&sleep, &mut Timer { ready: true }).unwrap();
    assert_eq!(fx.calls()[0].state, CallState::Succeeded);
    assert_eq!(woken.stats.live, 1);
    // Replayed after that, it returns at once.
    let mut replay = fx.replay(false);
    replay.call(&sleep, &mut Timer { ready: false }).unwrap();
}

#[test]
fn log_lines_already_recorded_are_not_written_again() {
    let fx = Fixture::new();
    let mut journal = fx.execution();
    journal.log("info", "before").unwrap();
    observe(&mut journal, 1);
    journal.log("info", "after").unwrap();
    fx.end(journal, RunEnd::Parked { error: "e".into() });
    let mut resumed = fx.execution();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = seen.clone();
    resumed.set_log_sink(Box::new(move |line, replayed| {
        sink.lock().unwrap().push((line.message.clone(), replayed));
    }));
    resumed.log("info", "before").unwrap();
    observe(&mut resumed, 1);
    resumed.log("info", "after").unwrap();
    resumed.log("info", "new").unwrap();
    fx.end(resumed, completed());
    let logs: Vec<String> = fx
        .store
        .logs(RUN)
        .unwrap()
        .into_iter()
        .map(|l| l.message)
        .collect();
    assert_eq!(logs, ["before", "after", "new"]);
    assert_eq!(
        *seen.lock().unwrap(),
        [
            ("before".to_string(), true),
            ("after".to_string(), true),
            ("new".to_string(), false)
        ]
    );
}

#[test]
fn a_lost_lease_or_a_drain_stops_the_run_before_any_live_io() {
    for lost in [true, false] {
        let fx = Fixture::new();
        let mut journal = fx.execution();
        let control = Arc::new(RunControl::default());
        journal.set_control(control.clone());
        observe(&mut journal, 1);
        if lost {
            control.lost.store(true, Ordering::SeqCst);
        } else {
            control.drain.store(true, Ordering::SeqCst);
        }
        let mut receiver = Receiver::default();
        let stop = journal
            .call(&spec(CallClass::Write, "orders", "{}"), &mut receiver)
            .unwrap_err();
        assert_eq!(receiver.performed, 0);
        if lost {
            assert!(matches!(stop, Stop::Fenced(_)), "{stop:?}");
        } else {
            assert_eq!(stop, Stop::Released { seq: 2 });
        }
    }
}

#[test]
fn a_newer_claim_fences_the_old_execution_before_its_write_leaves() {
    let fx = Fixture::new();
    let mut old = fx.execution();
    // Another worker takes the run over.
    let _new = fx.execution();
    let mut receiver = Receiver::default();
    let stop = old
        .call(&spec(CallClass::Write, "orders", "{}"), &mut receiver)
        .unwrap_err();
    assert!(matches!(stop, Stop::Fenced(_)), "{stop:?}");
    assert_eq!(receiver.performed, 0);
    assert!(fx.calls().is_empty());
}

#[test]
fn calls_past_calls_max_stop_the_run_with_the_limit_named() {
    let fx = Fixture::new();
    let mut journal = fx.execution_with(Limits {
        calls_max: 2,
        ..Limits::default()
    });
    observe(&mut journal, 1);
    observe(&mut journal, 2);
    let spec = CallSpec {
        class: CallClass::Observe,
        interface: "stephost:step/clock",
        function: "now",
        request: "",
        key: None,
        paid: false,
        redact: None,
    };
    let stop = journal
        .call(&spec, &mut Compute(|| Outcome::Ok(3.into())))
        .unwrap_err();
    assert!(
        matches!(stop, Stop::Limit(ref m) if m.contains("calls_max = 2")),
        "{stop:?}"
    );
}

#[test]
fn recorded_bytes_past_their_budget_stop_the_run_across_resumes() {
    let fx = Fixture::new();
    let limits = Limits {
        recorded_bytes_max: 20,
        ..Limits::default()
    };
    let spec = CallSpec {
        class: CallClass::Observe,
        interface: "stephost:step/clock",
        function: "now",
        request: "0123456789",
        key: None,
        paid: false,
        redact: None,
    };
    let mut first = fx.execution_with(limits.clone());
    first
        .call(&spec, &mut Compute(|| Outcome::Ok(1.into())))
        .unwrap();
    fx.end(first, RunEnd::Parked { error: "e".into() });
    // The replayed call counts again: the second call goes past 20 bytes.
    let mut again = fx.execution_with(limits);
    again
        .call(&spec, &mut Compute(|| Outcome::Ok(1.into())))
        .unwrap();
    let stop = again
        .call(&spec, &mut Compute(|| Outcome::Ok(2.into())))
        .unwrap_err();
    assert!(
        matches!(stop, Stop::Limit(ref m) if m.contains("recorded_bytes_max = 20")),
        "{stop:?}"
    );
}

#[test]
fn log_lines_past_their_limit_stop_the_run() {
    let fx = Fixture::new();
    let mut journal = fx.execution_with(Limits {
        log_lines_max: 2,
        ..Limits::default()
    });
    journal.log("info", "one").unwrap();
    journal.log("info", "two").unwrap();
    let stop = journal.log("info", "three").unwrap_err();
    assert!(
        matches!(stop, Stop::Limit(ref m) if m.contains("log_lines_max = 2")),
        "{stop:?}"
    );
    let mut bytes = fx.execution_with(Limits {
        log_bytes_max: 5,
        ..Limits::default()
    });
    let stop = bytes.log("info", "longer than five").unwrap_err();
    assert!(
        matches!(stop, Stop::Limit(ref m) if m.contains("log_bytes_max = 5")),
        "{stop:?}"
    );
}

#[test]
fn the_chain_goes_on_from_the_recorded_calls_across_a_resume() {
    let fx = Fixture::new();
    let mut first = fx.execution();
    observe(&mut first, 1);
    observe(&mut first, 2);
    fx.end(first, RunEnd::Parked { error: "e".into() });
    let mut second = fx.execution();
    observe(&mut second, 1);
    observe(&mut second, 2);
    observe(&mut second, 3);
    second
        .call(
            &spec(CallClass::Write, "orders", "{}"),
            &mut Receiver::default(),
        )
        .unwrap();
    fx.end(second, completed());
    assert_eq!(
        crate::chain::Signer::plain()
            .verify_chain(RUN, &fx.calls())
            .map(|v| v.links),
        Ok(4)
    );
}

/// Live I/O that notes the trace context it was handed.
#[derive(Default)]
struct TraceSeen(Vec<Option<String>>);

impl LiveCall for TraceSeen {
    fn perform(&mut self, op: &OpContext<'_>, _attempts: &mut Attempts<'_>) -> Performed {
        self.0.push(op.trace_context().map(|(parent, _)| parent));
        Outcome::Ok(serde_json::json!("ok")).into()
    }
}

#[test]
fn with_a_trace_each_call_but_observe_calls_is_timed_and_carries_its_span() {
    let fixture = Fixture::new();
    let trace = crate::trace::RunTrace::new(true);
    let mut first = fixture.execution();
    first.set_trace(trace.clone());
    let mut seen = TraceSeen::default();
    first
        .call(&spec(CallClass::Read, "stock", "{}"), &mut seen)
        .unwrap();
    observe(&mut first, 7);
    first
        .call(&spec(CallClass::Write, "order", "{}"), &mut seen)
        .unwrap();
    let timings = first.take_timings();
    assert_eq!(
        timings
            .iter()
            .map(|t| (t.seq, t.replayed))
            .collect::<Vec<_>>(),
        [(1, false), (3, false)],
        "the clock reading (#2) is not timed"
    );
    assert!(timings.iter().all(|t| t.start_unix_ns <= t.end_unix_ns));
    // Each request named its own call's span under this execution's fence.
    assert_eq!(
        seen.0,
        [
            Some(trace.traceparent(&trace.call_span_id(RUN, 1, 1))),
            Some(trace.traceparent(&trace.call_span_id(RUN, 3, 1))),
        ]
    );
    fixture.crash(first);

    // The next execution replays them: timed as replayed, nothing sent.
    let mut second = fixture.execution();
    second.set_trace(trace.clone());
    let mut again = TraceSeen::default();
    second
        .call(&spec(CallClass::Read, "stock", "{}"), &mut again)
        .unwrap();
    observe(&mut second, 7);
    second
        .call(&spec(CallClass::Write, "order", "{}"), &mut again)
        .unwrap();
    let replayed: Vec<(u64, bool)> = second
        .take_timings()
        .iter()
        .map(|t| (t.seq, t.replayed))
        .collect();
    assert_eq!(replayed, [(1, true), (3, true)]);
    assert!(again.0.is_empty());

    // Without a trace: nothing timed, no trace context handed over.
    let mut third = fixture.execution();
    let mut plain = TraceSeen::default();
    third
        .call(&spec(CallClass::Read, "stock", "{}"), &mut plain)
        .unwrap();
    observe(&mut third, 7);
    for (class, function) in [(CallClass::Write, "order"), (CallClass::Read, "more")] {
        third
            .call(&spec(class, function, "{}"), &mut plain)
            .unwrap();
    }
    assert!(third.take_timings().is_empty());
    assert_eq!(plain.0, [None], "the one live call had no trace context");
}
