//! Approvals and durable timers: a waiting run costs no process, comes back
//! through a worker or `resume`, and a decision stays tied to what was
//! approved.

use std::time::Duration;

use serde_json::{Value, json};
use stephost_tests::{Sandbox, calls, guests};

const BIN: &str = env!("CARGO_BIN_EXE_stephost-crash");

const CONFIG: &str = stephost_tests::APPROVAL_CONFIG;

/// The approval step's call numbers: #1 the approval, then the stock read
/// and the order.
const APPROVAL_SEQ: &str = "1";

fn ask(sb: &Sandbox, run_id: &str, ttl_seconds: u64) {
    let ran = sb.run(
        guests::APPROVAL_STEP,
        &json!({"sku": "WIDGET-7", "quantity": 10, "ttl_seconds": ttl_seconds}).to_string(),
        run_id,
    );
    ran.expect_code(7);
    assert!(ran.stderr.contains("is waiting"), "{}", ran.stderr);
    let show = sb.show(run_id);
    assert_eq!(show["run"]["status"], "waiting");
    assert!(
        show["run"]["owner"].is_null(),
        "a waiting run holds no claim"
    );
    assert_eq!(calls(&show)[0]["class"], "suspend");
    assert_eq!(calls(&show)[0]["state"], "started");
}

fn pending(sb: &Sandbox) -> Vec<Value> {
    let listed = sb.stephost(&["approvals", "--json"]);
    listed.expect_code(0);
    listed.json().as_array().unwrap().clone()
}

/// The first 12 characters of the sha256 of `run_id`'s waiting approval's
/// details, as the inbox shows them to a person (zeros when none waits).
fn shown(sb: &Sandbox, run_id: &str) -> String {
    pending(sb)
        .iter()
        .find(|a| a["run_id"] == run_id)
        .and_then(|a| a["details_sha256"].as_str())
        .map(|sha| sha[..12].to_string())
        .unwrap_or_else(|| "000000000000".into())
}

#[test]
fn an_approved_run_rechecks_the_stock_and_orders_once() {
    let sb = Sandbox::with_config(BIN, CONFIG);
    ask(&sb, "a", 3600);
    let listed = pending(&sb);
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["subject"], "order 10 of WIDGET-7");
    assert_eq!(listed[0]["details"]["quantity"], 10);
    assert_eq!(listed[0]["details_sha256"].as_str().unwrap().len(), 64);
    // The plain listing shows what is approved and the prefix to name.
    let text = sb.stephost(&["approvals"]);
    text.expect_code(0);
    assert!(
        text.stdout.contains("order 10 of WIDGET-7"),
        "{}",
        text.stdout
    );
    assert!(text.stdout.contains("\"quantity\":10"), "{}", text.stdout);
    assert!(
        text.stdout
            .contains(&listed[0]["details_sha256"].as_str().unwrap()[..12]),
        "{}",
        text.stdout
    );
    assert!(
        sb.received("orders.jsonl").is_empty(),
        "ordered before approval"
    );

    // Approving something other than what was shown is refused.
    for wrong in ["0000000000000000", "abc"] {
        let blind = sb.stephost(&[
            "approve",
            "a",
            APPROVAL_SEQ,
            "--details",
            wrong,
            "--by",
            "alice",
        ]);
        blind.expect_code(2);
        assert!(blind.stderr.contains("details"), "{}", blind.stderr);
    }
    sb.stephost(&["approve", "a", APPROVAL_SEQ, "--by", "alice"])
        .expect_code(2);
    assert_eq!(pending(&sb).len(), 1);

    sb.stephost(&[
        "approve",
        "a",
        APPROVAL_SEQ,
        "--details",
        &shown(&sb, "a"),
        "--by",
        "alice",
        "--note",
        "ok for Q4",
    ])
    .expect_code(0);
    assert!(pending(&sb).is_empty());
    // Deciding twice is refused.
    let twice = sb.stephost(&["reject", "a", APPROVAL_SEQ, "--by", "bob"]);
    twice.expect_code(2);
    assert!(twice.stderr.contains("already decided"), "{}", twice.stderr);

    // A worker picks the decided run up.
    sb.stephost(&["worker", "--exit-when-idle"]).expect_code(0);
    let show = sb.show("a");
    assert_eq!(show["run"]["status"], "completed");
    let out: Value = serde_json::from_str(show["run"]["output"].as_str().unwrap()).unwrap();
    assert_eq!(out["verdict"], "approved");
    assert_eq!(out["by"], "alice");
    assert_eq!(out["note"], "ok for Q4");
    assert_eq!(out["on_hand"], 3);
    let orders = sb.received("orders.jsonl");
    assert_eq!(orders.len(), 1);
    assert_eq!(orders[0]["request"]["quantity"], 7);
    assert_eq!(calls(&show)[0]["resolved_by"], "alice");
    sb.stephost(&["verify", "a"]).expect_code(0);
    // The replay of the finished run needs nobody and sends nothing.
    sb.stephost(&["replay", "a"]).expect_code(0);
    assert_eq!(sb.received("orders.jsonl").len(), 1);
}

#[test]
fn a_rejected_run_orders_nothing() {
    let sb = Sandbox::with_config(BIN, CONFIG);
    ask(&sb, "r", 3600);
    sb.stephost(&[
        "reject",
        "r",
        APPROVAL_SEQ,
        "--by",
        "bob",
        "--note",
        "too many",
    ])
    .expect_code(0);
    let resumed = sb.stephost(&["resume", "r"]);
    resumed.expect_code(0);
    let out = resumed.json();
    assert_eq!(out["verdict"], "rejected");
    assert_eq!(out["by"], "bob");
    assert_eq!(out["ordered"], false);
    assert!(sb.received("orders.jsonl").is_empty());
}

#[test]
fn an_approval_expires_and_a_late_decision_is_refused() {
    let sb = Sandbox::with_config(BIN, CONFIG);
    ask(&sb, "e", 1);
    std::thread::sleep(Duration::from_millis(1300));
    let late = sb.stephost(&[
        "approve",
        "e",
        APPROVAL_SEQ,
        "--details",
        &shown(&sb, "e"),
        "--by",
        "alice",
    ]);
    late.expect_code(2);
    assert!(late.stderr.contains("expired"), "{}", late.stderr);
    // A worker wakes the run when the approval expires; the step sees it.
    sb.stephost(&["worker", "--exit-when-idle"]).expect_code(0);
    let show = sb.show("e");
    assert_eq!(show["run"]["status"], "completed");
    let out: Value = serde_json::from_str(show["run"]["output"].as_str().unwrap()).unwrap();
    assert_eq!(out["verdict"], "expired");
    assert!(sb.received("orders.jsonl").is_empty());
    let metrics = sb.stephost(&["metrics"]).stdout;
    assert!(metrics.contains("approvals_expired_total 1"), "{metrics}");
}

#[test]
fn deciding_an_unknown_call_or_a_non_approval_is_refused() {
    let sb = Sandbox::with_config(BIN, CONFIG);
    ask(&sb, "u", 3600);
    let missing = sb.stephost(&[
        "approve",
        "u",
        "9",
        "--details",
        &shown(&sb, "u"),
        "--by",
        "alice",
    ]);
    missing.expect_code(2);
    assert!(
        missing.stderr.contains("no such call"),
        "{}",
        missing.stderr
    );
    sb.stephost(&[
        "approve",
        "nope",
        "1",
        "--details",
        &shown(&sb, "nope"),
        "--by",
        "alice",
    ])
    .expect_code(2);
    sb.stephost(&[
        "approve",
        "u",
        APPROVAL_SEQ,
        "--details",
        &shown(&sb, "u"),
        "--by",
        "alice",
    ])
    .expect_code(0);
    sb.stephost(&["resume", "u"]).expect_code(0);
    // Call #2 is the stock read, not an approval.
    let wrong = sb.stephost(&[
        "approve",
        "u",
        "2",
        "--details",
        &shown(&sb, "u"),
        "--by",
        "alice",
    ]);
    wrong.expect_code(2);
    assert!(wrong.stderr.contains("not an approval"), "{}", wrong.stderr);
}

#[test]
fn a_waiting_run_survives_a_worker_restart() {
    let sb = Sandbox::with_config(BIN, CONFIG);
    sb.stephost(&[
        "submit",
        guests::APPROVAL_STEP,
        "--input",
        r#"{"sku":"WIDGET-7","quantity":10}"#,
        "--run-id",
        "w",
    ])
    .expect_code(0);
    // The first worker runs the step up to the approval and lets go of it.
    sb.stephost(&["worker", "--exit-when-idle"]).expect_code(0);
    assert_eq!(sb.show("w")["run"]["status"], "waiting");
    // A worker started now has nothing to do until someone decides.
    sb.stephost(&["worker", "--exit-when-idle"]).expect_code(0);
    assert_eq!(sb.show("w")["run"]["status"], "waiting");
    sb.stephost(&[
        "approve",
        "w",
        APPROVAL_SEQ,
        "--details",
        &shown(&sb, "w"),
        "--by",
        "carol",
    ])
    .expect_code(0);
    sb.stephost(&["worker", "--exit-when-idle"]).expect_code(0);
    assert_eq!(sb.show("w")["run"]["status"], "completed");
    assert_eq!(sb.received("orders.jsonl").len(), 1);
}

#[test]
fn a_short_sleep_is_slept_in_place_and_replays_at_once() {
    let sb = Sandbox::new(BIN);
    let ran = sb.run(guests::SLEEPER, r#"{"ms": 300}"#, "s");
    ran.expect_code(0);
    let out = ran.json();
    assert!(
        out["after"].as_u64().unwrap() - out["before"].as_u64().unwrap() >= 299_000_000,
        "{out}"
    );
    sb.stephost(&["replay", "s"]).expect_code(0);
    let show = sb.show("s");
    let sleep = calls(&show)
        .iter()
        .find(|c| c["interface"] == "stephost:step/timers")
        .unwrap();
    assert_eq!(sleep["state"], "succeeded");
}

#[test]
fn a_long_sleep_survives_a_crash_releases_the_run_and_wakes_once() {
    let sb = Sandbox::new(BIN);
    // sleeper's calls: #1 write, #2 clock, #3 the sleep, #4 clock, #5 write.
    // Crash right after the sleep is recorded: its wake time is on disk.
    let crashed = sb.run_crashing_at(
        "after-started@3",
        guests::SLEEPER,
        r#"{"ms": 4000}"#,
        "long",
    );
    assert_eq!(crashed.signal, Some(libc::SIGABRT), "{crashed:?}");
    let resumed = sb.stephost(&["resume", "long"]);
    resumed.expect_code(7);
    let show = sb.show("long");
    assert_eq!(show["run"]["status"], "waiting");
    assert!(show["run"]["owner"].is_null());
    let sleep = calls(&show)[2].clone();
    assert_eq!(sleep["interface"], "stephost:step/timers");
    // The wake time is the recorded start plus the sleep, not restarted by
    // the crash or the resume.
    assert_eq!(
        show["run"]["wake_at_ms"].as_i64().unwrap(),
        sleep["started_at_ms"].as_i64().unwrap() + 4000
    );
    // Not due yet: a worker has nothing to do.
    sb.stephost(&["worker", "--exit-when-idle"]).expect_code(0);
    assert_eq!(sb.show("long")["run"]["status"], "waiting");
    wait_until_past(show["run"]["wake_at_ms"].as_i64().unwrap());
    sb.stephost(&["worker", "--exit-when-idle"]).expect_code(0);
    let show = sb.show("long");
    assert_eq!(show["run"]["status"], "completed");
    assert_eq!(sb.received("orders.jsonl").len(), 2);
    let out: Value = serde_json::from_str(show["run"]["output"].as_str().unwrap()).unwrap();
    assert!(
        out["after"].as_u64().unwrap() - out["before"].as_u64().unwrap() >= 3_999_000_000,
        "{out}"
    );
    let sleeps = calls(&show)
        .iter()
        .filter(|c| c["interface"] == "stephost:step/timers")
        .count();
    assert_eq!(sleeps, 1, "the sleep was recorded once");
}

fn wait_until_past(at_ms: i64) {
    loop {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        if now > at_ms + 50 {
            return;
        }
        std::thread::sleep(Duration::from_millis(
            (at_ms + 60 - now).clamp(10, 500) as u64
        ));
    }
}

/// The WASI waits `show` lists for `run_id`: (function, request, state).
fn wasi_waits(sb: &Sandbox, run_id: &str) -> Vec<(String, String, String)> {
    calls(&sb.show(run_id))
        .iter()
        .filter(|c| c["interface"] == "wasi:clocks/monotonic-clock" && c["class"] == "suspend")
        .map(|c| {
            (
                c["function"].as_str().unwrap().to_string(),
                c["request"].as_str().unwrap().to_string(),
                c["state"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn an_hour_long_wasi_sleep_becomes_a_durable_timer_instead_of_a_hang() {
    let sb = Sandbox::new(BIN);
    let ran = sb.run(guests::WASI_ONLY, r#"{"sleep_ms": 3600000}"#, "h");
    ran.expect_code(7);
    let show = sb.show("h");
    assert_eq!(show["run"]["status"], "waiting");
    assert!(
        show["run"]["owner"].is_null(),
        "a waiting run holds no claim"
    );
    assert_eq!(
        wasi_waits(&sb, "h"),
        vec![(
            "subscribe-duration".to_string(),
            r#"{"ms":3600000}"#.to_string(),
            "started".to_string()
        )]
    );
    // A worker has nothing to do with it until it is due, and exits.
    sb.stephost(&["worker", "--exit-when-idle"]).expect_code(0);
    assert_eq!(sb.show("h")["run"]["status"], "waiting");
}

#[test]
fn a_short_wasi_sleep_is_slept_recorded_and_replayed_without_waiting() {
    let sb = Sandbox::new(BIN);
    sb.run(guests::WASI_ONLY, r#"{"sleep_ms": 200}"#, "s")
        .expect_code(0);
    assert_eq!(
        wasi_waits(&sb, "s"),
        vec![(
            "subscribe-duration".to_string(),
            r#"{"ms":200}"#.to_string(),
            "succeeded".to_string()
        )]
    );
    sb.stephost(&["replay", "s"]).expect_code(0);
}

#[test]
fn an_approval_subject_past_its_limit_ends_the_run_before_anything_is_recorded() {
    let sb = Sandbox::with_config(BIN, CONFIG);
    let sku = "W".repeat(2000);
    let ran = sb.run(
        guests::APPROVAL_STEP,
        &json!({"sku": sku, "quantity": 1, "ttl_seconds": 60}).to_string(),
        "long-subject",
    );
    ran.expect_code(3);
    assert!(
        ran.stderr.contains("approval_subject_bytes_max = 1024"),
        "{}",
        ran.stderr
    );
    assert!(calls(&sb.show("long-subject")).is_empty());
    assert!(pending(&sb).is_empty());
}
