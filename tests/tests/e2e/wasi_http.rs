//! A step's own HTTP client over `wasi:http`, journaled: the Rust `wstd`
//! example step and a test guest against the demo supplier on 127.0.0.1.

use serde_json::{Value, json};
use stephost_tests::{Sandbox, attempts_for, calls, guests};
use supplier_receiver::{Fault, Receiver};

const BIN: &str = env!("CARGO_BIN_EXE_stephost-crash");
/// The example's calls: 1 GET /inventory, 2 POST /orders.
const ORDER_SEQ: u64 = 2;
const TOKEN: &str = "supplier-token-8d3a61";

/// The receiver's origin granted, with a credential injected from the
/// environment (`SUPPLIER_TOKEN`).
fn config(receiver: &Receiver, idempotent: bool, lookup: bool) -> String {
    let lookup = if lookup {
        format!("lookup = \"{}/orders/{{operation_id}}\"\n", receiver.url())
    } else {
        String::new()
    };
    format!(
        r#"
[http."{url}"]
headers = {{ Authorization = "Bearer ${{SUPPLIER_TOKEN}}" }}
idempotent = {idempotent}
{lookup}retry = {{ attempts_max = 4, backoff_first_ms = 10, backoff_max_ms = 50 }}
"#,
        url = receiver.url()
    )
}

fn input(receiver: &Receiver) -> String {
    json!({"sku": "WIDGET-7", "quantity": 10, "supplier": receiver.url()}).to_string()
}

fn run_order(sb: &Sandbox, receiver: &Receiver, run_id: &str) -> stephost_tests::Ran {
    sb.stephost_with_env(
        "SUPPLIER_TOKEN",
        TOKEN,
        &[
            "run",
            guests::HTTP_SUPPLIER_ORDER,
            "--input",
            &input(receiver),
            "--run-id",
            run_id,
        ],
    )
}

#[track_caller]
fn expect_ordered(ran: &stephost_tests::Ran) -> Value {
    stephost_tests::expect_ordered(ran, 7)
}

#[test]
fn a_step_s_own_http_client_orders_once_with_the_write_protocol_and_replays_offline() {
    let receiver = Receiver::start().unwrap();
    let sb = Sandbox::with_config(BIN, &config(&receiver, false, false));
    let out = expect_ordered(&run_order(&sb, &receiver, "h1"));
    assert_eq!(receiver.business_effects(), 1);

    let show = sb.show("h1");
    let calls = calls(&show);
    let kinds: Vec<(&str, &str)> = calls
        .iter()
        .map(|c| {
            (
                c["interface"].as_str().unwrap(),
                c["class"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            ("wasi:http/outgoing-handler", "read"),
            ("wasi:http/outgoing-handler", "write")
        ]
    );
    // The write carried its operation id and fence, and the injected
    // credential; the read carried neither key nor fence.
    let requests = receiver.requests();
    let get = requests.iter().find(|r| r.method == "GET").unwrap();
    assert_eq!(get.header("idempotency-key"), None);
    assert_eq!(
        get.header("authorization"),
        Some(&*format!("Bearer {TOKEN}"))
    );
    let post = requests.iter().find(|r| r.method == "POST").unwrap();
    assert_eq!(
        post.header("idempotency-key"),
        calls[1]["operation_id"].as_str()
    );
    assert_eq!(post.header("stephost-fence"), Some("1"));
    assert_eq!(
        post.header("authorization"),
        Some(&*format!("Bearer {TOKEN}"))
    );
    assert_eq!(out["receipt"]["operation_id"], calls[1]["operation_id"]);

    // The credential is in no ledger file and no export.
    sb.assert_kept_out(TOKEN, "h1");

    // Replay: no request, the same output, without the credential.
    let seen = receiver.requests().len();
    let replayed = sb.stephost(&["replay", "h1", "--json"]);
    replayed.expect_code(0);
    let report = replayed.json();
    assert_eq!(report["result"], "consistent", "{report:#}");
    let output: Value = serde_json::from_str(report["output"].as_str().unwrap()).unwrap();
    assert_eq!(output, out);
    assert_eq!(receiver.requests().len(), seen, "the replay sent a request");
}

#[test]
fn a_crash_around_the_write_resumes_with_one_order_at_the_receiver() {
    for point in ["after-started@2", "after-send@2", "after-outcome@2"] {
        let receiver = Receiver::start().unwrap();
        let sb = Sandbox::with_config(BIN, &config(&receiver, true, true));
        let crashed = sb.stephost_with_envs(
            &[
                ("SUPPLIER_TOKEN", TOKEN.as_ref()),
                ("STEPHOST_CRASH_AT", point.as_ref()),
            ],
            &[
                "run",
                guests::HTTP_SUPPLIER_ORDER,
                "--input",
                &input(&receiver),
                "--run-id",
                "c1",
            ],
        );
        assert_eq!(crashed.signal, Some(libc::SIGABRT), "{point}: {crashed:?}");
        let resumed = sb.stephost_with_env("SUPPLIER_TOKEN", TOKEN, &["resume", "c1"]);
        let out = expect_ordered(&resumed);
        assert_eq!(receiver.business_effects(), 1, "crash at {point}");
        let show = sb.show("c1");
        assert_eq!(show["run"]["status"], "completed");
        assert_eq!(
            out["receipt"]["operation_id"],
            calls(&show)[ORDER_SEQ as usize - 1]["operation_id"],
            "crash at {point}"
        );
    }
}

#[test]
fn a_lost_answer_is_found_by_lookup_and_the_step_reads_the_receipt() {
    // The receiver places the order and drops the connection; the origin
    // does not deduplicate, so the write is not sent again: the lookup
    // finds the receipt, which the step's client reads as a 200.
    let receiver = Receiver::start().unwrap();
    let sb = Sandbox::with_config(BIN, &config(&receiver, false, true));
    receiver.push_fault(Fault::CommitThenDrop);
    let out = expect_ordered(&run_order(&sb, &receiver, "l1"));
    assert_eq!(receiver.business_effects(), 1);
    let show = sb.show("l1");
    let kinds: Vec<&str> = attempts_for(&show, ORDER_SEQ)
        .iter()
        .map(|a| a["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["send", "lookup"], "{show:#}");
    assert_eq!(
        out["receipt"]["operation_id"],
        calls(&show)[1]["operation_id"]
    );

    // Without a lookup the call is parked, never resent.
    let receiver = Receiver::start().unwrap();
    let sb = Sandbox::with_config(BIN, &config(&receiver, false, false));
    receiver.push_fault(Fault::CommitThenDrop);
    run_order(&sb, &receiver, "l2").expect_code(5);
    assert_eq!(calls(&sb.show("l2"))[1]["state"], "unknown");
    assert_eq!(receiver.business_effects(), 1);
}

#[test]
fn a_resend_refused_after_a_lost_answer_is_settled_by_lookup_not_given_to_the_step() {
    // The receiver places the order and drops the connection; the origin
    // deduplicates, so the write is sent again, and that is answered 409
    // (as a receiver still busy with the first answers "in progress"). The
    // 409 does not say the order was not placed: the lookup finds it and
    // the step reads the receipt. (The fault-injection harness found the
    // 409 given to the step, the run failed, the order placed.)
    let receiver = Receiver::start().unwrap();
    let sb = Sandbox::with_config(BIN, &config(&receiver, true, true));
    receiver.push_fault(Fault::CommitThenDrop);
    receiver.push_fault(Fault::status(409));
    let out = expect_ordered(&run_order(&sb, &receiver, "r1"));
    assert_eq!(receiver.business_effects(), 1);
    let show = sb.show("r1");
    let kinds: Vec<&str> = attempts_for(&show, ORDER_SEQ)
        .iter()
        .map(|a| a["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["send", "send", "lookup"], "{show:#}");
    assert_eq!(
        out["receipt"]["operation_id"],
        calls(&show)[1]["operation_id"]
    );

    // After a crash with the write started, its resend answered 409 is no
    // proof either: with nothing found by the lookup, the call is parked.
    let receiver = Receiver::start().unwrap();
    let sb = Sandbox::with_config(BIN, &config(&receiver, true, true));
    receiver.push_fault(Fault::status(409));
    let crashed = sb.stephost_with_envs(
        &[
            ("SUPPLIER_TOKEN", TOKEN.as_ref()),
            ("STEPHOST_CRASH_AT", "after-started@2".as_ref()),
        ],
        &[
            "run",
            guests::HTTP_SUPPLIER_ORDER,
            "--input",
            &input(&receiver),
            "--run-id",
            "r3",
        ],
    );
    assert_eq!(crashed.signal, Some(libc::SIGABRT), "{crashed:?}");
    let resumed = sb.stephost_with_env("SUPPLIER_TOKEN", TOKEN, &["resume", "r3"]);
    resumed.expect_code(5);
    assert_eq!(calls(&sb.show("r3"))[1]["state"], "unknown");

    // A first answer of 409, with nothing sent before it, is the step's.
    let receiver = Receiver::start().unwrap();
    let sb = Sandbox::with_config(BIN, &config(&receiver, true, true));
    receiver.push_fault(Fault::status(409));
    let ran = run_order(&sb, &receiver, "r2");
    // Exit 3: the run failed, as its step decided.
    ran.expect_code(3);
    assert!(ran.stderr.contains("409"), "{}", ran.stderr);
    assert_eq!(receiver.business_effects(), 0);
}

/// Runs `args` to its end, failing the test (and killing the process) if it
/// has not ended within a bound far past anything the machine's speed could
/// explain: what it guards is a wait that never ends.
fn ends(sb: &Sandbox, envs: &[(&str, &str)], args: &[&str]) -> std::process::Output {
    let mut command = sb.command(args);
    command.envs(envs.iter().copied());
    command.stdout(std::process::Stdio::piped());
    command.stderr(std::process::Stdio::piped());
    let mut child = command.spawn().unwrap();
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > std::time::Duration::from_secs(300) {
            child.kill().unwrap();
            panic!("stephost {args:?} did not end");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn open_bodies_are_bounded_and_a_stalled_exchange_ends_with_its_run() {
    let receiver = Receiver::start().unwrap();
    let url = format!("{}/orders", receiver.url());
    let sb = Sandbox::with_config(
        BIN,
        "[limits]
http_bodies_open_max = 4
wall_ms_max = 3000
payload_bytes_max = 65536
",
    );
    let hold = |run_id: &str, bodies: usize, bytes: usize| {
        let input = json!({"hold": {"url": url, "bodies": bodies, "bytes": bytes}});
        ends(
            &sb,
            &[],
            &[
                "run",
                guests::HTTP_STEP,
                "--input",
                &input.to_string(),
                "--run-id",
                run_id,
            ],
        );
        sb.show(run_id)["run"].clone()
    };
    // Bodies no request was ever sent for, each written past what a channel
    // buffers: no write waits for a reader.
    let held = hold("within", 4, 48 * 1024);
    assert_eq!(held["status"], "completed", "{held:#}");
    assert_eq!(held["output"], r#"{"held":4}"#);
    // One more body than the limit: the run stops, named.
    let over = hold("over", 5, 10);
    assert_eq!(over["status"], "failed", "{over:#}");
    assert!(
        over["error"]
            .as_str()
            .unwrap()
            .contains("http_bodies_open_max = 4"),
        "{over:#}"
    );
    // A body written past payload_bytes_max: the step's write fails.
    let large = hold("large", 1, 100 * 1024);
    assert_eq!(large["status"], "failed", "{large:#}");
    assert_eq!(receiver.requests().len(), 0, "a held request was sent");

    // A step waiting for a response while its own body is open waits until
    // its run's wall time is up.
    let stall = json!({"stall": {"url": url}}).to_string();
    ends(
        &sb,
        &[],
        &[
            "run",
            guests::HTTP_STEP,
            "--input",
            &stall,
            "--run-id",
            "stall",
        ],
    );
    let stalled = sb.show("stall")["run"].clone();
    assert_eq!(stalled["status"], "failed", "{stalled:#}");
    assert!(
        stalled["error"].as_str().unwrap().contains("wall_ms_max"),
        "{stalled:#}"
    );
    // Under a worker that drains: the run is let go, for another worker.
    sb.set_config(
        "[limits]
wall_ms_max = 3600000
",
    );
    sb.stephost(&[
        "submit",
        guests::HTTP_STEP,
        "--input",
        &stall,
        "--run-id",
        "drained",
    ])
    .expect_code(0);
    let mut worker = sb.command(&["worker", "--concurrency", "1"]);
    worker.stdout(std::process::Stdio::null());
    worker.stderr(std::process::Stdio::null());
    let mut worker = worker.spawn().unwrap();
    let bound = std::time::Duration::from_secs(300);
    let started = std::time::Instant::now();
    while sb.show("drained")["run"]["owner"].is_null() {
        assert!(started.elapsed() < bound, "the run was not claimed");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let term = std::process::Command::new("kill")
        .args(["-TERM", &worker.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = worker.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > bound {
            worker.kill().unwrap();
            panic!("the worker did not drain");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(0), "the worker did not drain cleanly");
    let drained = sb.show("drained")["run"].clone();
    assert!(
        drained["owner"].is_null(),
        "the claim was not released: {drained:#}"
    );
    assert_ne!(drained["status"], "failed", "{drained:#}");
    assert_eq!(receiver.requests().len(), 0);
}

/// A receiver answering every request with a 201 and a large body,
/// counting what it got.
struct Large(std::sync::atomic::AtomicUsize);

impl receiver_http::Service for Large {
    fn serve(&self, _req: receiver_http::Request, conn: &mut receiver_http::Conn<'_>) -> bool {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let body = "x".repeat(200 * 1024);
        conn.reply(
            &receiver_http::Response {
                status: 201,
                headers: vec![("Content-Type".into(), "text/plain".into())],
                body: body.into_bytes(),
            },
            false,
        )
    }
}

#[test]
fn a_write_whose_answer_is_too_large_to_record_reaches_the_step_as_done() {
    let large = std::sync::Arc::new(Large(std::sync::atomic::AtomicUsize::new(0)));
    let server = receiver_http::Server::start(
        std::net::TcpListener::bind("127.0.0.1:0").unwrap(),
        "large",
        1 << 20,
        large.clone(),
    )
    .unwrap();
    let sb = Sandbox::with_config(
        BIN,
        &format!(
            "[limits]\npayload_bytes_max = 65536\n[http.\"{}\"]\nretry = {{ attempts_max = 1 }}\n",
            server.url()
        ),
    );
    let url = format!("{}/orders", server.url());
    let answers = http_step(
        &sb,
        json!([
            {"method": "POST", "url": url, "body": "{}"},
            {"method": "GET", "url": url},
        ]),
    );
    // The write was done: its status and headers, no body, and why.
    assert_eq!(answers[0]["status"], 201, "{answers:#?}");
    assert_eq!(answers[0]["body"], "", "{answers:#?}");
    let omitted = answers[0]["headers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h[0] == "x-stephost-body-omitted")
        .unwrap_or_else(|| panic!("no header saying the body was left out: {answers:#?}"));
    assert!(
        omitted[1].as_str().unwrap().starts_with("204800 sha256="),
        "{omitted}"
    );
    // A read too large stays an error to its client (reading again is
    // harmless).
    assert!(
        answers[1]["error"]
            .as_str()
            .unwrap()
            .contains("HttpResponseBodySize"),
        "{answers:#?}"
    );
    assert_eq!(large.0.load(std::sync::atomic::Ordering::SeqCst), 2);
    server.stop();
}

/// The test guest's answers to `requests`.
fn http_step(sb: &Sandbox, requests: Value) -> Vec<Value> {
    let ran = sb.stephost_with_env(
        "SUPPLIER_TOKEN",
        TOKEN,
        &[
            "run",
            guests::HTTP_STEP,
            "--input",
            &json!({ "requests": requests }).to_string(),
        ],
    );
    ran.expect_code(0);
    ran.json().as_array().unwrap().clone()
}

#[test]
fn an_origin_not_granted_is_denied_and_host_headers_are_the_host_s() {
    let receiver = Receiver::start().unwrap();
    let limits = "[limits]\npayload_bytes_max = 4096\n";
    let sb = Sandbox::with_config(BIN, &format!("{limits}{}", config(&receiver, true, false)));
    let denied = "http://127.0.0.1:1/inventory/X";
    let answers = http_step(
        &sb,
        json!([
            {"method": "GET", "url": denied},
            {"method": "POST", "url": format!("{}/orders", receiver.url()),
             "headers": [["idempotency-key", "mine"]], "body": "{}"},
            {"method": "GET", "url": format!("{}/inventory/X", receiver.url()),
             "headers": [["authorization", "Bearer forged"]]},
            {"method": "GET", "url": format!("{}/inventory/WIDGET-7", receiver.url())},
            {"method": "POST", "url": format!("{}/orders", receiver.url()),
             "body_bytes": 5000},
            {"method": "TRACE", "url": format!("{}/inventory/WIDGET-7", receiver.url())},
        ]),
    );
    let error = |i: usize| answers[i]["error"].as_str().unwrap_or_default().to_string();
    assert!(error(0).contains("HttpRequestDenied"), "{answers:#?}");
    // The host's headers cannot be set by the step: refused in its client,
    // before anything is sent.
    assert!(
        error(1).to_lowercase().contains("forbidden"),
        "{answers:#?}"
    );
    assert!(
        error(2).to_lowercase().contains("forbidden"),
        "{answers:#?}"
    );
    assert_eq!(answers[3]["status"], 200, "{answers:#?}");
    // The receiver's session cookie is never the step's to see, nor kept.
    assert!(
        !answers[3].to_string().to_lowercase().contains("set-cookie"),
        "{answers:#?}"
    );
    assert!(!sb.ledger_contains(supplier_receiver::SESSION_COOKIE));
    // A body larger than payload_bytes_max is refused before it is sent.
    assert!(error(4).contains("HttpRequestBodySize"), "{answers:#?}");
    // TRACE would echo the injected credential: refused unless listed.
    assert!(error(5).contains("HttpRequestDenied"), "{answers:#?}");
    assert_eq!(receiver.requests().len(), 1, "only the granted GET left");
    assert_eq!(receiver.business_effects(), 0);
    // The refusal is recorded, naming what to grant.
    let runs = sb.stephost(&["runs", "--json"]).json();
    let run_id = runs[0]["run_id"].as_str().unwrap().to_string();
    let show = sb.show(&run_id);
    let refused = &calls(&show)[0];
    assert_eq!(refused["interface"], "wasi:http/outgoing-handler");
    let outcome = refused["outcome"].as_str().unwrap();
    assert!(
        outcome.contains("\"denied\"")
            && outcome.contains("origin http://127.0.0.1:1 is not granted")
            && outcome.contains("grant it with [http."),
        "{refused:#}"
    );
}

#[test]
fn a_python_step_orders_with_its_own_http_client_like_the_rust_one() {
    let module = crate::languages::build(
        "examples/python-http-supplier-order/build.sh",
        "python_http_supplier_order.wasm",
    );
    let receiver = Receiver::start().unwrap();
    let sb = Sandbox::with_config(BIN, &config(&receiver, true, true));
    let python = run_order_with(&sb, &receiver, &module, "p1");
    let rust = run_order(&sb, &receiver, "r1");
    let (python, rust) = (expect_ordered(&python), expect_ordered(&rust));
    // Two runs, two orders, each sent once; the same answers but the
    // operation id.
    assert_eq!(receiver.business_effects(), 2);
    assert_eq!(python["on_hand"], rust["on_hand"]);
    let exchanges = |run: &str| -> Vec<(String, String)> {
        calls(&sb.show(run))
            .iter()
            .filter(|c| c["interface"] == "wasi:http/outgoing-handler")
            .map(|c| (c["class"].to_string(), c["request"].to_string()))
            .collect()
    };
    assert_eq!(exchanges("p1").len(), 2);
    assert_eq!(exchanges("p1")[0], exchanges("r1")[0], "the same GET");
    let seen = receiver.requests().len();
    let replayed = sb.stephost(&["replay", "p1"]);
    replayed.expect_code(0);
    assert!(
        replayed.stdout.contains("consistent"),
        "{}",
        replayed.stdout
    );
    assert_eq!(receiver.requests().len(), seen, "the replay sent a request");
}

fn run_order_with(
    sb: &Sandbox,
    receiver: &Receiver,
    module: &str,
    run_id: &str,
) -> stephost_tests::Ran {
    sb.stephost_with_env(
        "SUPPLIER_TOKEN",
        TOKEN,
        &[
            "run",
            module,
            "--input",
            &input(receiver),
            "--run-id",
            run_id,
        ],
    )
}
