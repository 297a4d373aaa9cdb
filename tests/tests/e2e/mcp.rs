//! Tools of MCP servers as journaled effects, against the example supplier
//! server (`examples/mcp-supplier-order/supplier_server.py`, the Python
//! `mcp` package from target/mcp-venv, which scripts/test.sh installs) over
//! stdio and streamable HTTP. The server counts: it appends each order it
//! places to a file.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use stephost_tests::{
    Sandbox, attempts_for, calls, guests, mcp_python as python, mcp_server_script as server_script,
    mcp_supplier_config as config,
};

const BIN: &str = env!("CARGO_BIN_EXE_stephost-crash");
const INPUT: &str = r#"{"sku":"WIDGET-7","quantity":10}"#;
/// The step's calls: 1 supplier.tools, 2 supplier.stock, 3 supplier.order.
const ORDER_SEQ: u64 = 3;
const ORDERS: &str = "supplier-orders.jsonl";

/// The step's effects with only the order sent to `server` (a
/// `[mcp.supplier]` body), a write by configuration: the tool list and the
/// stock are answered by the host, so the order is the first request the
/// server gets in a run.
fn order_only_config(server: &str) -> String {
    format!(
        r#"
[mcp.supplier]
{server}
timeout_ms = 20_000

[effects."supplier.tools"]
kind = "static"
class = "read"
response = '{{"server": {{"name": "supplier"}}, "tools": [{{"name": "check_stock"}}, {{"name": "place_order"}}]}}'

[effects."supplier.stock"]
kind = "static"
class = "read"
response = '{{"structuredContent": {{"on_hand": 3}}}}'

[effects."supplier.order"]
kind = "mcp"
server = "supplier"
tool = "place_order"
class = "write"
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

/// The message of a call that failed, as recorded.
#[track_caller]
fn error_message(call: &Value) -> String {
    let outcome: Value =
        serde_json::from_str(call["outcome"].as_str().expect("an outcome")).expect("JSON");
    outcome["err"]["message"]
        .as_str()
        .expect("an error")
        .to_string()
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
    // Classes: the list is a read; check_stock is annotated read-only (the
    // server is trusted with its annotations); the order has no class
    // configured and no read-only hint: a write.
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

    // No answer within timeout_ms (the server takes ten minutes): it may
    // have acted, and does not deduplicate: parked, not sent again. Starting
    // the server is not bounded by timeout_ms, so a slow start does not
    // count against it.
    let config =
        config(&stdio(&python()), false).replace("timeout_ms = 20_000", "timeout_ms = 2_000");
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
            .is_some_and(|d| d.contains("did not answer within 2000 ms (timeout_ms)")),
        "{show:#}"
    );
    assert!(orders(&sb).is_empty());
}

#[test]
fn starting_a_server_is_bounded_by_start_timeout_ms_not_by_timeout_ms() {
    // The server takes 4 s before it reads its first message (as one
    // fetched by npx or uvx may): longer than timeout_ms, well within the
    // default start_timeout_ms. Waited for, and the order placed.
    let slow_start = |extra: &str| {
        config(&stdio(&python()), false)
            .replace("timeout_ms = 20_000", &format!("timeout_ms = 2_000{extra}"))
    };
    let sb = Sandbox::with_config(BIN, &slow_start(""));
    let ran = run_with_fault(&sb, "slow-start", "s1");
    expect_ordered(&ran);
    assert_eq!(orders(&sb).len(), 1);

    // start_timeout_ms bounds it: a server not started within it is a call
    // that never left (each attempt starts the server again), so a failed
    // read, nothing in doubt, and the message names the setting.
    let sb = Sandbox::with_config(BIN, &slow_start("\nstart_timeout_ms = 1_000"));
    let ran = run_with_fault(&sb, "slow-start", "s2");
    assert_ne!(ran.code, Some(0), "{ran:?}");
    let show = sb.show("s2");
    let calls = calls(&show);
    assert_eq!(calls.len(), 1, "{show:#}");
    assert_eq!(calls[0]["state"], "failed", "{show:#}");
    assert!(
        error_message(&calls[0]).contains("did not start within 1000 ms (start_timeout_ms)"),
        "{show:#}"
    );
    assert!(orders(&sb).is_empty());
}

#[test]
fn a_server_answering_a_protocol_version_stephost_does_not_speak_is_left_before_a_write_leaves() {
    // The server answers initialize with 1999-01-01. The connection is
    // closed before anything is sent: the order is a failed call, not one in
    // doubt, and the message names the version and those stephost speaks.
    let sb = Sandbox::with_config(BIN, &order_only_config(&stdio(&python())));
    let ran = run_with_fault(&sb, "version-1999", "v1");
    assert_ne!(ran.code, Some(0), "{ran:?}");
    let show = sb.show("v1");
    let order = order_call(&show);
    assert_eq!(order["state"], "failed", "{show:#}");
    let message = error_message(order);
    assert!(
        message.contains(r#"answered initialize with protocol version "1999-01-01""#)
            && message.contains("it speaks 2024-11-05, 2025-03-26, 2025-06-18, 2025-11-25"),
        "{show:#}"
    );
    // Every attempt was turned away before the request left.
    let sends = attempts_for(&show, ORDER_SEQ);
    assert!(!sends.is_empty(), "{show:#}");
    assert!(sends.iter().all(|a| a["result"] == "retryable"), "{show:#}");
    assert!(orders(&sb).is_empty());
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

/// Whether process `pid` has ended with all its threads (its first thread
/// may be a zombie while the others still run, and hold its pipes open).
fn ended_whole(pid: u32) -> bool {
    let threads = std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count());
    !alive(pid) && threads <= 1
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether run `run_id` has ended (or is parked).
fn ended(sb: &Sandbox, run_id: &str) -> bool {
    let show = sb.stephost(&["show", run_id, "--json"]);
    show.code == Some(0)
        && ["completed", "failed", "parked", "diverged"]
            .contains(&show.json()["run"]["status"].as_str().unwrap_or(""))
}

/// `stephost worker` in the background, its stderr in `worker.log`;
/// stopped (SIGTERM) when dropped.
struct Worker<'a> {
    sb: &'a Sandbox,
    child: Child,
}

impl<'a> Worker<'a> {
    fn start(sb: &'a Sandbox, env: &[(&str, &std::ffi::OsStr)]) -> Self {
        let log = std::fs::File::create(sb.path("worker.log")).unwrap();
        let mut command = sb.command(&["worker", "--concurrency", "1"]);
        command
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log);
        Worker {
            sb,
            child: command.spawn().unwrap(),
        }
    }

    /// Submits the step ordering 10 of `sku` as `run_id` and waits for the
    /// run to end; its `show`.
    fn order(&self, run_id: &str, sku: &str) -> Value {
        let input = format!(r#"{{"sku":"{sku}","quantity":10}}"#);
        self.sb
            .stephost(&[
                "submit",
                guests::MCP_SUPPLIER_ORDER,
                "--input",
                &input,
                "--run-id",
                run_id,
            ])
            .expect_code(0);
        wait_until(run_id, || ended(self.sb, run_id));
        self.sb.show(run_id)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.sb.path("worker.log")).unwrap()
    }
}

impl Drop for Worker<'_> {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

#[test]
fn a_server_that_died_while_idle_is_started_again_before_a_write_is_sent() {
    // A worker's runs share the server. It is killed between two runs'
    // orders; the second order is sent once, to a new server, not parked
    // as in doubt: nothing had left. The server does not deduplicate.
    let sb = Sandbox::with_config(BIN, &order_only_config(&stdio(&python())));
    let pids = sb.path("pids");
    let worker = Worker::start(&sb, &[("SUPPLIER_MCP_PIDFILE", pids.as_os_str())]);
    assert_eq!(worker.order("i1", "WIDGET-7")["run"]["status"], "completed");
    let first: u32 = std::fs::read_to_string(&pids)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    Command::new("kill")
        .args(["-KILL", &first.to_string()])
        .status()
        .unwrap();
    wait_until("the server to die", || ended_whole(first));

    let show = worker.order("i2", "GADGET-2");
    assert_eq!(
        show["run"]["status"],
        "completed",
        "{}\n{show:#}",
        worker.log()
    );
    let sends: Vec<&str> = attempts_for(&show, ORDER_SEQ)
        .iter()
        .map(|a| a["result"].as_str().unwrap())
        .collect();
    assert_eq!(sends, ["ok"], "sent once, on a live connection: {show:#}");
    assert!(
        worker.log().contains("had exited; starting it again")
            || worker.log().contains("had closed; starting it again"),
        "{}",
        worker.log()
    );
    let placed = orders(&sb);
    assert_eq!(placed.len(), 2, "{placed:#?}");
    assert_eq!(placed[1]["operation_id"], order_call(&show)["operation_id"]);
    let started = std::fs::read_to_string(&pids).unwrap();
    assert_eq!(started.lines().count(), 2, "a second server: {started}");
}

#[test]
fn a_write_to_a_server_over_http_that_went_down_fails_as_never_sent_not_in_doubt() {
    // The server is stopped between two runs' orders: no connection can be
    // made for the second order, so it never left. Retried, then failed;
    // not parked as in doubt.
    let sb = Sandbox::with_config(BIN, "");
    let server = HttpServer::start(sb.dir.path());
    sb.set_config(&order_only_config(&format!("url = {:?}", server.url)));
    let worker = Worker::start(&sb, &[]);
    assert_eq!(worker.order("h2", "WIDGET-7")["run"]["status"], "completed");
    // Killed and waited for: its port refuses connections.
    drop(server);

    let show = worker.order("h3", "GADGET-2");
    assert_eq!(show["run"]["status"], "failed", "{show:#}");
    assert_eq!(order_call(&show)["state"], "failed", "{show:#}");
    let sends = attempts_for(&show, ORDER_SEQ);
    assert_eq!(
        sends.len(),
        3,
        "every attempt of its retry policy: {show:#}"
    );
    assert!(
        sends.iter().all(|a| a["detail"].as_str().is_some_and(
            |d| d.contains("cannot connect to MCP server supplier, so nothing was sent")
        )),
        "{show:#}"
    );
    assert_eq!(orders(&sb).len(), 1);
}

#[test]
fn a_read_only_hint_makes_a_read_only_from_a_server_trusted_with_annotations() {
    // The server annotates place_order read-only, wrongly. Its hints are not
    // trusted by default: every tool call is a write unless configured a
    // read, so the order is recorded started and carries its fence.
    let trusted = config(&stdio(&python()), false);
    let untrusted = trusted.replace("trust_annotations = true\n", "");
    assert_ne!(untrusted, trusted);
    let classes = |sb: &Sandbox, run_id: &str| -> Vec<String> {
        calls(&sb.show(run_id))
            .iter()
            .map(|c| c["class"].as_str().unwrap().to_string())
            .collect()
    };
    let sb = Sandbox::with_config(BIN, &untrusted);
    expect_ordered(&run_with_fault(&sb, "read-only-order", "a1"));
    assert_eq!(classes(&sb, "a1"), ["read", "write", "write"]);
    assert_eq!(orders(&sb)[0]["fence"], sb.show("a1")["run"]["fence"]);

    // A read by configuration.
    let configured = untrusted.replace(
        "tool = \"check_stock\"\n",
        "tool = \"check_stock\"\nclass = \"read\"\n",
    );
    let sb = Sandbox::with_config(BIN, &configured);
    expect_ordered(&run_with_fault(&sb, "read-only-order", "a2"));
    assert_eq!(classes(&sb, "a2"), ["read", "read", "write"]);

    // trust_annotations = true: the server's hints decide, wrong ones too.
    let sb = Sandbox::with_config(BIN, &trusted);
    expect_ordered(&run_with_fault(&sb, "read-only-order", "a3"));
    assert_eq!(classes(&sb, "a3"), ["read", "read", "read"]);
    assert!(orders(&sb)[0]["fence"].is_null());
}

#[test]
fn a_failed_tool_list_is_a_failed_read_retried_not_an_empty_list() {
    // The server's first tools/list answers an internal error: the read is
    // retried and the step gets the list.
    let sb = stdio_sandbox(false);
    let ran = run_with_fault(&sb, "list-error-once", "l1");
    let out = expect_ordered(&ran);
    assert_eq!(
        out["tools"],
        serde_json::json!(["check_stock", "place_order"])
    );
    let show = sb.show("l1");
    let sends: Vec<&str> = attempts_for(&show, 1)
        .iter()
        .map(|a| a["result"].as_str().unwrap())
        .collect();
    assert_eq!(sends, ["retryable", "ok"], "{show:#}");
}

#[test]
fn a_server_s_stderr_lines_are_cut_at_stderr_line_bytes_max() {
    // The server prints a line of 1 MiB, then a short one: the host logs
    // the first 4,096 bytes of the long one with a marker, and the next.
    let sb = stdio_sandbox(false);
    let ran = run_with_fault(&sb, "huge-stderr", "o1");
    expect_ordered(&ran);
    let logged: Vec<&str> = ran
        .stderr
        .lines()
        .filter_map(|l| l.strip_prefix("stephost mcp supplier: "))
        .collect();
    let long = logged
        .iter()
        .find(|l| l.starts_with("xxxx"))
        .unwrap_or_else(|| panic!("{logged:?}"));
    let (kept, marker) = long.split_at(4_096.min(long.len()));
    assert_eq!(kept, "x".repeat(4_096));
    assert_eq!(
        marker,
        " [line cut at 4096 bytes (stderr_line_bytes_max); the rest dropped]"
    );
    assert!(logged.contains(&"the supplier is up"), "{logged:?}");
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
