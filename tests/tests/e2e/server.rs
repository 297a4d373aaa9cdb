//! `stephost serve`: the HTTP API, access by token, live updates and
//! webhooks, against a real server process on 127.0.0.1 on the backend the
//! suite runs on; and the console in headless Chromium.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use stephost_core::mac::MacKey;
use stephost_tests::server::{Served, WebhookReceiver};
use stephost_tests::{SUPPLIER_CONFIG, Sandbox, guests};

const BIN: &str = env!("CARGO_BIN_EXE_stephost-crash");

/// The supplier's effects, and `orders`: a receiver that neither
/// deduplicates nor answers lookups, so a crash after its send parks the
/// call as unknown.
fn config(webhooks: &str) -> String {
    format!(
        "{SUPPLIER_CONFIG}\n[effects.orders]\nkind = \"file\"\nclass = \"write\"\npath = \
         \"orders.jsonl\"\ndeduplicate = false\nlookup = false\n{webhooks}"
    )
}

const SECRET: &str = "webhook-secret-0123456789";

fn webhook(url: &str) -> String {
    format!(
        "\n[[webhooks]]\nname = \"ops\"\nurl = \"{url}\"\nsecret_env = \"HOOK_SECRET\"\n\
         backoff_first_ms = 100\nbackoff_max_ms = 400\ntimeout_ms = 2000\n"
    )
}

/// A run of multi-write whose write (call #3) was sent and then the
/// process died: the server's worker resumes it and parks the call.
fn crash_after_a_write(sb: &Sandbox, run_id: &str) {
    let crashed = sb.run_crashing_at(
        "after-send@3",
        guests::MULTI_WRITE,
        r#"{"count":1}"#,
        run_id,
    );
    assert_eq!(crashed.signal, Some(libc::SIGABRT), "{crashed:?}");
}

fn supplier_input(quantity: u64, approval: bool) -> Value {
    match approval {
        true => json!({"sku": "WIDGET-7", "quantity": quantity, "approval_ttl_seconds": 3600}),
        false => json!({"sku": "WIDGET-7", "quantity": quantity}),
    }
}

fn submit(served: &Served, digest: &str, input: Value, run_id: &str) -> Value {
    served
        .post(
            "/api/runs",
            &json!({"module_digest": digest, "input": input, "run_id": run_id}),
        )
        .expect(201)
}

#[test]
fn the_api_submits_lists_pages_and_shows_runs_in_the_clis_shapes() {
    let sb = Sandbox::with_config(BIN, &config(""));
    let served = sb.serve(&[], &[]);
    let client = served.client();
    let digest = client.upload(guests::SUPPLIER_ORDER);
    for i in 0..3 {
        let run = submit(
            &served,
            &digest,
            supplier_input(10, false),
            &format!("r{i}"),
        );
        assert_eq!(run["run_id"], format!("r{i}"));
        assert_eq!(run["module_digest"], digest);
    }
    // The same id with the same module and input is the same run; another
    // input is refused, as `stephost submit` refuses it.
    submit(&served, &digest, supplier_input(10, false), "r0");
    served
        .post(
            "/api/runs",
            &json!({"module_digest": digest, "input": supplier_input(9, false), "run_id": "r0"}),
        )
        .expect_error(409, "run_exists");
    let b64 = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD
            .encode(std::fs::read(guests::SUPPLIER_ORDER).unwrap())
    };
    let uploaded = served
        .post(
            "/api/runs",
            &json!({"module_base64": b64, "input": supplier_input(1, false), "run_id": "r3"}),
        )
        .expect(201);
    assert_eq!(uploaded["module_digest"], digest);
    // A run with a model budget of its own keeps it; one without shows none.
    let budgeted = served
        .post(
            "/api/runs",
            &json!({"module_digest": digest, "input": supplier_input(1, false), "run_id": "r4",
                    "budget": {"model_tokens_max": 700}}),
        )
        .expect(201);
    assert_eq!(budgeted["budget"], json!({"model_tokens_max": 700}));
    assert!(uploaded.get("budget").is_none(), "{uploaded}");
    served
        .post(
            "/api/runs",
            &json!({"module_digest": digest, "input": 1, "budget": {"tokens": 1}}),
        )
        .expect_error(400, "bad_input");
    for i in 0..5 {
        served.wait_status(&format!("r{i}"), "completed");
    }
    assert_eq!(
        served.get("/api/runs/r4").expect(200)["run"]["budget"]["model_tokens_max"],
        700
    );

    // Filters and pages.
    let page = served.get("/api/runs?status=completed&limit=3").expect(200);
    let ids: Vec<&str> = page["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 3);
    let next = page["next"].as_str().unwrap();
    let rest = served
        .get(&format!("/api/runs?status=completed&limit=3&after={next}"))
        .expect(200);
    assert_eq!(rest["runs"].as_array().unwrap().len(), 2);
    assert!(rest["next"].is_null());
    assert!(!ids.contains(&rest["runs"][0]["run_id"].as_str().unwrap()));
    for query in [
        format!("module={digest}"),
        "step=supplier-order@0.1.0".to_string(),
        "created_after_ms=0".to_string(),
    ] {
        let all = served.get(&format!("/api/runs?{query}")).expect(200);
        assert_eq!(all["runs"].as_array().unwrap().len(), 5, "{query}");
    }
    for query in ["status=failed", "step=other@1", "created_before_ms=0"] {
        let none = served.get(&format!("/api/runs?{query}")).expect(200);
        assert_eq!(none["runs"], json!([]), "{query}");
    }
    served
        .get("/api/runs?status=finished")
        .expect_error(400, "bad_input");
    let summary = served.get("/api/summary").expect(200);
    assert_eq!(summary["counts"]["completed"], 5);

    // A run: the same row the CLI shows; its timeline a page at a time.
    let view = served.get("/api/runs/r1").expect(200);
    let show = sb.show("r1");
    assert_eq!(view["run"], show["run"]);
    let first = served.get("/api/runs/r1/calls?limit=1").expect(200);
    assert_eq!(first["calls"].as_array().unwrap().len(), 1);
    assert_eq!(first["calls"][0]["seq"], 1);
    assert_eq!(first["calls"][0]["name"], "inventory.read");
    assert_eq!(first["calls"][0]["attempts"][0]["result"], "ok");
    assert_eq!(first["next_seq"], 2);
    let all = served.get("/api/runs/r1/calls").expect(200);
    let shown_calls = show["calls"].as_array().unwrap();
    assert_eq!(all["calls"].as_array().unwrap().len(), shown_calls.len());
    assert!(all["next_seq"].is_null());
    for (page_call, shown) in all["calls"].as_array().unwrap().iter().zip(shown_calls) {
        assert_eq!(page_call["operation_id"], shown["operation_id"]);
        assert_eq!(page_call["request"], shown["request"]);
        // Performed by the run's one execution, under its claim's fence.
        assert_eq!(page_call["fence"], shown["fence"]);
        assert_eq!(page_call["fence"], view["run"]["fence"]);
    }
    let call = served.get("/api/runs/r1/calls/1").expect(200);
    assert_eq!(call["request"], shown_calls[0]["request"]);
    served
        .get("/api/runs/r1/calls/99")
        .expect_error(404, "not_found");
    served
        .get("/api/runs/nope")
        .expect_error(404, "unknown_run");
    served
        .get("/api/runs/nope/calls")
        .expect_error(404, "unknown_run");
    served
        .get("/api/no/such/path")
        .expect_error(404, "not_found");

    // Export is the CLI's fixture; verify and replay agree with the CLI.
    let exported = served.get("/api/runs/r1/export").expect(200);
    let cli_export: Value = serde_json::from_str(&sb.stephost(&["export", "r1"]).stdout).unwrap();
    assert_eq!(exported, cli_export);
    let verified = served.get("/api/runs/r1/verify").expect(200);
    assert_eq!(verified["result"], "intact", "{verified:#}");
    let replayed = served.post("/api/runs/r1/replay", &json!({})).expect(200);
    assert_eq!(replayed["result"], "consistent", "{replayed:#}");
    let other = client.upload(guests::DIVERGENT);
    let diverged = served
        .post("/api/runs/r1/replay", &json!({"module_digest": other}))
        .expect(200);
    assert_ne!(diverged["result"], "consistent", "{diverged:#}");
    served
        .post("/api/runs", &json!({"input": 1}))
        .expect_error(400, "bad_input");
    served
        .post("/api/runs", &json!({"module_digest": "00", "input": 1}))
        .expect_error(404, "unknown_module");

    // What the API cannot read is a JSON error too.
    let client = served.client();
    let bad_json = client.request("POST", "/api/runs", Some(b"{not json"));
    bad_json.expect_error(400, "bad_input");
    served
        .post(
            "/api/runs",
            &json!({"module_digest": digest, "colour": "red"}),
        )
        .expect_error(400, "bad_input");
    let plain = client.request_with("POST", "/api/approvals/r1/1", Some(b"{}"), &[]);
    let plain = plain.expect_error(400, "bad_input");
    assert!(
        plain["fix"].as_str().unwrap().contains("application/json"),
        "{plain:#}"
    );
    served
        .get("/api/approvals/r1/x")
        .expect_error(405, "method_not_allowed");
    served
        .post("/api/approvals/r1/x", &json!({"verdict": "approved"}))
        .expect_error(400, "bad_input");
    // A replay's body is optional; one that is not JSON (whitespace alone
    // included) is refused.
    client
        .request_with(
            "POST",
            "/api/runs/r1/replay",
            Some(b"\n"),
            &[("Content-Type", "application/json")],
        )
        .expect_error(400, "bad_input");
    client
        .request_with(
            "POST",
            "/api/runs/r1/replay",
            Some(b""),
            &[("Content-Type", "application/json")],
        )
        .expect(200);
    // What a browser could be tricked into sending is refused: a POST from
    // another site, and (without tokens) a name other than loopback.
    let json = ("Content-Type", "application/json");
    client
        .request_with(
            "POST",
            "/api/runs/r1/replay",
            Some(b"{}"),
            &[json, ("Origin", "http://evil.example")],
        )
        .expect_error(403, "forbidden");
    let own = served.base.clone();
    client
        .request_with(
            "POST",
            "/api/runs/r1/replay",
            Some(b"{}"),
            &[json, ("Origin", &own)],
        )
        .expect(200);
    client
        .request_with(
            "GET",
            "/api/runs",
            None,
            &[("Host", "rebound.evil.example:7070")],
        )
        .expect_error(403, "forbidden");

    // Metrics and health.
    let metrics = served.get("/metrics");
    assert_eq!(metrics.status, 200);
    assert!(
        metrics
            .body
            .contains("stephost_runs{status=\"completed\"} 5"),
        "{}",
        metrics.body
    );
    assert_eq!(served.get("/healthz").status, 200);
    assert_eq!(served.get("/readyz").status, 200);
    // SIGTERM drains and exits 0.
    assert_eq!(served.stop(), Some(0));
}

#[test]
fn with_tokens_every_request_needs_one_decisions_an_operator_and_who_is_the_tokens_name() {
    let sb = Sandbox::with_config(BIN, &config(""));
    let tokens = "ana operator ana-token-0123456789abcdef\nviewer read viewer-token-0123456789";
    let served = sb.serve(&[], &[("STEPHOST_API_TOKENS", tokens)]);
    let ana = served.with_token("ana-token-0123456789abcdef");
    let viewer = served.with_token("viewer-token-0123456789");
    let nobody = served.client();
    let wrong = served.with_token("ana-token-0123456789abcdeX");

    for client in [&nobody, &wrong] {
        client.get("/api/runs").expect_error(401, "unauthorized");
        client.get("/metrics").expect_error(401, "unauthorized");
    }
    // Health checks and the console's page need no token.
    assert_eq!(nobody.get("/healthz").status, 200);
    assert_eq!(nobody.get("/").status, 200);

    let digest = ana.upload(guests::SUPPLIER_ORDER);
    let body = json!({"module_digest": digest, "input": supplier_input(10, true), "run_id": "a"});
    viewer
        .post("/api/runs", &body)
        .expect_error(403, "forbidden");
    ana.post("/api/runs", &body).expect(201);
    let waiting = viewer.wait_status("a", "waiting");
    assert_eq!(waiting["run"]["status"], "waiting");

    let inbox = viewer.get("/api/approvals").expect(200);
    let approval = &inbox[0];
    assert_eq!(approval["run_id"], "a");
    assert_eq!(approval["details"]["quantity"], 10);
    let seq = approval["seq"].as_u64().unwrap();
    let sha = approval["details_sha256"].as_str().unwrap();
    let path = format!("/api/approvals/a/{seq}");
    viewer
        .post(
            &path,
            &json!({"verdict": "approved", "details_sha256": sha}),
        )
        .expect_error(403, "forbidden");
    // Approving something other than what was shown is refused.
    let refused = ana
        .post(
            &path,
            &json!({"verdict": "approved", "details_sha256": "0000000000000000"}),
        )
        .expect_error(409, "not_decidable");
    assert!(
        refused["message"].as_str().unwrap().contains(sha),
        "{refused:#}"
    );
    ana.post(&path, &json!({"verdict": "approved"}))
        .expect_error(409, "not_decidable");
    ana.post(&path, &json!({"verdict": "maybe", "details_sha256": sha}))
        .expect_error(400, "bad_input");
    // The token's name is who decided, whatever the body says.
    let decided = ana
        .post(
            &path,
            &json!({"verdict": "approved", "details_sha256": &sha[..12], "by": "mallory"}),
        )
        .expect(200);
    assert_eq!(decided["by"], "ana");
    viewer.wait_status("a", "completed");
    assert_eq!(sb.received("supplier-orders.jsonl").len(), 1);
    let show = sb.show("a");
    let call = &show["calls"][seq as usize - 1];
    assert_eq!(call["resolved_by"], "ana", "{show:#}");
    // Deciding it again is refused.
    ana.post(&path, &json!({"verdict": "rejected"}))
        .expect_error(409, "not_decidable");
    // The token reaches neither the ledger nor the log.
    assert!(!sb.ledger_contains("ana-token-0123456789abcdef"));
    assert!(
        !served
            .log
            .lock()
            .unwrap()
            .contains("ana-token-0123456789abcdef")
    );
    assert_eq!(served.stop(), Some(0));
}

#[test]
fn an_unknown_call_resolved_through_the_api_lets_the_run_continue() {
    let sb = Sandbox::with_config(BIN, &config(""));
    crash_after_a_write(&sb, "u");
    let served = sb.serve(&[], &[]);
    served.wait_status("u", "parked");
    let queue = served.get("/api/unknown").expect(200);
    let unknown = &queue[0];
    assert_eq!(
        (unknown["run_id"].as_str(), unknown["seq"].as_u64()),
        (Some("u"), Some(3))
    );
    assert!(!unknown["operation_id"].as_str().unwrap().is_empty());
    assert!(unknown["request"].as_str().is_some());
    // The receiver got it once; nothing was sent again.
    assert_eq!(sb.received("orders.jsonl").len(), 1);
    let path = "/api/unknown/u/3";
    served
        .post(path, &json!({"outcome": "succeeded", "by": "ana"}))
        .expect_error(400, "bad_input");
    served
        .post(
            path,
            &json!({"outcome": "succeeded", "response": {"receipt": "R-1"}}),
        )
        .expect_error(400, "bad_input");
    served
        .post(
            "/api/unknown/u/1",
            &json!({"outcome": "failed", "message": "no", "by": "ana"}),
        )
        .expect_error(409, "not_decidable");
    served
        .post(
            path,
            &json!({"outcome": "succeeded", "response": {"receipt": "R-1"}, "by": "ana"}),
        )
        .expect(200);
    let done = served.wait_status("u", "completed");
    assert!(
        done["run"]["output"].as_str().unwrap().contains("R-1"),
        "{done:#}"
    );
    assert_eq!(sb.received("orders.jsonl").len(), 1);
    assert_eq!(served.get("/api/unknown").expect(200), json!([]));
    let call = served.get("/api/runs/u/calls/3").expect(200);
    assert_eq!(call["resolved_by"], "ana");
}

#[test]
fn a_server_on_a_public_address_needs_tokens_and_a_bad_token_line_is_refused() {
    let sb = Sandbox::with_config(BIN, &config(""));
    let open = sb.stephost(&["serve", "--listen", "0.0.0.0:0"]);
    open.expect_code(2);
    assert!(open.stderr.contains("without tokens"), "{}", open.stderr);
    let bad = sb.stephost_with_env(
        "STEPHOST_API_TOKENS",
        "ana admin ana-token-0123456789",
        &["serve", "--listen", "127.0.0.1:0"],
    );
    bad.expect_code(2);
    assert!(
        bad.stderr.contains("neither read nor operator"),
        "{}",
        bad.stderr
    );
    // A webhook whose secret is not set is refused before anything starts.
    sb.set_config(&config(&webhook("http://127.0.0.1:9/hook")));
    let unset = sb.stephost(&["serve", "--listen", "127.0.0.1:0"]);
    unset.expect_code(2);
    assert!(unset.stderr.contains("HOOK_SECRET"), "{}", unset.stderr);
}

#[test]
fn every_documented_route_is_served_and_live_updates_name_the_runs_that_change() {
    let sb = Sandbox::with_config(BIN, &config(""));
    let served = sb.serve(&[], &[]);
    let doc = served.get("/openapi.json").expect(200);
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().unwrap();
    assert!(paths.len() >= 15, "{paths:#?}");
    for (path, methods) in paths {
        for method in methods.as_object().unwrap().keys() {
            let concrete = path.replace("{run_id}", "nope").replace("{seq}", "1");
            if concrete == "/api/events" {
                continue; // a stream; read below
            }
            if concrete == "/api/runs/nope/calls/1" {
                // Served, and says the run is unknown (a missing route
                // would say not_found).
                served.get(&concrete).expect_error(404, "unknown_run");
                continue;
            }
            let answer = served.client().request(
                &method.to_uppercase(),
                &concrete,
                (method == "post").then_some(b"{}"),
            );
            let routed = !answer.body.contains("no such path");
            assert!(
                routed,
                "{method} {path} is documented but not served: {answer:?}"
            );
        }
    }
    let digest = served.client().upload(guests::SUPPLIER_ORDER);
    let events = served
        .client()
        .events_until("\"live\"", Duration::from_secs(30), || {
            submit(&served, &digest, supplier_input(1, false), "live");
        });
    assert!(events.contains("text/event-stream"), "{events}");
    assert!(events.contains("event: runs"), "{events}");
    assert!(events.contains("\"run_id\":\"live\""), "{events}");
    // A stream left open does not hold a draining server.
    let open = served.client().open_events();
    assert_eq!(served.stop(), Some(0));
    drop(open);
}

/// One read token cannot take every connection with event streams: it
/// holds at most event_streams_per_token_max (8) open, the next is refused
/// with 429 `too_many_streams`, another token is not held back, and a
/// stream that closes frees its place.
#[test]
fn a_token_holds_at_most_its_share_of_event_streams() {
    let sb = Sandbox::with_config(BIN, &config(""));
    let (dash_token, ops_token) = ("dash-token-0123456789abcdef", "ops-token-0123456789abcdef");
    let served = sb.serve(
        &[],
        &[(
            "STEPHOST_API_TOKENS",
            &format!("dash read {dash_token}; ops operator {ops_token}"),
        )],
    );
    let dash = served.with_token(dash_token);
    let mut open: Vec<_> = (0..8).map(|_| dash.open_events()).collect();
    let refused = dash
        .get("/api/events")
        .expect_error(429, "too_many_streams");
    let message = refused["message"].as_str().unwrap();
    assert!(
        message.contains("\"dash\"") && message.contains("event_streams_per_token_max allows 8"),
        "{refused:#}"
    );
    // Another token's stream is served, and gets events.
    let ops = served.with_token(ops_token);
    let digest = ops.upload(guests::SUPPLIER_ORDER);
    let events = ops.events_until("\"capped\"", Duration::from_secs(30), || {
        ops.post(
            "/api/runs",
            &json!({"module_digest": digest, "input": supplier_input(1, false), "run_id": "capped"}),
        )
        .expect(201);
    });
    assert!(events.contains("event: runs"), "{events}");
    // A stream its reader closed frees its place (once the server sees it
    // closed: at the latest at the stream's next keep-alive, 15 s).
    drop(open.pop());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (stream, head) = dash.try_open_events();
        if head.contains("200 OK") {
            open.push(stream);
            break;
        }
        assert!(head.contains("429"), "{head}");
        assert!(Instant::now() < deadline, "a closed stream kept its place");
        std::thread::sleep(Duration::from_millis(100));
    }
    dash.get("/api/events")
        .expect_error(429, "too_many_streams");
    // The streams left open do not hold a draining server.
    assert_eq!(served.stop(), Some(0));
    drop(open);
}

/// Whether a delivery is signed as docs/api.md tells a receiver to check:
/// `Stephost-Signature` is the HMAC of `TIMESTAMP.DELIVERY_ID.BODY`, and
/// the timestamp is recent (a receiver refuses older ones as replays).
fn signature_ok(delivery: &stephost_tests::server::Delivery) -> bool {
    let (Some(at), Some(id)) = (
        delivery.header("Stephost-Timestamp"),
        delivery.header("Stephost-Delivery"),
    ) else {
        return false;
    };
    let Ok(at_s) = at.parse::<i64>() else {
        return false;
    };
    let now_s = stephost_core::clock::now_ms() / 1_000;
    let signed = format!("{at_s}.{id}.{}", delivery.body);
    let expected = format!(
        "sha256={}",
        stephost_core::ids::to_hex(&MacKey::new(SECRET.as_bytes()).mac(signed.as_bytes()))
    );
    (now_s - at_s).abs() <= 300 && delivery.header("Stephost-Signature") == Some(expected.as_str())
}

#[test]
fn webhooks_are_signed_retried_after_a_500_and_still_owed_after_a_sigkill() {
    let receiver = WebhookReceiver::start(&[500]);
    let sb = Sandbox::with_config(BIN, &config(&webhook(&receiver.url)));
    let env = [("HOOK_SECRET", SECRET)];
    let served = sb.serve(&[], &env);
    let digest = served.client().upload(guests::PANICKER);
    served
        .post(
            "/api/runs",
            &json!({"module_digest": digest, "input": null, "run_id": "f"}),
        )
        .expect(201);
    served.wait_status("f", "failed");
    let got = receiver.wait_for("a delivery after a 500", |d| {
        d.iter().any(|x| x.answered == 200)
    });
    assert_eq!(got[0].answered, 500);
    let (first, second) = (&got[0], &got[1]);
    for d in [first, second] {
        assert!(signature_ok(d), "{d:#?}");
        assert_eq!(d.header("Stephost-Event"), Some("failed"));
    }
    // The retry is the same notification: same delivery id, same body.
    assert_eq!(
        first.header("Stephost-Delivery"),
        second.header("Stephost-Delivery")
    );
    assert_eq!(first.body, second.body);
    let body: Value = serde_json::from_str(&second.body).unwrap();
    assert_eq!(
        (
            body["event"].as_str(),
            body["run_id"].as_str(),
            body["status"].as_str()
        ),
        (Some("failed"), Some("f"), Some("failed"))
    );
    assert_eq!(
        body["delivery_id"].as_str(),
        second.header("Stephost-Delivery")
    );
    let view = served.wait_for("the notice marked delivered", "/api/runs/f", |v| {
        v["notices"][0]["state"] == "delivered"
    });
    assert_eq!(view["notices"][0]["attempts"], 2, "{view:#}");

    // The receiver fails every attempt while a run parks; the server is
    // killed; a person resolves the call meanwhile, so nothing in the
    // ledger's state calls for the notice any more: only its record does.
    // The next server delivers it.
    receiver.script(&[503; 1000]);
    served.kill();
    crash_after_a_write(&sb, "p");
    let served = sb.serve(&[], &env);
    served.wait_status("p", "parked");
    receiver.wait_for("an attempt at the parked notice", |d| {
        d.iter()
            .any(|x| x.header("Stephost-Event") == Some("parked"))
    });
    served.kill();
    sb.stephost(&["resolve", "p", "3", "--failed", "not there", "--by", "ana"])
        .expect_code(0);
    receiver.script(&[]);
    let served = sb.serve(&[], &env);
    let got = receiver.wait_for("the parked notice delivered after the kill", |d| {
        d.iter()
            .any(|x| x.header("Stephost-Event") == Some("parked") && x.answered == 200)
    });
    let parked: Vec<_> = got
        .iter()
        .filter(|d| d.header("Stephost-Event") == Some("parked"))
        .collect();
    assert!(parked.iter().all(|d| signature_ok(d)));
    let ids: std::collections::BTreeSet<_> = parked
        .iter()
        .map(|d| d.header("Stephost-Delivery"))
        .collect();
    assert_eq!(ids.len(), 1, "one notification, however often it was tried");
    let body: Value = serde_json::from_str(&parked[0].body).unwrap();
    assert_eq!(
        (body["run_id"].as_str(), body["seq"].as_u64()),
        (Some("p"), Some(3))
    );
    // Delivered, each is not sent again: two notifications accepted, once
    // each (the resolved run then fails: a third, its own).
    served.wait_status("p", "failed");
    receiver.wait_for("the failed run's notice", |d| {
        d.iter().any(|x| {
            x.answered == 200
                && x.header("Stephost-Event") == Some("failed")
                && x.body.contains("\"run_id\":\"p\"")
        })
    });
    std::thread::sleep(Duration::from_millis(1_500));
    let accepted = receiver.deliveries();
    let mut ids: Vec<_> = accepted
        .iter()
        .filter(|d| d.answered == 200)
        .map(|d| d.header("Stephost-Delivery").unwrap().to_string())
        .collect();
    let all = ids.len();
    ids.sort();
    ids.dedup();
    assert_eq!((ids.len(), all), (3, 3), "{accepted:#?}");
    assert_eq!(served.stop(), Some(0));
}

/// A scripted model server answering `script`, and the configuration of
/// the model `support` on it (OpenAI Chat, no key) besides the supplier
/// effects.
fn with_model(script: &str) -> (model_server::ModelServer, String) {
    let model = model_server::ModelServer::start_with(model_server::Config {
        script: model_server::Script::from_json(script).unwrap(),
        ..model_server::Config::default()
    })
    .unwrap();
    let models = format!(
        "\n[models.support]\napi = \"openai-chat\"\nurl = \"{}\"\nmodel = \"scripted-1\"\n",
        model.url()
    );
    (model, config(&models))
}

/// A model's answer, streamed in over about two seconds, reaches the event
/// stream while it grows, before the run records it whole: each event the
/// text that came since the one before, with where it begins in the answer.
#[test]
fn a_models_answer_streams_to_the_event_stream_while_it_grows() {
    let text = "The parcel left the depot this morning, passed the sorting centre at noon \
                and is on the van now; it will reach you before six this evening.";
    let (_model, config) = with_model(
        &json!({"turns": [{"text": text, "sse_write_bytes": 48, "sse_gap_ms": 60}]}).to_string(),
    );
    let sb = Sandbox::with_config(BIN, &config);
    let served = sb.serve(&[], &[]);
    let digest = served.client().upload(guests::CHAT_STEP);
    let events = served.client().events_until(
        "\"run_id\":\"streamed\",\"status\":\"completed\"",
        Duration::from_secs(60),
        || {
            submit(
                &served,
                &digest,
                json!({"model": "support", "message": "Where is my parcel?"}),
                "streamed",
            );
        },
    );
    assert!(events.contains("event: model"), "{events}");
    let pieces: Vec<(u64, String)> = events
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .filter(|v| v["run_id"] == "streamed" && v["seq"] == 1)
        .map(|v| {
            let offset = v["offset"].as_u64();
            let piece = v["text"].as_str().map(str::to_string);
            (offset.zip(piece)).unwrap_or_else(|| panic!("an event without offset and text: {v}"))
        })
        .collect();
    // The stream was open before the run began: the pieces, each where
    // the one before ended, put together the answer's start, and nothing is
    // sent twice.
    let mut so_far = String::new();
    for (offset, piece) in &pieces {
        assert!(!piece.is_empty(), "{pieces:#?}");
        assert_eq!(*offset, so_far.chars().count() as u64, "{pieces:#?}");
        so_far.push_str(piece);
    }
    assert!(
        text.starts_with(&so_far),
        "{so_far:?} is not the answer's start"
    );
    assert!(
        pieces.len() > 1 && pieces.iter().all(|(_, piece)| piece.len() < text.len()),
        "the answer did not come in pieces: {pieces:#?}"
    );
    let run = served.wait_status("streamed", "completed");
    let output: Value = serde_json::from_str(run["run"]["output"].as_str().unwrap()).unwrap();
    assert_eq!(output["text"], text);
    // The timeline gives the model call's tokens and its attempt.
    let page = served.get("/api/runs/streamed/calls").expect(200);
    let chat = &page["calls"][0];
    assert_eq!(chat["name"], "models.chat", "{page:#}");
    assert!(chat["tokens"].as_u64().unwrap() > 0, "{page:#}");
    assert_eq!(chat["attempts"][0]["result"], "ok", "{page:#}");
    assert_eq!(served.stop(), Some(0));
}

/// A model call held back by a pause the provider asked another run to
/// take says so on the event stream while it waits.
#[test]
fn a_model_call_waiting_for_capacity_says_so_on_the_event_stream() {
    let (model, config) = with_model(
        r#"{"turns": [{"text": "Hello.",
                "faults": [{"kind": "status", "status": 429, "retry_after_ms": 3000, "times": 1}]}]}"#,
    );
    let sb = Sandbox::with_config(BIN, &config);
    let served = sb.serve(&[], &[]);
    let digest = served.client().upload(guests::CHAT_STEP);
    let input = json!({"model": "support", "message": "hi"});
    submit(&served, &digest, input.clone(), "told");
    let deadline = Instant::now() + Duration::from_secs(30);
    while model.report()["requests_total"] == 0 {
        assert!(Instant::now() < deadline, "the model was not asked");
        std::thread::sleep(Duration::from_millis(10));
    }
    let events = served.client().events_until(
        "\"run_id\":\"held\",\"status\":\"completed\"",
        Duration::from_secs(60),
        || {
            submit(&served, &digest, input, "held");
        },
    );
    let waits: Vec<Value> = events
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .filter(|v| v["run_id"] == "held" && v["waiting"].is_string())
        .collect();
    assert!(!waits.is_empty(), "no event said the call waits: {events}");
    assert!(
        waits[0]["waiting"].as_str().unwrap().contains("pause"),
        "{waits:#?}"
    );
    served.wait_status("told", "completed");
    assert_eq!(served.stop(), Some(0));
}

/// The console in headless Chromium, driven by `tests/browser/console.mjs`
/// (playwright-core): find a run, open its timeline, see a divergence at
/// its call, approve a waiting approval and see the run complete, resolve
/// an unknown call and see its run continue, watch a model's answer stream
/// in on its run's page.
#[test]
fn the_console_in_a_browser_approves_and_resolves() {
    // A model whose answer streams in over about nine seconds.
    let (_model, config) = with_model(
        r#"{"turns": [{"text": "The parcel left the depot this morning, passed the sorting centre at noon and is on the van now; it will reach you before six this evening.", "sse_gap_ms": 300}]}"#,
    );
    let sb = Sandbox::with_config(BIN, &config);
    crash_after_a_write(&sb, "parked-run");
    // A run whose recording no longer matches its step at call #1 (as if
    // the step had read something the host did not record): it diverges
    // when the server's worker resumes it.
    crash_after_a_write(&sb, "diverged-run");
    sb.tamper()
        .edit_call("diverged-run", 1, &mut |call| {
            call.request = r#"{"changed":1}"#.into();
            call.request_hash = "changed".into();
        })
        .unwrap();
    let served = sb.serve(&[], &[]);
    let digest = served.client().upload(guests::SUPPLIER_ORDER);
    submit(&served, &digest, supplier_input(10, true), "approval-run");
    served.wait_status("approval-run", "waiting");
    served.wait_status("parked-run", "parked");
    let diverged = served.wait_status("diverged-run", "diverged");
    assert!(
        diverged["run"]["error"]
            .as_str()
            .unwrap()
            .contains("call #1 diverged"),
        "{diverged:#}"
    );
    let chat_digest = served.client().upload(guests::CHAT_STEP);
    served.browse("console.mjs", &[&chat_digest]);
    // What the browser did is in the ledger.
    let approved = served.wait_status("approval-run", "completed");
    assert_eq!(approved["run"]["status"], "completed");
    assert_eq!(sb.received("supplier-orders.jsonl").len(), 1);
    let resolved = served.wait_status("parked-run", "completed");
    assert!(resolved["run"]["output"].as_str().unwrap().contains("R-77"));
    // One write each of parked-run and diverged-run, sent before their
    // crashes; neither sent again.
    assert_eq!(sb.received("orders.jsonl").len(), 2);
    let call = served.get("/api/runs/parked-run/calls/3").expect(200);
    assert_eq!(call["resolved_by"], "browser-ana");
}

#[test]
fn two_servers_on_one_ledger_share_the_runs_and_notify_each_event_once() {
    let receiver = WebhookReceiver::start(&[]);
    let sb = Sandbox::with_config(BIN, &config(&webhook(&receiver.url)));
    let env = [("HOOK_SECRET", SECRET)];
    let (a, b) = (sb.serve(&[], &env), sb.serve(&[], &env));
    let digest = a.client().upload(guests::SUPPLIER_ORDER);
    let runs: Vec<String> = (0..6).map(|i| format!("two-{i}")).collect();
    for run_id in &runs {
        submit(&a, &digest, supplier_input(10, true), run_id);
    }
    // Each waits for an approval; each is decided through the other server.
    for run_id in &runs {
        b.wait_status(run_id, "waiting");
    }
    // Both servers see every approval waiting; each is notified once.
    receiver.wait_for("an approval notice per run", |d| {
        d.iter().filter(|x| x.answered == 200).count() >= runs.len()
    });
    let inbox = b.get("/api/approvals").expect(200);
    assert_eq!(inbox.as_array().unwrap().len(), runs.len());
    for approval in inbox.as_array().unwrap() {
        let path = format!(
            "/api/approvals/{}/{}",
            approval["run_id"].as_str().unwrap(),
            approval["seq"]
        );
        b.post(
            &path,
            &json!({"verdict": "approved", "details_sha256": approval["details_sha256"], "by": "ana"}),
        )
        .expect(200);
    }
    for run_id in &runs {
        a.wait_status(run_id, "completed");
    }
    assert_eq!(sb.received("supplier-orders.jsonl").len(), runs.len());
    // One approval notice per run, each sent once, though both servers saw
    // every approval.
    std::thread::sleep(Duration::from_millis(1_500));
    let got = receiver.deliveries();
    let mut ids: Vec<&str> = got
        .iter()
        .map(|d| d.header("Stephost-Delivery").unwrap())
        .collect();
    ids.sort();
    let sent = ids.len();
    ids.dedup();
    assert_eq!((ids.len(), sent), (runs.len(), runs.len()), "{got:#?}");
    assert!(
        got.iter()
            .all(|d| d.header("Stephost-Event") == Some("approval"))
    );
    assert_eq!(a.stop(), Some(0));
    assert_eq!(b.stop(), Some(0));
}

/// A request whose head is sent whole and whose body is not: `length` is
/// declared, `sent` bytes of it are sent. What the server answers, read
/// without sending the rest (at most 20 s: an answer that needs the rest
/// never comes).
fn answer_to_partial_body(
    addr: &str,
    path: &str,
    token: Option<&str>,
    length: usize,
    sent: usize,
) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Type: application/json\r\n\
         Content-Length: {length}\r\n\r\n"
    )
    .unwrap();
    stream.write_all(&vec![b' '; sent]).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut read = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                read.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&read);
                if text.contains("\r\n\r\n") && text.trim_end().ends_with('}') {
                    break;
                }
            }
            Err(e) => {
                assert!(
                    !read.is_empty(),
                    "no answer to POST {path} ({length} bytes declared, {sent} sent) \
                     without the rest of its body: {e}"
                );
                break;
            }
        }
    }
    String::from_utf8_lossy(&read).into_owned()
}

#[test]
fn a_read_token_is_refused_before_its_body_is_read_and_json_bodies_are_limited() {
    let sb = Sandbox::with_config(BIN, &config(""));
    let tokens = "ana operator ana-token-0123456789abcdef\nviewer read viewer-token-0123456789";
    let served = sb.serve(&[], &[("STEPHOST_API_TOKENS", tokens)]);
    let addr = served.addr();
    // A read token's 60 MiB POST is refused from its head: the answer comes
    // while 59.99 MiB of it are still unsent. So is one with no token.
    for path in [
        "/api/runs",
        "/api/modules",
        "/api/approvals/r/1",
        "/api/runs/r/replay",
    ] {
        let answer = answer_to_partial_body(
            &addr,
            path,
            Some("viewer-token-0123456789"),
            60 << 20,
            16 << 10,
        );
        assert!(answer.starts_with("HTTP/1.1 403"), "{path}: {answer}");
        assert!(answer.contains("\"forbidden\""), "{path}: {answer}");
        let answer = answer_to_partial_body(&addr, path, None, 60 << 20, 16 << 10);
        assert!(answer.starts_with("HTTP/1.1 401"), "{path}: {answer}");
    }
    // An operator's JSON body over json_body_bytes_max (1 MiB) is refused
    // as too large, also from its head; a module upload may be larger.
    let answer = answer_to_partial_body(
        &addr,
        "/api/runs",
        Some("ana-token-0123456789abcdef"),
        2 << 20,
        16 << 10,
    );
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("\"too_large\""), "{answer}");
    let ana = served.with_token("ana-token-0123456789abcdef");
    let not_a_module = ana.request("POST", "/api/modules", Some(&vec![b'x'; 2 << 20]));
    not_a_module.expect_error(400, "bad_input");
    // The server took no harm and still serves.
    assert_eq!(served.get("/healthz").status, 200);
    assert_eq!(served.stop(), Some(0));
}

#[test]
fn serve_stops_on_sigterm_while_half_sent_requests_are_open() {
    let sb = Sandbox::with_config(BIN, &config(""));
    let served = sb.serve(&[], &[]);
    let addr = served.addr();
    // 400 connections that sent a request line and one header, and no more.
    let open: Vec<TcpStream> = (0..400)
        .map(|_| {
            let mut stream = TcpStream::connect(&addr).unwrap();
            write!(stream, "GET /healthz HTTP/1.1\r\nHost: {addr}\r\n").unwrap();
            stream
        })
        .collect();
    assert_eq!(served.get("/healthz").status, 200, "served meanwhile");
    // Told to stop, it stops (after shutdown_grace_ms, 5 s by default,
    // dropping them) and drains its worker: exit 0.
    let asked = Instant::now();
    assert_eq!(served.stop_within(Duration::from_secs(20)), Some(0));
    eprintln!("stopped {:?} after SIGTERM", asked.elapsed());
    drop(open);
}

#[test]
fn a_half_sent_request_is_closed_after_the_header_timeout_and_connections_are_bounded() {
    let sb = Sandbox::with_config(BIN, &config(""));
    let served = sb.serve(
        &[
            "--header-read-timeout-ms",
            "1000",
            "--connections-max",
            "16",
        ],
        &[],
    );
    let addr = served.addr();
    // A request head never finished: the server closes the connection.
    let mut stream = TcpStream::connect(&addr).unwrap();
    write!(stream, "GET /healthz HTTP/1.1\r\nHost: {addr}\r\n").unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut buf = [0u8; 1024];
    match stream.read(&mut buf) {
        Ok(_) => {} // closed (0), or a 408 before closing
        Err(e) => assert!(
            !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "a half-sent request was kept open: {e}"
        ),
    }
    // 100 connections at once: at most 16 are taken in; the rest wait to
    // be accepted, and every one is served in its turn.
    let before = served.open_fds();
    let mut waiting: Vec<TcpStream> = (0..100)
        .map(|_| TcpStream::connect(&addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let taken = served.open_fds().saturating_sub(before);
    assert!(
        taken <= 16 + 2,
        "{taken} connections taken in at once; the bound is 16"
    );
    for stream in &mut waiting {
        write!(
            stream,
            "GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
    }
    for stream in &mut waiting {
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        // Answered, or closed after waiting past the header timeout.
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 200"),
            "{answer}"
        );
    }
    assert_eq!(served.get("/healthz").status, 200);
    assert_eq!(served.stop(), Some(0));
}

#[test]
fn readyz_is_a_cached_check_and_the_ledger_connections_stay_bounded() {
    let sb = Sandbox::with_config(BIN, &config(""));
    // A ledger of 200,000 runs, where counting them is work.
    sb.stephost(&["runs"]).expect_code(0);
    let filler: Vec<_> = (1..=200_000)
        .map(|i| {
            let run_id = format!("filler-{i}");
            let mut run = stephost_core::NewRun {
                run_id: &run_id,
                module_digest: "m",
                step: None,
                world: "w",
                input: "{}",
                now_ms: i,
                budget: Default::default(),
            }
            .record(None);
            run.status = stephost_core::RunStatus::Completed;
            run
        })
        .collect();
    sb.tamper().insert_runs(&filler).unwrap();
    let served = sb.serve(&[], &[]);
    assert_eq!(served.get("/readyz").status, 200);
    let before = served.open_fds();
    // 64 callers at once, four times each.
    let gate = std::sync::Barrier::new(64);
    std::thread::scope(|scope| {
        for _ in 0..64 {
            scope.spawn(|| {
                gate.wait();
                for _ in 0..4 {
                    assert_eq!(served.get("/readyz").status, 200);
                }
                assert_eq!(served.get("/api/summary").status, 200);
            });
        }
    });
    std::thread::sleep(Duration::from_millis(500));
    // Each ledger connection is a file or a socket or two; the handlers
    // keep ledger_stores_max (8) at most.
    let kept = served.open_fds().saturating_sub(before);
    assert!(
        kept <= 2 * 8,
        "{kept} more files open after the callers left"
    );
    let summary = served.get("/api/summary").expect(200);
    assert_eq!(summary["counts"]["completed"], 200_000);
    assert_eq!(served.stop(), Some(0));
}

#[test]
fn a_server_without_tokens_says_it_is_not_for_production() {
    let sb = Sandbox::with_config(BIN, &config(""));
    let served = sb.serve(&[], &[]);
    let log = served.log.lock().unwrap().clone();
    assert!(
        log.contains("WARNING: no API tokens") && log.contains("not for production"),
        "{log}"
    );
    let tokens = "ana operator ana-token-0123456789abcdef";
    let with = sb.serve(&[], &[("STEPHOST_API_TOKENS", tokens)]);
    assert!(!with.log.lock().unwrap().contains("WARNING"));
    assert_eq!(served.stop(), Some(0));
    assert_eq!(with.stop(), Some(0));
}

#[test]
fn a_webhooks_url_is_never_in_what_readers_see() {
    let receiver = WebhookReceiver::start(&[500; 1000]);
    let hooks = format!(
        "\n[[webhooks]]\nname = \"ops\"\nurl = \"{}?token=SECRET-IN-QUERY\"\nsecret_env = \"HOOK_SECRET\"\n\
         backoff_first_ms = 100\nbackoff_max_ms = 200\ntimeout_ms = 2000\n\
         \n[[webhooks]]\nname = \"down\"\nurl = \"http://127.0.0.1:9/SECRET-IN-PATH\"\n\
         secret_env = \"HOOK_SECRET\"\nbackoff_first_ms = 100\nbackoff_max_ms = 200\ntimeout_ms = 2000\n",
        receiver.url
    );
    let sb = Sandbox::with_config(BIN, &config(&hooks));
    let tokens = "ana operator ana-token-0123456789abcdef\nviewer read viewer-token-0123456789";
    let served = sb.serve(
        &[],
        &[("HOOK_SECRET", SECRET), ("STEPHOST_API_TOKENS", tokens)],
    );
    let ana = served.with_token("ana-token-0123456789abcdef");
    let viewer = served.with_token("viewer-token-0123456789");
    let digest = ana.upload(guests::PANICKER);
    ana.post(
        "/api/runs",
        &json!({"module_digest": digest, "input": null, "run_id": "f"}),
    )
    .expect(201);
    let view = viewer.wait_for("both webhooks tried and failed", "/api/runs/f", |v| {
        v["notices"]
            .as_array()
            .is_some_and(|n| n.len() == 2 && n.iter().all(|n| n["last_error"].is_string()))
    });
    for notice in view["notices"].as_array().unwrap() {
        let error = notice["last_error"].as_str().unwrap();
        let name = notice["webhook"].as_str().unwrap();
        assert!(error.contains(&format!("webhook {name:?}")), "{error}");
        assert!(
            !error.contains("SECRET") && !error.contains("http"),
            "{error}"
        );
    }
    let text = viewer.get("/api/runs/f").body;
    assert!(!text.contains("SECRET"), "{text}");
    // The receiver got each attempt signed (with a recent timestamp).
    let got = receiver.wait_for("an attempt", |d| !d.is_empty());
    assert!(signature_ok(&got[0]), "{:#?}", got[0]);
    assert_eq!(served.stop(), Some(0));
}

/// The seeds the contract test runs schemathesis with, one run each: fixed,
/// so that a run finds what the one before found. With
/// [`CONTRACT_EXAMPLES_MAX`] examples they find each mismatch the document
/// had with the server (a run id of "", base64 that was not, a whole number
/// written as 198492709.0, a budget raised on a run that has ended).
const CONTRACT_SEEDS: [u64; 2] = [7, 11];

/// Examples per operation and seed.
const CONTRACT_EXAMPLES_MAX: u32 = 20;

/// The API against its own /openapi.json: schemathesis (every check, an
/// operator token, fixed seeds and a bounded number of examples) against a
/// real server with a completed run and a waiting one. Needs schemathesis
/// in target/schemathesis (scripts/test.sh installs it) or at
/// STEPHOST_SCHEMATHESIS; fails, never skips, without it.
#[test]
fn the_api_matches_its_openapi_document() {
    let tool = std::env::var("STEPHOST_SCHEMATHESIS").unwrap_or_else(|_| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../target/schemathesis/bin/schemathesis"
        )
        .to_string()
    });
    assert!(
        std::path::Path::new(&tool).exists(),
        "schemathesis is not installed at {tool}: run scripts/test.sh (it installs it in a \
         venv under target/schemathesis), or set STEPHOST_SCHEMATHESIS"
    );
    let sb = Sandbox::with_config(BIN, &config(""));
    let token = "contract-token-0123456789abcdef";
    let served = sb.serve(
        &[],
        &[("STEPHOST_API_TOKENS", &format!("contract operator {token}"))],
    );
    let client = served.with_token(token);
    let digest = client.upload(guests::SUPPLIER_ORDER);
    for (run_id, approval) in [("contract-completed", false), ("contract-waiting", true)] {
        client
            .post(
                "/api/runs",
                &json!({"module_digest": digest, "input": supplier_input(10, approval), "run_id": run_id}),
            )
            .expect(201);
    }
    client.wait_status("contract-completed", "completed");
    client.wait_status("contract-waiting", "waiting");
    let contract = concat!(env!("CARGO_MANIFEST_DIR"), "/contract");
    let mut failed = Vec::new();
    for seed in CONTRACT_SEEDS {
        let started = Instant::now();
        let out = std::process::Command::new(&tool)
            .args([
                "--config-file",
                &format!("{contract}/schemathesis.toml"),
                "run",
            ])
            .arg(format!("{}/openapi.json", served.base))
            .args(["--checks", "all", "--workers", "1"])
            .args(["--max-examples", &CONTRACT_EXAMPLES_MAX.to_string()])
            .args(["--seed", &seed.to_string()])
            // Nothing carried from one seed's run to the next.
            .args(["--generation-database", "none"])
            .env("STEPHOST_CONTRACT_TOKEN", token)
            .env("STEPHOST_CONTRACT_HOOKS", format!("{contract}/hooks.py"))
            .env("NO_COLOR", "1")
            .current_dir(sb.dir.path())
            .output()
            .expect("run schemathesis");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        eprintln!("schemathesis, seed {seed}, took {:?}", started.elapsed());
        if !out.status.success() || !stdout.contains("passed") {
            failed.push(format!("seed {seed}:\n{stdout}\n{stderr}"));
        }
    }
    assert!(
        failed.is_empty(),
        "the API does not match /openapi.json:\n{}\nserver log:\n{}",
        failed.join("\n"),
        served.log.lock().unwrap()
    );
    assert!(!served.log.lock().unwrap().contains("panicked"));
    assert_eq!(served.stop(), Some(0));
}

#[test]
fn a_run_submitted_with_wait_is_answered_with_its_end_and_its_worker_needs_no_poll() {
    let sb = Sandbox::with_config(BIN, &config(""));
    // The server's worker looks for runs once an hour at most: only a
    // wake-up gets a submitted run to it.
    let served = sb.serve(&["--poll-ms", "3600000"], &[]);
    let digest = served.client().upload(guests::SUPPLIER_ORDER);
    let body = |input: Value, run_id: &str| json!({"module_digest": digest, "input": input, "run_id": run_id});
    // Two in turn: the second surely after the worker's first look.
    for run_id in ["w1", "w2"] {
        let run = served
            .post(
                "/api/runs?wait=60000",
                &body(supplier_input(10, false), run_id),
            )
            .expect(201);
        assert_eq!(run["status"], "completed", "{run:#}");
        let output: Value = serde_json::from_str(run["output"].as_str().unwrap()).unwrap();
        assert_eq!(output["ordered"], true, "{output:#}");
        assert_eq!(run["output"], sb.show(run_id)["run"]["output"]);
    }
    assert_eq!(sb.received("supplier-orders.jsonl").len(), 2);
    // A run that waits for a person is answered at once, waiting.
    let waiting = served
        .post(
            "/api/runs?wait=60000",
            &body(supplier_input(10, true), "w3"),
        )
        .expect(201);
    assert_eq!(waiting["status"], "waiting", "{waiting:#}");
    assert!(waiting["output"].is_null());
    // Without wait, the run as it was recorded.
    let pending = served
        .post("/api/runs", &body(supplier_input(10, false), "w4"))
        .expect(201);
    assert_eq!(pending["status"], "pending");
    served.wait_status("w4", "completed");
    served
        .post(
            "/api/runs?wait=soon",
            &body(supplier_input(10, false), "w5"),
        )
        .expect_error(400, "bad_input");
}
