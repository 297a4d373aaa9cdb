//! Tamper evidence with a chain key: a seal cannot be stripped to make a
//! forged run verify, and an edit made to the ledger between two events of
//! a run is refused by whoever would act on it next (a resume, a worker, a
//! person's decision), never signed with the real key.

use std::ffi::OsStr;
use std::path::PathBuf;

use serde_json::Value;
use stephost_tests::{Ran, Sandbox, guests};

const BIN: &str = env!("CARGO_BIN_EXE_stephost-crash");

/// A chain key file for `sb`, readable by its owner only.
fn chain_key(sb: &Sandbox) -> PathBuf {
    let key = sb.path("chain.key");
    std::fs::write(&key, "0123456789abcdef0123456789abcdef\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    key
}

/// `stephost ARGS` signing with the key at `key`.
fn keyed(sb: &Sandbox, key: &PathBuf, args: &[&str]) -> Ran {
    sb.stephost_with_env("STEPHOST_CHAIN_KEY_FILE", key, args)
}

/// Changes the run's row in the ledger as someone with direct access might.
fn edit_run(sb: &Sandbox, run_id: &str, edit: &mut dyn FnMut(&mut stephost_core::RunRecord)) {
    sb.tamper().edit_run(run_id, edit).unwrap();
}

#[test]
fn a_run_stripped_of_its_seal_does_not_verify() {
    let sb = Sandbox::new(BIN);
    let key = chain_key(&sb);
    keyed(
        &sb,
        &key,
        &[
            "run",
            guests::MULTI_WRITE,
            "--input",
            r#"{"count":2}"#,
            "--run-id",
            "s",
        ],
    )
    .expect_code(0);
    keyed(&sb, &key, &["verify", "s"]).expect_code(0);

    // In the ledger: the seal removed, the output forged.
    edit_run(&sb, "s", &mut |run| {
        run.seal = None;
        run.output = Some(r#"{"forged":true}"#.into());
    });
    let stripped = keyed(&sb, &key, &["verify", "s"]);
    stripped.expect_code(4);
    assert!(stripped.stdout.contains("no seal"), "{}", stripped.stdout);
    // Without the key, a stripped seal is no better.
    sb.stephost(&["verify", "s"]).expect_code(4);

    // In an export: the seal deleted, the output changed, the last call
    // dropped.
    keyed(
        &sb,
        &key,
        &[
            "run",
            guests::MULTI_WRITE,
            "--input",
            r#"{"count":2}"#,
            "--run-id",
            "e",
        ],
    )
    .expect_code(0);
    let export = sb.stephost(&["export", "e"]);
    export.expect_code(0);
    let mut fixture: Value = serde_json::from_str(&export.stdout).unwrap();
    fixture.as_object_mut().unwrap().remove("seal");
    fixture["output"] = Value::String(r#"{"forged":true}"#.into());
    fixture["calls"].as_array_mut().unwrap().pop();
    std::fs::write(sb.path("forged.json"), fixture.to_string()).unwrap();
    let forged = keyed(&sb, &key, &["verify", "forged.json"]);
    forged.expect_code(4);
    assert!(forged.stdout.contains("no seal"), "{}", forged.stdout);
}

#[test]
fn an_edited_call_is_refused_by_resume_and_workers_and_never_sealed() {
    let sb = Sandbox::new(BIN);
    let key = chain_key(&sb);
    let crash_and_key = [
        ("STEPHOST_CHAIN_KEY_FILE", key.as_os_str()),
        ("STEPHOST_CRASH_AT", OsStr::new("after-started@6")),
    ];
    let crashed = sb.stephost_with_envs(
        &crash_and_key,
        &[
            "run",
            guests::MULTI_WRITE,
            "--input",
            r#"{"count":2}"#,
            "--run-id",
            "t",
        ],
    );
    assert_eq!(crashed.signal, Some(libc::SIGABRT));
    let orders = sb.received("orders.jsonl").len();
    assert_eq!(orders, 1);

    // Between two executions: the first clock reading is changed.
    sb.tamper()
        .edit_call("t", 1, &mut |call| {
            call.outcome = Some(r#"{"ok":1}"#.into())
        })
        .unwrap();
    let before = sb.show("t")["run"].clone();

    let resumed = keyed(&sb, &key, &["resume", "t"]);
    resumed.expect_code(4);
    assert!(
        resumed.stderr.contains("does not verify") && resumed.stderr.contains("call #1"),
        "{}",
        resumed.stderr
    );
    let after = sb.show("t")["run"].clone();
    assert_eq!(after["status"], "running");
    assert_eq!(after["seal"], before["seal"], "the edited run was sealed");
    assert_eq!(
        sb.show("t")["calls"].as_array().unwrap().len(),
        6,
        "the edited run was extended"
    );
    assert_eq!(sb.received("orders.jsonl").len(), orders);

    // A worker claims it once (its row matches its seal), stops on the
    // edited call, and does not take it again.
    let worker = keyed(
        &sb,
        &key,
        &["worker", "--exit-when-idle", "--lease-ms", "500"],
    );
    worker.expect_code(0);
    assert!(
        worker.stderr.contains("does not verify"),
        "{}",
        worker.stderr
    );
    assert_eq!(sb.show("t")["run"]["seal"], before["seal"]);
    assert_eq!(sb.received("orders.jsonl").len(), orders);
    assert!(sb.metric("integrity_refusal_total") >= 1);
    keyed(&sb, &key, &["verify", "t"]).expect_code(4);
}

#[test]
fn an_edited_row_is_refused_by_a_decision_a_resume_and_a_worker() {
    let sb = Sandbox::with_config(BIN, stephost_tests::APPROVAL_CONFIG);
    let key = chain_key(&sb);
    keyed(
        &sb,
        &key,
        &[
            "run",
            guests::APPROVAL_STEP,
            "--input",
            r#"{"sku":"WIDGET-7","quantity":10,"ttl_seconds":3600}"#,
            "--run-id",
            "a",
        ],
    )
    .expect_code(7);
    let listed = sb.stephost(&["approvals", "--json"]).json();
    let sha = listed[0]["details_sha256"].as_str().unwrap()[..12].to_string();

    // While it waits for a person, its input is changed in the ledger.
    edit_run(&sb, "a", &mut |run| {
        run.input = r#"{"sku":"WIDGET-7","quantity":9999,"ttl_seconds":3600}"#.into()
    });
    let approved = keyed(
        &sb,
        &key,
        &["approve", "a", "1", "--details", &sha, "--by", "alice"],
    );
    approved.expect_code(4);
    assert!(
        approved.stderr.contains("does not verify") && approved.stderr.contains("input"),
        "{}",
        approved.stderr
    );
    let show = sb.show("a");
    assert_eq!(
        show["calls"][0]["state"], "started",
        "the approval was decided"
    );
    assert_eq!(show["run"]["status"], "waiting");

    keyed(&sb, &key, &["resume", "a"]).expect_code(4);
    assert_eq!(sb.show("a")["run"]["version"], show["run"]["version"]);

    // A submitted run whose input is changed before a worker takes it: the
    // worker does not claim it, since its row does not match its seal.
    keyed(
        &sb,
        &key,
        &[
            "submit",
            guests::MULTI_WRITE,
            "--input",
            r#"{"count":1}"#,
            "--run-id",
            "p",
        ],
    )
    .expect_code(0);
    edit_run(&sb, "p", &mut |run| run.input = r#"{"count":3}"#.into());
    let pending = sb.show("p")["run"].clone();
    let worker = keyed(
        &sb,
        &key,
        &["worker", "--exit-when-idle", "--log-format", "json"],
    );
    worker.expect_code(0);
    // The worker says so, naming the run and the trace it reports into.
    let refusal = worker
        .stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| {
            l["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("not claiming run p"))
        })
        .unwrap_or_else(|| panic!("the worker's refusal: {}", worker.stderr));
    assert_eq!(refusal["level"], "warn");
    assert_eq!(refusal["run_id"], "p");
    assert_eq!(refusal["trace_id"], pending["trace"]["trace_id"]);
    assert!(refusal["trace_id"].as_str().is_some_and(|t| t.len() == 32));
    assert_eq!(sb.show("p")["run"]["version"], pending["version"]);
    assert_eq!(sb.show("p")["run"]["status"], "pending");
    assert!(sb.received("orders.jsonl").is_empty());
}
