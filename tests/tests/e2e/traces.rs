//! OpenTelemetry traces, exported by OTLP/HTTP to a collector on 127.0.0.1
//! that decodes the protobuf: the supplier story crashed and resumed is one
//! trace; a wait for a person or a timer is a span; receivers get the
//! call's `traceparent`; a caller's trace is continued from `submit` and the
//! API; with no endpoint nothing is sent. (A model call's GenAI span is
//! tested with the other model calls, in `models.rs`.)

use std::ffi::OsStr;

use serde_json::{Value, json};
use stephost_tests::otlp::{Collector, Span};
use stephost_tests::{Ran, Sandbox, calls, guests};
use supplier_receiver::Receiver;

const BIN: &str = env!("CARGO_BIN_EXE_stephost-crash");
const INPUT: &str = r#"{"sku":"WIDGET-7","quantity":10}"#;
/// The supplier step's calls: 1 inventory.read, 2 clock, 3 random, 4 supplier.order.
const ORDER_SEQ: i64 = 4;
const CALLER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// The supplier configuration against `receiver`, which deduplicates.
fn supplier(receiver: &Receiver) -> Sandbox {
    Sandbox::with_config(
        BIN,
        &stephost_tests::supplier_http_config(&receiver.url(), false),
    )
}

/// `stephost ARGS` exporting to `collector`, with `more` in its environment.
fn traced(sb: &Sandbox, collector: &Collector, more: &[(&str, &str)], args: &[&str]) -> Ran {
    let mut vars: Vec<(&str, &OsStr)> =
        vec![("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint().as_ref())];
    vars.extend(more.iter().map(|(k, v)| (*k, v.as_ref())));
    sb.stephost_with_envs(&vars, args)
}

fn trace_id_of(sb: &Sandbox, run_id: &str) -> String {
    sb.show(run_id)["run"]["trace"]["trace_id"]
        .as_str()
        .expect("the run keeps its trace")
        .to_string()
}

fn executions(spans: &[Span]) -> Vec<&Span> {
    let mut found: Vec<&Span> = spans
        .iter()
        .filter(|s| !s.attr("stephost.execution.end").is_null())
        .collect();
    found.sort_by_key(|s| s.attr("stephost.execution.fence").as_i64());
    found
}

fn children<'a>(spans: &'a [Span], parent: &Span) -> Vec<&'a Span> {
    let mut found: Vec<&Span> = spans
        .iter()
        .filter(|s| s.parent_span_id == parent.span_id)
        .collect();
    found.sort_by_key(|s| s.attr("stephost.call.seq").as_i64());
    found
}

fn the_run_span(spans: &[Span]) -> &Span {
    let runs: Vec<&Span> = spans
        .iter()
        .filter(|s| !s.attr("stephost.run.status").is_null())
        .collect();
    assert_eq!(runs.len(), 1, "one run span: {spans:#?}");
    runs[0]
}

/// The trace id and span id of a `traceparent`.
fn ids_of(traceparent: &str) -> (String, String) {
    let fields: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(fields.len(), 4, "{traceparent}");
    (fields[1].to_string(), fields[2].to_string())
}

#[test]
fn the_supplier_story_crashed_and_resumed_is_one_trace_of_both_executions() {
    let receiver = Receiver::start().unwrap();
    let collector = Collector::start();
    let sb = supplier(&receiver);
    let crash = [("STEPHOST_CRASH_AT", "after-send@4")];
    let args = [
        "run",
        guests::SUPPLIER_ORDER,
        "--input",
        INPUT,
        "--run-id",
        "t1",
    ];
    let crashed = traced(&sb, &collector, &crash, &args);
    assert_eq!(crashed.signal, Some(libc::SIGABRT), "{crashed:?}");
    traced(&sb, &collector, &[], &["resume", "t1"]).expect_code(0);
    assert_eq!(receiver.business_effects(), 1);

    let trace = trace_id_of(&sb, "t1");
    let spans = collector.spans();
    assert!(
        spans.iter().all(|s| s.trace_id == trace),
        "every span in the run's trace {trace}: {spans:#?}"
    );
    assert!(spans.iter().all(|s| s.service == "stephost"));
    let run = the_run_span(&spans);
    assert_eq!(run.parent_span_id, "", "the run's span is the trace's root");
    assert_eq!(run.attr("stephost.run.id"), "t1");
    assert_eq!(run.attr("stephost.run.status"), "completed");
    assert_eq!(run.status_code, 1);

    // One span per execution, both children of the run's: the one that died
    // (rebuilt by the resume, which took the run over) and the one that
    // completed it.
    let execs = executions(&spans);
    assert_eq!(execs.len(), 2, "{spans:#?}");
    let (first, second) = (execs[0], execs[1]);
    assert_eq!(first.attr("stephost.execution.fence"), 1);
    assert_eq!(first.attr("stephost.execution.end"), "lost_claim");
    assert_eq!(first.status_code, 2);
    assert_eq!(second.attr("stephost.execution.fence"), 2);
    assert_eq!(second.attr("stephost.execution.end"), "completed");
    for exec in [first, second] {
        assert_eq!(exec.parent_span_id, run.span_id);
        assert_eq!(exec.attr("stephost.run.id"), "t1");
        assert!(exec.attr("stephost.module.digest").as_str().unwrap().len() == 64);
        assert!(exec.attr("stephost.worker").is_string());
    }

    // The first execution's calls, as it recorded them; the second's, the
    // read replayed and the order settled live. The clock and random
    // readings (#2, #3) are counted on the execution, not a span each.
    let show = sb.show("t1");
    let recorded = calls(&show);
    let seqs = |spans: &[&Span]| -> Vec<i64> {
        spans
            .iter()
            .map(|s| s.attr("stephost.call.seq").as_i64().unwrap())
            .collect()
    };
    let before = children(&spans, first);
    assert_eq!(seqs(&before), [1, ORDER_SEQ], "{before:#?}");
    let after = children(&spans, second);
    assert_eq!(seqs(&after), [1, ORDER_SEQ], "{after:#?}");
    assert_eq!(second.attr("stephost.execution.calls_replayed"), 3);
    assert_eq!(second.attr("stephost.execution.calls_live"), 1);
    for span in &after {
        let call = &recorded[span.attr("stephost.call.seq").as_u64().unwrap() as usize - 1];
        assert_eq!(span.attr("stephost.call.class"), &call["class"]);
        assert_eq!(span.attr("stephost.call.function"), &call["function"]);
        assert_eq!(span.attr("stephost.call.state"), "succeeded");
        assert!(span.start_ns <= span.end_ns);
    }
    let replayed: Vec<bool> = after
        .iter()
        .map(|s| s.attr("stephost.call.replayed").as_bool().unwrap())
        .collect();
    assert_eq!(replayed, [true, false]);
    let order = after[1];
    assert_eq!(
        order.attr("stephost.call.operation_id"),
        &recorded[ORDER_SEQ as usize - 1]["operation_id"]
    );
    assert_eq!(order.kind, 3, "a write is a client span");
    assert_eq!(after[0].kind, 3, "a read is a client span");
    assert!(
        order
            .events
            .iter()
            .any(|(name, attrs)| name == "attempt" && attrs["stephost.attempt.result"] == "ok"),
        "the order's attempts are its events: {order:#?}"
    );

    // Each order request carried the traceparent of the span of the call
    // that sent it: the run's trace, a span the host reported.
    let posts: Vec<_> = receiver
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST")
        .collect();
    assert_eq!(
        posts.len(),
        2,
        "sent, then sent again to a deduplicating receiver"
    );
    for (post, sender) in posts.iter().zip([before[1], order]) {
        let (trace_id, span_id) = ids_of(post.header("traceparent").expect("a traceparent"));
        assert_eq!(trace_id, trace);
        assert_eq!(span_id, sender.span_id);
    }
    // Not part of what was recorded: a replay (no spans) is consistent.
    assert!(
        !recorded[3]["request"]
            .as_str()
            .unwrap()
            .contains("traceparent")
    );
    let replay = sb
        .stephost(&["replay", "t1", "--json"])
        .expect_code(0)
        .json();
    assert_eq!(replay["result"], "consistent");
}

#[test]
fn a_wait_for_a_person_is_a_span_between_the_executions() {
    let collector = Collector::start();
    let sb = Sandbox::with_config(BIN, stephost_tests::APPROVAL_CONFIG);
    let input = json!({"sku": "WIDGET-7", "quantity": 10, "ttl_seconds": 3600}).to_string();
    let args = [
        "run",
        guests::APPROVAL_STEP,
        "--input",
        &input,
        "--run-id",
        "w1",
    ];
    traced(&sb, &collector, &[], &args).expect_code(7);
    let listed = sb.stephost(&["approvals", "--json"]).expect_code(0).json();
    let details = listed[0]["details_sha256"].as_str().unwrap()[..12].to_string();
    std::thread::sleep(std::time::Duration::from_millis(50));
    sb.stephost(&["approve", "w1", "1", "--details", &details, "--by", "alice"])
        .expect_code(0);
    traced(&sb, &collector, &[], &["resume", "w1"]).expect_code(0);

    let spans = collector.spans();
    let trace = trace_id_of(&sb, "w1");
    assert!(spans.iter().all(|s| s.trace_id == trace));
    let run = the_run_span(&spans);
    let execs = executions(&spans);
    let ends: Vec<&Value> = execs
        .iter()
        .map(|s| s.attr("stephost.execution.end"))
        .collect();
    assert_eq!(ends, ["waiting", "completed"]);
    let waits: Vec<&Span> = spans
        .iter()
        .filter(|s| !s.attr("stephost.wait.for").is_null())
        .collect();
    assert_eq!(waits.len(), 1, "{spans:#?}");
    let wait = waits[0];
    assert_eq!(wait.name, "wait approval");
    assert_eq!(wait.attr("stephost.wait.for"), "approval");
    assert_eq!(wait.parent_span_id, run.span_id);
    // From the approval's call (in the first execution, in ms) to the
    // second execution's start.
    assert!(wait.end_ns - wait.start_ns >= 50_000_000, "{wait:#?}");
    assert!(wait.start_ns + 1_000_000 >= execs[0].start_ns);
    assert!(wait.start_ns <= execs[0].end_ns);
    assert!(wait.end_ns <= execs[1].start_ns + 1_000_000);
    assert_eq!(wait.attr("stephost.wait.decided_by"), "alice");
    // The approval itself, a suspend call the person decided: the second
    // execution replayed it.
    let approval = children(&spans, execs[1])
        .into_iter()
        .find(|s| s.attr("stephost.call.class") == "suspend")
        .expect("the approval's span");
    assert_eq!(approval.attr("stephost.call.replayed"), true);
    assert_eq!(approval.attr("stephost.call.resolved_by"), "alice");
}

#[test]
fn a_wait_for_a_timer_is_a_span_until_a_worker_wakes_the_run() {
    let collector = Collector::start();
    let sb = Sandbox::new(BIN);
    let args = [
        "run",
        guests::SLEEPER,
        "--input",
        r#"{"ms": 2500}"#,
        "--run-id",
        "s1",
    ];
    traced(&sb, &collector, &[], &args).expect_code(7);
    // A worker that exits when idle finds the run due once the timer is.
    std::thread::sleep(std::time::Duration::from_millis(2600));
    traced(&sb, &collector, &[], &["worker", "--exit-when-idle"]).expect_code(0);
    assert_eq!(sb.show("s1")["run"]["status"], "completed");
    let spans = collector.spans();
    let wait = spans
        .iter()
        .find(|s| s.name == "wait timer")
        .unwrap_or_else(|| panic!("a timer's wait: {spans:#?}"));
    assert_eq!(wait.attr("stephost.wait.status"), "waiting");
    assert!(wait.end_ns - wait.start_ns >= 2_000_000_000, "{wait:#?}");
    let execs = executions(&spans);
    assert_eq!(execs.len(), 2);
    assert_eq!(execs[0].attr("stephost.execution.end"), "waiting");
    assert!(execs[0].attr("stephost.run.wake_at").is_string());
    assert_eq!(wait.parent_span_id, the_run_span(&spans).span_id);
}

#[test]
fn with_no_endpoint_nothing_is_sent_and_receivers_get_no_traceparent() {
    let receiver = Receiver::start().unwrap();
    let collector = Collector::start();
    let sb = supplier(&receiver);
    sb.run(guests::SUPPLIER_ORDER, INPUT, "n1").expect_code(0);
    assert_eq!(collector.requests(), 0);
    let post = receiver.last_order_request().unwrap();
    assert_eq!(post.header("traceparent"), None);
    // The run has a trace all the same, for a worker that exports later.
    assert_eq!(trace_id_of(&sb, "n1").len(), 32);

    // A setting this build cannot honour is refused, named.
    let grpc = traced(
        &sb,
        &collector,
        &[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")],
        &["run", guests::SUPPLIER_ORDER, "--input", INPUT],
    );
    grpc.expect_code(2);
    assert!(grpc.stderr.contains("http/protobuf"), "{}", grpc.stderr);
    // Switched off by the standard variable, with an endpoint set.
    traced(
        &sb,
        &collector,
        &[("OTEL_SDK_DISABLED", "true")],
        &[
            "run",
            guests::SUPPLIER_ORDER,
            "--input",
            INPUT,
            "--run-id",
            "n2",
        ],
    )
    .expect_code(0);
    assert_eq!(collector.requests(), 0);
}

#[test]
fn a_collector_that_cannot_be_reached_is_said_and_the_run_goes_on() {
    let receiver = Receiver::start().unwrap();
    let sb = supplier(&receiver);
    let ran = sb.stephost_with_env(
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "http://127.0.0.1:1",
        &[
            "run",
            guests::SUPPLIER_ORDER,
            "--input",
            INPUT,
            "--run-id",
            "u1",
        ],
    );
    ran.expect_code(0);
    assert_eq!(receiver.business_effects(), 1);
    assert!(
        ran.stderr
            .contains("exporting spans to http://127.0.0.1:1/v1/traces failed"),
        "{}",
        ran.stderr
    );
}

/// A listener that keeps the head of every request it gets and answers
/// each with `status` (and `location`, if any).
struct Listener {
    status: u16,
    location: Option<String>,
    heads: std::sync::Mutex<Vec<Vec<(String, String)>>>,
}

impl receiver_http::Service for Listener {
    fn serve(&self, req: receiver_http::Request, conn: &mut receiver_http::Conn<'_>) -> bool {
        self.heads.lock().unwrap().push(req.headers.clone());
        let mut answer = receiver_http::Response::empty(self.status);
        if let Some(location) = &self.location {
            answer = answer.with_header("location", location.clone());
        }
        conn.reply(&answer, req.keep_alive())
    }
}

fn listen(
    status: u16,
    location: Option<String>,
) -> (receiver_http::Server, std::sync::Arc<Listener>) {
    let listener = std::sync::Arc::new(Listener {
        status,
        location,
        heads: Default::default(),
    });
    let server = receiver_http::Server::start(
        std::net::TcpListener::bind("127.0.0.1:0").unwrap(),
        "listener",
        64 << 20,
        listener.clone(),
    )
    .unwrap();
    (server, listener)
}

#[test]
fn a_collector_s_redirect_is_a_failed_export_and_its_headers_go_nowhere_else() {
    // Another listener on this machine, and a collector that redirects
    // exports to it (307 keeps the method and the body).
    let (elsewhere, went_elsewhere) = listen(200, None);
    let (collector, redirecting) = listen(307, Some(format!("{}/v1/traces", elsewhere.url())));
    let receiver = Receiver::start().unwrap();
    let sb = supplier(&receiver);
    let key = "collector-key-0123456789";
    let ran = sb.stephost_with_envs(
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url().as_ref()),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                format!("x-collector-key={key}").as_ref(),
            ),
        ],
        &[
            "run",
            guests::SUPPLIER_ORDER,
            "--input",
            INPUT,
            "--run-id",
            "r1",
        ],
    );
    ran.expect_code(0);
    assert_eq!(receiver.business_effects(), 1);
    // The collector was asked, with its key.
    let asked = redirecting.heads.lock().unwrap().clone();
    assert!(!asked.is_empty(), "the collector got no export");
    assert!(
        asked[0]
            .iter()
            .any(|(n, v)| n == "x-collector-key" && v == key),
        "{asked:#?}"
    );
    // Its redirect was not followed: the other listener got nothing, so
    // neither the spans nor the key.
    let got = went_elsewhere.heads.lock().unwrap().clone();
    assert!(got.is_empty(), "the redirect was followed: {got:#?}");
    assert!(
        ran.stderr.contains("the collector answered 307"),
        "{}",
        ran.stderr
    );
    drop((collector, elsewhere));
}

#[test]
fn a_caller_s_traceparent_given_to_submit_is_continued_by_a_worker() {
    let receiver = Receiver::start().unwrap();
    let collector = Collector::start();
    let sb = supplier(&receiver);
    let submit = |traceparent: &str, run_id: &str| {
        sb.stephost(&[
            "submit",
            guests::SUPPLIER_ORDER,
            "--input",
            INPUT,
            "--run-id",
            run_id,
            "--traceparent",
            traceparent,
            "--tracestate",
            "vendor=1",
        ])
    };
    let bad = submit("00-zz-00f067aa0ba902b7-01", "c0");
    bad.expect_code(2);
    assert!(bad.stderr.contains("traceparent"), "{}", bad.stderr);
    submit(CALLER, "c1").expect_code(0);
    assert_eq!(trace_id_of(&sb, "c1"), CALLER_TRACE);
    let worker = traced(
        &sb,
        &collector,
        &[("STEPHOST_LOG_FORMAT", "json")],
        &["worker", "--exit-when-idle"],
    );
    worker.expect_code(0);

    let spans = collector.spans();
    assert!(!spans.is_empty());
    assert!(spans.iter().all(|s| s.trace_id == CALLER_TRACE));
    let run = the_run_span(&spans);
    assert_eq!(
        run.parent_span_id, CALLER_SPAN,
        "the run's span is the caller's child"
    );
    // The time from the submission to the worker's claim.
    assert!(spans.iter().any(|s| s.name == "wait worker"), "{spans:#?}");
    let post = receiver.last_order_request().unwrap();
    let (trace_id, _) = ids_of(post.header("traceparent").unwrap());
    assert_eq!(trace_id, CALLER_TRACE);
    assert_eq!(post.header("tracestate"), Some("vendor=1"));
    // The step's log lines and the worker's line of its end name the trace.
    let lines: Vec<Value> = worker
        .stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect();
    let step_lines: Vec<&Value> = lines.iter().filter(|l| l["source"] == "step").collect();
    assert!(!step_lines.is_empty(), "{}", worker.stderr);
    assert!(step_lines.iter().all(|l| l["trace_id"] == CALLER_TRACE));
    let ended = lines
        .iter()
        .find(|l| l["source"] == "worker" && l["message"] == "run c1 completed")
        .unwrap_or_else(|| panic!("the worker's line of the run's end: {}", worker.stderr));
    assert_eq!(ended["trace_id"], CALLER_TRACE);
}

#[test]
fn the_api_continues_the_trace_of_a_submission_s_traceparent_header() {
    let receiver = Receiver::start().unwrap();
    let collector = Collector::start();
    let sb = supplier(&receiver);
    let served = sb.serve(
        &[],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint())],
    );
    let digest = served.client().upload(guests::SUPPLIER_ORDER);
    let body = json!({"module_digest": digest, "input": {"sku": "WIDGET-7", "quantity": 10},
                      "run_id": "a1"});
    let json_body = serde_json::to_vec(&body).unwrap();
    let bad = served.client().request_with(
        "POST",
        "/api/runs",
        Some(&json_body),
        &[
            ("Content-Type", "application/json"),
            ("traceparent", "nonsense"),
        ],
    );
    bad.expect_error(400, "bad_input");
    let created = served
        .client()
        .request_with(
            "POST",
            "/api/runs?wait=20000",
            Some(&json_body),
            &[
                ("Content-Type", "application/json"),
                ("traceparent", CALLER),
            ],
        )
        .expect(201);
    assert_eq!(created["trace"]["trace_id"], CALLER_TRACE);
    assert_eq!(created["trace"]["parent_span_id"], CALLER_SPAN);
    assert_eq!(created["status"], "completed", "{created}");
    served.stop();
    let spans = collector.spans();
    assert!(!spans.is_empty());
    assert!(spans.iter().all(|s| s.trace_id == CALLER_TRACE));
    assert_eq!(the_run_span(&spans).parent_span_id, CALLER_SPAN);
}

#[test]
fn a_step_s_own_http_client_sends_its_call_s_traceparent() {
    let receiver = Receiver::start().unwrap();
    let collector = Collector::start();
    let sb = Sandbox::with_config(BIN, &format!("[http.\"{}\"]\n", receiver.url()));
    let input = json!({"sku": "WIDGET-7", "quantity": 10, "supplier": receiver.url()});
    let args = [
        "run",
        guests::HTTP_SUPPLIER_ORDER,
        "--input",
        &input.to_string(),
        "--run-id",
        "h1",
    ];
    traced(&sb, &collector, &[], &args).expect_code(0);
    let spans = collector.spans();
    for request in receiver.requests() {
        let (trace_id, span_id) = ids_of(request.header("traceparent").expect("a traceparent"));
        assert_eq!(trace_id, trace_id_of(&sb, "h1"));
        let span = spans
            .iter()
            .find(|s| s.span_id == span_id)
            .expect("the request's span was reported");
        assert_eq!(
            span.attr("stephost.call.interface"),
            "wasi:http/outgoing-handler"
        );
    }
}
