//! Redaction with no way around it: a request hash that proves the text
//! kept and gives away nothing else, a marker planted in a recorded request
//! that `verify` finds, a refusal redacted as a sent call would be, secrets
//! scrubbed from every error, a marker never sent after a resume, and a
//! run's input kept with its redacted values as markers.

use model_server::{Config, ModelServer, Script};
use serde_json::Value;
use stephost_tests::{Ran, Sandbox, calls, guests};

const BIN: &str = env!("CARGO_BIN_EXE_stephost-crash");

const KEY: &str = "sk-test-redaction-e2e";

/// A chain key file for `sb`, readable by its owner only.
fn chain_key(sb: &Sandbox) -> std::path::PathBuf {
    let key = sb.path("chain.key");
    std::fs::write(&key, "a test chain key of enough bytes, 0123456789").unwrap();
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    key
}

/// `stephost ARGS` with the chain key and the model's key.
fn keyed(sb: &Sandbox, args: &[&str]) -> Ran {
    let key = sb.path("chain.key");
    sb.stephost_with_envs(
        &[
            ("STEPHOST_CHAIN_KEY_FILE", key.as_os_str()),
            ("STEPHOST_TEST_MODEL_KEY", KEY.as_ref()),
        ],
        args,
    )
}

/// The model `support` at `url`, redacting every message's text.
fn model_config(url: &str, extra: &str) -> String {
    format!(
        r#"
[models.support]
api = "openai-chat"
url = "{url}"
model = "scripted-1"
key_env = "STEPHOST_TEST_MODEL_KEY"
max_tokens = 1024

[models.support.retry]
attempts_max = 2
backoff_first_ms = 10
backoff_max_ms = 50
deadline_ms = 20000

[redact."models.support"]
request = ["/messages/*/content/*/text"]
response = ["/content/*/text"]
{extra}"#
    )
}

fn model_server(script: Option<&str>) -> ModelServer {
    ModelServer::start_with(Config {
        script: script.map_or_else(Script::default_refund, |s| Script::from_json(s).unwrap()),
        key: Some(KEY.into()),
        ..Config::default()
    })
    .unwrap()
}

/// Asserts that `secret` is nowhere in `sb`'s ledger nor in run `run_id`'s
/// export (made with the key its configuration needs).
#[track_caller]
fn kept_out(sb: &Sandbox, secret: &str, run_id: &str) {
    assert!(!sb.ledger_contains(secret), "{secret} is in the ledger");
    let export = keyed(sb, &["export", run_id]);
    export.expect_code(0);
    assert!(!export.stdout.contains(secret), "{secret} is in the export");
}

fn requests(server: &ModelServer) -> u64 {
    server.report()["requests_total"].as_u64().unwrap()
}

#[test]
fn a_request_hash_is_of_the_kept_text_and_a_planted_marker_does_not_verify() {
    const NONCE_FIELD: &str = "request_nonce";
    let sb = Sandbox::with_config(
        BIN,
        &format!(
            "{}\n[redact.\"supplier.order\"]\nrequest = [\"/{NONCE_FIELD}\"]\n",
            stephost_tests::SUPPLIER_CONFIG
        ),
    );
    chain_key(&sb);
    let input = r#"{"sku":"WIDGET-7","quantity":10}"#;
    keyed(
        &sb,
        &[
            "run",
            guests::SUPPLIER_ORDER,
            "--input",
            input,
            "--run-id",
            "h",
        ],
    )
    .expect_code(0);
    let show = sb.show("h");
    let order = calls(&show)
        .iter()
        .find(|c| c["function"] == "supplier.order")
        .expect("the order call")
        .clone();
    let request = order["request"].as_str().unwrap();
    assert!(request.contains("stephost_redacted:"), "{request}");
    // The hash is of the request as kept: nothing of the value is in it
    // that the marker does not already hold.
    let export: Value = keyed(&sb, &["export", "h"]).json();
    for call in export["calls"].as_array().unwrap() {
        let hash = stephost_core::ids::request_hash(
            call["interface"].as_str().unwrap(),
            call["function"].as_str().unwrap(),
            call["request"].as_str().unwrap(),
        );
        assert_eq!(call["request_hash"], hash, "{call:#}");
    }
    keyed(&sb, &["verify", "h"]).expect_code(0);

    // The inventory read's request rewritten in the ledger, with a marker
    // planted beside it: found.
    sb.tamper()
        .edit_call("h", 1, &mut |call| {
            call.request = r#"{"note":"stephost_redacted:hmac-sha256:00","sku":"WIDGET-9"}"#.into()
        })
        .unwrap();
    let verified = keyed(&sb, &["verify", "h"]);
    verified.expect_code(4);
    assert!(verified.stdout.contains("call #1"), "{}", verified.stdout);
}

#[test]
fn a_refusal_is_redacted_and_a_secret_is_scrubbed_from_every_error() {
    const MESSAGE: &str = "my card is 4000-0566-5566-5556";
    let server = model_server(None);
    let sb = Sandbox::with_config(BIN, &model_config(&server.url(), ""));
    chain_key(&sb);
    // Refused for the run's budget: not sent, and the message is not kept.
    let input = serde_json::json!({"model": "support", "message": MESSAGE}).to_string();
    let ran = keyed(
        &sb,
        &[
            "run",
            guests::CHAT_STEP,
            "--input",
            &input,
            "--run-id",
            "b",
            "--model-tokens-max",
            "10",
        ],
    );
    ran.expect_code(0);
    assert_eq!(ran.json()["error"], "budget", "{}", ran.stdout);
    assert_eq!(requests(&server), 0);
    // The input holds it (not redacted here); the call's request must not.
    let show = sb.show("b");
    let chat = &calls(&show)[0];
    assert!(
        !chat["request"].as_str().unwrap().contains("4000-0566"),
        "{chat:#}"
    );

    // A provider's error that echoes a key of any shape: never kept, never
    // shown to the step.
    const ODD_KEY: &str = "odd-shaped-credential-7f3a9c";
    let echo = ModelServer::start_with(Config {
        script: Script::from_json(&format!(
            r#"{{"turns": [{{"text": "never", "faults": [{{"kind": "status", "status": 401,
                "message": "Incorrect API key provided: {ODD_KEY}."}}]}}]}}"#
        ))
        .unwrap(),
        ..Config::default()
    })
    .unwrap();
    let sb = Sandbox::with_config(BIN, &model_config(&echo.url(), ""));
    chain_key(&sb);
    let ran = sb.stephost_with_envs(
        &[
            ("STEPHOST_CHAIN_KEY_FILE", sb.path("chain.key").as_os_str()),
            ("STEPHOST_TEST_MODEL_KEY", ODD_KEY.as_ref()),
        ],
        &[
            "run",
            guests::CHAT_STEP,
            "--input",
            r#"{"model":"support","message":"hello"}"#,
            "--run-id",
            "k",
        ],
    );
    ran.expect_code(0);
    let out = ran.json();
    assert_eq!(out["error"], "rejected", "{out}");
    assert!(
        out["message"].as_str().unwrap().contains("[redacted]"),
        "{out}"
    );
    for text in [&ran.stdout, &ran.stderr] {
        assert!(!text.contains(ODD_KEY), "{text}");
    }
    kept_out(&sb, ODD_KEY, "k");

    // A URL filled from a redacted value, in a failed attempt's detail and
    // the call's error: scrubbed (the input's copy redacted too).
    const SKU: &str = "SECRET-SKU-424242";
    let sb = Sandbox::with_config(
        BIN,
        r#"
[effects."inventory.read"]
kind = "http"
class = "read"
method = "GET"
url = "http://127.0.0.1:9/inventory/{sku}"
timeout_ms = 2000

[effects."inventory.read".retry]
attempts_max = 2
backoff_first_ms = 10
backoff_max_ms = 20

[redact."inventory.read"]
request = ["/sku"]

[redact."input"]
request = ["/sku"]
"#,
    );
    chain_key(&sb);
    let input = serde_json::json!({"sku": SKU, "quantity": 10}).to_string();
    let ran = keyed(
        &sb,
        &[
            "run",
            guests::SUPPLIER_ORDER,
            "--input",
            &input,
            "--run-id",
            "u",
        ],
    );
    assert!(
        ran.stdout.contains("[redacted]") || ran.stderr.contains("[redacted]"),
        "{ran:?}"
    );
    for text in [&ran.stdout, &ran.stderr] {
        assert!(!text.contains(SKU), "{text}");
    }
    let show = sb.show("u");
    let attempts = stephost_tests::attempts_for(&show, 1);
    assert_eq!(attempts.len(), 2, "{show:#}");
    assert!(
        attempts[0]["detail"]
            .as_str()
            .unwrap()
            .contains("[redacted]"),
        "{show:#}"
    );
    kept_out(&sb, SKU, "u");
}

#[test]
fn a_value_redacted_from_an_answer_is_never_sent_on_after_a_resume() {
    const CARD: &str = "4111-1111-1111-1111";
    let server = model_server(Some(r#"{"turns": [{"text": "Noted."}]}"#));
    let sb = Sandbox::with_config(
        BIN,
        &model_config(
            &server.url(),
            &format!(
                r#"
[limits]
model_budget_exceeded = "park"

[effects."vault.read"]
kind = "static"
class = "read"
response = '{{"card": "{CARD}"}}'

[redact."vault.read"]
response = ["/card"]
"#
            ),
        ),
    );
    chain_key(&sb);
    let input = r#"{"model":"support","message":"Check my card.","with_card":true,"quiet":true}"#;
    // Parked over its budget at the model call, the card's read (its answer
    // kept as a marker) committed with the park.
    let parked = keyed(
        &sb,
        &[
            "run",
            guests::CHAT_STEP,
            "--input",
            input,
            "--run-id",
            "r",
            "--model-tokens-max",
            "10",
        ],
    );
    parked.expect_code(5);
    assert_eq!(requests(&server), 0);
    // A person raises the budget and resumes it: the step builds its prompt
    // from the marker, which is not sent.
    let resumed = keyed(&sb, &["resume", "r", "--model-tokens-max", "100000"]);
    assert_eq!(
        requests(&server),
        0,
        "a marker was sent to the model: {resumed:?} {:#}",
        sb.show("r")
    );
    let run = sb.show("r")["run"].clone();
    assert_eq!(run["status"], "failed", "{resumed:?}");
    assert!(
        run["error"]
            .as_str()
            .unwrap()
            .starts_with("redacted_value: call #2"),
        "{run:#}"
    );
    assert!(!sb.ledger_contains(CARD));
}

#[test]
fn a_runs_input_is_kept_with_its_redacted_values_as_markers() {
    const MESSAGE: &str = "refund order A-1001 to card 5555-4444-3333-1111";
    let server = model_server(Some(r#"{"turns": [{"text": "Done."}]}"#));
    let sb = Sandbox::with_config(
        BIN,
        &model_config(
            &server.url(),
            "\n[redact.\"input\"]\nrequest = [\"/message\"]\n",
        ),
    );
    chain_key(&sb);
    let input =
        serde_json::json!({"model": "support", "message": MESSAGE, "quiet": true}).to_string();
    // Run in one process: the step gets the whole input.
    let ran = keyed(
        &sb,
        &["run", guests::CHAT_STEP, "--input", &input, "--run-id", "i"],
    );
    ran.expect_code(0);
    assert_eq!(ran.json()["stop"], "stop", "{}", ran.stdout);
    assert!(
        server.report().to_string().contains("5555-4444-3333-1111"),
        "the model did not get the whole input"
    );
    let kept = sb.show("i")["run"]["input"].clone();
    assert!(
        kept.as_str().unwrap().contains("stephost_redacted:"),
        "{kept}"
    );
    kept_out(&sb, "5555-4444-3333-1111", "i");
    keyed(&sb, &["verify", "i"]).expect_code(0);
    // Submitting the same input again is the same run.
    keyed(
        &sb,
        &[
            "submit",
            guests::CHAT_STEP,
            "--input",
            &input,
            "--run-id",
            "i",
        ],
    )
    .expect_code(0);

    // Submitted, then taken by a worker in another process: the step gets
    // the input as kept, and its marker is never sent.
    keyed(
        &sb,
        &[
            "submit",
            guests::CHAT_STEP,
            "--input",
            &input,
            "--run-id",
            "j",
        ],
    )
    .expect_code(0);
    keyed(&sb, &["worker", "--exit-when-idle"]).expect_code(0);
    let run = sb.show("j")["run"].clone();
    assert_eq!(run["status"], "failed", "{run:#}");
    assert!(
        run["error"]
            .as_str()
            .unwrap()
            .starts_with("redacted_value:"),
        "{run:#}"
    );
    assert_eq!(requests(&server), 1);
    kept_out(&sb, "5555-4444-3333-1111", "j");
}
