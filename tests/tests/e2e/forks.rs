//! Forks: a run forked from a call keeps the calls before it (their
//! outcomes, their operation ids) and goes live from there with the build
//! given, which must make those calls. From the CLI, the API and the
//! console.

use serde_json::{Value, json};
use stephost_tests::model_stub::ModelStub;
use stephost_tests::{Sandbox, attempts_for, calls, guests};

const BIN: &str = env!("CARGO_BIN_EXE_stephost-crash");

/// `orders` (a deduplicating file receiver) and `echo`; the square step
/// for the fan-out guest's children.
fn sandbox() -> Sandbox {
    Sandbox::with_config(
        BIN,
        &format!(
            "{}\n[steps.square]\nmodule = {:?}\n",
            stephost_tests::BASE_CONFIG,
            guests::SQUARE
        ),
    )
}

/// Run `src` of the buggy build: two orders, then a confirmation to an
/// effect no one granted (call #3 fails, and the run).
fn failed_source(sb: &Sandbox) -> Value {
    sb.run(guests::FORK_STEP, r#"{"customer": "acme"}"#, "src")
        .expect_code(3);
    let show = sb.show("src");
    assert_eq!(show["run"]["status"], "failed", "{show:#}");
    assert_eq!(calls(&show)[2]["state"], "failed", "{show:#}");
    assert_eq!(sb.received("orders.jsonl").len(), 2);
    show
}

fn work(sb: &Sandbox) {
    sb.stephost(&["worker", "--exit-when-idle"]).expect_code(0);
}

fn operation_ids(show: &Value) -> Vec<String> {
    calls(show)
        .iter()
        .map(|c| c["operation_id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_failed_run_forked_at_its_failing_call_with_a_fixed_build_completes_and_pays_nothing_again() {
    let sb = sandbox();
    let source = failed_source(&sb);
    let forked = sb
        .stephost(&[
            "fork",
            "src",
            "--at",
            "3",
            "--module",
            guests::FORK_STEP_FIXED,
            "--run-id",
            "fixed",
        ])
        .expect_code(0)
        .stdout
        .trim()
        .to_string();
    assert_eq!(forked, "fixed");
    work(&sb);
    let show = sb.show("fixed");
    assert_eq!(show["run"]["status"], "completed", "{show:#}");
    assert_eq!(show["run"]["fork"]["run_id"], "src");
    assert_eq!(show["run"]["fork"]["seq"], 3);
    let output: Value = serde_json::from_str(show["run"]["output"].as_str().unwrap()).unwrap();
    assert_eq!(output["confirmed"]["customer"], "acme", "{output:#}");
    // The orders were kept, not sent again: the receiver has the two the
    // source sent; the fork's first two calls are the source's.
    assert_eq!(sb.received("orders.jsonl").len(), 2);
    let kept = &calls(&show)[..2];
    for (mine, theirs) in kept.iter().zip(calls(&source)) {
        assert_eq!(mine["operation_id"], theirs["operation_id"]);
        assert_eq!(mine["outcome"], theirs["outcome"]);
    }
    assert_eq!(calls(&show)[2]["function"], "echo");
    // Kept, not performed: the source's writes had attempts, the fork's
    // copies have none.
    for seq in [1, 2] {
        assert!(!attempts_for(&source, seq).is_empty());
        assert!(attempts_for(&show, seq).is_empty(), "{show:#}");
    }
    // The source is unchanged and names its fork; both verify, the fork's
    // kept calls against the source's chain; the fork replays.
    let after = sb.show("src");
    assert_eq!(after["run"], source["run"]);
    assert_eq!(after["forks"][0]["run_id"], "fixed");
    assert_eq!(after["forks"][0]["at"], 3);
    sb.stephost(&["verify", "src"]).expect_code(0);
    let verified = sb.stephost(&["verify", "fixed"]);
    verified.expect_code(0);
    sb.stephost(&["replay", "fixed"]).expect_code(0);
    let text = sb
        .stephost(&["show", "fixed"])
        .expect_code(0)
        .stdout
        .clone();
    assert!(text.contains("fork of  src at #3"), "{text}");
    // A source whose kept calls were changed afterwards no longer vouches
    // for the fork's.
    sb.tamper()
        .edit_call("src", 2, &mut |call| {
            call.outcome = Some(r#"{"ok":{"forged":true}}"#.into())
        })
        .unwrap();
    let broken = sb.stephost(&["verify", "fixed"]);
    broken.expect_code(4);
    assert!(
        broken
            .stdout
            .contains("its source, run src, does not verify before #3"),
        "{}",
        broken.stdout
    );
}

#[test]
fn a_forks_writes_where_the_source_sent_them_reach_the_receiver_as_the_same_operations() {
    let sb = sandbox();
    let source = failed_source(&sb);
    // From call #1: both orders are made again, live, by the fork.
    sb.stephost(&[
        "fork",
        "src",
        "--at",
        "1",
        "--module",
        guests::FORK_STEP_FIXED,
        "--run-id",
        "again",
    ])
    .expect_code(0);
    work(&sb);
    let show = sb.show("again");
    assert_eq!(show["run"]["status"], "completed", "{show:#}");
    assert_eq!(operation_ids(&show)[..2], operation_ids(&source)[..2]);
    // The receiver deduplicated them: two orders, as the source left it.
    let orders = sb.received("orders.jsonl");
    assert_eq!(
        stephost_tests::distinct_operations(&orders).len(),
        2,
        "{orders:#?}"
    );
    assert_eq!(orders.len(), 2, "{orders:#?}");
}

#[test]
fn a_fork_whose_build_does_not_make_the_kept_calls_is_refused_naming_the_call() {
    let sb = sandbox();
    failed_source(&sb);
    let refused = sb.stephost(&["fork", "src", "--at", "3", "--module", guests::MULTI_WRITE]);
    refused.expect_code(4);
    assert!(
        refused.stderr.contains("before #3") && refused.stderr.contains("#1"),
        "{}",
        refused.stderr
    );
    let out_of_range = sb.stephost(&["fork", "src", "--at", "9"]);
    out_of_range.expect_code(2);
    assert!(
        out_of_range.stderr.contains("has 3 call(s)"),
        "{}",
        out_of_range.stderr
    );
    // Nothing was made.
    let runs = sb.stephost(&["runs", "--json"]).expect_code(0).json();
    assert_eq!(runs.as_array().unwrap().len(), 1, "{runs:#}");
    assert!(sb.show("src")["forks"].is_null());
}

#[test]
fn children_joined_before_the_fork_are_shared_and_one_not_joined_refuses_it() {
    let sb = sandbox();
    sb.run(guests::FANOUT, r#"{"n": 2}"#, "parent")
        .expect_code(7);
    loop {
        work(&sb);
        let status = sb.show("parent")["run"]["status"].clone();
        if status == "completed" {
            break;
        }
        assert!(status == "waiting" || status == "pending", "{status}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let parent = sb.show("parent");
    let runs_before = sb.stephost(&["runs", "--json"]).expect_code(0).json();
    let last = calls(&parent).len() as u64;
    // Between the starts and the joins: a child's end reaches only the
    // parent, so the fork could not join it.
    let refused = sb.stephost(&["fork", "parent", "--at", "2"]);
    refused.expect_code(2);
    assert!(
        refused.stderr.contains("started child run") && refused.stderr.contains("#1"),
        "{}",
        refused.stderr
    );
    // After the joins of the first two (the called child is started and
    // joined live by the fork again: a child of its own).
    let joins_end = calls(&parent)
        .iter()
        .position(|c| c["function"] == "start" && c["seq"].as_u64() > Some(2))
        .map(|i| i as u64 + 1)
        .unwrap_or(last + 1);
    let at = joins_end.to_string();
    sb.stephost(&["fork", "parent", "--at", &at, "--run-id", "copy"])
        .expect_code(0);
    loop {
        work(&sb);
        let status = sb.show("copy")["run"]["status"].clone();
        if status == "completed" {
            break;
        }
        assert!(status == "waiting" || status == "pending", "{status}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let copy = sb.show("copy");
    let out: Value = serde_json::from_str(copy["run"]["output"].as_str().unwrap()).unwrap();
    let was: Value = serde_json::from_str(parent["run"]["output"].as_str().unwrap()).unwrap();
    // The first two children are the parent's, shared: not run again.
    assert_eq!(out["started"], was["started"]);
    assert_eq!(out["joined"], was["joined"]);
    // The one the fork started live is its own (an id made with the
    // fork's), and one more run of the square step.
    let runs_after = sb.stephost(&["runs", "--json"]).expect_code(0).json();
    assert_eq!(
        runs_after.as_array().unwrap().len(),
        runs_before.as_array().unwrap().len() + 2,
        "the fork and its one live child"
    );
    sb.stephost(&["verify", "copy"]).expect_code(0);
}

#[test]
fn the_api_and_the_console_fork_a_run() {
    let sb = sandbox();
    failed_source(&sb);
    let served = sb.serve(
        &[],
        &[(
            "STEPHOST_API_TOKENS",
            "ana operator ana-token-0123456789abcdef\nviewer read viewer-token-0123456789",
        )],
    );
    let ana = served.with_token("ana-token-0123456789abcdef");
    let bytes = std::fs::read(guests::FORK_STEP_FIXED).unwrap();
    let stored = ana
        .request_with(
            "POST",
            "/api/modules",
            Some(&bytes),
            &[("Content-Type", "application/octet-stream")],
        )
        .expect(201);
    let digest = stored["module_digest"].as_str().unwrap().to_string();
    ana.post(
        "/api/runs/src/fork",
        &json!({"at": 3, "module_digest": digest, "run_id": "api-fork"}),
    )
    .expect(201);
    ana.wait_status("api-fork", "completed");
    ana.post("/api/runs/src/fork", &json!({"at": 9}))
        .expect_error(409, "fork_refused");
    let diverged = ana
        .post(
            "/api/runs/src/fork",
            &json!({"at": 3, "module_base64": base64_of(guests::MULTI_WRITE)}),
        )
        .expect_error(409, "diverged");
    assert!(
        diverged["message"].as_str().unwrap().contains("#1"),
        "{diverged:#}"
    );
    served.browse("fork.mjs", &[&digest]);
    let run = ana.get("/api/runs/src").expect(200);
    assert_eq!(run["forks"].as_array().unwrap().len(), 2, "{run:#}");
}

fn base64_of(path: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(std::fs::read(path).unwrap())
}

#[test]
fn a_model_answer_before_the_fork_is_reused_not_paid_again() {
    let stub = ModelStub::start("Order 7 more widgets.", 42);
    let sb = Sandbox::with_config(BIN, &stephost_tests::llm_config(&stub.url()));
    let with_key = |args: &[&str]| {
        sb.stephost_with_env("STEPHOST_TEST_KEY", std::ffi::OsStr::new("sk-test"), args)
    };
    with_key(&[
        "run",
        guests::LLM_STEP,
        "--input",
        r#"{"question":"how many?"}"#,
        "--run-id",
        "l",
    ])
    .expect_code(0);
    assert_eq!(stub.requests().len(), 1);
    // From after the model's answer: the fork keeps it.
    with_key(&["fork", "l", "--at", "2", "--run-id", "l2"]).expect_code(0);
    with_key(&["worker", "--exit-when-idle"]).expect_code(0);
    let fork = sb.show("l2");
    assert_eq!(fork["run"]["status"], "completed", "{fork:#}");
    assert_eq!(fork["run"]["output"], sb.show("l")["run"]["output"]);
    assert_eq!(fork["tokens_total"], 42);
    assert_eq!(stub.requests().len(), 1, "the fork asked the model again");
}
