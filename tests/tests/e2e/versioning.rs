//! New builds of a step against recorded runs: the corpus replay for CI and
//! upgrades that repin only runs whose history the new build reproduces.

use serde_json::Value;
use stephost_tests::{Sandbox, guests};

const BIN: &str = env!("CARGO_BIN_EXE_stephost-crash");

#[test]
fn the_corpus_replay_reports_each_run_and_fails_on_a_divergent_one() {
    let sb = Sandbox::new(BIN);
    // The divergent build changes only the second write, so a one-write run
    // still replays and a three-write run does not.
    sb.run(guests::MULTI_WRITE, r#"{"count":1}"#, "one")
        .expect_code(0);
    sb.run(guests::MULTI_WRITE, r#"{"count":3}"#, "three")
        .expect_code(0);
    std::fs::create_dir(sb.path("corpus")).unwrap();
    for id in ["one", "three"] {
        let export = sb.stephost(&["export", id]);
        export.expect_code(0);
        std::fs::write(sb.path(&format!("corpus/{id}.json")), export.stdout).unwrap();
    }
    let same = sb.stephost(&[
        "replay",
        "--fixtures",
        "corpus",
        "--module",
        guests::MULTI_WRITE,
    ]);
    same.expect_code(0);
    assert!(
        same.stderr.contains("2 run(s) replayed, 0 diverged"),
        "{}",
        same.stderr
    );

    let changed = sb.stephost(&[
        "replay",
        "--fixtures",
        "corpus",
        "--module",
        guests::DIVERGENT,
        "--json",
    ]);
    changed.expect_code(4);
    let reports: Vec<Value> = changed.json().as_array().unwrap().clone();
    assert_eq!(reports.len(), 2);
    let by_run = |id: &str| {
        reports
            .iter()
            .find(|r| r["report"]["run_id"] == id)
            .unwrap()
            .clone()
    };
    assert_eq!(by_run("one")["report"]["result"], "consistent");
    let three = by_run("three");
    assert_eq!(three["report"]["result"], "diverged");
    assert_eq!(three["report"]["divergence"]["seq"], 6);
    assert_eq!(
        three["report"]["divergence"]["recorded"]["function"],
        "orders"
    );
}

#[test]
fn upgrade_repins_a_compatible_run_and_leaves_an_incompatible_one() {
    let slow = r#"
[effects.orders]
kind = "file"
class = "write"
path = "orders.jsonl"
"#;
    let sb = Sandbox::with_config(BIN, slow);
    // Two interrupted runs: one stopped after its first write, one after its
    // second.
    for (id, point) in [("early", "after-outcome@3"), ("late", "after-outcome@6")] {
        let crashed = sb.run_crashing_at(point, guests::MULTI_WRITE, r#"{"count":3}"#, id);
        assert_eq!(crashed.signal, Some(libc::SIGABRT), "{crashed:?}");
    }
    let digest = sb.show("early")["run"]["module_digest"]
        .as_str()
        .unwrap()
        .to_string();
    let upgraded = sb.stephost(&[
        "upgrade",
        "--from",
        &digest,
        "--module",
        guests::DIVERGENT,
        "--json",
    ]);
    upgraded.expect_code(4);
    let outcomes: Vec<Value> = upgraded.json().as_array().unwrap().clone();
    let moved = |id: &str| outcomes.iter().find(|o| o["run_id"] == id).unwrap()["moved"].clone();
    assert_eq!(moved("early"), true, "{outcomes:#?}");
    assert_eq!(moved("late"), false, "{outcomes:#?}");
    assert_ne!(sb.show("early")["run"]["module_digest"], digest.as_str());
    assert_eq!(sb.show("early")["run"]["step"], "guest-divergent@0.1.0");
    assert_eq!(sb.show("late")["run"]["module_digest"], digest.as_str());
    // Both finish: the early one under the new build (whose second write
    // carries the divergent marker), the late one under its own.
    sb.stephost(&["resume", "early"]).expect_code(0);
    sb.stephost(&["resume", "late"]).expect_code(0);
    // The repin resealed the run's row: its record verifies under the new
    // module.
    sb.stephost(&["verify", "early"]).expect_code(0);
    let lines = sb.received("orders.jsonl");
    let early_marked = lines
        .iter()
        .filter(|l| l["run_id"] == "early" && l["request"]["divergent"] == true)
        .count();
    let late_marked = lines
        .iter()
        .filter(|l| l["run_id"] == "late" && l["request"]["divergent"] == true)
        .count();
    assert_eq!((early_marked, late_marked), (1, 0));
    assert_eq!(lines.len(), 6);
    let metrics = sb.stephost(&["metrics"]).stdout;
    assert!(
        metrics.contains("workflow_version_mismatch_total 1"),
        "{metrics}"
    );
    // A finished run is not upgraded.
    sb.stephost(&["upgrade", "early", "--module", guests::DIVERGENT])
        .expect_code(2);
}

#[test]
fn verify_detects_a_tampered_recording() {
    let sb = Sandbox::new(BIN);
    sb.run(guests::MULTI_WRITE, r#"{"count":2}"#, "v")
        .expect_code(0);
    let intact = sb.stephost(&["verify", "v"]);
    intact.expect_code(0);
    assert!(intact.stdout.starts_with("intact"), "{}", intact.stdout);
    let export = sb.stephost(&["export", "v"]);
    std::fs::write(sb.path("v.json"), &export.stdout).unwrap();
    sb.stephost(&["verify", "v.json"]).expect_code(0);

    // Change what the supplier answered to the first write (call #3).
    let mut fixture: Value = serde_json::from_str(&export.stdout).unwrap();
    let outcome = fixture["calls"][2]["outcome"].as_str().unwrap().to_string();
    assert!(outcome.contains("R-"), "{outcome}");
    fixture["calls"][2]["outcome"] = Value::String(outcome.replace("R-", "X-"));
    std::fs::write(sb.path("tampered.json"), fixture.to_string()).unwrap();
    let broken = sb.stephost(&["verify", "tampered.json"]);
    broken.expect_code(4);
    assert!(broken.stdout.contains("call #3"), "{}", broken.stdout);

    // Dropping a call breaks the chain too.
    let mut dropped: Value = serde_json::from_str(&export.stdout).unwrap();
    let calls = dropped["calls"].as_array_mut().unwrap();
    calls.remove(1);
    for (i, c) in calls.iter_mut().enumerate() {
        c["seq"] = Value::from(i as u64 + 1);
    }
    std::fs::write(sb.path("dropped.json"), dropped.to_string()).unwrap();
    sb.stephost(&["verify", "dropped.json"]).expect_code(4);
}

#[test]
fn resume_with_another_build_is_refused_naming_both() {
    let sb = Sandbox::new(BIN);
    let crashed = sb.run_crashing_at(
        "after-outcome@3",
        guests::MULTI_WRITE,
        r#"{"count":2}"#,
        "p",
    );
    assert_eq!(crashed.signal, Some(libc::SIGABRT));
    let pinned = sb.show("p")["run"]["module_digest"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(sb.show("p")["run"]["world"], "stephost:step/step@0.3.0");
    // The step's declared name and version, from its crate via the SDK.
    assert_eq!(sb.show("p")["run"]["step"], "guest-multi-write@0.1.0");
    let refused = sb.stephost(&["resume", "p", "--module", guests::DIVERGENT]);
    refused.expect_code(4);
    assert!(refused.stderr.contains(&pinned), "{}", refused.stderr);
    assert!(
        refused.stderr.contains("stephost upgrade p"),
        "{}",
        refused.stderr
    );
    assert_eq!(
        sb.show("p")["run"]["status"],
        "running",
        "a refused resume changed the run"
    );
    // With its own build it resumes.
    sb.stephost(&["resume", "p", "--module", guests::MULTI_WRITE])
        .expect_code(0);
}

/// `stephost ARGS` with the compiled-component cache in `cache`.
fn with_cache(sb: &Sandbox, cache: &std::path::Path, args: &[&str]) -> stephost_tests::Ran {
    sb.stephost_with_env("STEPHOST_CACHE_DIR", cache, args)
}

fn digest_of(sb: &Sandbox, run_id: &str) -> String {
    sb.show(run_id)["run"]["module_digest"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn a_swapped_cache_file_is_compiled_over_not_run() {
    let sb = Sandbox::new(BIN);
    let cache = sb.path("cache");
    let input = r#"{"count":2}"#;
    for (guest, id) in [(guests::MULTI_WRITE, "a"), (guests::DIVERGENT, "b")] {
        with_cache(
            &sb,
            &cache,
            &["run", guest, "--input", input, "--run-id", id],
        )
        .expect_code(0);
    }
    let (a, b) = (digest_of(&sb, "a"), digest_of(&sb, "b"));
    // The divergent build's compiled code (and its MAC) under the first
    // build's name.
    let mut swapped = 0;
    for entry in std::fs::read_dir(&cache).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name.starts_with(&b) {
            std::fs::copy(cache.join(&name), cache.join(name.replace(&b, &a))).unwrap();
            swapped += 1;
        }
    }
    assert_eq!(swapped, 2, "a compiled file and its MAC");
    with_cache(
        &sb,
        &cache,
        &[
            "run",
            guests::MULTI_WRITE,
            "--input",
            input,
            "--run-id",
            "c",
        ],
    )
    .expect_code(0);
    let marked: Vec<Value> = sb
        .received("orders.jsonl")
        .into_iter()
        .filter(|l| l["run_id"] == "c" && l["request"]["divergent"] == true)
        .collect();
    assert!(marked.is_empty(), "another build's code ran: {marked:?}");
    sb.stephost(&["replay", "c"]).expect_code(0);
    // The cache is its owner's only.
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&cache), 0o700);
    for entry in std::fs::read_dir(&cache).unwrap() {
        assert_eq!(mode(&entry.unwrap().path()), 0o600);
    }
}

#[test]
fn a_changed_module_row_is_refused_before_it_runs() {
    let sb = Sandbox::new(BIN);
    let crashed = sb.run_crashing_at(
        "after-outcome@3",
        guests::MULTI_WRITE,
        r#"{"count":2}"#,
        "p",
    );
    assert_eq!(crashed.signal, Some(libc::SIGABRT), "{crashed:?}");
    sb.run(guests::DIVERGENT, r#"{"count":1}"#, "other")
        .expect_code(0);
    let (pinned, other) = (digest_of(&sb, "p"), digest_of(&sb, "other"));
    // An SQLite ledger and its WAL (while it is there) are their owner's
    // only.
    use std::os::unix::fs::PermissionsExt;
    if stephost_tests::test_backend() == stephost_tests::Backend::Sqlite {
        assert!(sb.db().is_file(), "no ledger at {}", sb.db().display());
    }
    for file in [sb.db(), sb.db().with_extension("db-wal")] {
        if let Ok(meta) = std::fs::metadata(&file) {
            assert_eq!(
                meta.permissions().mode() & 0o777,
                0o600,
                "{}",
                file.display()
            );
        }
    }
    let _ = other;
    let divergent = std::fs::read(guests::DIVERGENT).unwrap();
    sb.tamper().replace_module(&pinned, &divergent).unwrap();
    let resumed = sb.stephost(&["resume", "p"]);
    resumed.expect_code(4);
    assert!(
        resumed.stderr.contains(&pinned) && resumed.stderr.contains("changed"),
        "{}",
        resumed.stderr
    );
    assert_eq!(sb.show("p")["run"]["status"], "running");
    assert_eq!(
        sb.received("orders.jsonl")
            .iter()
            .filter(|l| l["run_id"] == "p")
            .count(),
        1,
        "the changed module sent something"
    );
}

/// An exported run, edited by `edit` and written to `name`.
fn write_edited(sb: &Sandbox, run_id: &str, name: &str, edit: impl FnOnce(&mut Value)) {
    let export = sb.stephost(&["export", run_id]);
    export.expect_code(0);
    let mut fixture: Value = serde_json::from_str(&export.stdout).unwrap();
    edit(&mut fixture);
    std::fs::write(sb.path(name), fixture.to_string()).unwrap();
}

/// [`write_edited`], then `verify` of the file.
fn verify_edited(
    sb: &Sandbox,
    run_id: &str,
    name: &str,
    edit: impl FnOnce(&mut Value),
) -> stephost_tests::Ran {
    write_edited(sb, run_id, name, edit);
    sb.stephost(&["verify", name])
}

#[test]
fn verify_covers_the_runs_row_a_dropped_tail_and_forged_placeholders() {
    let sb = Sandbox::new(BIN);
    sb.run(guests::MULTI_WRITE, r#"{"count":2}"#, "v")
        .expect_code(0);
    let intact = sb.stephost(&["verify", "v"]);
    intact.expect_code(0);
    assert!(intact.stdout.contains("UNSIGNED"), "{}", intact.stdout);
    assert!(
        intact.stdout.contains("matches its seal"),
        "{}",
        intact.stdout
    );

    // The run's output, changed in the ledger.
    let output = sb.show("v")["run"]["output"].as_str().unwrap().to_string();
    let forged = output.replace("R-", "X-");
    assert_ne!(forged, output);
    sb.tamper()
        .edit_run("v", &mut |run| run.output = Some(forged.clone()))
        .unwrap();
    let edited = sb.stephost(&["verify", "v"]);
    edited.expect_code(4);
    assert!(edited.stdout.contains("its row"), "{}", edited.stdout);
    assert!(edited.stdout.contains("output"), "{}", edited.stdout);
    sb.tamper()
        .edit_run("v", &mut |run| run.output = Some(output.clone()))
        .unwrap();
    sb.stephost(&["verify", "v"]).expect_code(0);

    // The last calls dropped: every remaining link still holds.
    let dropped = verify_edited(&sb, "v", "dropped.json", |f| {
        let calls = f["calls"].as_array_mut().unwrap();
        let keep = calls.len() - 2;
        calls.truncate(keep);
    });
    dropped.expect_code(4);
    assert!(dropped.stdout.contains("dropped"), "{}", dropped.stdout);

    // A request replaced by what looks like the size placeholder.
    let placeholder = verify_edited(&sb, "v", "placeholder.json", |f| {
        f["calls"][2]["request"] = Value::String(r#"{"stephost_request_bytes":999999}"#.into());
    });
    placeholder.expect_code(4);
    assert!(
        placeholder.stdout.contains("call #3"),
        "{}",
        placeholder.stdout
    );
}

#[test]
fn with_a_key_links_and_seals_are_signed_and_cover_who_decided() {
    let sb = Sandbox::with_config(BIN, stephost_tests::APPROVAL_CONFIG);
    let key = sb.path("chain.key");
    std::fs::write(&key, "0123456789abcdef0123456789abcdef\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let keyed = |args: &[&str]| sb.stephost_with_env("STEPHOST_CHAIN_KEY_FILE", &key, args);
    keyed(&[
        "run",
        guests::APPROVAL_STEP,
        "--input",
        r#"{"sku":"WIDGET-7","quantity":10,"ttl_seconds":3600}"#,
        "--run-id",
        "k",
    ])
    .expect_code(7);
    let listed = sb.stephost(&["approvals", "--json"]).json();
    let sha = listed[0]["details_sha256"].as_str().unwrap()[..12].to_string();
    keyed(&["approve", "k", "1", "--details", &sha, "--by", "alice"]).expect_code(0);
    keyed(&["resume", "k"]).expect_code(0);

    let signed = keyed(&["verify", "k"]);
    signed.expect_code(0);
    assert!(
        signed.stdout.contains("signed with the chain key"),
        "{}",
        signed.stdout
    );
    // Without the key nothing can be checked, and nothing is called intact.
    let keyless = sb.stephost(&["verify", "k"]);
    keyless.expect_code(4);
    assert!(
        keyless.stdout.contains("set the chain key"),
        "{}",
        keyless.stdout
    );

    // Who decided is covered: another name breaks the decision's link.
    write_edited(&sb, "k", "who.json", |f| {
        assert_eq!(f["calls"][0]["resolved_by"], "alice");
        f["calls"][0]["resolved_by"] = Value::String("mallory".into());
    });
    let who = keyed(&["verify", "who.json"]);
    who.expect_code(4);
    assert!(who.stdout.contains("call #1"), "{}", who.stdout);

    // A run recorded without the key does not pass for a signed one.
    sb.run(guests::MULTI_WRITE, r#"{"count":1}"#, "plain")
        .expect_code(0);
    let unsigned = keyed(&["verify", "plain"]);
    unsigned.expect_code(4);
    assert!(
        unsigned.stdout.contains("not signed"),
        "{}",
        unsigned.stdout
    );

    // A key file others can read is refused.
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let open_key = keyed(&["verify", "k"]);
    open_key.expect_code(2);
    assert!(open_key.stderr.contains("chmod 600"), "{}", open_key.stderr);
}
