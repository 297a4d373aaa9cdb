//! Harness for the end-to-end tests: each test gets a sandbox folder with its
//! own ledger, configuration and receiver file, and drives the real binary
//! as a child process.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use stephost_ledger_postgres::throwaway::TestServer;

pub mod golden;
pub mod model_stub;
pub mod otlp;
pub mod server;
pub mod sim;

/// The test guests and examples, built from source by `build.rs`.
pub mod guests {
    pub const SUPPLIER_ORDER: &str = env!("SUPPLIER_ORDER");
    pub const MCP_SUPPLIER_ORDER: &str = env!("MCP_SUPPLIER_ORDER");
    pub const HTTP_SUPPLIER_ORDER: &str = env!("HTTP_SUPPLIER_ORDER");
    pub const HTTP_STEP: &str = env!("GUEST_HTTP_STEP");
    pub const MULTI_WRITE: &str = env!("GUEST_MULTI_WRITE");
    pub const DIVERGENT: &str = env!("GUEST_DIVERGENT");
    pub const LOOPER: &str = env!("GUEST_LOOPER");
    pub const MEMORY_BOMB: &str = env!("GUEST_MEMORY_BOMB");
    pub const PANICKER: &str = env!("GUEST_PANICKER");
    pub const HUGE_PAYLOAD: &str = env!("GUEST_HUGE_PAYLOAD");
    pub const WRONG_WORLD: &str = env!("GUEST_WRONG_WORLD");
    pub const WASI_ONLY: &str = env!("GUEST_WASI_ONLY");
    pub const LLM_STEP: &str = env!("GUEST_LLM_STEP");
    pub const CHAT_STEP: &str = env!("GUEST_CHAT_STEP");
    pub const APPROVAL_STEP: &str = env!("GUEST_APPROVAL_STEP");
    pub const SLEEPER: &str = env!("GUEST_SLEEPER");
    pub const FANOUT: &str = env!("GUEST_FANOUT");
    pub const FANOUT_V2: &str = env!("GUEST_FANOUT_V2");
    pub const FORK_STEP: &str = env!("GUEST_FORK_STEP");
    pub const FORK_STEP_FIXED: &str = env!("GUEST_FORK_STEP_FIXED");
    pub const SQUARE: &str = env!("GUEST_SQUARE");
    pub const PROMISE_STEP: &str = env!("GUEST_PROMISE_STEP");
    pub const COMMAND: &str = env!("GUEST_COMMAND");
    /// The refund agent of `examples/agent-refund`.
    pub const AGENT_REFUND: &str = env!("AGENT_REFUND");
}

/// A configuration granting `orders` (a deduplicating file receiver) and
/// `echo`, with small limits for fast failures.
pub const BASE_CONFIG: &str = r#"
[effects.orders]
kind = "file"
class = "write"
path = "orders.jsonl"

[effects.echo]
kind = "echo"
class = "read"
"#;

/// The supplier example's effects with built-in receivers: a fixed stock of
/// 3 and a deduplicating file receiver for the orders.
pub const SUPPLIER_CONFIG: &str = r#"
[effects."inventory.read"]
kind = "static"
class = "read"
response = '{"sku": "WIDGET-7", "on_hand": 3}'

[effects."supplier.order"]
kind = "file"
class = "write"
path = "supplier-orders.jsonl"
"#;

/// The approval step's effects with built-in receivers: a fixed stock of 3
/// and a deduplicating file receiver for the orders.
pub const APPROVAL_CONFIG: &str = r#"
[effects."inventory.read"]
kind = "static"
class = "read"
response = '{"sku": "WIDGET-7", "on_hand": 3}'

[effects.orders]
kind = "file"
class = "write"
path = "orders.jsonl"
"#;

/// The supplier example's effects over HTTP against the demo supplier at
/// `url`: an order is idempotent, and can be looked up if `lookup`.
pub fn supplier_http_config(url: &str, lookup: bool) -> String {
    let config = r#"
[effects."inventory.read"]
kind = "http"
class = "read"
method = "GET"
url = "URL/inventory/{sku}"

[effects."supplier.order"]
kind = "http"
class = "write"
method = "POST"
url = "URL/orders"
idempotent = true
"#;
    let lookup = if lookup {
        "lookup = \"URL/orders/{operation_id}\"\n"
    } else {
        ""
    };
    format!("{config}{lookup}").replace("URL", url)
}

/// The Python of `target/mcp-venv` (with the `mcp` package), which runs the
/// MCP supplier server; panics saying how to install it when missing.
pub fn mcp_python() -> PathBuf {
    let python = repo_root().join("target/mcp-venv/bin/python3");
    assert!(
        python.exists(),
        "the MCP supplier server needs the Python `mcp` package in target/mcp-venv: run \
         scripts/test.sh (it installs it) or `python3 -m venv target/mcp-venv && \
         target/mcp-venv/bin/pip install mcp==2.3.0`"
    );
    python
}

/// The MCP supplier server (`examples/mcp-supplier-order`).
pub fn mcp_server_script() -> PathBuf {
    repo_root().join("examples/mcp-supplier-order/supplier_server.py")
}

/// The MCP supplier step's effects against `server` (a `[mcp.supplier]`
/// body), which is trusted with its tools' annotations: the stock's and the
/// order's classes are left to them.
pub fn mcp_supplier_config(server: &str, idempotent: bool) -> String {
    format!(
        r#"
[mcp.supplier]
{server}
timeout_ms = 20_000
trust_annotations = true

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

/// A configuration whose `llm` is the scripted model server at `url`
/// (model `stub-model`, its key in `STEPHOST_TEST_KEY`).
pub fn llm_config(url: &str) -> String {
    format!("[llm]\nurl = \"{url}\"\nmodel = \"stub-model\"\napi_key_env = \"STEPHOST_TEST_KEY\"\n")
}

/// The result of one `stephost` invocation.
#[derive(Debug)]
pub struct Ran {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Ran {
    fn from(output: Output) -> Self {
        use std::os::unix::process::ExitStatusExt;
        Ran {
            code: output.status.code(),
            signal: output.status.signal(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// The stdout parsed as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}):\n{}\nstderr:\n{}",
                self.stdout, self.stderr
            )
        })
    }

    /// Panics with both streams unless the exit code is `code`.
    #[track_caller]
    pub fn expect_code(&self, code: i32) -> &Self {
        assert_eq!(
            self.code,
            Some(code),
            "expected exit code {code}\nstdout:\n{}\nstderr:\n{}",
            self.stdout,
            self.stderr
        );
        self
    }
}

/// The output of a supplier step that exited 0 having ordered `shortage`.
#[track_caller]
pub fn expect_ordered(ran: &Ran, shortage: i64) -> Value {
    ran.expect_code(0);
    let out = ran.json();
    assert_eq!(out["ordered"], true, "{out:#}");
    assert_eq!(out["shortage"], shortage, "{out:#}");
    out
}

/// A folder with a ledger and a configuration, and the binary to drive.
pub struct Sandbox {
    pub dir: tempfile::TempDir,
    pub bin: PathBuf,
    /// The sandbox's ledger URL, on the backend the tests run against.
    ledger: String,
}

impl Sandbox {
    /// `bin` is `env!("CARGO_BIN_EXE_stephost-crash")` from the test.
    pub fn new(bin: &str) -> Self {
        Self::with_config(bin, BASE_CONFIG)
    }

    pub fn with_config(bin: &str, config: &str) -> Self {
        Self::with_ledger(bin, config, None)
    }

    /// A sandbox whose ledger is at `ledger` (a URL), or, if `None`, on the
    /// backend the tests run against.
    pub fn with_ledger(bin: &str, config: &str, ledger: Option<String>) -> Self {
        Self::on(bin, config, test_backend(), ledger)
    }

    /// A sandbox whose ledger is at `ledger` (a URL), or, if `None`, a
    /// fresh one on `backend`.
    pub fn on(bin: &str, config: &str, backend: Backend, ledger: Option<String>) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("stephost.toml"), config).expect("write config");
        let ledger = ledger.unwrap_or_else(|| match backend {
            Backend::Sqlite => format!("sqlite:{}", dir.path().join("ledger.db").display()),
            Backend::Postgres => TestServer::shared().fresh_ledger(),
        });
        Sandbox {
            dir,
            bin: PathBuf::from(bin),
            ledger,
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The sandbox's SQLite ledger file (the tests that damage or inspect
    /// the file itself use it).
    pub fn db(&self) -> PathBuf {
        self.path("ledger.db")
    }

    /// The sandbox's ledger, on the backend the tests run against
    /// ([`test_backend`]): a SQLite file in the sandbox, or a schema of its
    /// own on the test PostgreSQL server.
    pub fn ledger_url(&self) -> String {
        self.ledger.clone()
    }

    /// Changes the ledger as someone with direct access to its database
    /// might (no rule checked, no seal made), on either backend.
    pub fn tamper(&self) -> Box<dyn stephost_core::tamper::Tamper> {
        stephost_ledger::Ledger::parse(&self.ledger_url())
            .and_then(|ledger| ledger.tamper())
            .expect("open the ledger to change it")
    }

    /// Runs `sqlite` or `postgres` (the same statement in each dialect)
    /// against the ledger's database: for a database that is not a
    /// stephost ledger; a ledger is changed through [`Sandbox::tamper`].
    pub fn sql(&self, sqlite: &str, postgres: &str) -> usize {
        match test_backend() {
            Backend::Sqlite => rusqlite::Connection::open(self.db())
                .expect("open the ledger")
                .execute(sqlite, [])
                .expect("change the ledger"),
            Backend::Postgres => {
                let out = self.psql(postgres);
                out.lines()
                    .rev()
                    .find_map(|l| l.rsplit(' ').next()?.parse().ok())
                    .unwrap_or(0)
            }
        }
    }

    /// The first column of what `query` (valid in both backends) returns,
    /// one line per row.
    pub fn query(&self, query: &str) -> String {
        match test_backend() {
            Backend::Sqlite => {
                let conn = rusqlite::Connection::open(self.db()).expect("open the ledger");
                let mut stmt = conn.prepare(query).expect("prepare the query");
                let rows: Vec<String> = stmt
                    .query_map([], |r| {
                        Ok(match r.get_ref(0)? {
                            rusqlite::types::ValueRef::Null => String::new(),
                            rusqlite::types::ValueRef::Integer(i) => i.to_string(),
                            rusqlite::types::ValueRef::Real(f) => f.to_string(),
                            rusqlite::types::ValueRef::Text(t)
                            | rusqlite::types::ValueRef::Blob(t) => {
                                String::from_utf8_lossy(t).into_owned()
                            }
                        })
                    })
                    .expect("run the query")
                    .collect::<Result<_, _>>()
                    .expect("read the rows");
                rows.join("\n")
            }
            Backend::Postgres => self.psql(query).trim_end().to_string(),
        }
    }

    /// Whether the sandbox's ledger has been created.
    pub fn ledger_exists(&self) -> bool {
        match test_backend() {
            Backend::Sqlite => self.db().exists(),
            Backend::Postgres => {
                self.psql("SELECT to_regclass('stephost_meta') IS NOT NULL")
                    .trim()
                    == "t"
            }
        }
    }

    /// Asserts that `secret` is in none of the ledger's data and not in
    /// the export of run `run_id`.
    #[track_caller]
    pub fn assert_kept_out(&self, secret: &str, run_id: &str) {
        assert!(!self.ledger_contains(secret), "{secret} is in the ledger");
        let export = self.stephost(&["export", run_id]);
        export.expect_code(0);
        assert!(!export.stdout.contains(secret), "{secret} is in the export");
    }

    /// Whether `text` is anywhere in the ledger's data.
    pub fn ledger_contains(&self, text: &str) -> bool {
        match test_backend() {
            // The file and its write-ahead log: a commit may not have
            // reached the file yet.
            Backend::Sqlite => ["ledger.db", "ledger.db-wal"].iter().any(|name| {
                std::fs::read(self.path(name))
                    .unwrap_or_default()
                    .windows(text.len())
                    .any(|w| w == text.as_bytes())
            }),
            Backend::Postgres => {
                let dump = self.psql(
                    "SELECT string_agg(t::text, ' ') FROM (SELECT r::text AS t FROM runs r \
                     UNION ALL SELECT c::text FROM calls c UNION ALL SELECT p::text FROM \
                     payloads p UNION ALL SELECT l::text FROM logs l) all_rows",
                );
                dump.contains(text)
            }
        }
    }

    fn psql(&self, sql: &str) -> String {
        let out = Command::new("psql")
            .arg(&self.ledger)
            .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .output()
            .expect("start psql");
        assert!(
            out.status.success(),
            "psql {sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `text` with what varies from one sandbox to the next replaced by
    /// placeholders ([`golden::normalize`]): the ledger's URL (`<ledger>`),
    /// the sandbox's folder (`<sandbox>`), the compiled-component cache
    /// (`<cache>`) and the repository's folder (`<repo>`, in the guests'
    /// paths), and the `extra` values the test knows vary.
    pub fn normalize(&self, text: &str, extra: &[(&str, &str)]) -> String {
        let ledger = self.ledger_url();
        let dir = self.dir.path().display().to_string();
        let cache = shared_cache_dir().display().to_string();
        let repo = repo_root().display().to_string();
        let mut known: Vec<(&str, &str)> = vec![
            (&ledger, "<ledger>"),
            (&dir, "<sandbox>"),
            (&cache, "<cache>"),
            (&repo, "<repo>"),
        ];
        known.extend_from_slice(extra);
        golden::normalize(text, &known)
    }

    /// Replaces the configuration.
    pub fn set_config(&self, config: &str) {
        std::fs::write(self.path("stephost.toml"), config).expect("write config");
    }

    /// A command for `stephost ARGS` against this sandbox's ledger and config.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.bin);
        // Named as people run it, so usage lines read `stephost`, not the
        // test build's file name.
        std::os::unix::process::CommandExt::arg0(&mut cmd, "stephost");
        cmd.current_dir(self.dir.path())
            .env("STEPHOST_LEDGER", self.ledger_url())
            .env_remove("STEPHOST_DB")
            .env("STEPHOST_CONFIG", self.path("stephost.toml"))
            // One compiled-component cache for every test process: a large
            // guest (Python, JavaScript) is compiled once, not per command.
            .env("STEPHOST_CACHE_DIR", shared_cache_dir())
            .env_remove("STEPHOST_CRASH_AT")
            .env_remove("STEPHOST_BREAK")
            .env_remove("STEPHOST_LEDGER_FAULTS")
            // Spans are exported only where a test asks for them.
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .env_remove("TRACEPARENT")
            .env_remove("TRACESTATE")
            .args(args);
        cmd
    }

    pub fn stephost(&self, args: &[&str]) -> Ran {
        Ran::from(self.command(args).output().expect("start stephost"))
    }

    /// The value of the counter or gauge `name` that `stephost metrics`
    /// prints (without labels).
    pub fn metric(&self, name: &str) -> i64 {
        let text = self.stephost(&["metrics"]);
        text.expect_code(0);
        text.stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no metric {name} in\n{}", text.stdout))
            .parse()
            .unwrap()
    }

    /// `stephost` with a crash point armed.
    pub fn stephost_crashing_at(&self, point: &str, args: &[&str]) -> Ran {
        self.stephost_with_env("STEPHOST_CRASH_AT", point, args)
    }

    /// `stephost ARGS` with the environment variable `name` set to `value`.
    pub fn stephost_with_env(
        &self,
        name: &str,
        value: impl AsRef<std::ffi::OsStr>,
        args: &[&str],
    ) -> Ran {
        self.stephost_with_envs(&[(name, value.as_ref())], args)
    }

    /// `stephost ARGS` with each `(name, value)` in its environment.
    pub fn stephost_with_envs(&self, vars: &[(&str, &std::ffi::OsStr)], args: &[&str]) -> Ran {
        let mut command = self.command(args);
        for (name, value) in vars {
            command.env(name, value);
        }
        Ran::from(command.output().expect("start stephost"))
    }

    /// `stephost run GUEST --input INPUT --run-id ID`.
    pub fn run(&self, guest: &str, input: &str, run_id: &str) -> Ran {
        self.stephost(&["run", guest, "--input", input, "--run-id", run_id])
    }

    /// [`Sandbox::run`] with a crash point armed.
    pub fn run_crashing_at(&self, point: &str, guest: &str, input: &str, run_id: &str) -> Ran {
        self.stephost_crashing_at(point, &["run", guest, "--input", input, "--run-id", run_id])
    }

    /// `stephost show RUN --json`.
    pub fn show(&self, run_id: &str) -> Value {
        self.stephost(&["show", run_id, "--json"])
            .expect_code(0)
            .json()
    }

    /// The lines of a file receiver's file, parsed.
    pub fn received(&self, file: &str) -> Vec<Value> {
        match std::fs::read_to_string(self.path(file)) {
            Ok(text) => text
                .lines()
                .map(|l| serde_json::from_str(l).expect("receiver line is JSON"))
                .collect(),
            Err(_) => Vec::new(),
        }
    }
}

/// A ledger backend the end-to-end tests can run against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    /// A schema per sandbox on the test server
    /// ([`stephost_ledger_postgres::throwaway::TestServer`]).
    Postgres,
}

/// The backend named by `STEPHOST_TEST_LEDGER` (`sqlite`, the default, or
/// `postgres`).
pub fn test_backend() -> Backend {
    match std::env::var("STEPHOST_TEST_LEDGER").as_deref() {
        Err(_) | Ok("") | Ok("sqlite") => Backend::Sqlite,
        Ok("postgres") => Backend::Postgres,
        Ok(other) => panic!(
            "STEPHOST_TEST_LEDGER={other:?} names no backend these tests know; use `sqlite` or \
             `postgres`"
        ),
    }
}

/// The compiled-component cache the tests share.
pub fn shared_cache_dir() -> PathBuf {
    std::env::temp_dir().join("stephost-test-cache")
}

/// The repository's folder (the workspace root).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is in the repository")
        .to_path_buf()
}

/// The calls of a `show --json` document.
pub fn calls(show: &Value) -> &Vec<Value> {
    show["calls"].as_array().expect("calls array")
}

/// The attempts recorded for call `seq`.
pub fn attempts_for(show: &Value, seq: u64) -> Vec<&Value> {
    show["attempts"]
        .as_array()
        .expect("attempts array")
        .iter()
        .filter(|a| a["seq"].as_u64() == Some(seq))
        .collect()
}

/// Asserts every operation id at the receiver is distinct and returns them.
#[track_caller]
pub fn distinct_operations(lines: &[Value]) -> Vec<String> {
    let ids: Vec<String> = lines
        .iter()
        .map(|l| {
            l["operation_id"]
                .as_str()
                .expect("operation_id")
                .to_string()
        })
        .collect();
    let mut sorted = ids.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(
        sorted.len(),
        ids.len(),
        "duplicate business effects: {lines:#?}"
    );
    ids
}

/// Reads a file's bytes, or none if absent.
pub fn bytes_of(path: &Path) -> Option<Vec<u8>> {
    std::fs::read(path).ok()
}
