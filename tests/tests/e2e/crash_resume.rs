//! Crash-resume, end to end: the real binary aborts at each named crash
//! point (or is killed with SIGKILL from outside), a new process resumes the
//! run from the bytes on disk, and the result is the same as an uncrashed
//! run's with exactly one business effect per write.

use std::time::{Duration, Instant};

use serde_json::Value;
use stephost_tests::{SUPPLIER_CONFIG, Sandbox, attempts_for, calls, distinct_operations, guests};

const BIN: &str = env!("CARGO_BIN_EXE_stephost-crash");

const INPUT: &str = r#"{"sku":"WIDGET-7","quantity":10}"#;
/// The supplier step's calls: 1 inventory.read, 2 clock, 3 random, 4 supplier.order.
const ORDER_SEQ: u64 = 4;

fn reference_output() -> Value {
    let sb = Sandbox::with_config(BIN, SUPPLIER_CONFIG);
    let ran = sb.run(guests::SUPPLIER_ORDER, INPUT, "order-1");
    ran.expect_code(0);
    ran.json()
}

fn sends(show: &Value, seq: u64) -> usize {
    attempts_for(show, seq)
        .iter()
        .filter(|a| a["kind"] == "send")
        .count()
}

/// Runs the supplier order as `order-1` and crashes it at `point` of the
/// order's call.
fn crash_order_at(sb: &Sandbox, point: &str) {
    let at = format!("{point}@{ORDER_SEQ}");
    let crashed = sb.run_crashing_at(&at, guests::SUPPLIER_ORDER, INPUT, "order-1");
    assert_eq!(crashed.signal, Some(libc::SIGABRT), "{crashed:?}");
}

/// Crashes the supplier run at `point`, checks what the ledger and the
/// receiver hold at that moment with `at_crash`, resumes, and checks the end.
fn crash_and_resume(point: &str, at_crash: impl Fn(&Sandbox, &Value)) {
    let sb = Sandbox::with_config(BIN, SUPPLIER_CONFIG);
    let crashed = sb.run_crashing_at(point, guests::SUPPLIER_ORDER, INPUT, "order-1");
    let name = point.split('@').next().unwrap();
    assert_eq!(
        crashed.signal,
        Some(libc::SIGABRT),
        "the process did not abort at {point}: {crashed:?}"
    );
    assert!(
        crashed.stderr.contains(&format!("crash point {name}@")),
        "crash point {point} did not fire: {}",
        crashed.stderr
    );
    assert!(
        crashed.stdout.is_empty(),
        "output escaped before completion"
    );
    let before = sb.show("order-1");
    assert_eq!(before["run"]["status"], "running");
    at_crash(&sb, &before);

    let resumed = sb.stephost(&["resume", "order-1"]);
    resumed.expect_code(0);
    assert_eq!(resumed.json(), reference_output(), "crash at {point}");

    let orders = sb.received("supplier-orders.jsonl");
    assert_eq!(orders.len(), 1, "crash at {point}: {orders:#?}");
    let after = sb.show("order-1");
    assert_eq!(after["run"]["status"], "completed");
    // The order left the host once, whatever the crash point.
    assert!(
        sends(&after, ORDER_SEQ) <= 1,
        "crash at {point}: sent twice"
    );
    assert_eq!(
        after["calls"][ORDER_SEQ as usize - 1]["operation_id"],
        orders[0]["operation_id"]
    );
    // Calls completed before the crash were not performed again: their
    // recorded outcomes are unchanged.
    for (old, new) in calls(&before).iter().zip(calls(&after)) {
        if old["state"] == "succeeded" {
            assert_eq!(old, new, "crash at {point}: a recorded call changed");
        }
    }
}

#[test]
fn crash_after_claim_leaves_nothing_and_the_same_run_id_does_the_job_once() {
    // `run` records a new run with its first commit, before anything
    // leaves the host: a crash before that leaves no run and sent
    // nothing, and running the same id again does the whole job once.
    let sb = Sandbox::with_config(BIN, SUPPLIER_CONFIG);
    let crashed = sb.run_crashing_at("after-claim", guests::SUPPLIER_ORDER, INPUT, "order-1");
    assert_eq!(crashed.signal, Some(libc::SIGABRT), "{crashed:?}");
    let shown = sb.stephost(&["show", "order-1"]);
    shown.expect_code(2);
    assert!(shown.stderr.contains("no run order-1"), "{}", shown.stderr);
    assert!(sb.received("supplier-orders.jsonl").is_empty());
    let again = sb.run(guests::SUPPLIER_ORDER, INPUT, "order-1");
    again.expect_code(0);
    assert_eq!(again.json(), reference_output());
    assert_eq!(sb.received("supplier-orders.jsonl").len(), 1);
    let show = sb.show("order-1");
    assert_eq!(show["run"]["status"], "completed");
    assert_eq!(show["run"]["fence"], 1);
}

#[test]
fn crash_after_a_read_is_started_performs_the_read_again() {
    // A read is not made durable before it is sent (it is safe to perform
    // again), so the crash leaves no trace of it and the resume reads anew.
    crash_and_resume("after-started@1", |_, show| {
        assert!(calls(show).is_empty(), "{show:#}");
    });
}

#[test]
fn crash_after_started_before_send_sends_the_order_once() {
    crash_and_resume(&format!("after-started@{ORDER_SEQ}"), |sb, show| {
        assert_eq!(calls(show)[ORDER_SEQ as usize - 1]["state"], "started");
        assert!(sb.received("supplier-orders.jsonl").is_empty());
    });
}

#[test]
fn a_run_that_diverges_on_resume_leaves_its_in_flight_write_unknown() {
    let sb = Sandbox::with_config(BIN, SUPPLIER_CONFIG);
    crash_order_at(&sb, "after-started");
    // The recording no longer matches the step before its write, as if the
    // step had read something the host did not record.
    sb.tamper()
        .edit_call("order-1", 1, &mut |call| {
            call.request = r#"{"sku":"OTHER"}"#.into();
            call.request_hash = "changed".into();
        })
        .unwrap();

    let resumed = sb.stephost(&["resume", "order-1"]);
    resumed.expect_code(4);
    let show = sb.show("order-1");
    assert_eq!(show["run"]["status"], "diverged");
    // The write that was started before the crash may have reached the
    // supplier or not: it is unknown, not left `started` for ever.
    assert_eq!(calls(&show)[ORDER_SEQ as usize - 1]["state"], "unknown");
    let error = show["run"]["error"].as_str().expect("error");
    assert!(
        error.contains(&format!("#{ORDER_SEQ}")) && error.contains("unknown"),
        "{error}"
    );
    // Nothing was sent on the way.
    assert!(sb.received("supplier-orders.jsonl").is_empty());
}

#[test]
fn crash_after_the_receiver_committed_reconciles_the_receipt() {
    crash_and_resume(&format!("after-send@{ORDER_SEQ}"), |sb, show| {
        assert_eq!(calls(show)[ORDER_SEQ as usize - 1]["state"], "started");
        assert_eq!(sb.received("supplier-orders.jsonl").len(), 1);
    });
}

#[test]
fn crash_after_the_outcome_of_a_deduplicated_write_settles_it_with_the_receiver() {
    // The supplier deduplicates by operation id, so the order's outcome
    // rides on the next commit (here, the run's end) instead of a commit
    // of its own: the crash finds it `started`, and resume asks the
    // supplier instead of ordering again.
    crash_and_resume(&format!("after-outcome@{ORDER_SEQ}"), |sb, show| {
        assert_eq!(calls(show)[ORDER_SEQ as usize - 1]["state"], "started");
        assert_eq!(sb.received("supplier-orders.jsonl").len(), 1);
    });
    let sb = Sandbox::with_config(BIN, SUPPLIER_CONFIG);
    crash_order_at(&sb, "after-outcome");
    sb.stephost(&["resume", "order-1"]).expect_code(0);
    let after = sb.show("order-1");
    let lookups: Vec<&Value> = attempts_for(&after, ORDER_SEQ)
        .into_iter()
        .filter(|a| a["kind"] == "lookup")
        .collect();
    assert_eq!(lookups.len(), 1, "{after:#}");
    assert_eq!(lookups[0]["result"], "found");
    // The send the crashed execution made, which it had no time to record,
    // is in the call's history as what it is: an interruption.
    let first = attempts_for(&after, ORDER_SEQ)[0].clone();
    assert_eq!(
        (&first["kind"], &first["result"], first["attempt"].as_u64()),
        (
            &Value::from("interrupted"),
            &Value::from("unrecorded"),
            Some(1)
        ),
        "{after:#}"
    );
}

#[test]
fn crash_after_the_outcome_of_a_write_that_cannot_be_resent_finds_it_recorded() {
    // A receiver that does not deduplicate: the outcome is committed before
    // the guest sees it, so the crash cannot lose it and resume needs no
    // lookup.
    let config = SUPPLIER_CONFIG.to_string() + "deduplicate = false\n";
    let sb = Sandbox::with_config(BIN, &config);
    crash_order_at(&sb, "after-outcome");
    let before = sb.show("order-1");
    assert_eq!(calls(&before)[ORDER_SEQ as usize - 1]["state"], "succeeded");
    let resumed = sb.stephost(&["resume", "order-1"]);
    resumed.expect_code(0);
    assert_eq!(resumed.json(), reference_output());
    assert_eq!(sb.received("supplier-orders.jsonl").len(), 1);
    let after = sb.show("order-1");
    assert!(
        attempts_for(&after, ORDER_SEQ)
            .iter()
            .all(|a| a["kind"] == "send"),
        "{after:#}"
    );
    assert_eq!(
        calls(&before)[ORDER_SEQ as usize - 1],
        calls(&after)[ORDER_SEQ as usize - 1]
    );
}

#[test]
fn crash_before_complete_finishes_without_new_calls() {
    crash_and_resume("before-complete", |_, show| {
        // Everything but the order's outcome, which rides with the end.
        for call in calls(show) {
            let expected = if call["seq"] == ORDER_SEQ {
                "started"
            } else {
                "succeeded"
            };
            assert_eq!(call["state"], expected, "{call:#}");
        }
    });
}

#[test]
fn a_crash_in_the_middle_of_many_writes_leaves_one_effect_per_write() {
    // multi-write: write i is call 3i+3; crash while sending the second.
    for point in ["after-started@6", "after-send@6", "after-outcome@6"] {
        let sb = Sandbox::new(BIN);
        let crashed = sb.run_crashing_at(point, guests::MULTI_WRITE, r#"{"count":4}"#, "m");
        assert_eq!(crashed.signal, Some(libc::SIGABRT), "{crashed:?}");
        let before = sb.show("m");
        let resumed = sb.stephost(&["resume", "m"]);
        resumed.expect_code(0);
        let out = resumed.json();
        assert_eq!(out["receipts"].as_array().unwrap().len(), 4);
        let lines = sb.received("orders.jsonl");
        assert_eq!(lines.len(), 4, "{point}: {lines:#?}");
        let ids = distinct_operations(&lines);
        let after = sb.show("m");
        for seq in [3u64, 6, 9, 12] {
            let call = &after["calls"][seq as usize - 1];
            assert_eq!(call["state"], "succeeded");
            assert!(ids.contains(&call["operation_id"].as_str().unwrap().to_string()));
            assert!(sends(&after, seq) <= 1, "{point}: call #{seq} sent twice");
        }
        for (old, new) in calls(&before).iter().zip(calls(&after)) {
            if old["state"] == "succeeded" {
                assert_eq!(old, new, "{point}: a recorded call changed");
            }
        }
        // A replay of the finished run agrees with it, and its chain holds
        // across the crash.
        sb.stephost(&["replay", "m"]).expect_code(0);
        sb.stephost(&["verify", "m"]).expect_code(0);
    }
}

#[test]
fn a_run_with_a_long_history_resumes_and_replays_it_read_while_replayed() {
    // 1,400 writes make 4,203 calls (3 per write, then the clock, random
    // and the WASI wall clock), enough for the ledger to hand the
    // history over in chunks while the guest replays it (more than 4,096);
    // crash while sending the last write, call #4200.
    let sb = Sandbox::new(BIN);
    let crashed = sb.run_crashing_at(
        "after-started@4200",
        guests::MULTI_WRITE,
        r#"{"count":1400}"#,
        "long",
    );
    assert_eq!(crashed.signal, Some(libc::SIGABRT), "{crashed:?}");
    resume_sends_each_write_once(&sb, "long", 1400);
    let show = sb.show("long");
    assert_eq!(calls(&show).len(), 4203);
    assert_eq!(calls(&show)[4199]["state"], "succeeded");
    sb.stephost(&["replay", "long"]).expect_code(0);
    sb.stephost(&["verify", "long"]).expect_code(0);
    // A call missing from the middle of the history: replay reports the
    // damaged ledger, not a verdict on the step.
    sb.tamper().delete_call("long", 3000).unwrap();
    let damaged = sb.stephost(&["replay", "long"]);
    damaged.expect_code(1);
    assert!(
        damaged
            .stderr
            .contains("call #3001 found where #3000 was expected"),
        "{}",
        damaged.stderr
    );
}

/// Resumes multi-write run `run_id` to its end: it returns a receipt for
/// each of its `writes` writes, and the receiver holds each write once.
fn resume_sends_each_write_once(sb: &Sandbox, run_id: &str, writes: usize) {
    let resumed = sb.stephost(&["resume", run_id]);
    resumed.expect_code(0);
    assert_eq!(resumed.json()["receipts"].as_array().unwrap().len(), writes);
    let lines = sb.received("orders.jsonl");
    assert_eq!(lines.len(), writes);
    distinct_operations(&lines);
}

#[test]
fn calls_buffered_past_the_journal_land_before_the_write_after_them() {
    // 1,500 clock reads before each write: more than the journal buffers
    // (`PENDING_WRITES_MAX`), so they are handed to the ledger's committer
    // thread while the step goes on. The write's `started` must still be
    // committed after all of them. Crash right after the second write's
    // `started` (call #3006), before it is sent.
    let sb = Sandbox::new(BIN);
    let input = r#"{"count":2,"observes":1500}"#;
    let crashed = sb.run_crashing_at("after-started@3006", guests::MULTI_WRITE, input, "b");
    assert_eq!(crashed.signal, Some(libc::SIGABRT), "{crashed:?}");
    let before = sb.show("b");
    let recorded = calls(&before);
    assert_eq!(recorded.len(), 3006);
    assert!(
        recorded[..3005].iter().all(|c| c["state"] == "succeeded"),
        "every call before the write is recorded, finished"
    );
    assert_eq!(recorded[3005]["state"], "started");
    assert_eq!(sb.received("orders.jsonl").len(), 1);
    sb.stephost(&["verify", "b"]).expect_code(0);

    resume_sends_each_write_once(&sb, "b", 2);
    // Replayed against its recording, the step makes the same calls.
    assert_eq!(calls(&sb.show("b")).len(), 3009);
    sb.stephost(&["replay", "b"]).expect_code(0);
    sb.stephost(&["verify", "b"]).expect_code(0);
}

#[test]
fn sigkill_while_a_write_is_in_flight_resumes_with_one_effect_per_write() {
    // The receiver commits each order, then takes 30 s to reply: the
    // process is killed while the second write waits for its reply.
    let slow = r#"
[effects.orders]
kind = "file"
class = "write"
path = "orders.jsonl"
reply_delay_ms = 30000
"#;
    let sb = Sandbox::with_config(BIN, slow);
    let mut child = sb
        .command(&[
            "run",
            guests::MULTI_WRITE,
            "--input",
            r#"{"count":3}"#,
            "--run-id",
            "k",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while sb.received("orders.jsonl").is_empty() {
        assert!(
            Instant::now() < deadline,
            "the first write never reached the receiver"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let rc = kill_hard(child.id());
    assert_eq!(rc, 0);
    let status = child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGKILL));

    let before = sb.show("k");
    assert_eq!(calls(&before).last().unwrap()["state"], "started");
    assert_eq!(sb.received("orders.jsonl").len(), 1);

    sb.set_config(stephost_tests::BASE_CONFIG);
    let resumed = sb.stephost(&["resume", "k"]);
    resumed.expect_code(0);
    let lines = sb.received("orders.jsonl");
    assert_eq!(lines.len(), 3, "{lines:#?}");
    distinct_operations(&lines);
    let after = sb.show("k");
    // The in-flight write was found at the receiver, not sent again.
    let first_write = attempts_for(&after, 3);
    assert_eq!(
        first_write
            .iter()
            .map(|a| a["kind"].as_str().unwrap())
            .collect::<Vec<_>>(),
        vec!["interrupted", "lookup"],
        "{after:#}"
    );
    assert_eq!(first_write[1]["result"], "found");
}

fn kill_hard(pid: u32) -> i32 {
    std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .map(|s| if s.success() { 0 } else { 1 })
        .unwrap_or(1)
}
