//! Tools of MCP servers as journaled effects, against the example supplier
//! server (`examples/mcp-supplier-order/supplier_server.py`, the Python
//! `mcp` package from target/mcp-venv, which scripts/test.sh installs) over
//! stdio and streamable HTTP. The server counts: it appends each order it
//! places to a file.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use stephost_tests::{Sandbox, attempts_for, calls, guests, repo_root};

const BIN: &str = env!("CARGO_BIN_EXE_stephost-crash");
const INPUT: &str = r#"{"sku":"WIDGET-7","quantity":10}"#;
/// The step's calls: 1 supplier.tools, 2 supplier.stock, 3 supplier.order.
const ORDER_SEQ: u64 = 3;
const ORDERS: &str = "supplier-orders.jsonl";

fn python() -> PathBuf {
    let python = repo_root().join("target/mcp-venv/bin/python3");
    assert!(
        python.exists(),
        "the MCP test server needs the Python `mcp` package in target/mcp-venv: run \
         scripts/test.sh (it installs it) or `python3 -m venv target/mcp-venv && \
         target/mcp-venv/bin/pip install mcp==2.3.0`"
    );
    python
}

fn server_script() -> PathBuf {
    repo_root().join("examples/mcp-supplier-order/supplier_server.py")
}

/// The step's effects against `server` (a `[mcp.supplier]` body). The
/// order's class is left to the tool's annotations.
fn config(server: &str, idempotent: bool) -> String {
    format!(
        r#"
[mcp.supplier]
{server}
timeout_ms = 20_000

[effects."supplier.tools"]
kind = "mcp"
server = "supplier"
list_tools = true

[effects."supplier.stock"]
kind = "mcp"
server = "supplier"
tool = "check_stock"

[effects."supplier.order"]
kind = "mcp"
server = "supplier"
tool = "place_order"
idempotent = {idempotent}
retry = {{ attempts_max = 3, backoff_first_ms = 10, backoff_max_ms = 50 }}
"#
    )
}

/// The server as a program over stdio, run by `python` at `program`.
fn stdio(program: &std::path::Path) -> String {
    format!(
        "command = {:?}\nargs = [{:?}]\nenv = [\"SUPPLIER_MCP_FAULT\", \"SUPPLIER_MCP_PIDFILE\"]",
        program.display().to_string(),
        server_script().display().to_string()
    )
}

fn stdio_sandbox(idempotent: bool) -> Sandbox {
    Sandbox::with_config(BIN, &config(&stdio(&python()), idempotent))
}

/// The step run as `run_id` with the server's `fault` armed.
fn run_with_fault(sb: &Sandbox, fault: &str, run_id: &str) -> stephost_tests::Ran {
    sb.stephost_with_env(
        "SUPPLIER_MCP_FAULT",
        fault,
        &[
            "run",
            guests::MCP_SUPPLIER_ORDER,
            "--input",
            INPUT,
            "--run-id",
            run_id,
        ],
    )
}

/// The order's call in `show`.
fn order_call(show: &Value) -> &Value {
    &calls(show)[ORDER_SEQ as usize - 1]
}

fn orders(sb: &Sandbox) -> Vec<Value> {
    sb.received(ORDERS)
}

#[track_caller]
fn expect_ordered(ran: &stephost_tests::Ran) -> Value {
    stephost_tests::expect_ordered(ran, 7)
}

#[test]
fn a_step_lists_reads_and_writes_through_mcp_and_replay_starts_no_server() {
    let sb = stdio_sandbox(false);
    let ran = sb.run(guests::MCP_SUPPLIER_ORDER, INPUT, "m1");
    let out = expect_ordered(&ran);
    assert_eq!(
        out["tools"],
        serde_json::json!(["check_stock", "place_order"])
    );
    assert_eq!(out["server"]["name"], "supplier");
    assert_eq!(out["server"]["version"], "1.4.0");
    assert_eq!(out["server"]["protocol_version"], "2025-11-25");

    let show = sb.show("m1");
    let calls = calls(&show);
    // Classes: the list is a read; check_stock is annotated read-only; the
    // order has no class configured and no read-only hint: a write.
    let classes: Vec<&str> = calls.iter().map(|c| c["class"].as_str().unwrap()).collect();
    assert_eq!(classes, ["read", "read", "write"], "{show:#}");
    // The write carried its operation id and fence in _meta.
    let placed = orders(&sb);
    assert_eq!(placed.len(), 1, "{placed:#?}");
    assert_eq!(placed[0]["operation_id"], calls[2]["operation_id"]);
    assert_eq!(placed[0]["fence"], show["run"]["fence"]);
    // No trace context when the host reports no spans.
    assert!(placed[0]["traceparent"].is_null());
    // Which server answered is recorded with the attempt.
    let attempt = &attempts_for(&show, ORDER_SEQ)[0];
    assert!(
        attempt["detail"]
            .as_str()
            .is_some_and(|d| d.contains("MCP server supplier 1.4.0 (protocol 2025-11-25)")),
        "{attempt:#}"
    );

    // Replay with a configuration whose server cannot even be started:
    // every answer, the tool list included, comes from the ledger.
    sb.set_config(&config(
        &stdio(std::path::Path::new("/nonexistent/python3")),
        false,
    ));
    let replayed = sb.stephost(&["replay", "m1", "--json"]);
    replayed.expect_code(0);
    let report = replayed.json();
    assert_eq!(report["result"], "consistent", "{report:#}");
    // The same tool list and answers: the same output.
    let replayed_output: Value =
        serde_json::from_str(report["output"].as_str().expect("output")).expect("JSON");
    assert_eq!(replayed_output, out);
    assert_eq!(orders(&sb).len(), 1);
}

#[test]
fn a_tool_error_reaches_the_step_as_a_rejection() {
    let sb = stdio_sandbox(false);
    let ran = sb.run(
        guests::MCP_SUPPLIER_ORDER,
        r#"{"sku":"NOPE-1","quantity":1}"#,
        "m2",
    );
    assert_ne!(ran.code, Some(0), "{ran:?}");
    assert!(
        ran.stderr.contains("MCP tool check_stock failed")
            && ran.stderr.contains("unknown sku NOPE-1"),
        "{}",
        ran.stderr
    );
    let show = sb.show("m2");
    assert_eq!(calls(&show)[1]["state"], "failed", "{show:#}");
    assert!(orders(&sb).is_empty());
}

/// Crashes the run at `point` of the order, resumes it, and checks that the
/// server placed one order.
fn crash_and_resume(point: &str) {
    let sb = stdio_sandbox(true);
    let crashed = sb.run_crashing_at(point, guests::MCP_SUPPLIER_ORDER, INPUT, "m3");
    assert_eq!(crashed.signal, Some(libc::SIGABRT), "{point}: {crashed:?}");
    let resumed = sb.stephost(&["resume", "m3"]);
    let out = expect_ordered(&resumed);
    let placed = orders(&sb);
    assert_eq!(placed.len(), 1, "crash at {point}: {placed:#?}");
    assert_eq!(out["order"], placed[0], "crash at {point}");
    let show = sb.show("m3");
    assert_eq!(show["run"]["status"], "completed");
    assert_eq!(order_call(&show)["operation_id"], placed[0]["operation_id"]);
}

#[test]
fn a_crash_around_a_write_tool_call_resumes_with_one_order_at_the_server() {
    for point in ["after-started@3", "after-send@3", "after-outcome@3"] {
        crash_and_resume(point);
    }
}

#[test]
fn a_write_whose_answer_may_be_lost_is_parked_when_the_server_does_not_deduplicate() {
    let sb = stdio_sandbox(false);
    let crashed = sb.run_crashing_at("after-send@3", guests::MCP_SUPPLIER_ORDER, INPUT, "m4");
    assert_eq!(crashed.signal, Some(libc::SIGABRT), "{crashed:?}");
    let resumed = sb.stephost(&["resume", "m4"]);
    resumed.expect_code(5);
    let show = sb.show("m4");
    assert_eq!(show["run"]["status"], "parked", "{show:#}");
    assert_eq!(order_call(&show)["state"], "unknown");
    assert_eq!(orders(&sb).len(), 1, "never sent twice");
}

#[test]
fn a_server_killed_mid_call_is_started_again_and_its_lost_answer_handled_as_one() {
    // The server places the order and dies before answering. A server that
    // deduplicates is sent the call again (a new server process) and
    // answers with the first order.
    let sb = stdio_sandbox(true);
    let pids = sb.path("pids");
    let ran = sb.stephost_with_envs(
        &[
            ("SUPPLIER_MCP_FAULT", "die-after".as_ref()),
            ("SUPPLIER_MCP_PIDFILE", pids.as_os_str()),
        ],
        &[
            "run",
            guests::MCP_SUPPLIER_ORDER,
            "--input",
            INPUT,
            "--run-id",
            "m5",
        ],
    );
    let out = expect_ordered(&ran);
    let placed = orders(&sb);
    assert_eq!(placed.len(), 1, "{placed:#?}");
    assert_eq!(out["order"], placed[0]);
    let started = std::fs::read_to_string(&pids).unwrap();
    assert_eq!(
        started.lines().count(),
        2,
        "a second server process: {started}"
    );
    let show = sb.show("m5");
    let sends: Vec<&str> = attempts_for(&show, ORDER_SEQ)
        .iter()
        .map(|a| a["result"].as_str().unwrap())
        .collect();
    assert_eq!(sends, ["retryable", "ok"], "{show:#}");

    // One that does not deduplicate: the call is parked, never resent.
    let sb = stdio_sandbox(false);
    let ran = run_with_fault(&sb, "die-after", "m6");
    ran.expect_code(5);
    let show = sb.show("m6");
    assert_eq!(order_call(&show)["state"], "unknown", "{show:#}");
    assert_eq!(orders(&sb).len(), 1);
}

#[test]
fn a_json_rpc_error_is_a_refusal_and_a_timeout_leaves_a_write_in_doubt() {
    let sb = stdio_sandbox(false);
    let ran = run_with_fault(&sb, "rpc-error", "e1");
    assert_ne!(ran.code, Some(0), "{ran:?}");
    assert!(
        ran.stderr
            .contains("refused the call (-32001): the supplier takes no orders today"),
        "{}",
        ran.stderr
    );
    let show = sb.show("e1");
    assert_eq!(order_call(&show)["state"], "failed");
    assert!(orders(&sb).is_empty());

    // No answer within timeout_ms: the server may have acted, and does not
    // deduplicate: parked, not sent again.
    let config =
        config(&stdio(&python()), false).replace("timeout_ms = 20_000", "timeout_ms = 1_000");
    let sb = Sandbox::with_config(BIN, &config);
    let ran = run_with_fault(&sb, "slow", "e2");
    ran.expect_code(5);
    let show = sb.show("e2");
    assert_eq!(order_call(&show)["state"], "unknown", "{show:#}");
    let sends = attempts_for(&show, ORDER_SEQ);
    assert_eq!(sends.len(), 1, "{show:#}");
    assert!(
        sends[0]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("did not answer within 1000 ms")),
        "{show:#}"
    );
}

#[test]
fn a_server_program_at_a_relative_path_is_found_in_the_configuration_s_folder() {
    // `--config shop/stephost.toml`, a relative path from the sandbox; the
    // program is a script beside it that starts the server.
    let sb = Sandbox::with_config(BIN, "");
    let folder = sb.path("shop");
    std::fs::create_dir(&folder).unwrap();
    std::fs::write(
        folder.join("stephost.toml"),
        config("command = \"./server.sh\"", true),
    )
    .unwrap();
    let script = folder.join("server.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nexec {} {}\n",
            python().display(),
            server_script().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let ran = sb.stephost(&[
        "--config",
        "shop/stephost.toml",
        "run",
        guests::MCP_SUPPLIER_ORDER,
        "--input",
        INPUT,
    ]);
    expect_ordered(&ran);
    // The server runs in the configuration's folder.
    assert_eq!(sb.received(&format!("shop/{ORDERS}")).len(), 1);
}

/// Whether process `pid` is still running (not a zombie).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| !stat.split(") ").nth(1).is_some_and(|s| s.starts_with('Z')))
}

#[test]
fn a_worker_shares_one_server_among_its_runs_and_stops_it_when_it_exits() {
    let sb = stdio_sandbox(true);
    let pids = sb.path("pids");
    for (id, sku) in [("w1", "WIDGET-7"), ("w2", "GADGET-2")] {
        let input = format!(r#"{{"sku":"{sku}","quantity":50}}"#);
        sb.stephost(&[
            "submit",
            guests::MCP_SUPPLIER_ORDER,
            "--input",
            &input,
            "--run-id",
            id,
        ])
        .expect_code(0);
    }
    sb.stephost_with_env(
        "SUPPLIER_MCP_PIDFILE",
        &pids,
        &["worker", "--exit-when-idle", "--concurrency", "2"],
    )
    .expect_code(0);
    for id in ["w1", "w2"] {
        assert_eq!(sb.show(id)["run"]["status"], "completed");
    }
    assert_eq!(orders(&sb).len(), 2);
    let started = std::fs::read_to_string(&pids).unwrap();
    assert_eq!(
        started.lines().count(),
        1,
        "one server for both runs: {started}"
    );
    let pid: u32 = started.trim().parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!alive(pid), "the server outlived its worker");
}

/// The example server over streamable HTTP on a free port, as a child.
struct HttpServer {
    child: Child,
    url: String,
}

impl HttpServer {
    fn start(dir: &std::path::Path) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(python())
            .arg(server_script())
            .args(["http", &port.to_string()])
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the MCP server");
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "the MCP server did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        HttpServer {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_server_over_streamable_http_is_called_with_a_header_never_recorded() {
    let sb = Sandbox::with_config(BIN, "");
    let server = HttpServer::start(sb.dir.path());
    let token = "secret-token-5c1f9e";
    sb.set_config(&config(
        &format!(
            "url = {:?}\nheaders = {{ Authorization = \"Bearer ${{SUPPLIER_TOKEN}}\" }}",
            server.url
        ),
        true,
    ));
    let ran = sb.stephost_with_env(
        "SUPPLIER_TOKEN",
        token,
        &[
            "run",
            guests::MCP_SUPPLIER_ORDER,
            "--input",
            INPUT,
            "--run-id",
            "h1",
        ],
    );
    let out = expect_ordered(&ran);
    assert_eq!(out["server"]["name"], "supplier");
    assert_eq!(orders(&sb).len(), 1);
    // The header's secret is in no ledger file and no export.
    sb.assert_kept_out(token, "h1");
    // Resumed: answered from the ledger, nothing sent again.
    sb.stephost_with_env("SUPPLIER_TOKEN", token, &["resume", "h1"])
        .expect_code(0);
    assert_eq!(orders(&sb).len(), 1);
}

#[test]
fn a_tool_call_carries_its_span_s_traceparent_in_meta() {
    let collector = stephost_tests::otlp::Collector::start();
    let sb = stdio_sandbox(false);
    let ran = sb.stephost_with_env(
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        collector.endpoint(),
        &[
            "run",
            guests::MCP_SUPPLIER_ORDER,
            "--input",
            INPUT,
            "--run-id",
            "t1",
        ],
    );
    expect_ordered(&ran);
    let show = sb.show("t1");
    let traceparent = orders(&sb)[0]["traceparent"]
        .as_str()
        .expect("the order's traceparent")
        .to_string();
    let fields: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(fields[1], show["run"]["trace"]["trace_id"]);
    let span = collector
        .spans()
        .into_iter()
        .find(|s| s.span_id == fields[2])
        .expect("the call's span was reported");
    assert_eq!(span.attr("stephost.call.seq"), ORDER_SEQ as i64);
    assert_eq!(span.attr("stephost.call.class"), "write");
}
