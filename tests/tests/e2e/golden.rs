//! Golden files (`tests/golden/`, see `stephost_tests::golden` for how to
//! re-bless them): what `show --json` and `metrics` print for the supplier
//! run, each command's `--help`, and the API's JSON for runs and calls. And
//! the frozen ledgers (`tests/frozen/`): every later build must open,
//! replay and verify them.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use stephost_tests::golden::{self, normalize, pretty};
use stephost_tests::{Ran, Sandbox, calls, guests};
use supplier_receiver::Receiver;

const BIN: &str = env!("CARGO_BIN_EXE_stephost-crash");

const INPUT: &str = r#"{"sku":"WIDGET-7","quantity":10}"#;
/// The supplier step's calls: 1 inventory.read, 2 clock, 3 random, 4 supplier.order.
const ORDER_SEQ: u64 = 4;

/// The supplier step's effects over HTTP against `receiver`, as
/// `examples/supplier-order/stephost-http.toml` has them.
fn http_config(receiver: &Receiver) -> String {
    // The order's table is the last: its retry policy goes at the end.
    stephost_tests::supplier_http_config(&receiver.url(), true)
        + "retry = { attempts_max = 5, backoff_first_ms = 50, backoff_max_ms = 2000 }\n"
}

/// The supplier story: the order reaches the supplier, the process dies
/// before its reply is recorded, and `resume` asks the supplier (a lookup)
/// instead of ordering again, and completes. The sandbox and the receiver
/// (which the outputs name as `<receiver>`).
fn supplier_story() -> (Sandbox, Receiver) {
    let receiver = Receiver::start().unwrap();
    let sb = Sandbox::with_config(BIN, &http_config(&receiver));
    let crashed = sb.run_crashing_at(
        &format!("after-send@{ORDER_SEQ}"),
        guests::SUPPLIER_ORDER,
        INPUT,
        "order-1",
    );
    assert_eq!(crashed.signal, Some(libc::SIGABRT), "{crashed:?}");
    let resumed = sb.stephost(&["resume", "order-1"]);
    resumed.expect_code(0);
    assert_eq!(resumed.json()["receipt"]["order_id"], "ORD-1");
    assert_eq!(receiver.business_effects(), 1);
    assert_eq!(receiver.lookups(), 1);
    (sb, receiver)
}

/// `text` normalised for a golden file of the supplier story.
fn story_text(sb: &Sandbox, receiver: &Receiver, text: &str) -> String {
    let addr = receiver.addr().to_string();
    sb.normalize(text, &[(&addr, "<receiver>")])
}

#[test]
fn the_supplier_runs_show_json_and_the_metrics_match_their_golden_files() {
    let (sb, receiver) = supplier_story();
    let show = sb.stephost(&["show", "order-1", "--json"]);
    show.expect_code(0);
    assert_eq!(show.json()["run"]["status"], "completed");
    assert_eq!(calls(&show.json()).len(), ORDER_SEQ as usize);
    golden::check(
        "supplier/show.json",
        &story_text(&sb, &receiver, &show.stdout),
    );

    let metrics = sb.stephost(&["metrics"]);
    metrics.expect_code(0);
    assert!(
        metrics.stdout.contains("\nreconciliation_total 1\n"),
        "{}",
        metrics.stdout
    );
    golden::check(
        "supplier/metrics.txt",
        &story_text(&sb, &receiver, &metrics.stdout),
    );
}

#[test]
fn the_apis_json_for_runs_a_run_and_its_calls_matches_the_golden_files() {
    let (sb, receiver) = supplier_story();
    let served = sb.serve(&[], &[]);
    let addr = served.addr();
    for (path, file) in [
        ("/api/runs", "api/runs.json"),
        ("/api/runs/order-1", "api/run.json"),
        ("/api/runs/order-1/calls", "api/calls.json"),
    ] {
        let body = served.get(path).expect(200);
        let text = story_text(&sb, &receiver, &pretty(&body));
        golden::check(file, &normalize(&text, &[(&addr, "<addr>")]));
    }
    // The run is the row `show --json` prints.
    assert_eq!(
        served.get("/api/runs/order-1").expect(200)["run"],
        sb.show("order-1")["run"]
    );
    served.stop();
}

/// `stephost ARGS` as a person would type it: named `stephost`, with no
/// STEPHOST_* variable set (clap prints their values in the help).
fn stephost_bare(args: &[&str]) -> Ran {
    let dir = tempfile::tempdir().unwrap();
    let mut command = Command::new(BIN);
    command.arg0("stephost").current_dir(dir.path()).args(args);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("STEPHOST_") {
            command.env_remove(name);
        }
    }
    let output = command.output().expect("start stephost");
    assert!(output.status.success(), "stephost {args:?}: {output:?}");
    Ran {
        code: output.status.code(),
        signal: None,
        stdout: String::from_utf8(output.stdout).expect("help is UTF-8"),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// The subcommands `stephost --help` lists (but `help`).
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect()
}

#[test]
fn each_commands_help_matches_its_golden_file() {
    let top = stephost_bare(&["--help"]);
    golden::check("help/stephost.txt", &top.stdout);
    let commands = subcommands(&top.stdout);
    for expected in ["run", "show", "verify", "export", "serve", "metrics"] {
        assert!(
            commands.iter().any(|c| c == expected),
            "{expected} is not among {commands:?}"
        );
    }
    let mut checked = vec!["stephost.txt".to_string()];
    for command in &commands {
        let help = stephost_bare(&[command, "--help"]);
        assert!(
            help.stdout.contains(&format!("Usage: stephost {command}")),
            "{}",
            help.stdout
        );
        let file = format!("stephost-{command}.txt");
        golden::check(&format!("help/{file}"), &help.stdout);
        checked.push(file);
    }
    golden::check_no_others("help", &checked);
}

// The frozen ledgers.

/// The frozen sets: each folder of `tests/frozen/` (named by the day it
/// was made) with a `ledger.sqlite`, its test chain key and exported runs.
fn frozen_sets() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("frozen");
    let mut sets: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("read {}: {e}", root.display()))
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.join("ledger.sqlite").is_file())
        .collect();
    sets.sort();
    sets
}

/// The chain key the frozen set was sealed with, copied to `dir` readable
/// by its owner only (git does not keep a file's mode).
fn frozen_key(set: &Path, dir: &Path) -> PathBuf {
    let key = dir.join("chain.key");
    std::fs::copy(set.join("TEST-ONLY-chain.key"), &key).expect("the frozen set's test key");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    key
}

/// The bytes of module `digest` as the frozen ledger file stores them, read
/// from the checked-in file itself (opened read-only), so that the exported
/// run can be replayed against the build it was recorded with.
fn frozen_module(set: &Path, digest: &str) -> Vec<u8> {
    let conn = rusqlite::Connection::open_with_flags(
        set.join("ledger.sqlite"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .expect("open the frozen ledger read-only");
    conn.query_row(
        "SELECT bytes FROM modules WHERE digest = ?1",
        [digest],
        |row| row.get(0),
    )
    .unwrap_or_else(|e| panic!("module {digest} in the frozen ledger: {e}"))
}

#[test]
fn every_frozen_ledger_opens_replays_and_verifies_with_this_build() {
    let sets = frozen_sets();
    assert!(!sets.is_empty(), "no frozen ledger in tests/frozen");
    for set in &sets {
        check_frozen(set);
    }
}

fn check_frozen(set: &Path) {
    let day = set.file_name().unwrap().to_string_lossy().into_owned();
    let original = std::fs::read(set.join("ledger.sqlite")).unwrap();
    // A copy: opening a ledger may migrate it, and the test changes it.
    let work = tempfile::tempdir().unwrap();
    let ledger = work.path().join("ledger.db");
    std::fs::write(&ledger, &original).unwrap();
    let key = frozen_key(set, work.path());
    // No effects are granted and no receiver runs: whatever the frozen runs
    // need is in the ledger.
    let sb = Sandbox::with_ledger(BIN, "", Some(format!("sqlite:{}", ledger.display())));
    let keyed = |args: &[&str]| sb.stephost_with_env("STEPHOST_CHAIN_KEY_FILE", &key, args);

    let runs = sb.stephost(&["runs", "--json"]);
    runs.expect_code(0);
    golden::check(&format!("frozen/{day}/runs.json"), &runs.stdout);
    let runs = runs.json();
    let runs = runs.as_array().unwrap();
    assert!(
        runs.iter().any(|r| r["status"] == "completed"),
        "{day}: a frozen ledger holds a completed run: {runs:#?}"
    );

    for run in runs {
        let run_id = run["run_id"].as_str().unwrap();
        let status = run["status"].as_str().unwrap();
        let what = format!("frozen {day}, run {run_id} ({status})");

        let verified = keyed(&["verify", run_id]);
        verified.expect_code(0);
        assert!(
            verified
                .stdout
                .starts_with(&format!("intact: run {run_id},"))
                && verified.stdout.contains("signed with the chain key"),
            "{what}: {}",
            verified.stdout
        );
        // Sealed with the key: without it nothing can be claimed intact.
        let unkeyed = sb.stephost(&["verify", run_id]);
        unkeyed.expect_code(4);
        assert!(
            unkeyed.stdout.starts_with("not checked"),
            "{what}: {}",
            unkeyed.stdout
        );

        let show = sb.stephost(&["show", run_id, "--json"]);
        show.expect_code(0);
        golden::check(&format!("frozen/{day}/show-{run_id}.json"), &show.stdout);

        match status {
            "completed" => {
                // Offline: the receiver it was recorded against is not
                // running and no effect is configured.
                let replayed = sb.stephost(&["replay", run_id, "--json"]);
                replayed.expect_code(0);
                assert_eq!(replayed.json()["result"], "consistent", "{what}");
                let export = sb.stephost(&["export", run_id]);
                export.expect_code(0);
                golden::check(
                    &format!("frozen/{day}/export-{run_id}.json"),
                    &export.stdout,
                );
            }
            "waiting" => {
                let approvals = sb.stephost(&["approvals", "--json"]).json();
                assert!(
                    approvals
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|a| a["run_id"] == run_id),
                    "{what}: {approvals:#}"
                );
            }
            "parked" => {
                // A person settles the unknown write; this build continues
                // the old run to its end and seals it with the same key.
                let show = show.json();
                let unknown = calls(&show)
                    .iter()
                    .find(|c| c["state"] == "unknown")
                    .unwrap_or_else(|| panic!("{what}: no unknown call"));
                let seq = unknown["seq"].to_string();
                keyed(&[
                    "resolve",
                    run_id,
                    &seq,
                    "--succeeded",
                    r#"{"order_id":"ORD-BY-HAND"}"#,
                    "--by",
                    "frozen-ledger-test",
                ])
                .expect_code(0);
                keyed(&["resume", run_id]).expect_code(0);
                assert_eq!(sb.show(run_id)["run"]["status"], "completed", "{what}");
                keyed(&["verify", run_id]).expect_code(0);
            }
            _ => {}
        }
    }

    // The exported runs: each verifies, and replays against the module the
    // ledger stores for it.
    let mut exports: Vec<PathBuf> = std::fs::read_dir(set)
        .unwrap()
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    exports.sort();
    assert!(
        !exports.is_empty(),
        "{day}: no exported run beside the ledger"
    );
    for export in &exports {
        let file = export.display().to_string();
        let fixture: Value =
            serde_json::from_str(&std::fs::read_to_string(export).unwrap()).unwrap();
        let verified = keyed(&["verify", &file]);
        verified.expect_code(0);
        assert!(
            verified.stdout.starts_with("intact:")
                && verified.stdout.contains("signed with the chain key"),
            "{file}: {}",
            verified.stdout
        );
        let module = work.path().join("module.wasm");
        let digest = fixture["module_digest"].as_str().expect("module_digest");
        std::fs::write(&module, frozen_module(set, digest)).unwrap();
        let replayed = sb.stephost(&[
            "replay",
            "--fixture",
            &file,
            "--module",
            &module.display().to_string(),
            "--json",
        ]);
        replayed.expect_code(0);
        assert_eq!(replayed.json()["result"], "consistent", "{file}");
    }

    prune_frozen(&sb, &ledger, &day);

    assert_eq!(
        std::fs::read(set.join("ledger.sqlite")).unwrap(),
        original,
        "the checked-in frozen ledger was changed"
    );
}

/// Retention on the migrated copy: the finished runs go with every row
/// they owned (payload parts referred to before the migration included),
/// the others stay whole.
fn prune_frozen(sb: &Sandbox, ledger: &Path, day: &str) {
    let count = |sql: &str| -> i64 {
        let conn = rusqlite::Connection::open(ledger).unwrap();
        conn.query_row(sql, [], |r| r.get(0))
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    };
    let parts_before = count("SELECT count(*) FROM payloads");
    let runs_before = sb.stephost(&["runs", "--json"]).json();
    let finished: Vec<&str> = runs_before
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| ["completed", "failed", "cancelled"].contains(&r["status"].as_str().unwrap()))
        .map(|r| r["run_id"].as_str().unwrap())
        .collect();
    assert!(!finished.is_empty(), "{day}: nothing finished to prune");
    let dry = sb.stephost(&["prune", "--finished-before", "0s", "--dry-run", "--json"]);
    dry.expect_code(0);
    assert_eq!(dry.json()["runs"], finished.len(), "{day}: {}", dry.stdout);
    let pruned = sb.stephost(&["prune", "--finished-before", "0s", "--json"]);
    pruned.expect_code(0);
    let pruned = pruned.json();
    assert_eq!(pruned["runs"], finished.len(), "{day}: {pruned:#}");
    assert!(pruned["bytes"].as_u64().unwrap() > 0, "{day}: {pruned:#}");
    for run_id in &finished {
        sb.stephost(&["show", run_id]).expect_code(2);
    }
    let left = sb.stephost(&["runs", "--json"]).json();
    assert_eq!(
        left.as_array().unwrap().len(),
        runs_before.as_array().unwrap().len() - finished.len(),
        "{day}: {left:#}"
    );
    for orphans in [
        "SELECT count(*) FROM calls WHERE run_no NOT IN (SELECT run_no FROM runs)",
        "SELECT count(*) FROM logs WHERE run_no NOT IN (SELECT run_no FROM runs)",
        "SELECT count(*) FROM run_epochs WHERE run_no NOT IN (SELECT run_no FROM runs)",
        "SELECT count(*) FROM payload_refs WHERE run_no NOT IN (SELECT run_no FROM runs)",
        "SELECT count(*) FROM payloads WHERE digest NOT IN (SELECT digest FROM payload_refs)",
        "SELECT count(*) FROM notices WHERE run_id NOT IN (SELECT run_id FROM runs)",
    ] {
        assert_eq!(count(orphans), 0, "{day}: {orphans}");
    }
    assert!(
        count("SELECT count(*) FROM payloads") <= parts_before,
        "{day}: no part was added by pruning"
    );
}
