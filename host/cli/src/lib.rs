//! The `stephost` command line. Thin: parses arguments, loads
//! configuration, calls the host's service layer, prints (see [`print`]),
//! and maps the result to an exit code (see [`stephost_runtime::exit`]).

pub mod allocator;
mod print;
mod schedule;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::{Args, Parser, Subcommand};
use stephost_core::approvals::{Decision, Verdict};
use stephost_core::settle::Resolution;
use stephost_core::store::Opener;
use stephost_core::store::{PoolOptions, RunQuery};
use stephost_core::{LogRecord, Views};
use stephost_ledger::Ledger;
use stephost_runtime::config::Config;
use stephost_runtime::options::RunOptions;
use stephost_runtime::replay::{Fixture, replay_fixture};
use stephost_runtime::service::{self, Verification};
use stephost_runtime::{Host, HostError, HostOptions, exit};

use crate::print::{print_json, print_replay, print_run, print_runs, print_show};

#[derive(Parser, Debug)]
#[command(
    name = "stephost",
    version,
    about = "Runs agent steps as sandboxed WebAssembly components and makes them durable",
    after_help = "Exit codes: 0 ok, 1 internal error, 2 usage or bad input, 3 step failed, \
                  4 divergence, 5 run parked (needs a person), 6 run claimed elsewhere, \
                  7 run waiting (timer, approval or child), 8 run cancelled"
)]
pub struct Cli {
    /// The ledger, as a URL: `sqlite:PATH` (an embedded ledger file, created
    /// if absent) or `postgres://USER@HOST:PORT/DATABASE` (or
    /// `postgresql://`; a database that workers on many machines share, its
    /// tables created by the first command). Default `sqlite:stephost.db`.
    #[arg(long, global = true, env = "STEPHOST_LEDGER")]
    pub ledger: Option<String>,
    /// Shorthand for `--ledger sqlite:PATH` (`--ledger` wins when both are
    /// given).
    #[arg(long, global = true, env = "STEPHOST_DB")]
    pub db: Option<PathBuf>,
    /// Effects and limits; `./stephost.toml` is used when present.
    #[arg(long, global = true, env = "STEPHOST_CONFIG")]
    pub config: Option<PathBuf>,
    /// Where compiled components are kept so the next process skips the
    /// compile (default `$XDG_CACHE_HOME/stephost` or `~/.cache/stephost`;
    /// `off` keeps them in memory only).
    #[arg(long, global = true, env = "STEPHOST_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a step module on an input; prints the output JSON.
    Run(RunArgs),
    /// Record a run for a worker to execute; prints its run id.
    Submit(SubmitArgs),
    /// Claim runnable runs and execute them until stopped (SIGINT/SIGTERM:
    /// stop claiming, let active runs reach their next call, release them).
    Worker(WorkerArgs),
    /// Run a worker and serve the HTTP API, the web console and webhook
    /// notifications (SIGINT/SIGTERM: stop serving, drain like `worker`).
    /// Tokens: STEPHOST_API_TOKENS or STEPHOST_API_TOKENS_FILE, lines
    /// `NAME ROLE TOKEN` (ROLE read or operator); required unless --listen
    /// is a loopback address.
    Serve(ServeArgs),
    /// Continue an interrupted run: replay its recorded calls, then go live.
    Resume(ResumeArgs),
    /// Replay a recorded run offline (no I/O) and report the first divergence.
    Replay(ReplayArgs),
    /// Move unfinished runs to a new build of their step: replays each run's
    /// history against it with no I/O and repins only runs that match.
    Upgrade(UpgradeArgs),
    /// Fork a run from a call: a new run keeping the calls before it (their
    /// outcomes, what they paid, their operation ids), pinned to a build
    /// that must make those calls, going live from there; prints its id.
    Fork(ForkArgs),
    /// Show a run and its call timeline.
    Show(ShowArgs),
    /// Cancel a run and every run below it: each begins nothing more (a
    /// write in flight is still settled, an unknown outcome still waits for
    /// a person) and ends `cancelled`; a parent joining it sees it as such.
    Cancel(CancelArgs),
    /// Delete finished runs (each with the runs below it and everything they
    /// owned) that finished before a time: what `[retention]` has workers do
    /// in the background, by hand. Pending, running, waiting and parked runs
    /// (an outcome `unknown`) are never deleted.
    Prune(PruneArgs),
    /// Show a run and the child runs it started, down its tree: each run's
    /// status, what it waits for, and what its model calls spent.
    Tree(TreeArgs),
    /// List runs.
    Runs(RunsArgs),
    /// Decide the outcome of a call parked as unknown, after checking with the
    /// receiver by hand; then `stephost resume` continues the run.
    Resolve(ResolveArgs),
    /// List approvals waiting for a decision.
    Approvals(ApprovalsArgs),
    /// Approve a waiting approval call; a worker (or `stephost resume`) then
    /// continues the run.
    Approve(ApproveArgs),
    /// Reject a waiting approval call.
    Reject(RejectArgs),
    /// List runs waiting for a promise (never its token).
    Promises(PromisesArgs),
    /// Complete a promise a run waits for, with the token the run handed
    /// out: resolve it with a JSON value or reject it with a message; a
    /// worker then continues the run.
    Complete(CompleteArgs),
    /// Check the tamper-evident chain of a run in the ledger, or of an
    /// exported run file.
    Verify(VerifyArgs),
    /// Print metrics in the Prometheus text format.
    Metrics,
    /// Write a run as a portable JSON fixture to stdout.
    Export(ExportArgs),
    /// Start steps on a cron schedule, kept in the ledger and fired once per
    /// slot by whichever worker looks first.
    Schedule(schedule::ScheduleArgs),
}

/// The arguments of `stephost run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// The step: a component for stephost:step/step, a core module with
    /// that world's component type, or a WASI command program.
    pub module: PathBuf,
    /// The input JSON.
    #[arg(long, conflicts_with = "input_file")]
    pub input: Option<String>,
    /// Read the input JSON from a file (`-` for stdin).
    #[arg(long)]
    pub input_file: Option<PathBuf>,
    /// Use this run id (re-running an existing id continues that run).
    #[arg(long)]
    pub run_id: Option<String>,
    /// Print the run report as JSON instead of the bare output.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub budget: BudgetArgs,
    #[command(flatten)]
    pub trace: TraceArgs,
}

/// A run's own model budget, on `run`, `submit` and `resume`: each bound
/// given replaces `[limits]`'s for that run (on `resume`, it raises a run
/// parked over its budget).
#[derive(Args, Debug, Default)]
pub struct BudgetArgs {
    /// Model tokens (input and output) the run may spend, across resumes.
    #[arg(long, value_name = "TOKENS")]
    pub model_tokens_max: Option<u64>,
    /// What the run's model calls may cost, in millionths of a US dollar.
    #[arg(long, value_name = "MICRO_USD")]
    pub model_cost_micro_usd_max: Option<u64>,
}

/// The caller's trace a new run continues.
#[derive(Args, Debug, Default)]
pub struct TraceArgs {
    /// Put the run in this W3C trace context (00-TRACE_ID-SPAN_ID-FLAGS):
    /// its spans are children of that span.
    #[arg(long, env = "TRACEPARENT", value_name = "TRACEPARENT")]
    pub traceparent: Option<String>,
    /// The W3C tracestate that goes with --traceparent, passed on to
    /// receivers.
    #[arg(
        long,
        env = "TRACESTATE",
        value_name = "TRACESTATE",
        requires = "traceparent"
    )]
    pub tracestate: Option<String>,
}

impl TraceArgs {
    fn trace(&self) -> Result<Option<stephost_core::RunTrace>, HostError> {
        self.traceparent
            .as_deref()
            .map(|t| stephost_core::RunTrace::from_traceparent(t, self.tracestate.as_deref()))
            .transpose()
            .map_err(HostError::BadInput)
    }
}

impl BudgetArgs {
    fn budget(&self) -> stephost_core::RunBudget {
        stephost_core::RunBudget {
            model_tokens_max: self.model_tokens_max,
            model_cost_micro_usd_max: self.model_cost_micro_usd_max,
        }
    }
}

/// The arguments of `stephost submit`.
#[derive(Args, Debug)]
pub struct SubmitArgs {
    /// The step: a component for stephost:step/step, a core module with
    /// that world's component type, or a WASI command program.
    pub module: PathBuf,
    /// The input JSON.
    #[arg(long, conflicts_with = "input_file")]
    pub input: Option<String>,
    /// Read the input JSON from a file (`-` for stdin).
    #[arg(long)]
    pub input_file: Option<PathBuf>,
    /// Use this run id (submitting an existing id with the same module
    /// and input returns that run, with the budget it has).
    #[arg(long)]
    pub run_id: Option<String>,
    /// Wait up to this long for the run to end (or to wait for a person or
    /// a timer, or be parked), then print it as `run` does; a run still
    /// pending or running then prints its id and exits 6.
    #[arg(long, value_name = "MS")]
    pub wait: Option<u64>,
    /// With --wait, print the run's row as JSON.
    #[arg(long, requires = "wait")]
    pub json: bool,
    #[command(flatten)]
    pub budget: BudgetArgs,
    #[command(flatten)]
    pub trace: TraceArgs,
}

/// How a worker or server writes its lines on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormatArg {
    Text,
    Json,
}

impl LogFormatArg {
    fn set(self) {
        stephost_runtime::logs::set_format(match self {
            LogFormatArg::Text => stephost_runtime::logs::LogFormat::Text,
            LogFormatArg::Json => stephost_runtime::logs::LogFormat::Json,
        });
    }
}

/// The arguments of `stephost worker`.
#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// Runs executed at once.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Lease of each claim, renewed in the background.
    #[arg(long, default_value_t = 30_000)]
    pub lease_ms: i64,
    /// Owner name in claims (default: host/pid/start-time).
    #[arg(long)]
    pub worker_id: Option<String>,
    /// Exit once nothing is runnable and nothing is active.
    #[arg(long)]
    pub exit_when_idle: bool,
    /// Look for runnable runs at least this often, in ms (default: every
    /// 5,000 ms on a ledger that wakes the worker when a run becomes due,
    /// PostgreSQL or a SQLite file on Linux; every 200 ms otherwise).
    #[arg(long)]
    pub poll_ms: Option<u64>,
    /// How the lines on stderr are written: `text` for people, `json` for a
    /// log pipeline (one object a line: time, level, source, message,
    /// run_id, seq).
    #[arg(long, value_enum, default_value = "text", env = "STEPHOST_LOG_FORMAT")]
    pub log_format: LogFormatArg,
}

/// The arguments of `stephost serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Address and port to listen on.
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub listen: std::net::SocketAddr,
    /// Runs executed at once.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Lease of each claim, renewed in the background.
    #[arg(long, default_value_t = 30_000)]
    pub lease_ms: i64,
    /// Owner name in claims (default: host/pid/start-time).
    #[arg(long)]
    pub worker_id: Option<String>,
    /// The largest module upload (POST /api/modules), in bytes.
    #[arg(long, default_value_t = stephost_server::settings::defaults::MODULE_BYTES_MAX)]
    pub module_bytes_max: usize,
    /// The largest JSON body of any other request, in bytes.
    #[arg(long, default_value_t = stephost_server::settings::defaults::JSON_BODY_BYTES_MAX)]
    pub json_body_bytes_max: usize,
    /// A connection that has not sent a whole request head within this
    /// time (also an idle kept-alive one) is closed.
    #[arg(long, default_value_t = stephost_server::settings::defaults::HEADER_READ_TIMEOUT_MS)]
    pub header_read_timeout_ms: u64,
    /// Connections served at once; more wait to be accepted.
    #[arg(long, default_value_t = stephost_server::settings::defaults::CONNECTIONS_MAX)]
    pub connections_max: usize,
    /// On SIGINT/SIGTERM, requests in flight have this long to finish;
    /// then connections still open are dropped.
    #[arg(long, default_value_t = stephost_server::settings::defaults::SHUTDOWN_GRACE_MS)]
    pub shutdown_grace_ms: u64,
    /// The longest `POST /api/runs?wait=MS` holds its request; a longer
    /// wait asked for is cut to it.
    #[arg(long, default_value_t = stephost_server::settings::defaults::WAIT_MS_MAX)]
    pub wait_ms_max: u64,
    /// The server's worker looks for runnable runs at least this often, in
    /// ms (as `stephost worker --poll-ms`).
    #[arg(long)]
    pub poll_ms: Option<u64>,
    /// How the lines on stderr are written (as `stephost worker
    /// --log-format`).
    #[arg(long, value_enum, default_value = "text", env = "STEPHOST_LOG_FORMAT")]
    pub log_format: LogFormatArg,
}

/// The arguments of `stephost resume`.
#[derive(Args, Debug)]
pub struct ResumeArgs {
    /// The run to continue.
    pub run_id: String,
    /// Insist on this build: refused unless the run is pinned to it.
    #[arg(long)]
    pub module: Option<PathBuf>,
    /// Print the run report as JSON instead of the bare output.
    #[arg(long)]
    pub json: bool,
    /// Raise the run's own model budget first (each bound given).
    #[command(flatten)]
    pub budget: BudgetArgs,
}

/// The arguments of `stephost replay`.
#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// The run to replay (from the ledger).
    #[arg(required_unless_present_any = ["fixture", "fixtures"], conflicts_with = "fixture")]
    pub run_id: Option<String>,
    /// Replay against this module instead of the recorded one.
    #[arg(long)]
    pub module: Option<PathBuf>,
    /// Replay an exported run file (needs --module); no ledger is opened.
    #[arg(long, requires = "module", conflicts_with = "fixtures")]
    pub fixture: Option<PathBuf>,
    /// Replay every exported run (`*.json`) in a folder against --module:
    /// a corpus check for CI; exits 4 if any run diverges.
    #[arg(long, requires = "module", conflicts_with = "run_id")]
    pub fixtures: Option<PathBuf>,
    /// Print the replay report (or, with --fixtures, one per run) as
    /// JSON.
    #[arg(long)]
    pub json: bool,
}

/// The arguments of `stephost upgrade`.
#[derive(Args, Debug)]
pub struct UpgradeArgs {
    /// The run to upgrade.
    #[arg(required_unless_present = "from", conflicts_with = "from")]
    pub run_id: Option<String>,
    /// Upgrade every unfinished run pinned to this module digest.
    #[arg(long)]
    pub from: Option<String>,
    /// The new build.
    #[arg(long)]
    pub module: PathBuf,
    /// Print each run's outcome (moved, or its first divergent call) as
    /// JSON.
    #[arg(long)]
    pub json: bool,
}

/// The arguments of `stephost fork`.
#[derive(Args, Debug)]
pub struct ForkArgs {
    /// The run to fork (it is not changed).
    pub run_id: String,
    /// The first call the fork makes live; the calls before it are kept.
    #[arg(long)]
    pub at: u64,
    /// The build the fork runs (default: the run's own); it must make the
    /// kept calls, as a replay checks before anything is written.
    #[arg(long)]
    pub module: Option<PathBuf>,
    /// The fork's run id (default: a new one).
    #[arg(long = "run-id", value_name = "RUN_ID")]
    pub fork_run_id: Option<String>,
    /// Print the fork's row as JSON.
    #[arg(long)]
    pub json: bool,
}

/// The arguments of `stephost show`.
#[derive(Args, Debug)]
pub struct ShowArgs {
    /// The run to show.
    pub run_id: String,
    /// Print the run, its calls with their attempts, and its log as JSON
    /// (the API's shape).
    #[arg(long)]
    pub json: bool,
}

/// The arguments of `stephost cancel`.
#[derive(Args, Debug)]
pub struct CancelArgs {
    /// The run to cancel, with the runs below it.
    pub run_id: String,
    /// Who cancels (kept in the ledger with the time).
    #[arg(long)]
    pub by: String,
    /// Why, for whoever reads the run later.
    #[arg(long)]
    pub reason: Option<String>,
    /// Print what was cancelled as JSON.
    #[arg(long)]
    pub json: bool,
}

/// The arguments of `stephost prune`.
#[derive(Args, Debug)]
pub struct PruneArgs {
    /// Delete runs (trees, by their root) that finished longer ago than
    /// this: `500ms`, `30s`, `10m`, `2h` or `30d`.
    #[arg(long, value_name = "DURATION")]
    pub finished_before: String,
    /// The roots' statuses to delete (repeat or separate by commas; finished
    /// ones only); default completed, failed and cancelled.
    #[arg(long = "status", value_delimiter = ',')]
    pub statuses: Vec<String>,
    /// Say which runs the first batch would delete, and delete nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Trees deleted in one transaction (a commit waits for one at most).
    #[arg(long, default_value_t = stephost_core::retention::BATCH_RUNS_DEFAULT)]
    pub batch_runs: usize,
    /// Print what was deleted as JSON.
    #[arg(long)]
    pub json: bool,
}

/// The arguments of `stephost promises`.
#[derive(Args, Debug)]
pub struct PromisesArgs {
    /// Print them as JSON.
    #[arg(long)]
    pub json: bool,
}

/// The arguments of `stephost complete`.
#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("completion").required(true).args(["resolve", "reject"])))]
pub struct CompleteArgs {
    /// The promise's token, as the run handed it out.
    pub token: String,
    /// Resolve it with this JSON value.
    #[arg(long)]
    pub resolve: Option<String>,
    /// Reject it with this message.
    #[arg(long)]
    pub reject: Option<String>,
    /// Who completes it (kept in the ledger with the time).
    #[arg(long)]
    pub by: String,
}

/// The arguments of `stephost tree`.
#[derive(Args, Debug)]
pub struct TreeArgs {
    /// The run at the top of the tree shown.
    pub run_id: String,
    /// Print the tree as JSON (the API's shape).
    #[arg(long)]
    pub json: bool,
}

/// The arguments of `stephost runs`.
#[derive(Args, Debug)]
pub struct RunsArgs {
    /// Only runs with this status (pending, running, waiting, completed,
    /// failed, parked, diverged).
    #[arg(long)]
    pub status: Option<String>,
    /// Only runs pinned to this module digest.
    #[arg(long)]
    pub module: Option<String>,
    /// At most this many runs, newest first.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Print the runs as JSON (the API's shape).
    #[arg(long)]
    pub json: bool,
}

/// The arguments of `stephost resolve`.
#[derive(Args, Debug)]
pub struct ResolveArgs {
    /// The parked run.
    pub run_id: String,
    /// The number of its call whose outcome is unknown.
    pub seq: u64,
    /// The operation happened; this JSON is the response the step sees.
    #[arg(long, conflicts_with = "failed", required_unless_present = "failed")]
    pub succeeded: Option<String>,
    /// The operation did not happen; the step sees `rejected` with this message.
    #[arg(long)]
    pub failed: Option<String>,
    /// Who decided (kept in the ledger with the time).
    #[arg(long)]
    pub by: String,
}

/// The arguments of `stephost approvals`.
#[derive(Args, Debug)]
pub struct ApprovalsArgs {
    /// Print them as JSON, with each run's module and the details'
    /// whole sha256.
    #[arg(long)]
    pub json: bool,
}

/// The arguments of `stephost approve`.
#[derive(Args, Debug)]
pub struct ApproveArgs {
    /// The waiting run.
    pub run_id: String,
    /// The number of its approval call, as `stephost approvals` lists it.
    pub seq: u64,
    /// The sha256 of the details approved, as `stephost approvals`
    /// lists it (at least its first 8 characters).
    #[arg(long)]
    pub details: String,
    /// Who decides (kept in the ledger with the time).
    #[arg(long)]
    pub by: String,
    /// Why, for whoever reads the run later (kept in the ledger with the
    /// decision).
    #[arg(long)]
    pub note: Option<String>,
}

/// The arguments of `stephost reject`.
#[derive(Args, Debug)]
pub struct RejectArgs {
    /// The waiting run.
    pub run_id: String,
    /// The number of its approval call, as `stephost approvals` lists it.
    pub seq: u64,
    /// The sha256 of the details rejected (optional; checked when given).
    #[arg(long)]
    pub details: Option<String>,
    /// Who decides (kept in the ledger with the time).
    #[arg(long)]
    pub by: String,
    /// Why, for whoever reads the run later (kept in the ledger with the
    /// decision).
    #[arg(long)]
    pub note: Option<String>,
}

/// The arguments of `stephost verify`.
#[derive(Args, Debug)]
pub struct VerifyArgs {
    /// A run id, or the path of an exported run (`stephost export`).
    pub target: String,
}

/// The arguments of `stephost export`.
#[derive(Args, Debug)]
pub struct ExportArgs {
    /// The run to export.
    pub run_id: String,
}

/// Parses the process arguments, runs the command, returns the exit code.
pub fn main() -> i32 {
    allocator::configure();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
                    exit::OK
                }
                _ => exit::BAD_INPUT,
            };
        }
    };
    match execute(cli) {
        Ok(code) => code,
        Err(e) => {
            stephost_runtime::logs::error("stephost", None, &e);
            e.exit_code()
        }
    }
}

fn load_config(path: Option<&Path>) -> Result<Config, HostError> {
    match path {
        Some(p) => Ok(Config::load(p)?),
        None if Path::new("stephost.toml").exists() => {
            Ok(Config::load(Path::new("stephost.toml"))?)
        }
        None => Ok(Config::default()),
    }
}

/// The compiled-component cache folder: as given, `off` for none, or the
/// user's cache folder.
fn compile_cache_dir(given: Option<&Path>) -> Option<PathBuf> {
    match given {
        Some(p) if p.as_os_str().is_empty() || p == Path::new("off") => None,
        Some(p) => Some(p.to_path_buf()),
        None => std::env::var_os("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .map(|base| base.join("stephost")),
    }
}

fn options(config: &Config) -> Result<HostOptions, HostError> {
    Ok(options_with(config, config.effects()?))
}

fn options_with(config: &Config, effects: stephost_effects::Effects) -> HostOptions {
    HostOptions {
        limits: config.limits.clone(),
        effects,
        log_sink: Some(Arc::new(
            |of: &stephost_runtime::options::RunOfLine<'_>, rec: &LogRecord, replayed: bool| {
                if !replayed {
                    stephost_runtime::logs::step_line(of, rec, print::Safe(&rec.message));
                }
            },
        )),
        cache_dir: config.cache_dir.clone(),
        signer: config.signer.clone(),
        telemetry: config.telemetry.clone(),
        steps: config.steps(),
        ..HostOptions::default()
    }
}

/// For commands that run no step: no effects (and so no secrets) needed.
fn quiet_options(config: &Config) -> HostOptions {
    HostOptions {
        limits: config.limits.clone(),
        cache_dir: config.cache_dir.clone(),
        signer: config.signer.clone(),
        ..HostOptions::default()
    }
}

fn read_input(input: Option<String>, file: Option<PathBuf>) -> Result<String, HostError> {
    Ok(match (input, file) {
        (Some(text), _) => text,
        (None, Some(file)) => String::from_utf8(read_file(&file)?)
            .map_err(|_| HostError::BadInput("the input file is not UTF-8".into()))?,
        (None, None) => "null".to_string(),
    })
}

fn read_file(path: &Path) -> Result<Vec<u8>, HostError> {
    if path == Path::new("-") {
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf).map_err(|source| {
            HostError::Read {
                path: "stdin".into(),
                source,
            }
        })?;
        return Ok(buf);
    }
    std::fs::read(path).map_err(|source| HostError::Read {
        path: path.display().to_string(),
        source,
    })
}

impl Cli {
    /// The ledger the command works on.
    fn ledger(&self) -> Result<Ledger, HostError> {
        match (&self.ledger, &self.db) {
            (Some(url), _) => Ok(Ledger::parse(url)?),
            (None, Some(path)) => Ok(Ledger::sqlite(path)),
            (None, None) => Ok(Ledger::parse(stephost_ledger::DEFAULT_URL)?),
        }
    }
}

/// A host over `ledger`.
fn open(ledger: &Ledger, options: HostOptions) -> Result<Host, HostError> {
    Host::open(ledger.open(PoolOptions::default())?, options)
}

/// The ledger's views alone: what the listing commands read, with no
/// engine built.
fn views(ledger: &Ledger) -> Result<Box<dyn Views>, HostError> {
    Ok(ledger.open(PoolOptions::default())?.views()?)
}

/// What every command is given: the configuration and the ledger.
struct Ctx {
    config: Config,
    ledger: Ledger,
}

fn execute(cli: Cli) -> Result<i32, HostError> {
    let mut config = load_config(cli.config.as_deref())?;
    config.cache_dir = compile_cache_dir(cli.cache_dir.as_deref());
    config.signer = stephost_runtime::config::signer_from_env()?;
    // Commands that record or execute runs report spans, when the
    // environment names a collector; the rest export nothing.
    let telemetry = match &cli.command {
        Command::Run(_)
        | Command::Submit(_)
        | Command::Worker(_)
        | Command::Serve(_)
        | Command::Resume(_) => stephost_runtime::telemetry::Telemetry::from_env()?,
        _ => None,
    };
    config.telemetry = telemetry.clone();
    let ctx = Ctx {
        config,
        ledger: cli.ledger()?,
    };
    let result = command(&ctx, cli.command);
    if let Some(telemetry) = telemetry {
        telemetry.shutdown();
    }
    result
}

fn command(ctx: &Ctx, command: Command) -> Result<i32, HostError> {
    match command {
        Command::Run(args) => run_step(ctx, args),
        Command::Submit(args) => submit(ctx, args),
        Command::Worker(args) => worker(ctx, args),
        Command::Serve(args) => serve(ctx, args),
        Command::Resume(args) => resume(ctx, args),
        Command::Replay(args) => replay(ctx, args),
        Command::Upgrade(args) => upgrade(ctx, args),
        Command::Fork(args) => fork(ctx, args),
        Command::Show(args) => show(ctx, args),
        Command::Tree(args) => tree(ctx, args),
        Command::Cancel(args) => cancel(ctx, args),
        Command::Prune(args) => prune(ctx, args),
        Command::Complete(args) => complete(ctx, args),
        Command::Runs(args) => runs(ctx, args),
        Command::Resolve(args) => resolve(ctx, args),
        Command::Approvals(args) => approvals(ctx, args),
        Command::Promises(args) => promises(ctx, args),
        Command::Approve(args) => approve(ctx, args),
        Command::Reject(args) => reject(ctx, args),
        Command::Verify(args) => verify(ctx, args),
        Command::Metrics => metrics(ctx),
        Command::Export(args) => export(ctx, args),
        Command::Schedule(args) => schedule::schedule(ctx, args),
    }
}

fn run_step(
    ctx: &Ctx,
    RunArgs {
        module,
        input,
        input_file,
        run_id,
        json,
        budget,
        trace,
    }: RunArgs,
) -> Result<i32, HostError> {
    let Ctx { config, ledger } = ctx;
    let input = read_input(input, input_file)?;
    let bytes = read_file(&module)?;
    let mut host = open(ledger, options(config)?)?;
    let report = host.run_with(
        &bytes,
        &module.display().to_string(),
        &input,
        run_id.as_deref(),
        RunOptions {
            budget: budget.budget(),
            trace: trace.trace()?,
        },
    )?;
    Ok(print_run(&report, json))
}

fn submit(
    ctx: &Ctx,
    SubmitArgs {
        module,
        input,
        input_file,
        run_id,
        wait,
        json,
        budget,
        trace,
    }: SubmitArgs,
) -> Result<i32, HostError> {
    let Ctx { config, ledger } = ctx;
    let input = read_input(input, input_file)?;
    let bytes = read_file(&module)?;
    let mut host = open(ledger, options(config)?)?;
    let run = host.submit_with(
        &bytes,
        &module.display().to_string(),
        &input,
        run_id.as_deref(),
        RunOptions {
            budget: budget.budget(),
            trace: trace.trace()?,
        },
    )?;
    let Some(wait) = wait else {
        let _ = writeln!(std::io::stdout().lock(), "{}", run.run_id);
        return Ok(exit::OK);
    };
    let run = service::wait_for_end(
        host.store(),
        &run.run_id,
        std::time::Duration::from_millis(wait),
    )?;
    Ok(crate::print::print_waited(&run, wait, json))
}

fn worker(
    ctx: &Ctx,
    WorkerArgs {
        concurrency,
        lease_ms,
        worker_id,
        exit_when_idle,
        poll_ms,
        log_format,
    }: WorkerArgs,
) -> Result<i32, HostError> {
    log_format.set();
    let Ctx { config, ledger } = ctx;
    // Refuses a bad configuration before claiming anything; every lane
    // shares the effects built here (and so each MCP server).
    let built = options(config)?;
    let shutdown = stop_on_signals()?;
    let worker_options = stephost_runtime::worker::WorkerOptions {
        exit_when_idle,
        retention: config.retention.clone(),
        ..stephost_runtime::worker::WorkerOptions::new(
            concurrency,
            lease_ms,
            worker_id.unwrap_or_else(stephost_runtime::owner::this_process),
        )
        .polling(poll_ms)
    };
    let make = || built.clone();
    let report = stephost_runtime::worker::run(ledger, &make, &worker_options, &shutdown)?;
    print_worker_report("worker", &report, worker_options.concurrency);
    Ok(exit::OK)
}

fn serve(
    ctx: &Ctx,
    ServeArgs {
        listen,
        concurrency,
        lease_ms,
        worker_id,
        module_bytes_max,
        json_body_bytes_max,
        header_read_timeout_ms,
        connections_max,
        shutdown_grace_ms,
        wait_ms_max,
        poll_ms,
        log_format,
    }: ServeArgs,
) -> Result<i32, HostError> {
    log_format.set();
    let Ctx { config, ledger } = ctx;
    // Refuses a bad configuration before serving anything; every lane
    // shares the effects built here (and so each MCP server).
    let built = options(config)?;
    let webhooks = config.webhooks()?;
    let tokens = stephost_server::Tokens::from_env().map_err(HostError::BadInput)?;
    let settings = stephost_server::ServeSettings {
        listen,
        concurrency,
        lease_ms,
        worker_id: worker_id.unwrap_or_else(stephost_runtime::owner::this_process),
        module_bytes_max,
        json_body_bytes_max,
        header_read_timeout_ms,
        connections_max,
        shutdown_grace_ms,
        wait_ms_max,
        poll_ms,
        retention: config.retention.clone(),
        ..stephost_server::ServeSettings::default()
    };
    let shutdown = stop_on_signals()?;
    let make = || built.clone();
    let report = stephost_server::serve(ledger, &make, webhooks, tokens, settings, shutdown)?;
    print_worker_report("serve", &report, concurrency);
    Ok(exit::OK)
}

fn resume(
    ctx: &Ctx,
    ResumeArgs {
        run_id,
        module,
        json,
        budget,
    }: ResumeArgs,
) -> Result<i32, HostError> {
    let Ctx { config, ledger } = ctx;
    let module = match &module {
        Some(path) => Some((read_file(path)?, path.display().to_string())),
        None => None,
    };
    let mut host = open(ledger, options(config)?)?;
    let raised = budget.budget();
    if !raised.is_empty() {
        host.set_budget(&run_id, &raised)?;
    }
    let report = host.resume_with(
        &run_id,
        module.as_ref().map(|(b, w)| (b.as_slice(), w.as_str())),
    )?;
    Ok(print_run(&report, json))
}

fn replay(
    ctx: &Ctx,
    ReplayArgs {
        run_id,
        module,
        fixture,
        fixtures,
        json,
    }: ReplayArgs,
) -> Result<i32, HostError> {
    let Ctx { config, ledger } = ctx;
    // A replay performs nothing: it needs no secret.
    let opts = options_with(config, config.offline_effects()?);
    if let Some(dir) = fixtures {
        let module = module.expect("clap requires --module with --fixtures");
        return replay_corpus(&dir, &module, &opts, json);
    }
    let new_module = match &module {
        Some(path) => Some((read_file(path)?, path.display().to_string())),
        None => None,
    };
    let report = match (fixture, run_id) {
        (Some(file), _) => {
            let fixture = read_fixture(&file)?;
            let (bytes, what) = new_module.expect("clap requires --module with --fixture");
            let engine =
                stephost_runtime::engine::StepEngine::with_disk_cache(opts.cache_dir.as_deref())?;
            replay_fixture(&engine, fixture, &bytes, &what, &opts)?
        }
        (None, Some(run_id)) => {
            let host = open(ledger, opts)?;
            let module = new_module.as_ref().map(|(b, w)| (b.as_slice(), w.as_str()));
            host.replay(&run_id, module)?
        }
        (None, None) => unreachable!("clap requires a run id or --fixture"),
    };
    print_replay(&report, json);
    Ok(report.exit_code())
}

fn upgrade(
    ctx: &Ctx,
    UpgradeArgs {
        run_id,
        from,
        module,
        json,
    }: UpgradeArgs,
) -> Result<i32, HostError> {
    let Ctx { config, ledger } = ctx;
    let bytes = read_file(&module)?;
    let what = module.display().to_string();
    let mut host = open(ledger, options(config)?)?;
    let outcomes = match (run_id, from) {
        (Some(id), _) => vec![host.upgrade(&id, &bytes, &what)?],
        (None, Some(digest)) => service::upgrade_from(&mut host, &digest, &bytes, &what)?,
        (None, None) => unreachable!("clap requires a run id or --from"),
    };
    if json {
        print_json(&outcomes);
    } else {
        print::print_upgrades(&outcomes);
    }
    Ok(if outcomes.iter().all(|o| o.moved) {
        exit::OK
    } else {
        exit::DIVERGED
    })
}

fn fork(
    ctx: &Ctx,
    ForkArgs {
        run_id,
        at,
        module,
        fork_run_id,
        json,
    }: ForkArgs,
) -> Result<i32, HostError> {
    let Ctx { config, ledger } = ctx;
    let bytes = module.as_deref().map(read_file).transpose()?;
    let what = module.as_ref().map(|m| m.display().to_string());
    let mut host = open(ledger, options(config)?)?;
    let forked = host.fork(
        &run_id,
        at,
        bytes.as_deref().zip(what.as_deref()),
        fork_run_id.as_deref(),
    )?;
    if json {
        print_json(&forked);
    } else {
        let _ = writeln!(std::io::stdout().lock(), "{}", forked.run_id);
    }
    Ok(exit::OK)
}

fn show(ctx: &Ctx, ShowArgs { run_id, json }: ShowArgs) -> Result<i32, HostError> {
    let detail = service::run_detail(views(&ctx.ledger)?.as_ref(), &run_id)?;
    if json {
        print_json(&detail);
    } else {
        print_show(&detail);
    }
    Ok(exit::OK)
}

fn complete(
    ctx: &Ctx,
    CompleteArgs {
        token,
        resolve,
        reject,
        by,
    }: CompleteArgs,
) -> Result<i32, HostError> {
    use stephost_core::promises::{self, Completed, Completion, PromiseError, PromiseState};
    let Ctx { config, ledger } = ctx;
    let (state, value) = match (resolve, reject) {
        (Some(json), None) => {
            let value: serde_json::Value = serde_json::from_str(&json)
                .map_err(|e| HostError::BadInput(format!("--resolve is not JSON: {e}")))?;
            (PromiseState::Resolved, value.to_string())
        }
        (None, Some(message)) => (PromiseState::Rejected, message),
        _ => unreachable!("clap requires exactly one of --resolve and --reject"),
    };
    let completion = Completion {
        state,
        value,
        by: by.clone(),
        at_ms: stephost_core::clock::now_ms(),
    };
    let store = ledger.open(PoolOptions::default())?.store()?;
    let completed = promises::complete(store.as_ref(), &config.signer, &token, &completion)
        .map_err(|e| match e {
            PromiseError::Store(e) => HostError::from(e),
            other => HostError::BadInput(other.to_string()),
        })?;
    let (run_id, id) = promises::verify(&config.signer, &token).expect("a completed token");
    match completed {
        Completed::Completed => eprintln!(
            "stephost: promise {id} of run {run_id} {} by {by}; a worker continues the run",
            state.as_str()
        ),
        Completed::Again => eprintln!(
            "stephost: promise {id} of run {run_id} was {} the same way already; nothing changed",
            state.as_str()
        ),
    }
    Ok(exit::OK)
}

fn prune(
    ctx: &Ctx,
    PruneArgs {
        finished_before,
        statuses,
        dry_run,
        batch_runs,
        json,
    }: PruneArgs,
) -> Result<i32, HostError> {
    let Ctx { config, ledger } = ctx;
    let age = schedule::duration_ms(&finished_before).map_err(HostError::BadInput)?;
    let statuses =
        stephost_runtime::retention::parse_statuses(&statuses).map_err(HostError::BadInput)?;
    let mut rule = stephost_core::retention::Rule::new(
        stephost_core::clock::now_ms().saturating_sub(age),
        &statuses,
    )
    .map_err(HostError::BadInput)?;
    rule.batch_runs = batch_runs.max(1);
    let host = open(ledger, options(config)?)?;
    let summary = stephost_core::retention::prune_all(host.retention()?.as_ref(), &rule, dry_run)?;
    let pruned = &summary.pruned;
    if json {
        print_json(&serde_json::json!({
            "dry_run": dry_run,
            "runs": pruned.run_ids.len(),
            "run_ids": pruned.run_ids,
            "bytes": pruned.bytes,
            "reclaimed_bytes": summary.reclaimed_bytes,
        }));
    } else if dry_run {
        println!(
            "would delete {} runs ({} bytes) in the first batch; nothing deleted",
            pruned.run_ids.len(),
            pruned.bytes
        );
        for id in &pruned.run_ids {
            println!("{id}");
        }
    } else {
        println!(
            "deleted {} runs ({} bytes of rows); {} bytes given back to the file system",
            pruned.run_ids.len(),
            pruned.bytes,
            summary.reclaimed_bytes
        );
    }
    Ok(exit::OK)
}

fn cancel(
    ctx: &Ctx,
    CancelArgs {
        run_id,
        by,
        reason,
        json,
    }: CancelArgs,
) -> Result<i32, HostError> {
    let Ctx { config, ledger } = ctx;
    let mut host = open(ledger, options(config)?)?;
    let request = stephost_core::CancelRequest {
        at_ms: stephost_core::clock::now_ms(),
        by,
        reason,
    };
    let cancelled = host.cancel(&run_id, &request)?;
    let runs: Vec<serde_json::Value> = cancelled
        .iter()
        .map(|(id, report)| {
            serde_json::json!({
                "run_id": id,
                "status": report.as_ref().map(|r| r.status.as_str()),
            })
        })
        .collect();
    if json {
        print_json(&serde_json::json!({ "cancelled": runs }));
    } else {
        for (id, report) in &cancelled {
            match report {
                Some(report) => println!("{id} {}", report.status.as_str()),
                None => println!("{id} cancelling: it stops at its next call"),
            }
        }
        if cancelled.is_empty() {
            println!("{run_id} and the runs below it were cancelled already");
        }
    }
    Ok(exit::OK)
}

fn tree(ctx: &Ctx, TreeArgs { run_id, json }: TreeArgs) -> Result<i32, HostError> {
    let tree = service::tree(views(&ctx.ledger)?.as_ref(), &run_id)?;
    if json {
        print_json(&tree);
    } else {
        crate::print::print_tree(&tree);
    }
    Ok(exit::OK)
}

fn runs(
    ctx: &Ctx,
    RunsArgs {
        status,
        module,
        limit,
        json,
    }: RunsArgs,
) -> Result<i32, HostError> {
    let query = RunQuery {
        status: status.as_deref().map(service::parse_status).transpose()?,
        module_digest: module,
        limit,
        ..RunQuery::default()
    };
    let runs = service::runs(views(&ctx.ledger)?.as_ref(), &query)?;
    if json {
        print_json(&runs);
    } else {
        print_runs(&runs);
    }
    Ok(exit::OK)
}

fn resolve(
    ctx: &Ctx,
    ResolveArgs {
        run_id,
        seq,
        succeeded,
        failed,
        by,
    }: ResolveArgs,
) -> Result<i32, HostError> {
    let Ctx { config, ledger } = ctx;
    let resolution = match (succeeded, failed) {
        (Some(response), _) => Resolution::Succeeded(response),
        (None, Some(message)) => Resolution::Failed(message),
        (None, None) => unreachable!("clap requires --succeeded or --failed"),
    };
    let host = open(ledger, quiet_options(config))?;
    let options = host.options();
    service::resolve(
        host.store(),
        &options.signer,
        &options.limits,
        &run_id,
        seq,
        &resolution,
        &by,
    )?;
    eprintln!(
        "stephost: call #{seq} of run {run_id} resolved by {by}; continue it with \
         `stephost resume {run_id}`"
    );
    Ok(exit::OK)
}

fn approvals(ctx: &Ctx, ApprovalsArgs { json }: ApprovalsArgs) -> Result<i32, HostError> {
    let rows = service::approvals(views(&ctx.ledger)?.as_ref())?;
    if json {
        print_json(&rows);
    } else {
        print::print_approvals(&rows);
    }
    Ok(exit::OK)
}

fn promises(ctx: &Ctx, PromisesArgs { json }: PromisesArgs) -> Result<i32, HostError> {
    let rows = service::promises(views(&ctx.ledger)?.as_ref())?;
    if json {
        print_json(&rows);
    } else {
        print::print_promises(&rows);
    }
    Ok(exit::OK)
}

fn approve(
    ctx: &Ctx,
    ApproveArgs {
        run_id,
        seq,
        details,
        by,
        note,
    }: ApproveArgs,
) -> Result<i32, HostError> {
    let Ctx { config, ledger } = ctx;
    decide(
        ledger,
        config,
        &run_id,
        seq,
        &Decision {
            verdict: Verdict::Approved,
            by: &by,
            note: note.as_deref(),
            details_sha256: Some(&details),
        },
    )
}

fn reject(
    ctx: &Ctx,
    RejectArgs {
        run_id,
        seq,
        details,
        by,
        note,
    }: RejectArgs,
) -> Result<i32, HostError> {
    let Ctx { config, ledger } = ctx;
    decide(
        ledger,
        config,
        &run_id,
        seq,
        &Decision {
            verdict: Verdict::Rejected,
            by: &by,
            note: note.as_deref(),
            details_sha256: details.as_deref(),
        },
    )
}

fn verify(ctx: &Ctx, VerifyArgs { target }: VerifyArgs) -> Result<i32, HostError> {
    let path = Path::new(&target);
    let (run_id, verified) = if path.is_file() {
        let fixture = read_fixture(path)?;
        let run = fixture.run_record();
        let verified = service::verify(&ctx.config.signer, &fixture.calls, &run);
        (run.run_id, verified)
    } else {
        let views = views(&ctx.ledger)?;
        let verified = service::verify_in(views.as_ref(), &ctx.config.signer, &target)?;
        (target.clone(), verified)
    };
    let run_id = &run_id;
    let mut out = std::io::stdout().lock();
    match verified {
        Verification::Intact {
            calls,
            links,
            signed,
        } => {
            let how = if signed {
                "signed with the chain key; the run's row matches its seal"
            } else {
                "UNSIGNED: a plain hash chain, which anyone who can write the ledger can \
                 redo (set STEPHOST_CHAIN_KEY_FILE when recording); the run's row matches \
                 its seal"
            };
            let _ = writeln!(
                out,
                "intact: run {run_id}, {calls} call(s), {links} chain link(s) verified; \
                 {how}"
            );
            Ok(exit::OK)
        }
        Verification::Broken { seq, reason } => {
            let at = seq
                .map(|s| format!("call #{s}"))
                .unwrap_or("its row".into());
            let _ = writeln!(
                out,
                "broken: run {run_id}, {at}: {reason}; the recording was changed or \
                 damaged after it was written"
            );
            Ok(exit::DIVERGED)
        }
        // Nothing is known to be changed, so it is not called broken.
        Verification::NeedsKey { reason } => {
            let _ = writeln!(out, "not checked: run {run_id}: {reason}");
            Ok(exit::DIVERGED)
        }
    }
}

fn metrics(ctx: &Ctx) -> Result<i32, HostError> {
    let text = stephost_runtime::metrics::render(views(&ctx.ledger)?.as_ref())?;
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    Ok(exit::OK)
}

fn export(ctx: &Ctx, ExportArgs { run_id }: ExportArgs) -> Result<i32, HostError> {
    print_json(&service::export(views(&ctx.ledger)?.as_ref(), &run_id)?);
    Ok(exit::OK)
}

/// Sets the flag returned on SIGINT or SIGTERM.
fn stop_on_signals() -> Result<Arc<std::sync::atomic::AtomicBool>, HostError> {
    let shutdown = Arc::new(std::sync::atomic::AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, shutdown.clone())
            .map_err(|e| HostError::Internal(format!("cannot handle signals: {e}")))?;
    }
    Ok(shutdown)
}

/// What a worker (or a server's worker) did, on stderr.
fn print_worker_report(
    command: &str,
    report: &stephost_runtime::worker::WorkerReport,
    concurrency: usize,
) {
    // Only a worker that runs several runs at once groups its commits.
    let shared = if concurrency > 1 {
        let c = &report.commits;
        format!(
            "; {} commits in {} transactions and {} fsyncs",
            c.commits, c.transactions, c.fsyncs
        )
    } else {
        String::new()
    };
    stephost_runtime::logs::info(
        command,
        None,
        format_args!(
            "{} completed, {} failed, {} parked, {} cancelled, {} released, {} abandoned, {} claim \
             conflicts, {} lease losses, {} schedule slot(s) fired{shared}",
            report.completed,
            report.failed,
            report.parked,
            report.cancelled,
            report.released,
            report.abandoned,
            report.claim_conflicts,
            report.lease_losses,
            report.scheduled,
        ),
    );
}

/// An exported run read from `path`.
fn read_fixture(path: &Path) -> Result<Fixture, HostError> {
    let text = String::from_utf8(read_file(path)?)
        .map_err(|_| HostError::BadInput(format!("{} is not UTF-8", path.display())))?;
    Fixture::parse(&text).map_err(|e| HostError::BadInput(format!("{}: {e}", path.display())))
}

/// Replays every fixture in `dir` against `module` and reports per run.
fn replay_corpus(
    dir: &Path,
    module: &Path,
    opts: &HostOptions,
    json: bool,
) -> Result<i32, HostError> {
    let bytes = read_file(module)?;
    let what = module.display().to_string();
    let engine = stephost_runtime::engine::StepEngine::with_disk_cache(opts.cache_dir.as_deref())?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|source| HostError::Read {
            path: dir.display().to_string(),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(HostError::BadInput(format!(
            "{} holds no exported runs (*.json); write them with `stephost export RUN_ID > FILE.json`",
            dir.display()
        )));
    }
    let mut code = exit::OK;
    let mut reports = Vec::new();
    for file in &files {
        let report = replay_fixture(&engine, read_fixture(file)?, &bytes, &what, opts)?;
        let this = report.exit_code();
        if this == exit::DIVERGED || (this != exit::OK && code == exit::OK) {
            code = this;
        }
        if !json {
            let _ = write!(std::io::stdout().lock(), "{}: ", file.display());
            print_replay(&report, false);
        }
        reports.push(serde_json::json!({ "file": file.display().to_string(), "report": report }));
    }
    if json {
        print_json(&reports);
    } else {
        let diverged = reports
            .iter()
            .filter(|r| {
                matches!(
                    r["report"]["result"].as_str(),
                    Some("diverged" | "output_differs" | "end_differs")
                )
            })
            .count();
        eprintln!(
            "stephost: {} run(s) replayed, {diverged} diverged",
            reports.len()
        );
    }
    Ok(code)
}

fn decide(
    ledger: &Ledger,
    config: &Config,
    run_id: &str,
    seq: u64,
    decision: &Decision<'_>,
) -> Result<i32, HostError> {
    let host = open(ledger, quiet_options(config))?;
    service::decide(host.store(), &host.options().signer, run_id, seq, decision)?;
    eprintln!(
        "stephost: call #{seq} of run {run_id} {} by {}; a worker or \
         `stephost resume {run_id}` continues the run",
        decision.verdict.as_str(),
        decision.by
    );
    Ok(exit::OK)
}
