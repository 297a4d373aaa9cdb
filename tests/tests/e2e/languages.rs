//! Steps in other languages and plain WASI programs, end to end: each guest
//! is built from source by its own `build.sh` (with the tools its README
//! names), run through `stephost run`, crashed at a write, resumed and
//! replayed, and compared with the Rust step for the same input and run id.
//!
//! The toolchains come from `scripts/guest-toolchains.sh` (the README's
//! test command runs it first). A guest whose toolchain is missing fails its
//! test with the build script's message, which names the tool and how to
//! install it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use serde_json::Value;
use stephost_tests::{SUPPLIER_CONFIG, Sandbox, calls, guests};

const BIN: &str = env!("CARGO_BIN_EXE_stephost-crash");
const INPUT: &str = r#"{"sku":"WIDGET-7","quantity":10}"#;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// Builds a guest with `script OUT` once per test process.
pub(crate) fn build(script: &str, name: &str) -> String {
    static BUILT: OnceLock<Mutex<std::collections::HashMap<String, String>>> = OnceLock::new();
    let built = BUILT.get_or_init(Mutex::default);
    let mut built = built.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(path) = built.get(name) {
        return path.clone();
    }
    let out = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("language-guests")
        .join(name);
    // `scripts/guest-toolchains.sh` installs the pinned tools here.
    let tools = root().join("target").join("guest-tools");
    let mut path = std::ffi::OsString::from(tools.join("bin"));
    path.push(":");
    path.push(tools.join("py").join("bin"));
    if let Some(rest) = std::env::var_os("PATH") {
        path.push(":");
        path.push(rest);
    }
    let ran = Command::new("bash")
        .arg(root().join(script))
        .arg(&out)
        .env("PATH", path)
        .output()
        .unwrap_or_else(|e| panic!("cannot start bash for {script}: {e}"));
    assert!(
        ran.status.success(),
        "building {name} with {script} failed ({}):\n{}\n{}",
        ran.status,
        String::from_utf8_lossy(&ran.stdout),
        String::from_utf8_lossy(&ran.stderr)
    );
    let path = out.display().to_string();
    built.insert(name.to_string(), path.clone());
    path
}

/// What the Rust step does for `input` under run id `run_id`: its exit
/// code, output or error, and its stephost calls.
struct Reference {
    code: Option<i32>,
    output: Value,
    calls: Vec<(String, String, Option<String>)>,
}

fn stephost_calls(show: &Value) -> Vec<(String, String, Option<String>)> {
    calls(show)
        .iter()
        .filter(|c| {
            c["interface"]
                .as_str()
                .is_some_and(|i| i.starts_with("stephost:step/"))
        })
        .map(|c| {
            let interface = c["interface"].as_str().unwrap_or_default().to_string();
            // Clock and random values differ between runs; the rest of an
            // effect's request must not, nor a write's operation id (from
            // its business key; a read's comes from its sequence number,
            // which a language runtime's start-up reads shift).
            let request = interface.ends_with("/effects").then(|| {
                let mut request: Value = c["request"]
                    .as_str()
                    .and_then(|r| serde_json::from_str(r).ok())
                    .unwrap_or_default();
                if let Some(fields) = request.as_object_mut() {
                    fields.remove("requested_at_ms");
                    fields.remove("request_nonce");
                }
                match c["class"].as_str() {
                    Some("write") => format!("{request} {}", c["operation_id"]),
                    _ => request.to_string(),
                }
            });
            (
                interface,
                c["function"].as_str().unwrap_or_default().to_string(),
                request,
            )
        })
        .collect()
}

fn reference(input: &str, run_id: &str) -> Reference {
    let sb = Sandbox::with_config(BIN, SUPPLIER_CONFIG);
    let ran = sb.run(guests::SUPPLIER_ORDER, input, run_id);
    let show = sb.show(run_id);
    Reference {
        code: ran.code,
        output: if ran.code == Some(0) {
            ran.json()
        } else {
            show["run"]["error"].clone()
        },
        calls: stephost_calls(&show),
    }
}

/// Runs the supplier step `module` (another language) like the Rust one:
/// a crash after its order is recorded as started, a resume that sends it
/// once, an offline replay; then a bad input.
fn behaves_like_the_rust_step(module: &str) {
    let rust = reference(INPUT, "order-1");
    assert_eq!(rust.code, Some(0));

    let sb = Sandbox::with_config(BIN, SUPPLIER_CONFIG);
    let crashed = sb.run_crashing_at("after-started", module, INPUT, "order-1");
    assert_eq!(
        crashed.signal,
        Some(libc::SIGABRT),
        "the run did not stop at its write: {crashed:?}"
    );
    assert!(sb.received("supplier-orders.jsonl").is_empty());
    let resumed = sb.stephost(&["resume", "order-1"]);
    resumed.expect_code(0);
    assert_eq!(
        resumed.json(),
        rust.output,
        "output differs from the Rust step's"
    );
    let orders = sb.received("supplier-orders.jsonl");
    assert_eq!(orders.len(), 1, "{orders:#?}");
    let show = sb.show("order-1");
    assert_eq!(
        stephost_calls(&show),
        rust.calls,
        "calls differ from the Rust step's"
    );
    // A runtime's start-up randomness (Python reseeds its `random`) is one
    // recorded call per read, not one per byte.
    let random_reads = calls(&show)
        .iter()
        .filter(|c| {
            c["interface"]
                .as_str()
                .is_some_and(|i| i.starts_with("wasi:random/"))
        })
        .count();
    assert!(
        random_reads <= 2,
        "{random_reads} WASI random reads recorded: {show:#}"
    );
    assert!(
        show["run"]["step"].as_str().is_some_and(|s| !s.is_empty()),
        "no declared step"
    );

    let replayed = sb.stephost(&["replay", "order-1"]);
    replayed.expect_code(0);
    assert!(
        replayed.stdout.contains("consistent"),
        "{}",
        replayed.stdout
    );

    // A bad input fails the same way, with no calls.
    let bad = r#"{"sku":"","quantity":1}"#;
    let rust_bad = reference(bad, "bad-1");
    let ran = sb.run(module, bad, "bad-1");
    assert_eq!(ran.code, rust_bad.code, "{ran:?}");
    assert_eq!(sb.show("bad-1")["run"]["error"], rust_bad.output);

    // Enough stock: nothing ordered.
    let enough = r#"{"sku":"WIDGET-7","quantity":2}"#;
    let rust_enough = reference(enough, "enough-1");
    let ran = sb.run(module, enough, "enough-1");
    ran.expect_code(0);
    assert_eq!(ran.json(), rust_enough.output);
    assert_eq!(sb.received("supplier-orders.jsonl").len(), 1);

    // A worker, whose instances come from a pool with fixed limits, runs
    // it the same way.
    let sb = Sandbox::with_config(BIN, SUPPLIER_CONFIG);
    sb.stephost(&["submit", module, "--input", INPUT, "--run-id", "order-1"])
        .expect_code(0);
    sb.stephost(&["worker", "--exit-when-idle"]).expect_code(0);
    let show = sb.show("order-1");
    assert_eq!(show["run"]["status"], "completed", "{show:#}");
    let output: Value =
        serde_json::from_str(show["run"]["output"].as_str().expect("output")).expect("JSON");
    assert_eq!(output, rust.output);
    assert_eq!(sb.received("supplier-orders.jsonl").len(), 1);
}

#[test]
fn a_python_step_behaves_like_the_rust_step() {
    let module = build(
        "examples/python-supplier-order/build.sh",
        "python_supplier_order.wasm",
    );
    behaves_like_the_rust_step(&module);
}

#[test]
fn a_javascript_step_behaves_like_the_rust_step() {
    let module = build(
        "examples/js-supplier-order/build.sh",
        "js_supplier_order.wasm",
    );
    behaves_like_the_rust_step(&module);
}

#[test]
fn a_c_step_behaves_like_the_rust_step() {
    // A core module: the host adapts it to a component in-process.
    let module = build(
        "examples/c-supplier-order/build.sh",
        "c_supplier_order.wasm",
    );
    behaves_like_the_rust_step(&module);
}

/// The refund agent of `examples/agent-refund`, in Rust and in Python
/// (`examples/python-agent-refund`), with the example's own configuration
/// pointed at the scripted model server and the demo receiver, as its
/// `run.sh` does: each refunds the order once after three model turns,
/// replays offline, and both make the same effect calls.
#[test]
fn the_refund_agent_example_refunds_once_alike_in_rust_and_python() {
    let python = build(
        "examples/python-agent-refund/build.sh",
        "python_agent_refund.wasm",
    );
    let key = [("OPENAI_API_KEY", std::ffi::OsStr::new("sk-scripted"))];
    let input = r#"{"message": "Hi, I'd like a refund for order A-1001: the blender arrived broken. Thanks, Sam"}"#;
    let mut made = Vec::new();
    for module in [guests::AGENT_REFUND, python.as_str()] {
        let model = model_server::ModelServer::start_with(model_server::Config::default()).unwrap();
        let receiver = supplier_receiver::Receiver::start().unwrap();
        let config = std::fs::read_to_string(root().join("examples/agent-refund/stephost.toml"))
            .unwrap()
            .replace("http://127.0.0.1:8081", &model.url())
            .replace("http://127.0.0.1:8080", &receiver.url());
        let sb = Sandbox::with_config(BIN, &config);
        let ran = sb.stephost_with_envs(
            &key,
            &["run", module, "--input", input, "--run-id", "agent"],
        );
        ran.expect_code(0);
        let out = ran.json();
        assert_eq!(out["refunded_cents"], 4999, "{module}: {out}");
        assert_eq!(out["turns"], 3, "{module}: {out}");
        assert_eq!(
            out["refunds"].as_array().map(Vec::len),
            Some(1),
            "{module}: {out}"
        );
        assert!(
            out["summary"]
                .as_str()
                .unwrap_or_default()
                .contains("A-1001"),
            "{module}: {out}"
        );
        assert_eq!(model.report()["requests_total"], 3, "{module}");
        // Offline: no model, no receiver, no key.
        drop(model);
        drop(receiver);
        sb.stephost(&["replay", "agent"]).expect_code(0);
        made.push(stephost_calls(&sb.show("agent")));
    }
    assert_eq!(
        made[0], made[1],
        "the Rust and Python agents made other calls"
    );
}

/// Checks a WASI command run: stdin in, stdout out, exit status kept,
/// clock recorded and replayed.
fn command_runs(module: &str, exact_exit: i32) {
    let sb = Sandbox::new(BIN);
    let ran = sb.run(module, r#""hello""#, "cmd-1");
    ran.expect_code(0);
    let out = ran.json();
    assert_eq!(
        out["input"].as_str().or(out["echo"].as_str()),
        Some("hello"),
        "{out}"
    );
    let show = sb.show("cmd-1");
    assert_eq!(show["run"]["world"], "wasi:cli/command@0.2");
    assert_eq!(show["run"]["exit_code"], 0);
    assert!(
        calls(&show)
            .iter()
            .any(|c| c["interface"] == "wasi:clocks/wall-clock"),
        "the clock read was not recorded: {show:#}"
    );
    // Replay feeds the recorded clock back: the same output, offline.
    let replayed = sb.stephost(&["replay", "cmd-1", "--json"]);
    replayed.expect_code(0);
    let verdict = replayed.json();
    assert_eq!(verdict["result"], "consistent");
    let replayed_output: Value =
        serde_json::from_str(verdict["output"].as_str().expect("output")).expect("JSON");
    assert_eq!(replayed_output, out);

    // A JSON document that is not a string reaches stdin as its text.
    let ran = sb.run(module, r#"{"a":[1,2]}"#, "cmd-2");
    ran.expect_code(0);
    let out = ran.json();
    assert_eq!(
        out["input"].as_str().or(out["echo"].as_str()),
        Some(r#"{"a":[1,2]}"#)
    );

    // A non-zero exit fails the step and keeps the status.
    let failed = sb.run(module, r#""exit=7""#, "cmd-3");
    failed.expect_code(3);
    let show = sb.show("cmd-3");
    assert_eq!(show["run"]["status"], "failed");
    assert_eq!(show["run"]["exit_code"], exact_exit);
    assert_eq!(
        show["run"]["error"],
        format!("step_error: the program exited with code {exact_exit}")
    );
}

#[test]
fn a_wasi_command_component_is_a_step() {
    // Rust's std reports only success or failure through wasi:cli/exit.
    command_runs(guests::COMMAND, 1);
}

#[test]
fn a_wasi_preview1_program_is_a_step_and_keeps_its_exit_code() {
    let module = build("tests/guests/c-command/build.sh", "c_command.wasm");
    command_runs(&module, 7);
    // A worker runs a submitted command program the same way.
    let sb = Sandbox::new(BIN);
    sb.stephost(&[
        "submit",
        &module,
        "--input",
        r#""exit=5""#,
        "--run-id",
        "w-1",
    ])
    .expect_code(0);
    sb.stephost(&["worker", "--exit-when-idle"]).expect_code(0);
    let show = sb.show("w-1");
    assert_eq!(show["run"]["status"], "failed");
    assert_eq!(show["run"]["exit_code"], 5);
    // Its waits are durable sleeps: a short one slept and recorded, an
    // hour-long one waiting out of memory.
    let sb = Sandbox::new(BIN);
    sb.run(&module, r#""sleep=300""#, "nap").expect_code(0);
    let naps: Vec<Value> = calls(&sb.show("nap"))
        .iter()
        .filter(|c| c["function"] == "poll_oneoff")
        .cloned()
        .collect();
    assert_eq!(naps.len(), 1, "{naps:#?}");
    assert_eq!(naps[0]["request"], r#"{"ms":300}"#);
    assert_eq!(naps[0]["state"], "succeeded");
    sb.stephost(&["replay", "nap"]).expect_code(0);
    let long = sb.run(&module, r#""sleep=3600000""#, "hour");
    long.expect_code(7);
    assert_eq!(sb.show("hour")["run"]["status"], "waiting");
    // Its randomness is recorded too: one call for its 8 bytes (not one
    // per byte), replayed into the same nonce.
    let sb = Sandbox::new(BIN);
    let ran = sb.run(&module, r#""x""#, "r-1");
    ran.expect_code(0);
    let show = sb.show("r-1");
    let random: Vec<&Value> = calls(&show)
        .iter()
        .filter(|c| c["interface"] == "wasi:random/random")
        .collect();
    assert_eq!(random.len(), 1, "{show:#}");
    assert_eq!(random[0]["request"], "8");
    let nonce = ran.json()["nonce"].clone();
    let replayed = sb.stephost(&["replay", "r-1", "--json"]).json();
    let replayed_output: Value =
        serde_json::from_str(replayed["output"].as_str().expect("output")).expect("JSON");
    assert_eq!(replayed_output["nonce"], nonce);
}

#[test]
fn a_hostile_poll_oneoff_count_is_a_fault_not_a_host_abort() {
    let module = build("tests/guests/c-command/build.sh", "c_command.wasm");
    let sb = Sandbox::new(BIN);
    // Under an address-space limit, as workers often run: an allocation
    // sized by the guest's count would abort the host.
    let mut limited = std::process::Command::new("sh");
    let args = sb.command(&["run", &module, "--input", r#""poll=huge""#, "--run-id", "p"]);
    limited
        .arg("-c")
        .arg("ulimit -v 8000000 && exec \"$0\" \"$@\"")
        .arg(args.get_program())
        .args(args.get_args())
        .current_dir(args.get_current_dir().expect("the sandbox"));
    for (name, value) in args.get_envs() {
        match value {
            Some(value) => limited.env(name, value),
            None => limited.env_remove(name),
        };
    }
    let out = limited.output().expect("start stephost");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let output: Value = serde_json::from_slice(&out.stdout).expect("JSON output");
    // EFAULT: the subscriptions do not fit in the guest's memory.
    assert_eq!(output["poll_errno"], 21, "{output}");
}

#[test]
fn a_command_printing_text_gets_a_json_string_output() {
    let sb = Sandbox::new(BIN);
    let ran = sb.run(guests::COMMAND, r#""text""#, "t-1");
    ran.expect_code(0);
    let out = ran.json();
    assert!(
        out.as_str()
            .is_some_and(|s| s.starts_with("plain text at ")),
        "{out}"
    );
}

#[test]
fn a_damaged_compiled_cache_file_is_compiled_over() {
    let sb = Sandbox::with_config(BIN, SUPPLIER_CONFIG);
    let cache = sb.path("cache");
    let run = |id: &str| {
        let mut cmd = sb.command(&[
            "run",
            guests::SUPPLIER_ORDER,
            "--input",
            INPUT,
            "--run-id",
            id,
        ]);
        cmd.env("STEPHOST_CACHE_DIR", &cache);
        cmd.output().expect("start stephost")
    };
    assert!(run("c-1").status.success());
    // The compiled file, beside its MAC and the folder's key.
    let files: Vec<PathBuf> = std::fs::read_dir(&cache)
        .expect("the cache folder was made")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "cwasm"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    std::fs::write(&files[0], b"not a compiled component").expect("damage the file");
    let again = run("c-2");
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert!(
        std::fs::metadata(&files[0]).expect("file").len() > 1000,
        "the damaged file was not replaced"
    );
}
