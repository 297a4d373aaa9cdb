//! The `stephost` command line. Thin: parses arguments, loads configuration,
//! calls the library, prints, and maps the result to an exit code
//! (see [`crate::error::exit`]).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::{Parser, Subcommand};
use serde::Serialize;

use crate::config::Config;
use crate::error::{HostError, exit};
use crate::ledger::{AttemptRecord, CallRecord, LogRecord, RunRecord, RunStatus};
use crate::replay::{Fixture, ReplayReport, ReplayVerdict};
use crate::runner::{Host, HostOptions, Resolution, RunReport, replay_fixture};

#[derive(Parser, Debug)]
#[command(
    name = "stephost",
    version,
    about = "Runs agent steps as sandboxed WebAssembly components and makes them durable",
    after_help = "Exit codes: 0 ok, 1 internal error, 2 usage or bad input, 3 step failed, \
                  4 divergence, 5 run parked (needs a person), 6 run claimed elsewhere, \
                  7 run waiting (timer or approval)"
)]
pub struct Cli {
    /// The ledger (SQLite file); created if absent.
    #[arg(
        long,
        global = true,
        env = "STEPHOST_DB",
        default_value = "stephost.db"
    )]
    pub db: PathBuf,
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
    Run {
        /// The step: a component for stephost:step/step, a core module with
        /// that world's component type, or a WASI command program.
        module: PathBuf,
        /// The input JSON.
        #[arg(long, conflicts_with = "input_file")]
        input: Option<String>,
        /// Read the input JSON from a file (`-` for stdin).
        #[arg(long)]
        input_file: Option<PathBuf>,
        /// Use this run id (re-running an existing id continues that run).
        #[arg(long)]
        run_id: Option<String>,
        /// Print the run report as JSON instead of the bare output.
        #[arg(long)]
        json: bool,
    },
    /// Record a run for a worker to execute; prints its run id.
    Submit {
        module: PathBuf,
        #[arg(long, conflicts_with = "input_file")]
        input: Option<String>,
        #[arg(long)]
        input_file: Option<PathBuf>,
        #[arg(long)]
        run_id: Option<String>,
    },
    /// Claim runnable runs and execute them until stopped (SIGINT/SIGTERM:
    /// stop claiming, let active runs reach their next call, release them).
    Worker {
        /// Runs executed at once.
        #[arg(long, default_value_t = 4)]
        concurrency: usize,
        /// Lease of each claim, renewed in the background.
        #[arg(long, default_value_t = 30_000)]
        lease_ms: i64,
        /// Owner name in claims (default: host/pid/start-time).
        #[arg(long)]
        worker_id: Option<String>,
        /// Exit once nothing is runnable and nothing is active.
        #[arg(long)]
        exit_when_idle: bool,
    },
    /// Continue an interrupted run: replay its recorded calls, then go live.
    Resume {
        run_id: String,
        /// Insist on this build: refused unless the run is pinned to it.
        #[arg(long)]
        module: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Replay a recorded run offline (no I/O) and report the first divergence.
    Replay {
        /// The run to replay (from the ledger).
        #[arg(required_unless_present_any = ["fixture", "fixtures"], conflicts_with = "fixture")]
        run_id: Option<String>,
        /// Replay against this module instead of the recorded one.
        #[arg(long)]
        module: Option<PathBuf>,
        /// Replay an exported run file (needs --module); no ledger is opened.
        #[arg(long, requires = "module", conflicts_with = "fixtures")]
        fixture: Option<PathBuf>,
        /// Replay every exported run (`*.json`) in a folder against --module:
        /// a corpus check for CI; exits 4 if any run diverges.
        #[arg(long, requires = "module", conflicts_with = "run_id")]
        fixtures: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Move unfinished runs to a new build of their step: replays each run's
    /// history against it with no I/O and repins only runs that match.
    Upgrade {
        /// The run to upgrade.
        #[arg(required_unless_present = "from", conflicts_with = "from")]
        run_id: Option<String>,
        /// Upgrade every unfinished run pinned to this module digest.
        #[arg(long)]
        from: Option<String>,
        /// The new build.
        #[arg(long)]
        module: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Show a run and its call timeline.
    Show {
        run_id: String,
        #[arg(long)]
        json: bool,
    },
    /// List runs.
    Runs {
        /// Only runs with this status (running, completed, failed, parked, diverged).
        #[arg(long)]
        status: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Decide the outcome of a call parked as unknown, after checking with the
    /// receiver by hand; then `stephost resume` continues the run.
    Resolve {
        run_id: String,
        seq: u64,
        /// The operation happened; this JSON is the response the step sees.
        #[arg(long, conflicts_with = "failed", required_unless_present = "failed")]
        succeeded: Option<String>,
        /// The operation did not happen; the step sees `rejected` with this message.
        #[arg(long)]
        failed: Option<String>,
        /// Who decided (kept in the ledger with the time).
        #[arg(long)]
        by: String,
    },
    /// List approvals waiting for a decision.
    Approvals {
        #[arg(long)]
        json: bool,
    },
    /// Approve a waiting approval call; a worker (or `stephost resume`) then
    /// continues the run.
    Approve {
        run_id: String,
        seq: u64,
        #[arg(long)]
        by: String,
        #[arg(long)]
        note: Option<String>,
    },
    /// Reject a waiting approval call.
    Reject {
        run_id: String,
        seq: u64,
        #[arg(long)]
        by: String,
        #[arg(long)]
        note: Option<String>,
    },
    /// Check the tamper-evident chain of a run in the ledger, or of an
    /// exported run file.
    Verify {
        /// A run id, or the path of an exported run (`stephost export`).
        target: String,
    },
    /// Print metrics in the Prometheus text format.
    Metrics,
    /// Write a run as a portable JSON fixture to stdout.
    Export { run_id: String },
}

/// Parses the process arguments, runs the command, returns the exit code.
pub fn main() -> i32 {
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
            eprintln!("stephost: {e}");
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
    Ok(HostOptions {
        limits: config.limits.clone(),
        effects: config.effects()?,
        log_sink: Some(Arc::new(|run_id: &str, rec: &LogRecord, replayed: bool| {
            if !replayed {
                eprintln!("[{run_id}] {}: {}", rec.level, rec.message);
            }
        })),
        cache_dir: config.cache_dir.clone(),
        ..HostOptions::default()
    })
}

/// For commands that run no step: no effects (and so no secrets) needed.
fn quiet_options(config: &Config) -> HostOptions {
    HostOptions {
        limits: config.limits.clone(),
        cache_dir: config.cache_dir.clone(),
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

fn execute(cli: Cli) -> Result<i32, HostError> {
    let mut config = load_config(cli.config.as_deref())?;
    config.cache_dir = compile_cache_dir(cli.cache_dir.as_deref());
    match cli.command {
        Command::Run {
            module,
            input,
            input_file,
            run_id,
            json,
        } => {
            let input = read_input(input, input_file)?;
            let bytes = read_file(&module)?;
            let mut host = Host::open(&cli.db, options(&config)?)?;
            let report = host.run(
                &bytes,
                &module.display().to_string(),
                &input,
                run_id.as_deref(),
            )?;
            Ok(print_run(&report, json))
        }
        Command::Submit {
            module,
            input,
            input_file,
            run_id,
        } => {
            let input = read_input(input, input_file)?;
            let bytes = read_file(&module)?;
            let mut host = Host::open(&cli.db, options(&config)?)?;
            let run = host.submit(
                &bytes,
                &module.display().to_string(),
                &input,
                run_id.as_deref(),
            )?;
            let _ = writeln!(std::io::stdout().lock(), "{}", run.run_id);
            Ok(exit::OK)
        }
        Command::Worker {
            concurrency,
            lease_ms,
            worker_id,
            exit_when_idle,
        } => {
            options(&config)?; // refuse a bad configuration before claiming anything
            let shutdown = Arc::new(std::sync::atomic::AtomicBool::new(false));
            for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
                signal_hook::flag::register(signal, shutdown.clone())
                    .map_err(|e| HostError::Internal(format!("cannot handle signals: {e}")))?;
            }
            let worker_options = crate::worker::WorkerOptions {
                concurrency: concurrency.max(1),
                lease_ms: lease_ms.max(100),
                worker_id: worker_id.unwrap_or_else(crate::owner::this_process),
                exit_when_idle,
                ..crate::worker::WorkerOptions::default()
            };
            let make = || {
                let mut o = options(&config).unwrap_or_default();
                o.owner = worker_options.worker_id.clone();
                o.lease_ms = worker_options.lease_ms;
                o
            };
            let report = crate::worker::run(&cli.db, &make, &worker_options, &shutdown)?;
            // Only a worker that runs several runs at once has a group committer.
            let shared = if worker_options.concurrency > 1 {
                let c = &report.commits;
                format!(
                    "; {} commits in {} transactions and {} fsyncs",
                    c.commits, c.transactions, c.fsyncs
                )
            } else {
                String::new()
            };
            eprintln!(
                "stephost worker: {} completed, {} failed, {} parked, {} released, {} abandoned, \
                 {} claim conflicts, {} lease losses{shared}",
                report.completed,
                report.failed,
                report.parked,
                report.released,
                report.abandoned,
                report.claim_conflicts,
                report.lease_losses,
            );
            Ok(exit::OK)
        }
        Command::Resume {
            run_id,
            module,
            json,
        } => {
            let module = match &module {
                Some(path) => Some((read_file(path)?, path.display().to_string())),
                None => None,
            };
            let mut host = Host::open(&cli.db, options(&config)?)?;
            let report = host.resume_with(
                &run_id,
                module.as_ref().map(|(b, w)| (b.as_slice(), w.as_str())),
            )?;
            Ok(print_run(&report, json))
        }
        Command::Replay {
            run_id,
            module,
            fixture,
            fixtures,
            json,
        } => {
            let opts = options(&config)?;
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
                    let text = String::from_utf8(read_file(&file)?).map_err(|_| {
                        HostError::BadInput(format!("{} is not UTF-8", file.display()))
                    })?;
                    let fixture = Fixture::parse(&text)
                        .map_err(|e| HostError::BadInput(format!("{}: {e}", file.display())))?;
                    let (bytes, what) = new_module.expect("clap requires --module with --fixture");
                    let engine =
                        crate::engine::StepEngine::with_disk_cache(opts.cache_dir.as_deref())?;
                    replay_fixture(&engine, fixture, &bytes, &what, &opts)?
                }
                (None, Some(run_id)) => {
                    let host = Host::open(&cli.db, opts)?;
                    let module = new_module.as_ref().map(|(b, w)| (b.as_slice(), w.as_str()));
                    host.replay(&run_id, module)?
                }
                (None, None) => unreachable!("clap requires a run id or --fixture"),
            };
            print_replay(&report, json);
            Ok(report.exit_code())
        }
        Command::Upgrade {
            run_id,
            from,
            module,
            json,
        } => {
            let bytes = read_file(&module)?;
            let what = module.display().to_string();
            let mut host = Host::open(&cli.db, options(&config)?)?;
            let targets: Vec<String> = match (run_id, from) {
                (Some(id), _) => vec![id],
                (None, Some(digest)) => host
                    .ledger()
                    .runs(None)?
                    .into_iter()
                    .filter(|r| r.module_digest == digest && !r.status.is_final())
                    .map(|r| r.run_id)
                    .collect(),
                (None, None) => unreachable!("clap requires a run id or --from"),
            };
            let mut outcomes = Vec::new();
            for id in &targets {
                outcomes.push(host.upgrade(id, &bytes, &what)?);
            }
            if json {
                print_json(&outcomes);
            } else {
                let mut out = std::io::stdout().lock();
                for o in &outcomes {
                    let _ = if o.moved {
                        writeln!(
                            out,
                            "moved      {}  {} -> {}",
                            o.run_id,
                            &o.from[..12],
                            &o.to[..12]
                        )
                    } else {
                        writeln!(out, "not moved  {}  (stays on {})", o.run_id, &o.from[..12])
                    };
                    if !o.moved {
                        drop(out);
                        print_replay(&o.report, false);
                        out = std::io::stdout().lock();
                    }
                }
                if outcomes.is_empty() {
                    let _ = writeln!(out, "no unfinished runs to upgrade");
                }
            }
            Ok(if outcomes.iter().all(|o| o.moved) {
                exit::OK
            } else {
                exit::DIVERGED
            })
        }
        Command::Show { run_id, json } => {
            let host = Host::open(&cli.db, quiet_options(&config))?;
            let ledger = host.ledger();
            let run = ledger.run(&run_id)?;
            let calls = ledger.calls(&run_id)?;
            let attempts = ledger.attempts(&run_id)?;
            let logs = ledger.logs(&run_id)?;
            if json {
                print_json(&RunDetail {
                    run: &run,
                    tokens_total: tokens_total(&calls),
                    calls: &calls,
                    attempts: &attempts,
                    logs: &logs,
                });
            } else {
                print_show(&run, &calls, &attempts, &logs);
            }
            Ok(exit::OK)
        }
        Command::Runs { status, json } => {
            let status = match status.as_deref() {
                None => None,
                Some(s) => Some(RunStatus::parse(s).ok_or_else(|| {
                    HostError::BadInput(format!(
                        "unknown status {s:?}; use running, completed, failed, parked or diverged"
                    ))
                })?),
            };
            let host = Host::open(&cli.db, quiet_options(&config))?;
            let runs = host.ledger().runs(status)?;
            if json {
                print_json(&runs);
            } else {
                print_runs(&runs);
            }
            Ok(exit::OK)
        }
        Command::Resolve {
            run_id,
            seq,
            succeeded,
            failed,
            by,
        } => {
            let resolution = match (succeeded, failed) {
                (Some(response), _) => Resolution::Succeeded(response),
                (None, Some(message)) => Resolution::Failed(message),
                (None, None) => unreachable!("clap requires --succeeded or --failed"),
            };
            let mut host = Host::open(&cli.db, quiet_options(&config))?;
            host.resolve(&run_id, seq, resolution, &by)?;
            eprintln!(
                "stephost: call #{seq} of run {run_id} resolved by {by}; continue it with \
                 `stephost resume {run_id}`"
            );
            Ok(exit::OK)
        }
        Command::Approvals { json } => {
            let host = Host::open(&cli.db, quiet_options(&config))?;
            let pending = host.ledger().pending_approvals()?;
            let rows: Vec<serde_json::Value> = pending
                .iter()
                .map(|(run, call)| {
                    let request: serde_json::Value =
                        serde_json::from_str(&call.request).unwrap_or_default();
                    serde_json::json!({
                        "run_id": run.run_id,
                        "seq": call.seq,
                        "subject": request["subject"],
                        "details": request["details"],
                        "details_sha256": request["details_sha256"],
                        "module_digest": run.module_digest,
                        "asked_at_ms": call.started_at_ms,
                        "expires_at_ms": crate::imports::approvals::expires_at_ms(call),
                    })
                })
                .collect();
            if json {
                print_json(&rows);
            } else {
                let mut out = std::io::stdout().lock();
                let _ = writeln!(
                    out,
                    "{:<26} {:>5}  {:<24} {:<24} {:<14} SUBJECT",
                    "RUN", "SEQ", "ASKED", "EXPIRES", "DETAILS"
                );
                for r in &rows {
                    let _ = writeln!(
                        out,
                        "{:<26} {:>5}  {:<24} {:<24} {:<14} {}",
                        r["run_id"].as_str().unwrap_or(""),
                        r["seq"],
                        format_time(r["asked_at_ms"].as_i64().unwrap_or(0)),
                        format_time(r["expires_at_ms"].as_i64().unwrap_or(0)),
                        &r["details_sha256"].as_str().unwrap_or("")[..12],
                        r["subject"].as_str().unwrap_or("")
                    );
                }
            }
            Ok(exit::OK)
        }
        Command::Approve {
            run_id,
            seq,
            by,
            note,
        } => decide(
            &cli.db,
            &config,
            &run_id,
            seq,
            "approved",
            &by,
            note.as_deref(),
        ),
        Command::Reject {
            run_id,
            seq,
            by,
            note,
        } => decide(
            &cli.db,
            &config,
            &run_id,
            seq,
            "rejected",
            &by,
            note.as_deref(),
        ),
        Command::Verify { target } => {
            let path = Path::new(&target);
            let (run_id, calls) = if path.is_file() {
                let text = String::from_utf8(read_file(path)?)
                    .map_err(|_| HostError::BadInput(format!("{target} is not UTF-8")))?;
                let fixture = Fixture::parse(&text)
                    .map_err(|e| HostError::BadInput(format!("{target}: {e}")))?;
                (fixture.run_id, fixture.calls)
            } else {
                let host = Host::open(&cli.db, quiet_options(&config))?;
                let calls = host.ledger().calls(&target)?;
                (target.clone(), calls)
            };
            match crate::ledger::chain::verify(&calls) {
                Ok(links) => {
                    let _ = writeln!(
                        std::io::stdout().lock(),
                        "intact: run {run_id}, {} call(s), {links} chain link(s) verified",
                        calls.len()
                    );
                    Ok(exit::OK)
                }
                Err((seq, reason)) => {
                    let _ = writeln!(
                        std::io::stdout().lock(),
                        "broken: run {run_id}, call #{seq}: {reason}; the recording was changed \
                         or damaged after it was written"
                    );
                    Ok(exit::DIVERGED)
                }
            }
        }
        Command::Metrics => {
            let host = Host::open(&cli.db, quiet_options(&config))?;
            let text = crate::metrics::render(host.ledger())?;
            let _ = std::io::stdout().lock().write_all(text.as_bytes());
            Ok(exit::OK)
        }
        Command::Export { run_id } => {
            let host = Host::open(&cli.db, quiet_options(&config))?;
            print_json(&host.export(&run_id)?);
            Ok(exit::OK)
        }
    }
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
    let engine = crate::engine::StepEngine::with_disk_cache(opts.cache_dir.as_deref())?;
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
        let text = String::from_utf8(read_file(file)?)
            .map_err(|_| HostError::BadInput(format!("{} is not UTF-8", file.display())))?;
        let fixture = Fixture::parse(&text)
            .map_err(|e| HostError::BadInput(format!("{}: {e}", file.display())))?;
        let report = replay_fixture(&engine, fixture, &bytes, &what, opts)?;
        let this = report.exit_code();
        if this == exit::DIVERGED || (this != exit::OK && code == exit::OK) {
            code = this;
        }
        if !json {
            let mut out = std::io::stdout().lock();
            let _ = write!(out, "{}: ", file.display());
            drop(out);
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
    db: &Path,
    config: &Config,
    run_id: &str,
    seq: u64,
    verdict: &str,
    by: &str,
    note: Option<&str>,
) -> Result<i32, HostError> {
    if by.trim().is_empty() {
        return Err(HostError::BadInput("--by must name who decided".into()));
    }
    let mut host = Host::open(db, quiet_options(config))?;
    let now = crate::clock::now_ms();
    let decision = crate::imports::approvals::decision_json(verdict, by, note, now);
    let outcome = crate::journal::Outcome::Ok(serde_json::Value::String(decision.to_string()));
    host.ledger_mut()
        .decide_approval(run_id, seq, &outcome.to_json(), by, now)?;
    eprintln!(
        "stephost: call #{seq} of run {run_id} {verdict} by {by}; a worker or \
         `stephost resume {run_id}` continues the run"
    );
    Ok(exit::OK)
}

#[derive(Serialize)]
struct RunDetail<'a> {
    run: &'a RunRecord,
    tokens_total: u64,
    calls: &'a [CallRecord],
    attempts: &'a [AttemptRecord],
    logs: &'a [LogRecord],
}

fn print_json<T: Serialize>(value: &T) {
    let text =
        serde_json::to_string_pretty(value).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"));
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{text}");
}

/// The exit code for how a run ended.
pub fn run_exit_code(status: RunStatus) -> i32 {
    match status {
        RunStatus::Completed => exit::OK,
        RunStatus::Failed => exit::STEP_FAILED,
        RunStatus::Parked => exit::PARKED,
        RunStatus::Diverged => exit::DIVERGED,
        // A run left running was released or abandoned by this process.
        RunStatus::Waiting => exit::WAITING,
        RunStatus::Pending | RunStatus::Running => exit::CLAIMED,
    }
}

fn print_run(report: &RunReport, json: bool) -> i32 {
    if json {
        print_json(report);
    } else if let Some(output) = &report.output {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{output}");
    }
    let s = &report.stats;
    match report.status {
        RunStatus::Completed => eprintln!(
            "stephost: run {} completed ({} calls performed, {} replayed)",
            report.run_id, s.live, s.replayed
        ),
        RunStatus::Waiting => eprintln!(
            "stephost: run {} is waiting{}; a worker or `stephost resume {}` continues it when \
             due or decided (`stephost approvals` lists pending approvals)",
            report.run_id,
            report
                .wake_at_ms
                .map(|t| format!(" until {}", format_time(t)))
                .unwrap_or_default(),
            report.run_id
        ),
        RunStatus::Parked => eprintln!(
            "stephost: run {} is parked and needs a person: {}\n  \
             check the receiver by hand, then `stephost resolve {} SEQ --succeeded JSON | \
             --failed MESSAGE --by NAME` and `stephost resume {}`",
            report.run_id,
            report.error.as_deref().unwrap_or(""),
            report.run_id,
            report.run_id
        ),
        status => eprintln!(
            "stephost: run {} {}: {}",
            report.run_id,
            status.as_str(),
            report.error.as_deref().unwrap_or("")
        ),
    }
    run_exit_code(report.status)
}

fn print_replay(report: &ReplayReport, json: bool) {
    if json {
        print_json(report);
        return;
    }
    let mut out = std::io::stdout().lock();
    let _ = match &report.verdict {
        ReplayVerdict::Consistent { calls, output } => {
            let _ = writeln!(
                out,
                "consistent: run {} replayed {calls} call(s) with no divergence",
                report.run_id
            );
            match output {
                Some(o) => writeln!(out, "output: {o}"),
                None => Ok(()),
            }
        }
        ReplayVerdict::Incomplete { calls, reason } => writeln!(
            out,
            "consistent so far: run {} is unfinished; {calls} recorded call(s) matched; {reason}",
            report.run_id
        ),
        ReplayVerdict::Diverged { divergence } => {
            writeln!(out, "divergence in run {}: {divergence}", report.run_id)
        }
        ReplayVerdict::OutputDiffers { recorded, new } => writeln!(
            out,
            "divergence in run {}: same calls, different output\n  recorded: {recorded}\n  new:      {new}",
            report.run_id
        ),
        ReplayVerdict::EndDiffers { recorded, new } => writeln!(
            out,
            "divergence in run {}: same calls, different end\n  recorded: {recorded}\n  new:      {new}",
            report.run_id
        ),
        ReplayVerdict::StepFailed { error } => {
            writeln!(out, "replay of run {} failed: {error}", report.run_id)
        }
    };
}

fn print_runs(runs: &[RunRecord]) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "{:<26} {:<10} {:<14} {:<24} {:<6} {:<24} OWNER",
        "RUN", "STATUS", "MODULE", "UPDATED", "FENCE", "LEASE UNTIL"
    );
    for run in runs {
        let _ = writeln!(
            out,
            "{:<26} {:<10} {:<14} {:<24} {:<6} {:<24} {}",
            run.run_id,
            run.status.as_str(),
            &run.module_digest[..12.min(run.module_digest.len())],
            format_time(run.updated_at_ms),
            run.fence,
            run.lease_until_ms
                .map(format_time)
                .unwrap_or_else(|| "-".into()),
            run.owner.as_deref().unwrap_or("-")
        );
    }
}

/// Model tokens spent by a run's recorded completions.
fn tokens_total(calls: &[CallRecord]) -> u64 {
    calls
        .iter()
        .filter(|c| c.interface == crate::imports::llm::INTERFACE)
        .filter_map(|c| c.outcome.as_deref())
        .filter_map(|o| serde_json::from_str::<serde_json::Value>(o).ok())
        .filter_map(|o| {
            o.get("ok")
                .and_then(|v| v.as_str())
                .and_then(crate::effects::llm::total_tokens)
        })
        .sum()
}

/// A call's display name: the effect name, or `interface function`.
fn call_name(call: &CallRecord) -> String {
    if call.interface == crate::imports::effects::INTERFACE {
        call.function.clone()
    } else {
        let short = call.interface.trim_start_matches("stephost:step/");
        format!("{short}.{}", call.function)
    }
}

fn print_show(
    run: &RunRecord,
    calls: &[CallRecord],
    attempts: &[AttemptRecord],
    logs: &[LogRecord],
) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "run      {}", run.run_id);
    let _ = writeln!(out, "status   {}", run.status.as_str());
    let _ = writeln!(out, "module   {}", run.module_digest);
    let _ = writeln!(
        out,
        "step     {} ({})",
        run.step.as_deref().unwrap_or("(no declared version)"),
        run.world
    );
    let _ = writeln!(out, "created  {}", format_time(run.created_at_ms));
    let _ = writeln!(out, "updated  {}", format_time(run.updated_at_ms));
    let _ = writeln!(
        out,
        "owner    {} (fence {})",
        run.owner.as_deref().unwrap_or("-"),
        run.fence
    );
    let _ = writeln!(out, "input    {}", run.input);
    if let Some(o) = &run.output {
        let _ = writeln!(out, "output   {o}");
    }
    if let Some(code) = run.exit_code {
        let _ = writeln!(out, "exit     {code}");
    }
    if let Some(e) = &run.error {
        let _ = writeln!(out, "error    {e}");
    }
    let tokens = tokens_total(calls);
    if tokens > 0 {
        let _ = writeln!(
            out,
            "tokens   {tokens} (model completions; a replay spends none)"
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:>5}  {:<8} {:<32} {:<10} {:<14} {:>8} {:>4}",
        "SEQ", "CLASS", "CALL", "STATE", "OPERATION", "MS", "TRY"
    );
    for call in calls {
        let tries = attempts.iter().filter(|a| a.seq == call.seq).count();
        let ms = call
            .finished_at_ms
            .map(|f| (f - call.started_at_ms).to_string())
            .unwrap_or_else(|| "-".into());
        let _ = writeln!(
            out,
            "{:>5}  {:<8} {:<32} {:<10} {:<14} {:>8} {:>4}",
            call.seq,
            call.class.as_str(),
            call_name(call),
            call.state.as_str(),
            if call.operation_id.is_empty() {
                "-"
            } else {
                &call.operation_id[..12.min(call.operation_id.len())]
            },
            ms,
            tries
        );
    }
    if !logs.is_empty() {
        let _ = writeln!(out, "\nlog");
        for log in logs {
            let _ = writeln!(
                out,
                "  after #{:<4} {:<5} {}",
                log.after_seq, log.level, log.message
            );
        }
    }
}

use crate::clock::format_time;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_printed_in_utc() {
        assert_eq!(format_time(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_time(1_795_941_296_789), "2026-11-29T08:34:56.789Z");
        assert_eq!(format_time(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }
}
