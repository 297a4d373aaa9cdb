//! Bad input and hostile guests: each ends with a clear message, a stable
//! exit code, a recorded typed state, and a ledger that still works.

use serde_json::{Value, json};
use stephost_tests::{Backend, Ran, Sandbox, calls, golden, guests, test_backend};

const BIN: &str = env!("CARGO_BIN_EXE_stephost-crash");

const SMALL_LIMITS: &str = r#"
[limits]
fuel_max = 200_000_000
memory_bytes_max = 67_108_864
payload_bytes_max = 65_536

[effects.echo]
kind = "echo"
class = "read"
"#;

/// What bad input made stephost print, for the golden file
/// `tests/golden/bad-input/NAME.txt`: each command's arguments, exit code
/// and stderr, normalised (`stephost_tests::golden`).
struct Transcript<'a> {
    sb: &'a Sandbox,
    text: String,
}

impl<'a> Transcript<'a> {
    fn new(sb: &'a Sandbox) -> Self {
        Transcript {
            sb,
            text: String::new(),
        }
    }

    /// Adds `stephost ARGS` and what it printed on stderr.
    fn add(&mut self, args: &[&str], ran: &Ran) -> &mut Self {
        let args: Vec<String> = args
            .iter()
            .map(|a| match a.len() {
                0..=200 => format!("{a:?}"),
                n => format!("<{n} bytes>"),
            })
            .collect();
        let ended = match (ran.code, ran.signal) {
            (Some(code), _) => format!("exit {code}"),
            (None, signal) => format!("signal {signal:?}"),
        };
        // A line past 1,000 bytes (a huge run id echoed) is kept in part.
        let stderr: Vec<String> = ran
            .stderr
            .lines()
            .map(|line| match line.char_indices().nth(300) {
                Some((cut, _)) if line.len() > 1000 => {
                    format!("{}… ({} bytes in all)", &line[..cut], line.len())
                }
                _ => line.to_string(),
            })
            .collect();
        self.text.push_str(&format!(
            "$ stephost {}\n{ended}\n{}\n\n",
            args.join(" "),
            stderr.join("\n")
        ));
        self
    }

    /// Compares with the golden file `bad-input/NAME.txt`.
    #[track_caller]
    fn check(&self, name: &str) {
        golden::check(
            &format!("bad-input/{name}.txt"),
            &self.sb.normalize(&self.text, &[]),
        );
    }
}

/// The golden file of one command's bad input.
#[track_caller]
fn golden_stderr(sb: &Sandbox, name: &str, args: &[&str], ran: &Ran) {
    Transcript::new(sb).add(args, ran).check(name);
}

/// The ledger still answers and holds exactly the runs named.
#[track_caller]
fn ledger_holds(sb: &Sandbox, expected: &[(&str, &str)]) {
    let runs = sb.stephost(&["runs", "--json"]);
    runs.expect_code(0);
    let found: Vec<(String, String)> = runs
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["run_id"].as_str().unwrap().to_string(),
                r["status"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(found, expected);
}

#[test]
fn a_file_that_is_not_wasm_is_refused_and_no_run_is_created() {
    let sb = Sandbox::new(BIN);
    std::fs::write(sb.path("step.wasm"), "definitely not wasm").unwrap();
    let ran = sb.run("step.wasm", "{}", "r");
    ran.expect_code(2);
    assert!(
        ran.stderr.contains("not a WebAssembly module"),
        "{}",
        ran.stderr
    );
    golden_stderr(
        &sb,
        "not-wasm",
        &["run", "step.wasm", "--input", "{}", "--run-id", "r"],
        &ran,
    );
    ledger_holds(&sb, &[]);
}

#[test]
fn a_core_module_is_refused_with_how_to_make_a_component() {
    let sb = Sandbox::new(BIN);
    // The smallest core module: magic and version 1.
    std::fs::write(sb.path("core.wasm"), b"\0asm\x01\0\0\0").unwrap();
    let ran = sb.run("core.wasm", "{}", "r");
    ran.expect_code(2);
    assert!(
        ran.stderr.contains("core WebAssembly module"),
        "{}",
        ran.stderr
    );
    assert!(ran.stderr.contains("component"));
    golden_stderr(
        &sb,
        "core-module",
        &["run", "core.wasm", "--input", "{}", "--run-id", "r"],
        &ran,
    );
}

#[test]
fn a_truncated_component_is_refused_as_invalid() {
    let sb = Sandbox::new(BIN);
    let bytes = std::fs::read(guests::MULTI_WRITE).unwrap();
    std::fs::write(sb.path("cut.wasm"), &bytes[..bytes.len() / 2]).unwrap();
    let ran = sb.run("cut.wasm", "{}", "r");
    ran.expect_code(2);
    assert!(
        ran.stderr.contains("not a valid component"),
        "{}",
        ran.stderr
    );
    golden_stderr(
        &sb,
        "truncated-component",
        &["run", "cut.wasm", "--input", "{}", "--run-id", "r"],
        &ran,
    );
    ledger_holds(&sb, &[]);
}

#[test]
fn a_component_for_another_world_names_what_is_missing() {
    let sb = Sandbox::new(BIN);
    let ran = sb.run(guests::WRONG_WORLD, "{}", "r");
    ran.expect_code(2);
    assert!(ran.stderr.contains("another world"), "{}", ran.stderr);
    assert!(
        ran.stderr
            .contains("exports neither `run` nor `wasi:cli/run`"),
        "{}",
        ran.stderr
    );
    assert!(ran.stderr.contains("process"), "{}", ran.stderr);
    golden_stderr(
        &sb,
        "another-world",
        &["run", guests::WRONG_WORLD, "--input", "{}", "--run-id", "r"],
        &ran,
    );
    ledger_holds(&sb, &[]);
}

#[test]
fn input_that_is_not_json_is_refused_before_anything_runs() {
    let sb = Sandbox::new(BIN);
    let ran = sb.run(guests::MULTI_WRITE, "{count: 1", "r");
    ran.expect_code(2);
    assert!(
        ran.stderr.contains("input is not valid JSON"),
        "{}",
        ran.stderr
    );
    golden_stderr(
        &sb,
        "input-not-json",
        &[
            "run",
            guests::MULTI_WRITE,
            "--input",
            "{count: 1",
            "--run-id",
            "r",
        ],
        &ran,
    );
    ledger_holds(&sb, &[]);
    assert!(sb.received("orders.jsonl").is_empty());
}

#[test]
fn a_run_id_that_is_empty_huge_or_holds_control_characters_is_refused() {
    let sb = Sandbox::new(BIN);
    let huge = "x".repeat(4096);
    let mut transcript = Transcript::new(&sb);
    for id in ["", huge.as_str(), "order\u{1b}[2J1", "a/../b"] {
        for command in ["run", "submit"] {
            let args = [
                command,
                guests::MULTI_WRITE,
                "--input",
                "{\"count\":1}",
                "--run-id",
                id,
            ];
            let ran = sb.stephost(&args);
            ran.expect_code(2);
            assert!(
                ran.stderr.contains("run id"),
                "{command} {id:?}: {}",
                ran.stderr
            );
            assert!(!ran.stderr.contains('\u{1b}'), "{}", ran.stderr);
            transcript.add(&args, &ran);
        }
    }
    transcript.check("run-ids");
    ledger_holds(&sb, &[]);
    assert!(sb.received("orders.jsonl").is_empty());
}

#[test]
fn an_unknown_run_id_is_reported_for_every_command() {
    let sb = Sandbox::new(BIN);
    let mut transcript = Transcript::new(&sb);
    for args in [
        vec!["resume", "nope"],
        vec!["replay", "nope"],
        vec!["show", "nope"],
        vec!["export", "nope"],
    ] {
        let ran = sb.stephost(&args);
        ran.expect_code(2);
        assert!(
            ran.stderr.contains("no run nope"),
            "{args:?}: {}",
            ran.stderr
        );
        transcript.add(&args, &ran);
    }
    transcript.check("unknown-run");
}

#[test]
fn a_ledger_that_is_not_a_stephost_database_is_refused_and_left_alone() {
    let sb = Sandbox::new(BIN);
    // Another application's data where the ledger should be.
    let text = "name,qty\nwidget,3\n".repeat(500);
    match test_backend() {
        Backend::Sqlite => std::fs::write(sb.db(), &text).unwrap(),
        Backend::Postgres => {
            sb.sql("", "CREATE TABLE runs (name text, qty int)");
            sb.sql("", "INSERT INTO runs VALUES ('widget', 3)");
        }
    }
    let ran = sb.run(guests::MULTI_WRITE, r#"{"count":1}"#, "r");
    ran.expect_code(2);
    assert!(
        ran.stderr.contains("is not a stephost ledger"),
        "{}",
        ran.stderr
    );
    // What the database is not differs by backend: a golden file for each.
    let backend = match test_backend() {
        Backend::Sqlite => "sqlite",
        Backend::Postgres => "postgres",
    };
    golden_stderr(
        &sb,
        &format!("not-a-ledger.{backend}"),
        &[
            "run",
            guests::MULTI_WRITE,
            "--input",
            r#"{"count":1}"#,
            "--run-id",
            "r",
        ],
        &ran,
    );
    match test_backend() {
        Backend::Sqlite => assert_eq!(std::fs::read_to_string(sb.db()).unwrap(), text),
        Backend::Postgres => {
            assert_eq!(sb.query("SELECT name || ',' || qty FROM runs"), "widget,3");
            assert!(!sb.ledger_exists());
        }
    }
}

#[test]
fn a_guest_that_loops_forever_is_stopped_by_its_fuel_limit() {
    let sb = Sandbox::with_config(BIN, SMALL_LIMITS);
    let ran = sb.run(guests::LOOPER, "{}", "loop");
    ran.expect_code(3);
    assert!(ran.stderr.contains("fuel_exhausted"), "{}", ran.stderr);
    golden_stderr(
        &sb,
        "fuel",
        &["run", guests::LOOPER, "--input", "{}", "--run-id", "loop"],
        &ran,
    );
    let show = sb.show("loop");
    assert_eq!(show["run"]["status"], "failed");
    assert!(
        show["run"]["error"]
            .as_str()
            .unwrap()
            .starts_with("fuel_exhausted:")
    );
    // What the guest did before the limit is recorded.
    assert!(!calls(&show).is_empty());
    ledger_holds(&sb, &[("loop", "failed")]);
}

#[test]
fn a_guest_that_grows_memory_without_bound_is_stopped_by_its_memory_limit() {
    let sb = Sandbox::with_config(BIN, SMALL_LIMITS);
    let ran = sb.run(guests::MEMORY_BOMB, "{}", "bomb");
    ran.expect_code(3);
    golden_stderr(
        &sb,
        "memory",
        &[
            "run",
            guests::MEMORY_BOMB,
            "--input",
            "{}",
            "--run-id",
            "bomb",
        ],
        &ran,
    );
    let show = sb.show("bomb");
    assert_eq!(show["run"]["status"], "failed");
    let error = show["run"]["error"].as_str().unwrap();
    assert!(error.starts_with("memory_limit:"), "{error}");
    assert!(error.contains("67108864"), "{error}");
}

#[test]
fn a_guest_that_panics_ends_as_a_failed_run() {
    let sb = Sandbox::new(BIN);
    let ran = sb.run(guests::PANICKER, "{}", "p");
    ran.expect_code(3);
    assert!(
        ran.stderr.contains("step panicked on purpose"),
        "{}",
        ran.stderr
    );
    golden_stderr(
        &sb,
        "panic",
        &["run", guests::PANICKER, "--input", "{}", "--run-id", "p"],
        &ran,
    );
    let show = sb.show("p");
    assert_eq!(show["run"]["status"], "failed");
    assert!(show["run"]["error"].as_str().unwrap().starts_with("trap:"));
    // A failed run is final: resuming reports the same failure.
    let again = sb.stephost(&["resume", "p"]);
    again.expect_code(3);
}

#[test]
fn a_request_larger_than_the_payload_limit_is_refused_as_invalid_and_recorded_by_size() {
    let sb = Sandbox::with_config(BIN, SMALL_LIMITS);
    let ran = sb.run(
        guests::HUGE_PAYLOAD,
        &json!({"bytes": 200_000}).to_string(),
        "big",
    );
    ran.expect_code(3);
    assert!(ran.stderr.contains("payload_bytes_max"), "{}", ran.stderr);
    golden_stderr(
        &sb,
        "payload",
        &[
            "run",
            guests::HUGE_PAYLOAD,
            "--input",
            &json!({"bytes": 200_000}).to_string(),
            "--run-id",
            "big",
        ],
        &ran,
    );
    let show = sb.show("big");
    let call = &calls(&show)[0];
    assert_eq!(call["state"], "failed");
    let outcome: Value = serde_json::from_str(call["outcome"].as_str().unwrap()).unwrap();
    assert_eq!(outcome["err"]["kind"], "invalid");
    // The ledger keeps the size, not the 200 kB.
    assert!(call["request"].as_str().unwrap().len() < 100);
    // Within the limit the same guest succeeds.
    let ok = sb.run(
        guests::HUGE_PAYLOAD,
        &json!({"bytes": 1000}).to_string(),
        "small",
    );
    ok.expect_code(0);
    assert_eq!(ok.json()["received"], 1000);
}

#[test]
fn a_step_has_no_environment_files_or_sockets() {
    let sb = Sandbox::new(BIN);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let ran = sb
        .command(&[
            "run",
            guests::WASI_ONLY,
            "--input",
            &json!({"port": port}).to_string(),
        ])
        .env("SECRET_TOKEN", "hunter2")
        .output()
        .unwrap();
    assert_eq!(
        ran.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    let out: Value = serde_json::from_slice(&ran.stdout).unwrap();
    assert_eq!(out["env_count"], 0);
    assert!(
        out["fs_error"].is_string(),
        "the guest read the file system: {out}"
    );
    assert!(
        out["net_error"].is_string(),
        "the guest opened a socket: {out}"
    );
    assert!(
        listener.accept().is_err(),
        "a connection reached the listener"
    );
}

#[test]
fn usage_errors_exit_with_the_usage_code() {
    let sb = Sandbox::new(BIN);
    let mut transcript = Transcript::new(&sb);
    for args in [
        &["frobnicate"][..],
        &["run"],
        &["runs", "--status", "sleeping"],
    ] {
        let ran = sb.stephost(args);
        ran.expect_code(2);
        transcript.add(args, &ran);
    }
    transcript.check("usage");
    sb.stephost(&["--help"]).expect_code(0);
}

#[test]
fn a_configuration_with_an_unknown_field_is_refused_with_its_line() {
    let sb = Sandbox::with_config(BIN, "[effects.orders]\nkind = \"echo\"\nretries = 3\n");
    let ran = sb.run(guests::MULTI_WRITE, r#"{"count":1}"#, "r");
    ran.expect_code(2);
    assert!(ran.stderr.contains("line 3"), "{}", ran.stderr);
    golden_stderr(
        &sb,
        "config-unknown-field",
        &[
            "run",
            guests::MULTI_WRITE,
            "--input",
            r#"{"count":1}"#,
            "--run-id",
            "r",
        ],
        &ran,
    );
}

#[test]
fn a_redaction_a_replayed_step_could_not_read_is_refused_when_the_configuration_is_read() {
    let key = "a test chain key of enough bytes, 0123456789";
    for (pointers, named) in [
        ("request = [\"/messages\"]", "/messages"),
        ("response = [\"/content/*/type\"]", "/content/*/type"),
        ("[redact.\"input\"]\nresponse = [\"/x\"]", "input"),
    ] {
        let sb = Sandbox::with_config(
            BIN,
            &format!(
                "[models.support]\napi = \"openai-chat\"\nurl = \"http://127.0.0.1:1\"\n\
                 model = \"m\"\n[redact.\"models.support\"]\n{pointers}\n"
            ),
        );
        let ran = sb.stephost_with_env(
            "STEPHOST_CHAIN_KEY",
            key,
            &["run", guests::MULTI_WRITE, "--input", r#"{"count":1}"#],
        );
        ran.expect_code(2);
        assert!(ran.stderr.contains(named), "{named}: {}", ran.stderr);
    }
}

#[test]
fn an_effect_name_past_its_limit_ends_the_run_without_recording_it() {
    let sb = Sandbox::new(BIN);
    let name = "e".repeat(300);
    let ran = sb.run(
        guests::MULTI_WRITE,
        &json!({"count": 1, "effect": name}).to_string(),
        "long-name",
    );
    ran.expect_code(3);
    assert!(
        ran.stderr.contains("effect_name_bytes_max = 256"),
        "{}",
        ran.stderr
    );
    golden_stderr(
        &sb,
        "effect-name",
        &[
            "run",
            guests::MULTI_WRITE,
            "--input",
            &json!({"count": 1, "effect": name}).to_string(),
            "--run-id",
            "long-name",
        ],
        &ran,
    );
    let show = sb.show("long-name");
    assert!(
        calls(&show).iter().all(|c| c["function"] != name.as_str()),
        "the name was recorded"
    );
    assert!(
        show["run"]["error"].as_str().unwrap().starts_with("limit:"),
        "{show:#}"
    );
}

#[test]
fn a_run_past_its_recorded_bytes_budget_ends_with_the_limit_named() {
    let sb = Sandbox::with_config(
        BIN,
        "[limits]\nrecorded_bytes_max = 2000\n\n[effects.orders]\nkind = \"echo\"\n",
    );
    let ran = sb.run(guests::MULTI_WRITE, r#"{"count":50}"#, "big");
    ran.expect_code(3);
    assert!(
        ran.stderr.contains("recorded_bytes_max = 2000"),
        "{}",
        ran.stderr
    );
    assert!(
        ran.stderr.contains("[big] info: write 3 to orders done"),
        "{}",
        ran.stderr
    );
    // The golden file leaves out the step's progress lines: after which of
    // them the budget runs out varies with the digits of the random values
    // its calls record.
    let ran = Ran {
        stderr: ran
            .stderr
            .lines()
            .filter(|line| !line.starts_with("[big] "))
            .collect::<Vec<_>>()
            .join("\n"),
        stdout: ran.stdout.clone(),
        ..ran
    };
    golden_stderr(
        &sb,
        "recorded-bytes",
        &[
            "run",
            guests::MULTI_WRITE,
            "--input",
            r#"{"count":50}"#,
            "--run-id",
            "big",
        ],
        &ran,
    );
    // What was recorded stays within the budget and one payload.
    let recorded: usize = calls(&sb.show("big"))
        .iter()
        .map(|c| {
            c["request"].as_str().map_or(0, str::len) + c["outcome"].as_str().map_or(0, str::len)
        })
        .sum();
    assert!(recorded < 2000 + 1024, "{recorded} bytes recorded");
    assert!(calls(&sb.show("big")).len() < 50 * 3);
}

#[test]
fn a_guest_that_computes_past_its_wall_clock_budget_is_stopped_with_the_limit_named() {
    // Fuel enough for many minutes: the wall-clock budget stops it first.
    let sb = Sandbox::with_config(
        BIN,
        "[limits]\nwall_ms_max = 300\nfuel_max = 1000000000000000\n",
    );
    let ran = sb.run(guests::LOOPER, "{}", "spin");
    ran.expect_code(3);
    assert!(ran.stderr.contains("wall_ms_max = 300"), "{}", ran.stderr);
    golden_stderr(
        &sb,
        "wall-clock",
        &["run", guests::LOOPER, "--input", "{}", "--run-id", "spin"],
        &ran,
    );
    let show = sb.show("spin");
    assert_eq!(show["run"]["status"], "failed");
    assert!(
        show["run"]["error"].as_str().unwrap().starts_with("limit:"),
        "{show:#}"
    );
}
