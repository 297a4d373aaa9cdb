//! Promises: a run makes a promise, hands its token to a receiver and
//! waits, out of memory; another system completes it with the token (the
//! CLI or the API, which needs no bearer token) and a worker continues the
//! run. The first completion wins, the same one again is accepted, a
//! forged token or a late completion is refused, and the token is nowhere
//! in the ledger.

use serde_json::{Value, json};
use stephost_tests::{Ran, Sandbox, calls, guests};

const BIN: &str = env!("CARGO_BIN_EXE_stephost-crash");

/// `orders` keeps the token only as a keyed hash in the ledger.
fn sandbox() -> Sandbox {
    let sb = Sandbox::with_config(
        BIN,
        &format!(
            "{}\n[redact.\"orders\"]\nrequest = [\"/token\"]\n",
            stephost_tests::BASE_CONFIG
        ),
    );
    let key = sb.path("chain.key");
    std::fs::write(&key, "a test chain key of enough bytes, 0123456789").unwrap();
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    sb
}

/// `stephost ARGS` with the operator's key.
fn keyed(sb: &Sandbox, args: &[&str]) -> Ran {
    sb.stephost_with_env("STEPHOST_CHAIN_KEY_FILE", sb.path("chain.key"), args)
}

fn keyed_crashing_at(sb: &Sandbox, point: &str, args: &[&str]) -> Ran {
    let key = sb.path("chain.key");
    sb.stephost_with_envs(
        &[
            ("STEPHOST_CHAIN_KEY_FILE", key.as_os_str()),
            ("STEPHOST_CRASH_AT", point.as_ref()),
        ],
        args,
    )
}

/// The token the run handed the receiver (its `n`th request).
fn token(sb: &Sandbox, n: usize) -> String {
    sb.received("orders.jsonl")[n]["request"]["token"]
        .as_str()
        .unwrap()
        .to_string()
}

fn complete(sb: &Sandbox, token: &str, how: &[&str]) -> Ran {
    let mut args = vec!["complete", token];
    args.extend_from_slice(how);
    keyed(sb, &args)
}

/// Runs the promise step on `input` as run `run_id`, which waits.
fn waiting(sb: &Sandbox, input: &str, run_id: &str) {
    let args = [
        "run",
        guests::PROMISE_STEP,
        "--input",
        input,
        "--run-id",
        run_id,
    ];
    keyed(sb, &args).expect_code(7);
}

/// Runs keyed workers until run `run_id` has ended.
fn finish(sb: &Sandbox, run_id: &str) -> Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    loop {
        keyed(sb, &["worker", "--exit-when-idle"]).expect_code(0);
        let show = sb.show(run_id);
        if show["run"]["status"] != "waiting" && show["run"]["status"] != "pending" {
            return show;
        }
        assert!(std::time::Instant::now() < deadline, "{show:#}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

fn output(show: &Value) -> Value {
    assert_eq!(show["run"]["status"], "completed", "{show:#}");
    serde_json::from_str(show["run"]["output"].as_str().unwrap()).unwrap()
}

#[test]
fn a_promise_completed_while_its_run_waits_continues_it_and_the_first_completion_wins() {
    let sb = sandbox();
    waiting(&sb, "{}", "w");
    let show = sb.show("w");
    assert_eq!(show["run"]["status"], "waiting");
    let wait = &calls(&show)[2];
    assert_eq!(
        (&wait["function"], &wait["class"], &wait["state"]),
        (&json!("wait"), &json!("suspend"), &json!("started"))
    );
    let token = token(&sb, 0);
    assert!(token.starts_with("w~1~"), "{token}");
    let listed = sb.stephost(&["promises", "--json"]);
    listed.expect_code(0);
    let listed = listed.json();
    assert_eq!(
        (&listed[0]["run_id"], &listed[0]["seq"], &listed[0]["name"]),
        (&json!("w"), &json!(3), &json!("payment"))
    );
    // The token is nowhere in what the ledger gives out.
    let export = keyed(&sb, &["export", "w"]);
    export.expect_code(0);
    assert!(!export.stdout.contains(&token));
    assert!(!show.to_string().contains(&token));

    let mut forged = token.clone();
    let last = forged.pop().unwrap();
    forged.push(if last == '0' { '1' } else { '0' });
    let refused = complete(&sb, &forged, &["--resolve", "{}", "--by", "mallory"]);
    refused.expect_code(2);
    assert!(
        refused.stderr.contains("no promise has this token"),
        "{}",
        refused.stderr
    );

    complete(
        &sb,
        &token,
        &["--resolve", r#"{"paid": true}"#, "--by", "acme"],
    )
    .expect_code(0);
    let again = complete(
        &sb,
        &token,
        &["--resolve", r#"{"paid":true}"#, "--by", "acme"],
    );
    again.expect_code(0);
    assert!(
        again.stderr.contains("the same way already"),
        "{}",
        again.stderr
    );
    let other = complete(&sb, &token, &["--reject", "declined", "--by", "acme"]);
    other.expect_code(2);
    assert!(
        other.stderr.contains("this one differs"),
        "{}",
        other.stderr
    );

    // The completion made the run due: one worker pass ends it.
    keyed(&sb, &["worker", "--exit-when-idle"]).expect_code(0);
    let show = sb.show("w");
    assert_eq!(
        output(&show),
        json!({"promise": 1, "settled": {"resolved": {"paid": true}}})
    );
    let wait = &calls(&show)[2];
    assert_eq!(wait["state"], "succeeded");
    let recorded: Value = serde_json::from_str(wait["outcome"].as_str().unwrap()).unwrap();
    assert_eq!(recorded["ok"]["by"], "acme", "{recorded}");
    // A replay makes the same token (the redacted request checks it) and
    // ends the same way; without the key it cannot.
    keyed(&sb, &["replay", "w"]).expect_code(0);
    assert_ne!(sb.stephost(&["replay", "w"]).code, Some(0));
    // The run has ended: the same completion is still accepted, another
    // still refused.
    complete(
        &sb,
        &token,
        &["--resolve", r#"{"paid": true}"#, "--by", "acme"],
    )
    .expect_code(0);
    complete(&sb, &token, &["--resolve", "1", "--by", "acme"]).expect_code(2);
}

#[test]
fn a_promise_completed_before_its_run_waits_ends_the_wait_at_once() {
    let sb = sandbox();
    // The run sleeps (out of memory) between handing the token out and
    // waiting; the completion lands meanwhile.
    let input = json!({"sleep_ms": 5000}).to_string();
    waiting(&sb, &input, "b");
    complete(
        &sb,
        &token(&sb, 0),
        &["--reject", "card declined", "--by", "bank"],
    )
    .expect_code(0);
    let show = finish(&sb, "b");
    assert_eq!(
        output(&show),
        json!({"promise": 1, "settled": {"rejected": "card declined"}})
    );
    let wait = calls(&show)
        .iter()
        .find(|c| c["function"] == "wait" && c["interface"] == "stephost:step/promises")
        .unwrap();
    assert_eq!(
        wait["class"], "observe",
        "found at once, nothing to wait for"
    );
}

#[test]
fn a_promise_not_completed_in_time_expires_and_a_late_completion_is_refused() {
    let sb = sandbox();
    let input = json!({"ttl_seconds": 1}).to_string();
    waiting(&sb, &input, "x");
    let show = finish(&sb, "x");
    assert_eq!(output(&show), json!({"promise": 1, "settled": "expired"}));
    let late = complete(&sb, &token(&sb, 0), &["--resolve", "{}", "--by", "slow"]);
    late.expect_code(2);
    assert!(late.stderr.contains("expired"), "{}", late.stderr);
}

#[test]
fn a_worker_killed_while_its_run_waits_leaves_it_for_the_next_with_the_same_token() {
    let sb = sandbox();
    // Calls: #1 create, #2 the token to `orders`, #3 the wait. The process
    // dies once the wait is recorded `started`.
    let died = keyed_crashing_at(
        &sb,
        "after-started@3",
        &[
            "run",
            guests::PROMISE_STEP,
            "--input",
            "{}",
            "--run-id",
            "k",
        ],
    );
    assert_eq!(died.signal, Some(libc::SIGABRT), "{died:?}");
    complete(&sb, &token(&sb, 0), &["--resolve", "42", "--by", "acme"]).expect_code(0);
    keyed(&sb, &["resume", "k"]).expect_code(0);
    let show = sb.show("k");
    assert_eq!(
        output(&show),
        json!({"promise": 1, "settled": {"resolved": 42}})
    );
    // The resumed run handed the same token to the same operation: the
    // receiver kept one request.
    assert_eq!(sb.received("orders.jsonl").len(), 1);
}

#[test]
fn the_api_completes_a_promise_with_its_token_alone_and_refuses_a_forged_one() {
    let sb = sandbox();
    waiting(&sb, "{}", "a");
    let token = token(&sb, 0);
    let key = sb.path("chain.key");
    let served = sb.serve(
        &[],
        &[
            ("STEPHOST_CHAIN_KEY_FILE", key.to_str().unwrap()),
            (
                "STEPHOST_API_TOKENS",
                "ana operator ana-token-0123456789abcdef\nviewer read viewer-token-0123456789",
            ),
        ],
    );
    let ana = served.with_token("ana-token-0123456789abcdef");
    let waiting = ana.get("/api/promises").expect(200);
    assert_eq!(waiting.as_array().unwrap().len(), 1, "{waiting:#}");
    assert_eq!(
        (
            &waiting[0]["run_id"],
            &waiting[0]["promise"],
            &waiting[0]["name"]
        ),
        (&json!("a"), &json!(1), &json!("payment"))
    );
    assert!(!waiting.to_string().contains(&token));
    served.browse("promises.mjs", &[]);
    // No bearer token: the promise's token is the authorization.
    let nobody = served.client();
    nobody
        .post("/api/runs/a/cancel", &json!({}))
        .expect_error(401, "unauthorized");
    nobody
        .post(&format!("/api/promises/{token}x"), &json!({"resolve": 1}))
        .expect_error(404, "not_found");
    let done = nobody
        .post(
            &format!("/api/promises/{token}"),
            &json!({"resolve": {"signed": true}, "by": "docusign"}),
        )
        .expect(200);
    assert_eq!(
        done,
        json!({"run_id": "a", "promise": 1, "result": "completed", "state": "resolved"})
    );
    let again = nobody
        .post(
            &format!("/api/promises/{token}"),
            &json!({"resolve": {"signed": true}}),
        )
        .expect(200);
    assert_eq!(again["result"], "again");
    nobody
        .post(&format!("/api/promises/{token}"), &json!({"reject": "no"}))
        .expect_error(409, "promise_completed");
    nobody
        .post(&format!("/api/promises/{token}"), &json!({"resolve": null}))
        .expect_error(400, "bad_input");
    // The server's worker continues the run at once.
    let run = ana.wait_status("a", "completed");
    let out: Value = serde_json::from_str(run["run"]["output"].as_str().unwrap()).unwrap();
    assert_eq!(out["settled"], json!({"resolved": {"signed": true}}));
    let kept: Value =
        serde_json::from_str(calls(&sb.show("a"))[2]["outcome"].as_str().unwrap()).unwrap();
    assert_eq!(kept["ok"]["by"], "docusign");
    served.stop();
}

#[test]
fn a_python_step_makes_and_waits_for_a_promise_as_the_rust_one_does() {
    let module =
        crate::languages::build("tests/guests/python-fanout/build.sh", "python_fanout.wasm");
    let sb = sandbox();
    let input = json!({"promise": 60}).to_string();
    keyed(&sb, &["run", &module, "--input", &input, "--run-id", "py"]).expect_code(7);
    let token = token(&sb, 0);
    assert!(token.starts_with("py~"), "{token}");
    complete(&sb, &token, &["--resolve", r#"{"ok": 1}"#, "--by", "acme"]).expect_code(0);
    keyed(&sb, &["worker", "--exit-when-idle"]).expect_code(0);
    assert_eq!(
        output(&sb.show("py"))["settled"],
        json!({"resolved": {"ok": 1}})
    );
}
