//! Schedules: each slot of a cron expression starts one run, named after
//! the schedule and the slot, whichever of several workers fires it; a
//! paused schedule fires nothing; slots missed while no worker ran fire
//! only within the catch-up window. From the CLI, the API and the console.

use std::process::Stdio;

use serde_json::{Value, json};
use stephost_tests::{Sandbox, guests};

const BIN: &str = env!("CARGO_BIN_EXE_stephost-crash");

/// One write to `orders` (a deduplicating file receiver) a run.
const INPUT: &str = r#"{"count": 1}"#;

fn sandbox() -> Sandbox {
    Sandbox::new(BIN)
}

fn add(sb: &Sandbox, name: &str, extra: &[&str]) -> Value {
    let mut args = vec![
        "schedule",
        "add",
        name,
        "--cron",
        "* * * * * *",
        "--module",
        guests::MULTI_WRITE,
        "--input",
        INPUT,
        "--json",
    ];
    args.extend_from_slice(extra);
    sb.stephost(&args).expect_code(0).json()
}

fn list(sb: &Sandbox) -> Vec<Value> {
    sb.stephost(&["schedule", "list", "--json"])
        .expect_code(0)
        .json()
        .as_array()
        .expect("a list")
        .clone()
}

/// The runs of schedule `name`, by slot (the run id's part after `@`).
fn fired(sb: &Sandbox, name: &str) -> Vec<Value> {
    let runs = sb
        .stephost(&["runs", "--json", "--limit", "1000"])
        .expect_code(0)
        .json();
    let mut mine: Vec<Value> = runs
        .as_array()
        .expect("runs")
        .iter()
        .filter(|r| {
            r["run_id"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{name}@"))
        })
        .cloned()
        .collect();
    mine.sort_by_key(|r| r["run_id"].as_str().unwrap().to_string());
    mine
}

/// The slot of a fired run, in ms since the epoch.
fn slot_ms(run: &Value) -> i64 {
    let id = run["run_id"].as_str().unwrap();
    let at = id.split('@').nth(1).unwrap();
    let t = chrono::DateTime::parse_from_rfc3339(at).expect("a slot");
    t.timestamp_millis()
}

/// `count` workers started at once, each exiting once nothing is due;
/// waits for them all.
fn workers_at_once(sb: &Sandbox, count: usize) {
    let mut children: Vec<_> = (0..count)
        .map(|i| {
            sb.command(&[
                "worker",
                "--concurrency",
                "2",
                "--poll-ms",
                "50",
                "--worker-id",
                &format!("w{i}"),
                "--exit-when-idle",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start a worker")
        })
        .collect();
    for child in &mut children {
        assert!(child.wait().expect("a worker").success());
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[test]
fn three_workers_fire_each_missed_slot_in_the_window_once_and_none_before_it() {
    let sb = sandbox();
    let added = add(&sb, "tick", &["--overlap", "allow", "--catch-up", "3s"]);
    let first_slot = added["next_at_ms"].as_i64().unwrap();
    // No worker runs while slots come and go: the first ones fall out of
    // the catch-up window.
    while now_ms() < first_slot + 6_000 {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let started = now_ms();
    workers_at_once(&sb, 3);
    let runs = fired(&sb, "tick");
    assert!(!runs.is_empty(), "the slots in the window fired");
    let slots: Vec<i64> = runs.iter().map(slot_ms).collect();
    // Nothing older than the window as the first worker looked.
    assert!(
        slots.iter().all(|s| *s >= started - 3_000 - 1_000),
        "slots before the window fired: {slots:?} (workers started at {started})"
    );
    assert!(!slots.contains(&first_slot), "{slots:?}");
    // Every slot from the window's first on fired, each once: one run and
    // one order at the receiver apiece.
    for pair in slots.windows(2) {
        assert_eq!(pair[1] - pair[0], 1_000, "a slot was missed: {slots:?}");
    }
    for run in &runs {
        assert_eq!(run["status"], "completed", "{run:#}");
    }
    let orders = sb.received("orders.jsonl");
    assert_eq!(orders.len(), runs.len(), "{orders:#?}");
    assert_eq!(
        stephost_tests::distinct_operations(&orders).len(),
        runs.len()
    );
    // Each slot's run was made by one worker; the slots before the window
    // were passed over.
    assert_eq!(sb.metric("schedule_runs_fired_total"), runs.len() as i64);
    assert!(sb.metric("schedule_slots_skipped_total") >= 1);
    let tick = &list(&sb)[0];
    assert_eq!(
        tick["last_run_id"],
        runs.last().unwrap()["run_id"],
        "{tick:#}"
    );
}

#[test]
fn a_paused_schedule_fires_nothing_and_resumes_from_its_next_slot() {
    let sb = sandbox();
    add(&sb, "nightly", &[]);
    sb.stephost(&["schedule", "pause", "nightly"])
        .expect_code(0);
    assert_eq!(list(&sb)[0]["paused"], true);
    std::thread::sleep(std::time::Duration::from_millis(2_500));
    workers_at_once(&sb, 1);
    assert!(fired(&sb, "nightly").is_empty());
    let resumed_at = now_ms();
    sb.stephost(&["schedule", "resume", "nightly"])
        .expect_code(0);
    let resumed = &list(&sb)[0];
    assert_eq!(resumed["paused"], false);
    assert!(resumed["next_at_ms"].as_i64().unwrap() > resumed_at - 1_000);
    while now_ms() < resumed_at + 2_000 {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    workers_at_once(&sb, 1);
    let runs = fired(&sb, "nightly");
    assert!(!runs.is_empty());
    assert!(
        runs.iter().all(|r| slot_ms(r) >= resumed_at - 1_000),
        "a slot of the paused time fired: {runs:#?}"
    );
    // `skip` (the default): one run at a time, the newest slot.
    assert_eq!(runs.len(), 1, "{runs:#?}");
    // Removed, it fires nothing more; its runs stay.
    sb.stephost(&["schedule", "remove", "nightly"])
        .expect_code(0);
    assert!(list(&sb).is_empty());
    assert_eq!(fired(&sb, "nightly").len(), 1);
    let again = sb.stephost(&["schedule", "remove", "nightly"]);
    again.expect_code(2);
    assert!(
        again.stderr.contains("no schedule nightly"),
        "{}",
        again.stderr
    );
}

#[test]
fn a_schedule_is_refused_with_what_is_wrong() {
    let sb = sandbox();
    let bad_cron = sb.stephost(&[
        "schedule",
        "add",
        "x",
        "--cron",
        "61 * * * *",
        "--module",
        guests::MULTI_WRITE,
    ]);
    bad_cron.expect_code(2);
    assert!(
        bad_cron.stderr.contains("cron expression"),
        "{}",
        bad_cron.stderr
    );
    let bad_zone = sb.stephost(&[
        "schedule",
        "add",
        "x",
        "--cron",
        "0 7 * * *",
        "--timezone",
        "Mars/Olympus",
        "--module",
        guests::MULTI_WRITE,
    ]);
    bad_zone.expect_code(2);
    assert!(bad_zone.stderr.contains("IANA"), "{}", bad_zone.stderr);
    let no_step = sb.stephost(&[
        "schedule",
        "add",
        "x",
        "--cron",
        "0 7 * * *",
        "--step",
        "nope@1",
    ]);
    no_step.expect_code(2);
    assert!(no_step.stderr.contains("--module"), "{}", no_step.stderr);
    add(&sb, "x", &[]);
    let twice = sb.stephost(&[
        "schedule",
        "add",
        "x",
        "--cron",
        "0 7 * * *",
        "--module",
        guests::MULTI_WRITE,
    ]);
    twice.expect_code(2);
    assert!(twice.stderr.contains("exists"), "{}", twice.stderr);
}

#[test]
fn the_api_and_the_console_add_list_pause_resume_and_remove_schedules() {
    let sb = sandbox();
    // A build the ledger has run: a schedule names it by its step.
    sb.run(guests::MULTI_WRITE, r#"{"count": 0}"#, "seed")
        .expect_code(0);
    let step = sb.show("seed")["run"]["step"].as_str().unwrap().to_string();
    let served = sb.serve(
        &[],
        &[(
            "STEPHOST_API_TOKENS",
            "ana operator ana-token-0123456789abcdef\nviewer read viewer-token-0123456789",
        )],
    );
    let ana = served.with_token("ana-token-0123456789abcdef");
    let viewer = served.with_token("viewer-token-0123456789");
    let added = ana
        .post(
            "/api/schedules",
            &json!({"name": "morning", "cron": "0 7 * * *", "timezone": "Europe/Paris",
                    "step": step, "input": {"count": 1}, "overlap": "buffer-one"}),
        )
        .expect(201);
    assert_eq!(added["overlap"], "buffer-one");
    assert_eq!(added["input"], r#"{"count":1}"#);
    viewer
        .post(
            "/api/schedules",
            &json!({"name": "other", "cron": "0 7 * * *", "step": step}),
        )
        .expect_error(403, "forbidden");
    ana.post(
        "/api/schedules",
        &json!({"name": "morning", "cron": "0 8 * * *", "step": step}),
    )
    .expect_error(409, "schedule_exists");
    ana.post(
        "/api/schedules",
        &json!({"name": "bad", "cron": "0 25 * * *", "step": step}),
    )
    .expect_error(400, "bad_input");
    ana.post("/api/schedules/nope/pause", &json!(null))
        .expect_error(404, "unknown_schedule");
    let listed = viewer.get("/api/schedules").expect(200);
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed:#}");
    // The console pauses it and resumes it.
    served.browse("schedules.mjs", &[]);
    let after = viewer.get("/api/schedules").expect(200);
    assert_eq!(after[0]["paused"], false, "{after:#}");
    assert!(after[0]["version"].as_i64().unwrap() >= 3, "{after:#}");
    ana.post("/api/schedules/morning/pause", &json!(null))
        .expect(200);
    assert_eq!(list(&sb)[0]["paused"], true);
    ana.request("DELETE", "/api/schedules/morning", None)
        .expect(200);
    assert!(list(&sb).is_empty());
}
