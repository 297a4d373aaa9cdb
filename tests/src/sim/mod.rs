//! The fault-injection harness: from one seed it draws a cluster of
//! worker processes, a workload and a schedule of faults ([`plan`]), runs
//! them against the real binary, a real ledger (SQLite, or PostgreSQL
//! with `STEPHOST_TEST_LEDGER=postgres`) and two real HTTP receivers on
//! 127.0.0.1 (one deduplicating by `Idempotency-Key`, one not), acts as
//! the person who settles parked calls and as the system completing
//! promises, and checks every invariant ([`check`]) once each run has
//! ended. The same seed draws the same plan; the processes' interleaving
//! is the machine's. `docs/testing.md` says how to run it.

pub mod check;
mod cluster;
pub mod plan;
pub mod rng;
mod watch;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use supplier_receiver::{Config, Receiver};

use crate::{Sandbox, guests};
use check::Receivers;
use cluster::Cluster;
use plan::{Fault, Plan, ServerEvent, Work};

/// How long a seed may take, past its faults, for every run to end.
pub const SETTLE_SECS: u64 = 180;

/// Once the faults have stopped, a waiting run whose wake time passed
/// this long ago without a worker taking it was not woken (a lost
/// wake-up). Long enough for every worker's slots to be busy with runs
/// retrying their models and receivers meanwhile: the default of
/// [`Options::woken_within`].
pub const WOKEN_WITHIN: Duration = Duration::from_secs(60);

/// A parked call is settled once it has been parked this long: a receiver
/// that commits late (at most 800 ms after the request) has committed by
/// then, so the harness, like a careful person, sees what it holds.
const PARKED_SETTLE: Duration = Duration::from_millis(1500);

/// One seed to run.
pub struct Options {
    pub seed: u64,
    /// The `stephost` binary built with crash points (`stephost-crash`).
    pub bin: PathBuf,
    /// Rules the host is told to break (`STEPHOST_BREAK`), to show a
    /// check catches it.
    pub breaks: Option<String>,
    /// Keep the seed's folder (ledger, worker logs) and print where.
    pub keep: bool,
    /// The ledger's backend; the seed draws it when `None`.
    pub ledger: Option<crate::Backend>,
    /// How long past its wake time a waiting run may wait once the faults
    /// stopped before it counts as not woken ([`WOKEN_WITHIN`]; shorter
    /// only where a wake-up is lost on purpose).
    pub woken_within: Duration,
}

/// What a seed did and found.
pub struct Report {
    pub plan: Plan,
    /// The ledger's backend.
    pub backend: crate::Backend,
    /// What happened to the workers.
    pub events: Vec<String>,
    /// Each invariant found broken.
    pub broken: Vec<String>,
    pub runs: usize,
    /// Faults that happened: worker faults, cancels, server events,
    /// receivers' and the model's misbehaviours served, ledger faults that
    /// reached a worker's log.
    pub faults: usize,
    /// How long the seed took, its checks included.
    pub took: Duration,
    /// The seed's folder, when kept.
    pub kept: Option<PathBuf>,
}

impl Report {
    /// The command that runs this seed again.
    pub fn rerun(&self, breaks: Option<&str>) -> String {
        let backend = match self.backend {
            crate::Backend::Sqlite => "sqlite",
            crate::Backend::Postgres => "postgres",
        };
        let breaks = breaks.map_or(String::new(), |b| format!(" --break {b}"));
        format!(
            "cargo build -p stephost-tests --bins && STEPHOST_TEST_LEDGER={backend} \
             target/debug/stephost-sim --seed {}{breaks} --keep",
            self.plan.seed
        )
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.plan)?;
        for event in &self.events {
            writeln!(f, "  {event}")?;
        }
        writeln!(
            f,
            "  {} run(s) in the ledger, {} fault(s) injected, {:.1} s",
            self.runs,
            self.faults,
            self.took.as_secs_f64()
        )?;
        if let Some(dir) = &self.kept {
            writeln!(f, "  kept in {}", dir.display())?;
        }
        for broken in &self.broken {
            writeln!(f, "BROKEN: {broken}")?;
        }
        Ok(())
    }
}

fn config(plan: &Plan, deduplicating: &str, plain: &str, model: &str) -> String {
    let supplier_order = match plan.mcp {
        true => mcp_config(),
        false => format!(
            "[effects.\"supplier.order\"]\nkind = \"http\"\nclass = \"write\"\nmethod = \"POST\"\n\
             url = \"{deduplicating}/orders\"\nidempotent = true\n\
             lookup = \"{deduplicating}/orders/{{operation_id}}\"\n{ATTEMPTS}"
        ),
    };
    let attempts = ATTEMPTS;
    let lookup_plain = if plan.lookup_plain {
        format!("lookup = \"{plain}/orders/{{operation_id}}\"\n")
    } else {
        String::new()
    };
    // The effects whose receiver does not deduplicate.
    let plain_write = |name: &str| {
        format!(
            "[effects.{name}]\nkind = \"http\"\nclass = \"write\"\nmethod = \"POST\"\n\
             url = \"{plain}/orders\"\nidempotent = false\n{lookup_plain}{attempts}"
        )
    };
    format!(
        r#"[effects."inventory.read"]
kind = "http"
class = "read"
method = "GET"
url = "{deduplicating}/inventory/{{sku}}"

{supplier_order}
{orders}
{refund}
[effects."orders.lookup"]
kind = "static"
class = "read"
response = '{{"amount_cents": 2599, "status": "delivered"}}'

[models.support]
api = "{api}"
url = "{model}"
model = "scripted-1"
max_tokens = 1024

[models.support.retry]
attempts_max = 6
backoff_first_ms = 10
backoff_max_ms = 200
deadline_ms = 20000

[steps.square]
module = {square:?}

[http."{deduplicating}"]
idempotent = true
lookup = "{deduplicating}/orders/{{operation_id}}"
{attempts}
[http."{plain}"]
idempotent = false
{lookup_plain}{attempts}{limits}"#,
        limits = plan.model_tokens_max.map_or(String::new(), |max| format!(
            "\n[limits]\nmodel_tokens_max = {max}\n"
        )),
        square = guests::SQUARE,
        api = plan.model_api,
        orders = plain_write("orders"),
        refund = plain_write("\"payments.refund\""),
    )
}

/// Attempts time out before the slowest misbehaviours answer, so a
/// write's outcome is often in doubt.
const ATTEMPTS: &str = "timeout_ms = 400\nretry = { attempts_max = 3, backoff_first_ms = 20, \
                        backoff_max_ms = 200, deadline_ms = 5000 }\n";

/// The MCP supplier server, over stdio, started by each worker that needs
/// it: the tool list, the stock (a read, by the tool's annotation) and the
/// order (deduplicated by the server by operation id).
fn mcp_config() -> String {
    let server = format!(
        "command = {:?}\nargs = [{:?}]\n\
         env = [\"SUPPLIER_MCP_FAULT\", \"SUPPLIER_MCP_PIDFILE\", \"SUPPLIER_ORDERS\"]",
        crate::mcp_python().display().to_string(),
        crate::mcp_server_script().display().to_string(),
    );
    crate::mcp_supplier_config(&server, true)
}

/// Where the MCP supplier server keeps its orders (`SUPPLIER_ORDERS`) and
/// its processes' ids (`SUPPLIER_MCP_PIDFILE`), in the seed's folder.
pub const MCP_ORDERS: &str = "mcp-orders.jsonl";
pub const MCP_PIDS: &str = "mcp-pids";

fn submit(sb: &Sandbox, run_id: &str, work: &Work, receivers: &Receivers<'_>) {
    let (guest, input) = match work {
        Work::Supplier { quantity } => (
            guests::SUPPLIER_ORDER,
            json!({"sku": format!("SKU-{run_id}"), "quantity": quantity}),
        ),
        Work::Writes { count } => (guests::MULTI_WRITE, json!({ "count": count })),
        Work::Sleeper { ms } => (guests::SLEEPER, json!({ "ms": ms })),
        Work::Fanout { n, sleep_ms } => (guests::FANOUT, json!({ "n": n, "sleep_ms": sleep_ms })),
        Work::Promise { ttl_seconds, .. } => {
            (guests::PROMISE_STEP, json!({ "ttl_seconds": ttl_seconds }))
        }
        Work::Agent { order } => (
            guests::CHAT_STEP,
            json!({
                "model": "support",
                "message": format!("Please refund order {order}, it arrived broken."),
                "agent": true,
            }),
        ),
        Work::Approval { ttl_seconds, .. } => (
            guests::APPROVAL_STEP,
            json!({"sku": format!("SKU-{run_id}"), "quantity": 10, "ttl_seconds": ttl_seconds}),
        ),
        Work::WasiHttp { plain } => {
            let supplier = match plain {
                true => receivers.plain.url(),
                false => receivers.deduplicating.url(),
            };
            (
                guests::HTTP_SUPPLIER_ORDER,
                json!({"sku": format!("SKU-{run_id}"), "quantity": 10, "supplier": supplier}),
            )
        }
        Work::Mcp => (
            guests::MCP_SUPPLIER_ORDER,
            json!({"sku": "WIDGET-7", "quantity": 10}),
        ),
    };
    sb.stephost(&[
        "submit",
        guest,
        "--input",
        &input.to_string(),
        "--run-id",
        run_id,
    ])
    .expect_code(0);
}

/// Promises whose tokens reached the plain receiver, completed as the
/// plan says.
#[derive(Default)]
struct Promises {
    seen: HashMap<String, Instant>,
    done: HashSet<String>,
    tries: HashMap<String, u32>,
}

impl Promises {
    fn complete_due(&mut self, sb: &Sandbox, plan: &Plan, plain: &Receiver) {
        for order in plain.orders() {
            let body = order.body_json();
            let Some(token) = body["token"].as_str() else {
                continue;
            };
            let seen = *self
                .seen
                .entry(token.to_string())
                .or_insert_with(Instant::now);
            let after = plan
                .submits
                .iter()
                .find(|s| Some(&s.run_id) == order.run_id.as_ref())
                .and_then(|s| match s.work {
                    Work::Promise { after, .. } => Some(after),
                    _ => None,
                })
                .unwrap_or_default();
            let tries = self.tries.entry(token.to_string()).or_default();
            if self.done.contains(token) || seen.elapsed() < after || *tries >= 5 {
                continue;
            }
            *tries += 1;
            let value = json!({"approved": true}).to_string();
            let ran = sb.stephost(&["complete", token, "--resolve", &value, "--by", "sim"]);
            if ran.code == Some(0) {
                self.done.insert(token.to_string());
            }
        }
    }
}

/// Approvals the harness decides as the plan says, once each has waited
/// its `after`.
#[derive(Default)]
struct Approvals {
    seen: HashMap<(String, u64), Instant>,
    done: HashSet<(String, u64)>,
}

impl Approvals {
    fn decide_due(&mut self, sb: &Sandbox, plan: &Plan) {
        if !plan
            .submits
            .iter()
            .any(|s| matches!(s.work, Work::Approval { .. }))
        {
            return;
        }
        let listed = sb.stephost(&["approvals", "--json"]);
        let listed: Value = serde_json::from_str(&listed.stdout).unwrap_or_default();
        for waiting in listed.as_array().into_iter().flatten() {
            let (Some(run_id), Some(seq)) = (waiting["run_id"].as_str(), waiting["seq"].as_u64())
            else {
                continue;
            };
            let key = (run_id.to_string(), seq);
            let seen = *self.seen.entry(key.clone()).or_insert_with(Instant::now);
            let Some((after, approve)) =
                plan.submits
                    .iter()
                    .find(|s| s.run_id == run_id)
                    .and_then(|s| match s.work {
                        Work::Approval { after, approve, .. } => Some((after, approve)),
                        _ => None,
                    })
            else {
                continue;
            };
            if self.done.contains(&key) || seen.elapsed() < after {
                continue;
            }
            let seq = seq.to_string();
            let details = waiting["details_sha256"].as_str().unwrap_or_default();
            let ran = match approve {
                true => {
                    sb.stephost(&["approve", run_id, &seq, "--details", details, "--by", "sim"])
                }
                false => sb.stephost(&["reject", run_id, &seq, "--by", "sim"]),
            };
            // Refused once the approval expired or the run was cancelled.
            if ran.code == Some(0) || ran.code == Some(2) {
                self.done.insert(key);
            }
        }
    }
}

/// Settles each call parked as `unknown` as a careful person would: by
/// what the receiver holds for its operation id, then resumes the run.
fn settle_parked(
    sb: &Sandbox,
    runs: &[Value],
    receivers: &Receivers<'_>,
    parked: &mut HashMap<String, Instant>,
    events: &mut Vec<String>,
) {
    for run in runs.iter().filter(|r| r["status"] == "parked") {
        let id = run["run_id"].as_str().unwrap_or_default().to_string();
        let since = *parked.entry(id.clone()).or_insert_with(Instant::now);
        if since.elapsed() < PARKED_SETTLE {
            continue;
        }
        parked.remove(&id);
        let show = sb.show(&id);
        for call in show["calls"].as_array().into_iter().flatten() {
            if call["state"] != "unknown" {
                continue;
            }
            let seq = call["seq"].as_u64().unwrap_or(0).to_string();
            let op = call["operation_id"].as_str().unwrap_or_default();
            let decided = match receivers.receipt(call, op) {
                Some(receipt) => {
                    let receipt = receipt.to_string();
                    sb.stephost(&["resolve", &id, &seq, "--succeeded", &receipt, "--by", "sim"])
                }
                None => sb.stephost(&[
                    "resolve",
                    &id,
                    &seq,
                    "--failed",
                    "the receiver holds no such order",
                    "--by",
                    "sim",
                ]),
            };
            events.push(format!(
                "{id} #{seq} settled by the receiver's record (exit {:?})",
                decided.code
            ));
        }
        let resumed = sb.stephost(&["resume", &id]);
        events.push(format!("{id} resumed (exit {:?})", resumed.code));
    }
}

/// How long the harness waits for `serve`'s event stream to show a run's
/// end it has surely sent ([`watch::SENT_WITHIN_MS`] after the change).
const STREAMED_WITHIN: Duration = Duration::from_secs(10);

/// Every run that ended after the faults stopped, while one of `serve`'s
/// event streams was open, is seen ending on it; what is not, broken.
fn streamed_ends(sb: &Sandbox, watch: &mut watch::Watch, calm_ms: i64) -> Vec<String> {
    let waited = Instant::now();
    loop {
        let runs = check::list(sb);
        let missed: Vec<String> = {
            let seen = watch.seen();
            runs.iter()
                .filter(|r| ended(r))
                .filter_map(|r| {
                    let at = r["updated_at_ms"].as_i64()?;
                    let (id, status) = (r["run_id"].as_str()?, r["status"].as_str()?);
                    let shown = seen.last.get(id).map(String::as_str);
                    (at >= calm_ms && seen.open_at(at) && shown != Some(status)).then(|| {
                        format!(
                            "run {id} ended {status} at {at} while serve's event stream was \
                             open, and the stream last showed it {shown:?}"
                        )
                    })
                })
                .collect()
        };
        if missed.is_empty() || waited.elapsed() >= STREAMED_WITHIN {
            watch.stop();
            return missed;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `kill -9` of every MCP server process the workers started that is
/// still there.
fn kill_mcp_servers(sb: &Sandbox) {
    let pids = std::fs::read_to_string(sb.path(MCP_PIDS)).unwrap_or_default();
    for pid in pids.lines().filter(|l| !l.trim().is_empty()) {
        let _ = std::process::Command::new("kill")
            .args(["-9", pid.trim()])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// The lines of the workers' logs that name an injected ledger fault.
fn injected_ledger_faults(sb: &Sandbox) -> usize {
    std::fs::read_dir(sb.dir.path())
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("worker-"))
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .map(|log| log.matches("injected fault").count())
        .sum()
}

fn ended(run: &Value) -> bool {
    matches!(
        run["status"].as_str(),
        Some("completed" | "failed" | "cancelled" | "diverged")
    )
}

/// Runs one seed to its end and checks every invariant.
pub fn run(options: &Options) -> Report {
    let began = Instant::now();
    let plan = Plan::draw(options.seed);
    let deduplicating = Receiver::start().expect("start the deduplicating receiver");
    let plain = Receiver::start_with(Config {
        deduplicate: false,
        ..Config::default()
    })
    .expect("start the plain receiver");
    for m in &plan.deduplicating {
        deduplicating.push_fault(m.clone());
    }
    for m in &plan.plain {
        plain.push_fault(m.clone());
    }
    for l in &plan.deduplicating_lookups {
        deduplicating.push_lookup_fault(l.clone());
    }
    for l in &plan.plain_lookups {
        plain.push_lookup_fault(l.clone());
    }
    let mut script = model_server::Script::default_refund();
    for (i, (turn, faults)) in script.turns.iter_mut().zip(&plan.model_faults).enumerate() {
        turn.faults = faults
            .iter()
            .map(|f| serde_json::from_value(f.clone()).expect("a model fault the server reads"))
            .collect();
        turn.omit_usage = plan.model_omit_usage.contains(&i);
    }
    let model_started_ms = stephost_core::clock::now_ms();
    let model = model_server::ModelServer::start_with(model_server::Config {
        script,
        ..model_server::Config::default()
    })
    .expect("start the scripted model server");
    // A PostgreSQL server of the seed's own when the plan does something
    // to the server: the suite's shared one serves other tests.
    let backend = options.ledger.unwrap_or(match plan.postgres_ledger {
        true => crate::Backend::Postgres,
        false => crate::Backend::Sqlite,
    });
    let own = (backend == crate::Backend::Postgres && !plan.postgres.is_empty()).then(|| {
        stephost_ledger_postgres::throwaway::Cluster::start()
            .expect("start a PostgreSQL server for the seed")
    });
    let sb = Sandbox::on(
        options.bin.to_str().expect("a UTF-8 path"),
        &config(&plan, &deduplicating.url(), &plain.url(), &model.url()),
        backend,
        own.as_ref().map(|c| c.fresh_ledger()),
    );
    let receivers = Receivers {
        deduplicating: &deduplicating,
        plain: &plain,
        model: &model,
        model_started_ms,
        mcp: plan.mcp.then(|| sb.path(MCP_ORDERS)),
    };
    let mut server_events = plan.postgres.iter().filter(|_| own.is_some()).peekable();
    let mut submits: Vec<_> = plan.submits.iter().collect();
    submits.sort_by_key(|s| s.at);
    let mut submits = submits.into_iter().peekable();
    while let Some(s) = submits.next_if(|s| s.at.is_zero()) {
        submit(&sb, &s.run_id, &s.work, &receivers);
    }
    // A console watching through `serve`'s event stream, reopened after
    // each restart.
    let mut watch = plan
        .serve
        .then(|| watch::Watch::start(sb.dir.path().to_path_buf()));
    let mut cluster = Cluster::start(&sb, &plan, options.breaks.clone());
    let mut injects = plan.injects.iter().peekable();
    let mut cancels = plan.cancels.iter().peekable();
    let mut promises = Promises::default();
    let mut approvals = Approvals::default();
    let mut parked = HashMap::new();
    let mut events = Vec::new();
    let mut broken = Vec::new();
    let start = Instant::now();
    let mut calm = false;
    let mut calm_ms = i64::MAX;
    let mut looked = Instant::now();
    loop {
        let now = start.elapsed();
        while let Some(s) = submits.next_if(|s| s.at <= now) {
            submit(&sb, &s.run_id, &s.work, &receivers);
        }
        while let Some(inject) = injects.next_if(|i| i.at <= now) {
            let w = inject.worker;
            match &inject.fault {
                Fault::Kill => cluster.kill(w, None),
                Fault::Arm(point) => cluster.kill(w, Some(point)),
                Fault::Pause { r#for } => cluster.pause(w, *r#for),
                Fault::Drain => cluster.drain(w),
                Fault::Outage { r#for } => cluster.outage(*r#for),
                Fault::McpDeath => kill_mcp_servers(&sb),
            }
            events.push(format!(
                "at {} ms worker {w}: {:?}",
                now.as_millis(),
                inject.fault
            ));
        }
        while let Some((_, run_id)) = cancels.next_if(|(at, _)| *at <= now) {
            // A run not submitted yet, or ended, is refused: that is fine.
            let ran = sb.stephost(&["cancel", run_id, "--by", "sim", "--reason", "the harness"]);
            events.push(format!(
                "at {} ms cancel {run_id} (exit {:?})",
                now.as_millis(),
                ran.code
            ));
        }
        while let Some((_, event)) = server_events.next_if(|(at, _)| *at <= now) {
            let Some(server) = &own else { break };
            let done = match event {
                ServerEvent::Restart => server.restart().map(|()| String::new()),
                ServerEvent::DropConnections => server.psql(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                     WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'",
                ),
            };
            events.push(format!(
                "at {} ms PostgreSQL {event:?}: {done:?}",
                now.as_millis()
            ));
        }
        cluster.tend();
        promises.complete_due(&sb, &plan, &plain);
        approvals.decide_due(&sb, &plan);
        if !calm && now >= plan.chaos {
            cluster.calm();
            calm = true;
            calm_ms = stephost_core::clock::now_ms();
        }
        if calm && looked.elapsed() >= Duration::from_millis(300) {
            looked = Instant::now();
            let runs = check::list(&sb);
            if !runs.is_empty() && runs.iter().all(ended) {
                break;
            }
            settle_parked(&sb, &runs, &receivers, &mut parked, &mut events);
            let now_ms = stephost_core::clock::now_ms();
            let asleep: Vec<String> = runs
                .iter()
                .filter(|r| r["status"] == "waiting")
                .filter_map(|r| {
                    let late = now_ms - r["wake_at_ms"].as_i64()?;
                    (late > options.woken_within.as_millis() as i64).then(|| {
                        format!(
                            "run {} waits for a wake-up that was due {} s ago: it was not woken",
                            r["run_id"],
                            late / 1000
                        )
                    })
                })
                .collect();
            if !asleep.is_empty() {
                broken.extend(asleep);
                break;
            }
            if now >= plan.chaos + Duration::from_secs(SETTLE_SECS) {
                let left: Vec<String> = runs
                    .iter()
                    .filter(|r| !ended(r))
                    .map(|r| format!("{} {}", r["run_id"], r["status"]))
                    .collect();
                broken.push(format!(
                    "{SETTLE_SECS} s after the last fault, runs had not ended: {left:?} (a \
                     waiting run not woken, a lease never released, or a run that cannot finish)"
                ));
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if let Some(watch) = &mut watch {
        broken.extend(streamed_ends(&sb, watch, calm_ms));
        let seen = watch.seen();
        events.push(format!(
            "serve's event stream: opened {} time(s), showed {} run(s)",
            seen.streams.len(),
            seen.last.len()
        ));
    }
    cluster.stop(Duration::from_secs(30));
    events.append(&mut cluster.events);
    drop(cluster);
    let ledger_faults = injected_ledger_faults(&sb);
    let odd = |queue: &[supplier_receiver::Fault]| {
        queue
            .iter()
            .filter(
                |m| !matches!(m, supplier_receiver::Fault::Delay(d) if *d <= plan::USUAL_LATENCY),
            )
            .count()
    };
    let served = |queue: &[supplier_receiver::Fault], receiver: &Receiver| {
        // Queued misbehaviours are served in order; those left were not.
        let left = receiver.pending_faults();
        odd(&queue[..queue.len().saturating_sub(left)])
    };
    let model_faults = model.report()["requests"]
        .as_array()
        .map_or(0, |r| r.iter().filter(|r| !r["fault"].is_null()).count());
    let faults = plan.injects.len()
        + plan.cancels.len()
        + if own.is_some() {
            plan.postgres.len()
        } else {
            0
        }
        + served(&plan.deduplicating, &deduplicating)
        + served(&plan.plain, &plain)
        + model_faults
        + ledger_faults;
    if ledger_faults > 0 {
        events.push(format!(
            "{ledger_faults} injected ledger fault(s) in the workers' logs"
        ));
    }
    broken.extend(check::all(
        &sb,
        &plan,
        &receivers,
        options.breaks.as_deref(),
    ));
    let runs = check::list(&sb).len();
    let kept = options.keep.then(|| sb.dir.path().to_path_buf());
    if options.keep {
        std::mem::forget(sb);
    }
    Report {
        plan,
        backend,
        events,
        broken,
        runs,
        faults,
        took: began.elapsed(),
        kept,
    }
}
