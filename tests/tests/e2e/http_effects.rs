//! Effects against real receiving systems on 127.0.0.1: the supplier's HTTP
//! order API (deduplicating by Idempotency-Key, serving lookups, and told to
//! fail, delay or drop replies), a command, and a model endpoint.

use std::time::{Duration, Instant};

use serde_json::Value;
use stephost_tests::model_stub::ModelStub;
use stephost_tests::{Sandbox, attempts_for, calls, guests};
use supplier_receiver::{Fault, Receiver};

const BIN: &str = env!("CARGO_BIN_EXE_stephost-crash");
const INPUT: &str = r#"{"sku":"WIDGET-7","quantity":10}"#;
/// The supplier step's calls: 1 inventory.read, 2 clock, 3 random, 4 supplier.order.
const ORDER_SEQ: u64 = 4;

/// The supplier configuration against `receiver`, with the write's
/// idempotency and lookup as given.
fn config(receiver: &Receiver, idempotent: bool, lookup: bool) -> String {
    let lookup = if lookup {
        "lookup = \"URL/orders/{operation_id}\"\n"
    } else {
        ""
    };
    format!(
        r#"
[effects."inventory.read"]
kind = "http"
class = "read"
method = "GET"
url = "URL/inventory/{{sku}}"

[effects."supplier.order"]
kind = "http"
class = "write"
method = "POST"
url = "URL/orders"
idempotent = {idempotent}
{lookup}retry = {{ attempts_max = 4, backoff_first_ms = 10, backoff_max_ms = 50 }}
"#
    )
    .replace("URL", &receiver.url())
}

fn sandbox(receiver: &Receiver, idempotent: bool, lookup: bool) -> Sandbox {
    Sandbox::with_config(BIN, &config(receiver, idempotent, lookup))
}

fn run(sb: &Sandbox) -> stephost_tests::Ran {
    sb.run(guests::SUPPLIER_ORDER, INPUT, "order-1")
}

/// `run` of the supplier step as `order-1`, in a child process left running.
fn spawn_run(sb: &Sandbox) -> std::process::Child {
    sb.command(&[
        "run",
        guests::SUPPLIER_ORDER,
        "--input",
        INPUT,
        "--run-id",
        "order-1",
    ])
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null())
    .spawn()
    .unwrap()
}

fn crash(sb: &Sandbox, point: &str) {
    let crashed = sb.run_crashing_at(point, guests::SUPPLIER_ORDER, INPUT, "order-1");
    assert_eq!(crashed.signal, Some(libc::SIGABRT), "{crashed:?}");
    assert!(crashed.stderr.contains("crash point"), "{}", crashed.stderr);
}

fn attempt_results(show: &Value, seq: u64) -> Vec<String> {
    attempts_for(show, seq)
        .iter()
        .map(|a| {
            format!(
                "{}:{}",
                a["kind"].as_str().unwrap(),
                a["result"].as_str().unwrap()
            )
        })
        .collect()
}

#[test]
fn an_order_over_http_carries_its_operation_id_run_and_fence() {
    let receiver = Receiver::start().unwrap();
    let sb = sandbox(&receiver, true, true);
    let ran = run(&sb);
    ran.expect_code(0);
    assert_eq!(ran.json()["on_hand"], 3);
    assert_eq!(receiver.business_effects(), 1);
    assert_eq!(receiver.inventory_reads(), 1);
    let seen = receiver.last_order_request().unwrap();
    let show = sb.show("order-1");
    let call = &calls(&show)[ORDER_SEQ as usize - 1];
    assert_eq!(
        seen.header("idempotency-key"),
        call["operation_id"].as_str()
    );
    assert_eq!(seen.header("stephost-run-id"), Some("order-1"));
    assert_eq!(seen.header("stephost-fence"), Some("1"));
    assert!(seen.header("stephost-payload-sha256").is_some());
    assert_eq!(receiver.orders()[0].body_json()["quantity"], 7);
}

#[test]
fn retryable_failures_are_retried_by_the_host_and_each_attempt_is_recorded() {
    let receiver = Receiver::start().unwrap();
    receiver.push_fault(Fault::status(503));
    receiver.push_fault(Fault::retry_after(429, 1));
    let sb = sandbox(&receiver, true, true);
    let started = Instant::now();
    run(&sb).expect_code(0);
    // Retry-After: 1 was honoured (a bound on behaviour, not a benchmark).
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert_eq!(receiver.requests_received(), 3);
    assert_eq!(receiver.business_effects(), 1);
    let show = sb.show("order-1");
    assert_eq!(
        attempt_results(&show, ORDER_SEQ),
        vec!["send:retryable", "send:retryable", "send:ok"]
    );
    // The business outcome is recorded once.
    assert_eq!(calls(&show)[ORDER_SEQ as usize - 1]["state"], "succeeded");
    assert_eq!(sb.metric("activity_retry_total"), 2);
}

#[test]
fn a_rejection_goes_to_the_step_at_once() {
    let receiver = Receiver::start().unwrap();
    receiver.push_fault(Fault::status(400));
    let sb = sandbox(&receiver, true, true);
    let ran = run(&sb);
    ran.expect_code(3);
    assert!(ran.stderr.contains("400"), "{}", ran.stderr);
    assert_eq!(receiver.requests_received(), 1);
    let show = sb.show("order-1");
    assert_eq!(attempt_results(&show, ORDER_SEQ), vec!["send:rejected"]);
    let outcome: Value = serde_json::from_str(
        calls(&show)[ORDER_SEQ as usize - 1]["outcome"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(outcome["err"]["kind"], "rejected");
    assert_eq!(sb.metric("non_retryable_failure_total"), 1);
}

#[test]
fn retries_that_run_out_reach_the_step_as_exhausted() {
    let receiver = Receiver::start().unwrap();
    for _ in 0..6 {
        receiver.push_fault(Fault::status(503));
    }
    let sb = sandbox(&receiver, true, true);
    let ran = run(&sb);
    ran.expect_code(3);
    assert_eq!(receiver.requests_received(), 4);
    assert_eq!(receiver.business_effects(), 0);
    let outcome: Value = serde_json::from_str(
        calls(&sb.show("order-1"))[ORDER_SEQ as usize - 1]["outcome"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(outcome["err"]["kind"], "exhausted");
    assert_eq!(sb.metric("retry_exhausted_total"), 1);
}

#[test]
fn a_lost_reply_is_retried_with_the_same_key_and_acts_once() {
    let receiver = Receiver::start().unwrap();
    receiver.push_fault(Fault::CommitThenDrop);
    let sb = sandbox(&receiver, true, true);
    run(&sb).expect_code(0);
    assert_eq!(receiver.requests_received(), 2);
    assert_eq!(receiver.business_effects(), 1);
    assert_eq!(receiver.idempotent_replays(), 1);
    assert_eq!(sb.metric("idempotency_key_hit_total"), 1);
}

#[test]
fn crash_after_the_supplier_committed_is_reconciled_by_lookup() {
    let receiver = Receiver::start().unwrap();
    let sb = sandbox(&receiver, true, true);
    crash(&sb, &format!("after-send@{ORDER_SEQ}"));
    assert_eq!(receiver.business_effects(), 1);
    let resumed = sb.stephost(&["resume", "order-1"]);
    resumed.expect_code(0);
    assert_eq!(resumed.json()["receipt"]["order_id"], "ORD-1");
    assert_eq!(receiver.requests_received(), 1, "the order was sent again");
    assert_eq!(receiver.lookups(), 1);
    // The send's own attempt row was to be committed with its outcome, so
    // the crash took both; the interruption is recorded in its place, then
    // the lookup that settled the call.
    assert_eq!(
        attempt_results(&sb.show("order-1"), ORDER_SEQ),
        vec!["interrupted:unrecorded", "lookup:found"]
    );
    assert_eq!(sb.metric("reconciliation_total"), 1);
    assert_eq!(sb.metric("workflow_resume_total"), 1);
    assert_eq!(sb.metric("workflow_resume_latency_seconds_count"), 1);
}

#[test]
fn a_write_not_found_at_an_idempotent_receiver_is_resent_with_the_same_key() {
    let receiver = Receiver::start().unwrap();
    let sb = sandbox(&receiver, true, true);
    crash(&sb, &format!("after-started@{ORDER_SEQ}"));
    assert_eq!(receiver.requests_received(), 0);
    sb.stephost(&["resume", "order-1"]).expect_code(0);
    assert_eq!(receiver.lookups(), 1);
    assert_eq!(receiver.business_effects(), 1);
    let op = calls(&sb.show("order-1"))[ORDER_SEQ as usize - 1]["operation_id"].clone();
    assert_eq!(
        receiver.orders()[0].operation_id.as_str(),
        op.as_str().unwrap()
    );
}

#[test]
fn a_write_not_found_at_a_receiver_that_does_not_deduplicate_is_unknown_and_not_sent() {
    let receiver = Receiver::start().unwrap();
    let sb = sandbox(&receiver, false, true);
    crash(&sb, &format!("after-started@{ORDER_SEQ}"));
    let resumed = sb.stephost(&["resume", "order-1"]);
    resumed.expect_code(5);
    assert_eq!(receiver.lookups(), 1);
    assert_eq!(receiver.requests_received(), 0, "an unknown write was sent");
    assert_eq!(
        calls(&sb.show("order-1"))[ORDER_SEQ as usize - 1]["state"],
        "unknown"
    );
    assert_eq!(sb.metric("side_effect_unknown_total"), 1);
}

#[test]
fn an_idempotent_receiver_without_lookup_gets_a_resend_with_the_same_key() {
    let receiver = Receiver::start().unwrap();
    let sb = sandbox(&receiver, true, false);
    crash(&sb, &format!("after-send@{ORDER_SEQ}"));
    sb.stephost(&["resume", "order-1"]).expect_code(0);
    assert_eq!(receiver.requests_received(), 2);
    assert_eq!(receiver.business_effects(), 1);
    assert_eq!(receiver.idempotent_replays(), 1);
}

#[test]
fn a_receiver_with_neither_is_unknown_then_resolved_by_a_person() {
    let receiver = Receiver::start().unwrap();
    let sb = sandbox(&receiver, false, false);
    crash(&sb, &format!("after-send@{ORDER_SEQ}"));
    sb.stephost(&["resume", "order-1"]).expect_code(5);
    assert_eq!(receiver.requests_received(), 1);
    // A person checks with the supplier and records what they found.
    let receipt = receiver.orders()[0].receipt().to_string();
    sb.stephost(&[
        "resolve",
        "order-1",
        "4",
        "--succeeded",
        &receipt,
        "--by",
        "ops@example",
    ])
    .expect_code(0);
    let resumed = sb.stephost(&["resume", "order-1"]);
    resumed.expect_code(0);
    assert_eq!(resumed.json()["receipt"]["order_id"], "ORD-1");
    assert_eq!(receiver.requests_received(), 1);
    assert_eq!(receiver.business_effects(), 1);
    // The decided write was served from the ledger, not sent.
    assert_eq!(sb.metric("side_effect_duplicate_prevented_total"), 1);
}

#[test]
fn a_read_interrupted_in_flight_is_performed_again() {
    let receiver = Receiver::start().unwrap();
    let sb = sandbox(&receiver, true, true);
    crash(&sb, "after-started@1");
    assert_eq!(receiver.inventory_reads(), 0);
    sb.stephost(&["resume", "order-1"]).expect_code(0);
    assert_eq!(receiver.inventory_reads(), 1);
    assert_eq!(receiver.business_effects(), 1);
}

#[test]
fn a_receipt_for_another_operation_is_refused_not_recorded_as_success() {
    let receiver = Receiver::start().unwrap();
    // Another run's order exists at the supplier.
    let other = sandbox(&receiver, true, true);
    other
        .run(guests::SUPPLIER_ORDER, INPUT, "other")
        .expect_code(0);
    let foreign = receiver.orders()[0].operation_id.clone();
    // This run's lookup is (mis)configured to find that order.
    let cfg = config(&receiver, false, true).replace("{operation_id}", &foreign);
    let sb = Sandbox::with_config(BIN, &cfg);
    crash(&sb, &format!("after-started@{ORDER_SEQ}"));
    let resumed = sb.stephost(&["resume", "order-1"]);
    resumed.expect_code(5);
    assert!(
        resumed.stderr.contains("names operation"),
        "{}",
        resumed.stderr
    );
    let show = sb.show("order-1");
    assert_eq!(calls(&show)[ORDER_SEQ as usize - 1]["state"], "unknown");
    assert_eq!(
        attempt_results(&show, ORDER_SEQ),
        vec!["interrupted:unrecorded", "lookup:foreign_receipt"]
    );
    assert_eq!(receiver.business_effects(), 1);
}

#[test]
fn sigkill_during_a_slow_http_write_is_reconciled_with_one_order() {
    let receiver = Receiver::start().unwrap();
    receiver.push_fault(Fault::Delay(Duration::from_secs(30)));
    let sb = sandbox(&receiver, true, true);
    let mut child = spawn_run(&sb);
    let deadline = Instant::now() + Duration::from_secs(60);
    while receiver.business_effects() == 0 {
        assert!(
            Instant::now() < deadline,
            "the order never reached the supplier"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    sb.stephost(&["resume", "order-1"]).expect_code(0);
    assert_eq!(receiver.business_effects(), 1);
    assert_eq!(receiver.requests_received(), 1);
    assert_eq!(receiver.lookups(), 1);
}

#[test]
fn a_command_effect_is_retried_by_exit_status_and_not_run_on_replay() {
    let sb = Sandbox::with_config(BIN, "");
    let script = sb.path("order.sh");
    // Fails with 75 (retry) the first time, then records the order.
    std::fs::write(
        &script,
        "#!/bin/sh\nset -e\ncd \"$(dirname \"$0\")\"\necho run >> invocations\n\
         if [ ! -e tried ]; then touch tried; exit 75; fi\n\
         cat > \"order-$STEPHOST_OPERATION_ID.json\"\n\
         printf '{\"receipt\":\"cmd-%s\",\"fence\":%s}' \"$(echo $STEPHOST_OPERATION_ID | cut -c1-8)\" \"$STEPHOST_FENCE\"\n",
    )
    .unwrap();
    sb.set_config(&format!(
        r#"
[effects.orders]
kind = "command"
class = "write"
argv = ["sh", "{}"]
retry = {{ attempts_max = 3, backoff_first_ms = 10 }}
"#,
        script.display()
    ));
    let ran = sb.run(guests::MULTI_WRITE, r#"{"count":1}"#, "c");
    ran.expect_code(0);
    let out = ran.json();
    assert!(
        out["receipts"][0]["receipt"]
            .as_str()
            .unwrap()
            .starts_with("cmd-")
    );
    assert_eq!(out["receipts"][0]["fence"], 1);
    let invocations = || {
        std::fs::read_to_string(sb.path("invocations"))
            .unwrap()
            .lines()
            .count()
    };
    assert_eq!(invocations(), 2);
    assert_eq!(
        attempt_results(&sb.show("c"), 3),
        vec!["send:retryable", "send:ok"]
    );
    sb.stephost(&["replay", "c"]).expect_code(0);
    assert_eq!(invocations(), 2, "replay ran the command");
}

#[test]
fn an_llm_completion_is_recorded_with_its_tokens_and_replayed_without_the_endpoint() {
    let stub = ModelStub::start("Order 7 more widgets.", 42);
    let sb = Sandbox::with_config(BIN, &stephost_tests::llm_config(&stub.url()));
    let ran = sb
        .command(&[
            "run",
            guests::LLM_STEP,
            "--input",
            r#"{"question":"how many?"}"#,
            "--run-id",
            "l",
        ])
        .env("STEPHOST_TEST_KEY", "sk-test")
        .output()
        .unwrap();
    assert_eq!(
        ran.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    let out: Value = serde_json::from_slice(&ran.stdout).unwrap();
    assert_eq!(out["answer"], "Order 7 more widgets.");
    let seen = stub.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body["model"], "stub-model");
    assert_eq!(seen[0].body["messages"][0]["content"], "how many?");
    assert_eq!(seen[0].authorization.as_deref(), Some("Bearer sk-test"));
    let show = sb.show("l");
    assert_eq!(show["tokens_total"], 42);
    assert_eq!(calls(&show)[0]["class"], "read");
    // The key is not in the ledger.
    assert!(!sb.ledger_contains("sk-test"));
    // Replay needs neither the endpoint nor the key.
    sb.set_config("");
    sb.stephost(&["replay", "l"]).expect_code(0);
    assert_eq!(stub.requests().len(), 1, "replay called the model");
}

#[test]
fn an_llm_completion_past_the_runs_token_budget_is_not_sent_and_replays_refused() {
    let stub = ModelStub::start("never", 42);
    let config = |tokens: u64| {
        format!(
            "{}[limits]\nmodel_tokens_max = {tokens}\n",
            stephost_tests::llm_config(&stub.url())
        )
    };
    // The request alone (about four bytes a token) is past 5 tokens.
    let sb = Sandbox::with_config(BIN, &config(5));
    let ran = sb
        .command(&[
            "run",
            guests::LLM_STEP,
            "--input",
            r#"{"question":"how many widgets are on hand?"}"#,
            "--run-id",
            "over",
        ])
        .env("STEPHOST_TEST_KEY", "sk-test")
        .output()
        .unwrap();
    let run = sb.show("over")["run"].clone();
    assert_eq!(run["status"], "failed", "{ran:?}");
    assert!(
        run["error"].as_str().unwrap().contains("model_tokens_max"),
        "{run:#}"
    );
    assert!(
        stub.requests().is_empty(),
        "a completion over budget was sent"
    );
    let show = sb.show("over");
    let refused = &calls(&show)[0];
    assert!(
        refused["outcome"].as_str().unwrap().contains("\"budget\""),
        "{refused:#}"
    );
    // Replayed under a budget that would let it through: refused as it was.
    sb.set_config(&config(1_000_000));
    sb.stephost(&["replay", "over"]).expect_code(0);
    assert!(stub.requests().is_empty());
}

#[test]
fn metrics_are_printed_in_prometheus_text_format() {
    let sb = Sandbox::new(BIN);
    sb.run(guests::MULTI_WRITE, r#"{"count":1}"#, "m")
        .expect_code(0);
    let text = sb.stephost(&["metrics"]);
    text.expect_code(0);
    assert!(
        text.stdout
            .contains("# TYPE side_effect_unknown_total counter")
    );
    assert!(
        text.stdout
            .contains("stephost_runs{status=\"completed\"} 1"),
        "{}",
        text.stdout
    );
}

#[test]
fn a_lost_reply_from_a_receiver_that_does_not_deduplicate_is_looked_up_not_resent() {
    let receiver = Receiver::start().unwrap();
    receiver.push_fault(Fault::CommitThenDrop);
    let sb = sandbox(&receiver, false, true);
    let ran = run(&sb);
    ran.expect_code(0);
    assert_eq!(ran.json()["receipt"]["order_id"], "ORD-1");
    assert_eq!(
        receiver.requests_received(),
        1,
        "resent to a receiver that does not deduplicate"
    );
    assert_eq!(receiver.business_effects(), 1);
    assert_eq!(receiver.lookups(), 1);
}

#[test]
fn a_lost_reply_with_no_way_to_ask_parks_the_run_instead_of_guessing() {
    let receiver = Receiver::start().unwrap();
    receiver.push_fault(Fault::CommitThenDrop);
    let sb = sandbox(&receiver, false, false);
    let ran = run(&sb);
    ran.expect_code(5);
    assert_eq!(receiver.requests_received(), 1);
    let show = sb.show("order-1");
    assert_eq!(show["run"]["status"], "parked");
    assert_eq!(calls(&show)[ORDER_SEQ as usize - 1]["state"], "unknown");
}

#[test]
fn an_in_flight_write_whose_effect_is_no_longer_configured_is_parked_not_failed() {
    let receiver = Receiver::start().unwrap();
    let sb = sandbox(&receiver, true, true);
    crash(&sb, &format!("after-send@{ORDER_SEQ}"));
    sb.set_config(
        &config(&receiver, true, true)
            .replace("[effects.\"supplier.order\"]", "[effects.\"other\"]"),
    );
    let resumed = sb.stephost(&["resume", "order-1"]);
    resumed.expect_code(5);
    assert!(
        resumed.stderr.contains("not configured now"),
        "{}",
        resumed.stderr
    );
    assert_eq!(
        calls(&sb.show("order-1"))[ORDER_SEQ as usize - 1]["state"],
        "unknown"
    );
    // With the effect granted again, a person can still settle it; the
    // supplier has exactly the one order.
    assert_eq!(receiver.business_effects(), 1);
}

#[test]
fn a_lookup_that_fails_once_is_asked_again_before_the_call_is_given_up() {
    let sb = Sandbox::with_config(BIN, "");
    let send = sb.path("send.sh");
    let lookup = sb.path("lookup.sh");
    // The receiver stores each order by operation id; its lookup answers an
    // error the first time it is asked, then the receipt.
    std::fs::write(
        &send,
        "#!/bin/sh\ncd \"$(dirname \"$0\")\"\ncat > \"order-$STEPHOST_OPERATION_ID.json\"\n\
         printf '{\"receipt\":\"cmd-order\"}'\n",
    )
    .unwrap();
    std::fs::write(
        &lookup,
        "#!/bin/sh\ncd \"$(dirname \"$0\")\"\n\
         if [ ! -e asked ]; then touch asked; echo 'ledger service busy' >&2; exit 1; fi\n\
         if [ -e \"order-$STEPHOST_OPERATION_ID.json\" ]; then printf '{\"receipt\":\"cmd-order\",\"operation_id\":\"%s\"}' \"$STEPHOST_OPERATION_ID\"; exit 0; fi\n\
         exit 3\n",
    )
    .unwrap();
    sb.set_config(&format!(
        r#"
[effects.orders]
kind = "command"
class = "write"
argv = ["sh", "{}"]
lookup = ["sh", "{}"]
retry = {{ attempts_max = 3, backoff_first_ms = 10 }}
"#,
        send.display(),
        lookup.display()
    ));
    let crashed = sb.run_crashing_at("after-send@3", guests::MULTI_WRITE, r#"{"count":1}"#, "l");
    assert_eq!(crashed.signal, Some(libc::SIGABRT), "{crashed:?}");
    let resumed = sb.stephost(&["resume", "l"]);
    resumed.expect_code(0);
    assert_eq!(resumed.json()["receipts"][0]["receipt"], "cmd-order");
    assert_eq!(
        attempt_results(&sb.show("l"), 3),
        vec!["interrupted:unrecorded", "lookup:error", "lookup:found"]
    );
}

#[test]
fn a_run_waiting_on_its_first_read_is_in_the_ledger() {
    // `run` records a new run with its first commit, which comes before
    // the first read leaves: a run held by a slow read is listed.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", silent.local_addr().unwrap());
    let sb = Sandbox::with_config(
        BIN,
        &format!(
            r#"
[effects."inventory.read"]
kind = "http"
class = "read"
method = "GET"
url = "{url}/inventory/{{sku}}"

[effects."supplier.order"]
kind = "http"
class = "write"
method = "POST"
url = "{url}/orders"
"#
        ),
    );
    let mut child = spawn_run(&sb);
    // The read has left the host once its connection arrives; it gets no
    // answer.
    let (_held, _) = silent.accept().unwrap();
    let listed = sb.stephost(&["runs", "--json"]).expect_code(0).json();
    child.kill().unwrap();
    child.wait().unwrap();
    let runs = listed.as_array().unwrap();
    assert_eq!(runs.len(), 1, "{listed:#}");
    assert_eq!(runs[0]["run_id"], "order-1");
    assert_eq!(runs[0]["status"], "running");
    assert!(calls(&sb.show("order-1")).is_empty());
}

/// The supplier configuration with the order's timeout at `ms`.
fn with_order_timeout(config: String, ms: u64) -> String {
    config.replace("retry = {", &format!("timeout_ms = {ms}\nretry = {{"))
}

#[test]
fn replies_all_lost_after_the_commit_are_settled_by_lookup_not_called_exhausted() {
    let receiver = Receiver::start().unwrap();
    for _ in 0..4 {
        receiver.push_fault(Fault::CommitThenDrop);
    }
    let sb = sandbox(&receiver, true, true);
    let ran = run(&sb);
    ran.expect_code(0);
    assert_eq!(ran.json()["receipt"]["order_id"], "ORD-1");
    assert_eq!(receiver.business_effects(), 1);
    let results = attempt_results(&sb.show("order-1"), ORDER_SEQ);
    assert_eq!(results.last().map(String::as_str), Some("lookup:found"));
    assert_eq!(results.iter().filter(|r| r.starts_with("send")).count(), 4);
}

#[test]
fn a_receiver_that_commits_after_the_lookup_leaves_the_call_unknown_not_failed() {
    let receiver = Receiver::start().unwrap();
    // The attempt times out at 300 ms; the lookup right after it finds no
    // order; the receiver commits it 2 s after it arrived.
    receiver.push_fault(Fault::CommitLate(Duration::from_secs(2)));
    let sb = Sandbox::with_config(
        BIN,
        &with_order_timeout(config(&receiver, false, true), 300),
    );
    let ran = run(&sb);
    ran.expect_code(5);
    let show = sb.show("order-1");
    assert_eq!(show["run"]["status"], "parked");
    assert_eq!(calls(&show)[ORDER_SEQ as usize - 1]["state"], "unknown");
    let results = attempt_results(&show, ORDER_SEQ);
    assert!(
        results.iter().any(|r| r == "lookup:not_found"),
        "{results:?}"
    );
    // And the receiver does hold the order: "failed" would have been a lie.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while receiver.business_effects() == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(receiver.business_effects(), 1);
}

#[test]
fn replies_all_lost_with_no_lookup_park_the_call_as_unknown() {
    let receiver = Receiver::start().unwrap();
    for _ in 0..4 {
        receiver.push_fault(Fault::CommitThenDrop);
    }
    let sb = sandbox(&receiver, true, false);
    let ran = run(&sb);
    ran.expect_code(5);
    assert!(
        !ran.stderr.contains("no record"),
        "nobody asked the receiver: {}",
        ran.stderr
    );
    let show = sb.show("order-1");
    assert_eq!(show["run"]["status"], "parked");
    assert_eq!(calls(&show)[ORDER_SEQ as usize - 1]["state"], "unknown");
    assert_eq!(receiver.business_effects(), 1);
}

#[test]
fn a_409_after_a_late_commit_is_settled_by_lookup_not_rejected() {
    let receiver = Receiver::start().unwrap();
    // The first attempt commits but answers after the host gave up on it;
    // the resend is told the key is still in progress.
    receiver.push_fault(Fault::Delay(Duration::from_secs(2)));
    receiver.push_fault(Fault::status(409));
    let sb = Sandbox::with_config(BIN, &with_order_timeout(config(&receiver, true, true), 300));
    let ran = run(&sb);
    ran.expect_code(0);
    assert_eq!(ran.json()["receipt"]["order_id"], "ORD-1");
    assert_eq!(
        attempt_results(&sb.show("order-1"), ORDER_SEQ),
        vec!["send:retryable", "send:rejected", "lookup:found"]
    );
    assert_eq!(receiver.business_effects(), 1);

    // Without a lookup the same is unknown, never "rejected".
    let receiver = Receiver::start().unwrap();
    receiver.push_fault(Fault::Delay(Duration::from_secs(2)));
    receiver.push_fault(Fault::status(409));
    let sb = Sandbox::with_config(
        BIN,
        &with_order_timeout(config(&receiver, true, false), 300),
    );
    run(&sb).expect_code(5);
    assert_eq!(
        calls(&sb.show("order-1"))[ORDER_SEQ as usize - 1]["state"],
        "unknown"
    );
}

#[test]
fn lookup_answers_that_name_no_operation_prove_nothing() {
    for (status, body) in [
        (200, r#"{"status":"ok"}"#),
        (204, ""),
        (200, "[]"),
        (200, "null"),
    ] {
        let receiver = Receiver::start().unwrap();
        let sb = sandbox(&receiver, false, true);
        // Started, never sent.
        crash(&sb, &format!("after-started@{ORDER_SEQ}"));
        receiver.set_lookup_answer(Some((status, body)));
        let resumed = sb.stephost(&["resume", "order-1"]);
        resumed.expect_code(5);
        let show = sb.show("order-1");
        assert_eq!(
            calls(&show)[ORDER_SEQ as usize - 1]["state"],
            "unknown",
            "{status} {body:?} was taken for a receipt"
        );
        assert_eq!(
            attempt_results(&show, ORDER_SEQ),
            vec!["interrupted:unrecorded", "lookup:foreign_receipt"],
            "{status} {body:?}"
        );
        assert_eq!(receiver.requests_received(), 0);
    }
}

#[test]
fn a_retry_after_of_u64_max_seconds_ends_the_call_without_a_panic() {
    let receiver = Receiver::start().unwrap();
    receiver.push_fault(Fault::retry_after(503, u64::MAX));
    let sb = sandbox(&receiver, true, true);
    let ran = run(&sb);
    assert!(!ran.stderr.contains("panicked"), "{}", ran.stderr);
    // 503 is "certainly not received": the retry is not worth waiting for
    // past the deadline, and the step is told its call failed.
    ran.expect_code(3);
    assert_eq!(receiver.requests_received(), 1);
    assert_eq!(receiver.business_effects(), 0);
    assert_eq!(
        calls(&sb.show("order-1"))[ORDER_SEQ as usize - 1]["state"],
        "failed"
    );
}

#[test]
fn a_command_that_leaves_a_process_behind_is_answered_and_its_group_killed() {
    let sb = Sandbox::with_config(BIN, "");
    // Relative to the configuration's folder, as the effect names it.
    std::fs::write(
        sb.path("order.sh"),
        "#!/bin/sh\n(sleep 3; touch survived) &\necho $! > background.pid\n\
         printf '{\"receipt\":\"cmd-order\"}'\n",
    )
    .unwrap();
    sb.set_config(
        r#"
[effects.orders]
kind = "command"
class = "write"
argv = ["sh", "./order.sh"]
timeout_ms = 60000
"#,
    );
    let ran = sb.run(guests::MULTI_WRITE, r#"{"count":1}"#, "bg");
    ran.expect_code(0);
    assert_eq!(ran.json()["receipts"][0]["receipt"], "cmd-order");
    let pid = std::fs::read_to_string(sb.path("background.pid")).unwrap();
    // Killed with its group: gone, or a zombie nobody reaped yet, once the
    // signal is delivered (the kill is sent before the run returns).
    let ended = || {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())).unwrap_or_default();
        let state = stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .split_whitespace()
            .next()
            .map(str::to_string);
        matches!(state.as_deref(), None | Some("Z") | Some("X"))
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ended() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(ended(), "the background process runs on");
    assert!(
        !sb.path("survived").exists(),
        "the background process ran on"
    );
}

#[test]
fn a_template_field_of_dot_dot_stays_one_path_segment() {
    let receiver = Receiver::start().unwrap();
    let sb = sandbox(&receiver, true, true);
    sb.run(
        guests::SUPPLIER_ORDER,
        r#"{"sku":"..","quantity":1}"#,
        "dots",
    )
    .expect_code(0);
    let paths: Vec<String> = receiver.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(paths[0], "/inventory/%2E%2E", "{paths:?}");
    assert!(
        paths
            .iter()
            .all(|p| p.starts_with("/inventory/") || p == "/orders"),
        "{paths:?}"
    );
}

#[test]
fn a_placeholder_in_a_url_host_is_refused_when_the_configuration_loads() {
    let receiver = Receiver::start().unwrap();
    let cfg = config(&receiver, true, true).replace(
        &format!("{}/inventory", receiver.url()),
        "http://{sku}.example/inventory",
    );
    let sb = Sandbox::with_config(BIN, &cfg);
    let ran = run(&sb);
    ran.expect_code(2);
    assert!(ran.stderr.contains("inventory.read"), "{}", ran.stderr);
    assert_eq!(receiver.requests().len(), 0);
}

#[test]
fn a_model_answer_is_committed_before_the_step_sees_it_and_never_asked_twice() {
    let stub = ModelStub::start("Order 7 more widgets.", 42);
    let sb = Sandbox::with_config(BIN, &stephost_tests::llm_config(&stub.url()));
    // The process dies right after the model answered (its first call).
    let crashed = sb
        .command(&[
            "run",
            guests::LLM_STEP,
            "--input",
            r#"{"question":"how many?"}"#,
            "--run-id",
            "l",
        ])
        .env("STEPHOST_TEST_KEY", "sk-test")
        .env("STEPHOST_CRASH_AT", "after-outcome@1")
        .output()
        .unwrap();
    assert_eq!(
        crashed.status.code(),
        None,
        "the process was to abort at its crash point: {}",
        String::from_utf8_lossy(&crashed.stderr)
    );
    assert_eq!(stub.requests().len(), 1);
    let before = sb.show("l");
    assert_eq!(calls(&before).len(), 1, "the answer was not recorded");
    assert_eq!(calls(&before)[0]["state"], "succeeded");
    let resumed = sb
        .command(&["resume", "l"])
        .env("STEPHOST_TEST_KEY", "sk-test")
        .output()
        .unwrap();
    assert_eq!(
        resumed.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    let out: Value = serde_json::from_slice(&resumed.stdout).unwrap();
    assert_eq!(out["answer"], "Order 7 more widgets.");
    assert_eq!(
        stub.requests().len(),
        1,
        "the resumed run asked the model again"
    );
}
