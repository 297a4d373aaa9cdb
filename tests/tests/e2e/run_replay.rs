//! Running, showing, exporting and replaying steps through the real binary.

use serde_json::{Value, json};
use stephost_tests::{SUPPLIER_CONFIG, Sandbox, attempts_for, calls, distinct_operations, guests};

const BIN: &str = env!("CARGO_BIN_EXE_stephost-crash");

#[test]
fn the_supplier_example_orders_the_shortage_once_and_records_every_call() {
    let sb = Sandbox::with_config(BIN, SUPPLIER_CONFIG);
    let ran = sb.run(
        guests::SUPPLIER_ORDER,
        r#"{"sku":"WIDGET-7","quantity":10}"#,
        "order-1",
    );
    ran.expect_code(0);
    let out = ran.json();
    assert_eq!(out["shortage"], 7);
    assert_eq!(out["ordered"], true);
    let orders = sb.received("supplier-orders.jsonl");
    assert_eq!(orders.len(), 1);
    assert_eq!(orders[0]["request"]["quantity"], 7);
    assert_eq!(orders[0]["run_id"], "order-1");
    assert_eq!(out["receipt"]["operation_id"], orders[0]["operation_id"]);

    let show = sb.show("order-1");
    assert_eq!(show["run"]["status"], "completed");
    let calls = calls(&show);
    let summary: Vec<(String, String, String)> = calls
        .iter()
        .map(|c| {
            (
                c["class"].as_str().unwrap().to_string(),
                c["function"].as_str().unwrap().to_string(),
                c["state"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(summary.first().unwrap().1, "inventory.read");
    assert_eq!(summary.last().unwrap().0, "write");
    assert_eq!(summary.last().unwrap().1, "supplier.order");
    assert!(summary.iter().all(|(_, _, state)| state == "succeeded"));
    // The write's operation id is the Idempotency-Key the receiver saw.
    assert_eq!(
        calls.last().unwrap()["operation_id"],
        orders[0]["operation_id"]
    );
    // Sequence numbers count from 1 without gaps.
    let seqs: Vec<u64> = calls.iter().map(|c| c["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=calls.len() as u64).collect::<Vec<_>>());
}

#[test]
fn replay_of_a_finished_run_performs_no_io_and_confirms_the_output() {
    let sb = Sandbox::new(BIN);
    let ran = sb.run(guests::MULTI_WRITE, r#"{"count":3}"#, "r1");
    ran.expect_code(0);
    let output = ran.json();
    assert_eq!(sb.received("orders.jsonl").len(), 3);
    let before = sb.show("r1");

    // Take every effect away and delete the receiver's file: a replay that
    // tried to perform anything would be denied or would recreate the file.
    sb.set_config("");
    std::fs::remove_file(sb.path("orders.jsonl")).unwrap();
    let replay = sb.stephost(&["replay", "r1", "--json"]);
    replay.expect_code(0);
    let report = replay.json();
    assert_eq!(report["result"], "consistent", "{report:#}");
    assert_eq!(
        serde_json::from_str::<Value>(report["output"].as_str().unwrap()).unwrap(),
        output
    );
    assert!(
        !sb.path("orders.jsonl").exists(),
        "replay touched the receiver"
    );
    // The ledger is unchanged: no call, attempt or log was added.
    assert_eq!(sb.show("r1"), before);
}

#[test]
fn resuming_a_completed_run_returns_its_output_without_performing_anything() {
    let sb = Sandbox::new(BIN);
    let first = sb.run(guests::MULTI_WRITE, r#"{"count":2}"#, "done");
    first.expect_code(0);
    let again = sb.stephost(&["resume", "done"]);
    again.expect_code(0);
    assert_eq!(again.json(), first.json());
    assert_eq!(sb.received("orders.jsonl").len(), 2);
    for seq in [3, 6] {
        assert_eq!(attempts_for(&sb.show("done"), seq).len(), 1);
    }
}

#[test]
fn replay_against_a_changed_module_names_the_first_divergent_call() {
    let sb = Sandbox::new(BIN);
    sb.run(guests::MULTI_WRITE, r#"{"count":3}"#, "r1")
        .expect_code(0);
    let replay = sb.stephost(&["replay", "r1", "--module", guests::DIVERGENT, "--json"]);
    replay.expect_code(4);
    let report = replay.json();
    assert_eq!(report["result"], "diverged", "{report:#}");
    let d = &report["divergence"];
    // The divergent guest changes the request of its second write (call #6).
    assert_eq!(d["seq"], 6, "{report:#}");
    assert_eq!(d["recorded"]["interface"], "stephost:step/effects");
    assert_eq!(d["recorded"]["function"], "orders");
    let recorded: Value = serde_json::from_str(d["recorded"]["request"].as_str().unwrap()).unwrap();
    let new: Value = serde_json::from_str(d["new"]["request"].as_str().unwrap()).unwrap();
    assert_eq!(recorded["i"], 1);
    assert_eq!(new["divergent"], true);
    assert!(recorded.get("divergent").is_none());

    // The human-readable form names both sides too.
    let text = sb.stephost(&["replay", "r1", "--module", guests::DIVERGENT]);
    text.expect_code(4);
    assert!(text.stdout.contains("call #6 diverged"), "{}", text.stdout);
    assert!(text.stdout.contains("recorded:") && text.stdout.contains("new:"));
}

#[test]
fn an_exported_run_replays_from_its_file_with_no_ledger() {
    let sb = Sandbox::new(BIN);
    sb.run(guests::MULTI_WRITE, r#"{"count":2}"#, "r1")
        .expect_code(0);
    let export = sb.stephost(&["export", "r1"]);
    export.expect_code(0);
    let fixture = export.json();
    assert_eq!(fixture["format"], "stephost-run/1");
    assert_eq!(fixture["status"], "completed");
    std::fs::write(sb.path("r1.json"), &export.stdout).unwrap();

    // Another folder, no database: the fixture and the module are enough.
    let other = Sandbox::with_config(BIN, "");
    std::fs::copy(sb.path("r1.json"), other.path("r1.json")).unwrap();
    let ok = other.stephost(&[
        "replay",
        "--fixture",
        "r1.json",
        "--module",
        guests::MULTI_WRITE,
    ]);
    ok.expect_code(0);
    assert!(ok.stdout.starts_with("consistent"), "{}", ok.stdout);
    assert!(!other.ledger_exists(), "a fixture replay opened a ledger");

    let bad = other.stephost(&[
        "replay",
        "--fixture",
        "r1.json",
        "--module",
        guests::DIVERGENT,
    ]);
    bad.expect_code(4);
    assert!(bad.stdout.contains("call #6 diverged"), "{}", bad.stdout);
}

#[test]
fn wasi_clock_random_and_hash_seed_are_recorded_and_replay_exactly() {
    let sb = Sandbox::new(BIN);
    let ran = sb.run(guests::MULTI_WRITE, r#"{"count":1}"#, "r1");
    ran.expect_code(0);
    let out = ran.json();
    let show = sb.show("r1");
    let interfaces: Vec<&str> = calls(&show)
        .iter()
        .map(|c| c["interface"].as_str().unwrap())
        .collect();
    assert!(
        interfaces.contains(&"wasi:clocks/wall-clock"),
        "{interfaces:?}"
    );
    assert!(interfaces.contains(&"stephost:step/clock"));
    assert!(interfaces.contains(&"stephost:step/random"));
    // The replayed output (which includes std's SystemTime::now and the
    // iteration order of a default-hashed HashMap) equals the original.
    let replay = sb.stephost(&["replay", "r1", "--json"]);
    replay.expect_code(0);
    let replayed: Value = serde_json::from_str(replay.json()["output"].as_str().unwrap()).unwrap();
    assert_eq!(replayed, out);
    assert_eq!(replayed["wasi_now_ms"], out["wasi_now_ms"]);
}

#[test]
fn runs_and_show_list_what_the_ledger_holds() {
    let sb = Sandbox::new(BIN);
    sb.run(guests::MULTI_WRITE, r#"{"count":1}"#, "ok-run")
        .expect_code(0);
    sb.run(guests::PANICKER, "{}", "bad-run").expect_code(3);
    let runs = sb.stephost(&["runs", "--json"]);
    runs.expect_code(0);
    let runs = runs.json();
    let statuses: Vec<(String, String)> = runs
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["run_id"].as_str().unwrap().to_string(),
                r["status"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert!(statuses.contains(&("ok-run".into(), "completed".into())));
    assert!(statuses.contains(&("bad-run".into(), "failed".into())));
    let failed = sb
        .stephost(&["runs", "--status", "failed", "--json"])
        .json();
    assert_eq!(failed.as_array().unwrap().len(), 1);
    let table = sb.stephost(&["show", "ok-run"]);
    table.expect_code(0);
    assert!(table.stdout.contains("orders"), "{}", table.stdout);
    assert!(table.stdout.contains("succeeded"));
    let text = sb.stephost(&["runs"]);
    assert!(text.stdout.contains("ok-run") && text.stdout.contains("bad-run"));
}

#[test]
fn the_same_run_id_with_another_input_is_refused() {
    let sb = Sandbox::new(BIN);
    sb.run(guests::MULTI_WRITE, r#"{"count":1}"#, "same")
        .expect_code(0);
    let again = sb.run(guests::MULTI_WRITE, r#"{"count":2}"#, "same");
    again.expect_code(2);
    assert!(again.stderr.contains("already exists"), "{}", again.stderr);
    assert_eq!(sb.received("orders.jsonl").len(), 1);
    distinct_operations(&sb.received("orders.jsonl"));
}

#[test]
fn an_ungranted_effect_is_denied_and_the_denial_is_recorded() {
    let sb = Sandbox::new(BIN);
    let ran = sb.run(
        guests::MULTI_WRITE,
        &json!({"count": 1, "effect": "payments"}).to_string(),
        "r1",
    );
    ran.expect_code(3);
    assert!(ran.stderr.contains("not granted"), "{}", ran.stderr);
    let show = sb.show("r1");
    let denied = calls(&show)
        .iter()
        .find(|c| c["function"] == "payments")
        .expect("the denied call is recorded");
    assert_eq!(denied["state"], "failed");
    assert!(denied["outcome"].as_str().unwrap().contains("denied"));
    assert!(sb.received("orders.jsonl").is_empty());
}

/// The log lines `show --json` lists for `run_id`: (level, message).
fn logs(sb: &Sandbox, run_id: &str) -> Vec<(String, String)> {
    sb.show(run_id)["logs"]
        .as_array()
        .expect("logs")
        .iter()
        .map(|l| {
            (
                l["level"].as_str().unwrap().to_string(),
                l["message"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn what_a_step_prints_is_recorded_once_and_not_printed_again_on_resume() {
    let sb = Sandbox::new(BIN);
    let crashed = sb.run_crashing_at(
        "after-outcome@6",
        guests::MULTI_WRITE,
        r#"{"count":2}"#,
        "p",
    );
    assert_eq!(crashed.signal, Some(libc::SIGABRT), "{crashed:?}");
    assert!(
        crashed
            .stderr
            .contains("stderr: guest stderr: write 0 sent"),
        "printed once, live, through the run's log: {}",
        crashed.stderr
    );
    let resumed = sb.stephost(&["resume", "p"]);
    resumed.expect_code(0);
    assert!(
        !resumed.stderr.contains("write 0 sent"),
        "the replayed prefix printed again: {}",
        resumed.stderr
    );
    assert!(
        resumed.stderr.contains("write 1 sent"),
        "{}",
        resumed.stderr
    );
    let printed: Vec<(String, String)> = logs(&sb, "p")
        .into_iter()
        .filter(|(level, _)| level == "stderr")
        .collect();
    assert_eq!(
        printed,
        vec![
            (
                "stderr".to_string(),
                "guest stderr: write 0 sent".to_string()
            ),
            (
                "stderr".to_string(),
                "guest stderr: write 1 sent".to_string()
            ),
        ]
    );
    let replayed = sb.stephost(&["replay", "p"]);
    replayed.expect_code(0);
    assert!(!replayed.stderr.contains("sent"), "{}", replayed.stderr);
}

#[test]
fn a_steps_output_past_its_limit_is_cut_with_a_marker() {
    let sb = Sandbox::with_config(
        BIN,
        "[limits]\nguest_output_bytes_max = 40\n\n[effects.orders]\nkind = \"echo\"\n",
    );
    sb.run(guests::MULTI_WRITE, r#"{"count":3}"#, "loud")
        .expect_code(0);
    let printed: Vec<String> = logs(&sb, "loud")
        .into_iter()
        .filter(|(level, _)| level == "stderr")
        .map(|(_, m)| m)
        .collect();
    assert_eq!(printed[0], "guest stderr: write 0 sent");
    assert_eq!(printed.len(), 3, "{printed:?}");
    assert!(
        printed[2].contains("guest_output_bytes_max = 40"),
        "{printed:?}"
    );
}

#[test]
fn text_a_step_chose_cannot_forge_lines_or_send_escapes_to_a_terminal() {
    let sb = Sandbox::new(BIN);
    let ran = sb.run(
        guests::MULTI_WRITE,
        &json!({"count": 1, "effect": "x\u{1b}[2J\nstephost: run forged completed"}).to_string(),
        "esc",
    );
    ran.expect_code(3);
    assert!(!ran.stderr.contains('\u{1b}'), "{:?}", ran.stderr);
    assert!(
        !ran.stderr
            .lines()
            .any(|l| l.starts_with("stephost: run forged")),
        "{}",
        ran.stderr
    );
    assert!(ran.stderr.contains("\\u{1b}[2J"), "{}", ran.stderr);
    let show = sb.stephost(&["show", "esc"]);
    show.expect_code(0);
    assert!(!show.stdout.contains('\u{1b}'), "{:?}", show.stdout);
}
