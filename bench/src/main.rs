//! `stephost-bench`: the cost of durability, measured against the physical
//! floor (one fsync'd SQLite commit) on the same disk, in one run; with
//! `--ab`, the same suite of this build and of another, in turn.
//!
//! It builds nothing: it expects the benchmark guest at
//! `target/guest-wasm/wasm32-wasip2/release/bench_guest.wasm` (or `--guest`)
//! and, for the CLI cold start, the `stephost` binary next to its own
//! executable (or `--cli`). See `bench/README.md`.

mod ab;
mod binary;
mod conversation;
mod floor;
mod postgres;
mod procstat;
mod report;
mod server;
mod web;

use std::error::Error;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use stephost_core::RunStatus;
use stephost_core::store::Opener;
use stephost_core::store::PoolOptions;
use stephost_ledger::Ledger;
use stephost_runtime::HostOptions;
use stephost_runtime::config::Config;
use stephost_runtime::replay::ReplayVerdict;
use stephost_runtime::runner::{Host, RunReport};
use stephost_runtime::worker::{self, WorkerOptions, WorkerReport};

use crate::floor::floor_us;
use crate::report::Row;

type Res<T> = Result<T, Box<dyn Error>>;

/// Name of the guest in error messages.
const WHAT: &str = "bench_guest.wasm";

// The counts. The whole suite must finish in well under a minute or two on
// 2 cores (an A/B runs it, and another build's, twice each).
/// Runs of writes made before figure 1, until one leaves the ledger's WAL
/// no larger than it found it; at most `WARMUP_ROUNDS_MAX` of them.
const WARMUP_WRITES: u64 = 400;
const WARMUP_ROUNDS_MAX: u64 = 10;
/// Figure 1: runs of `WRITE_RUN_WRITES` writes between its two floors (an
/// odd number: the median is one of them).
const WRITE_RUNS: usize = 3;
const WRITE_RUN_WRITES: u64 = 500;
const OBSERVES: u64 = 20_000;
const READS: u64 = 20_000;
/// How long one run of reads may take, by a probe; fewer reads if need be
/// (if a read costs an fsync, 20,000 of them take minutes on a busy disk).
const READS_BUDGET_US: f64 = 4e6;
const READS_MIN: u64 = 1_000;
const REPLAY_CALLS: u64 = 100_000;
const STARTS: usize = 200;
const CLI_STARTS: usize = 5;
/// Runs of two writes a worker executes, `WORKER_SLOTS` at once, for
/// figure 4's worker row.
const WORKER_RUNS: usize = 1_000;
const WORKER_SLOTS: usize = 4;
/// Figure 14: children of one write each, and the worker's slots.
const CHILDREN: u64 = 100;
const CHILDREN_SLOTS: usize = 4;
const GROUP_RUNS: usize = 64;
/// Writes per run of figure 5: long enough that the window it measures
/// (about a third of a second here) is the runs' steady state, not their
/// start and end.
const GROUP_WRITES: u64 = 300;
/// Measured rounds of figure 5 (after one that grows the WAL); the median
/// one is shown.
const GROUP_ROUNDS: usize = 3;
/// How far ahead of their submission figure 5's runs are told to start:
/// time for a warm worker to claim and start 64 runs.
const GROUP_LEAD: Duration = Duration::from_millis(250);
/// Times a round of figure 5 is made again, each with twice the lead, if a
/// run arrived after its start time.
const GROUP_RETRIES: u32 = 4;
/// How far ahead figure 7's runs are told to start; RSS is read three
/// quarters of the way there, while they sleep.
const MEMORY_LEAD: Duration = Duration::from_millis(400);
/// Times figure 7's runs are made again, each with twice the lead, if a
/// run arrived after RSS was read.
const MEMORY_RETRIES: u32 = 3;
/// The single run that figure 5 is compared with.
const SINGLE_WRITES: u64 = 500;
/// Writes of each run of figure 5 as users start them.
const USERS_WRITES: u64 = 100;
const RESUME_CALLS: u64 = 10_000;
const PENDING_RUNS: usize = 10_000;

fn main() {
    // The `stephost` binary's allocator, so that in-process figures measure
    // what the binary does.
    stephost::allocator::configure();
    match main_inner() {
        Ok(()) => {}
        Err(e) => {
            eprintln!("stephost-bench: {e}");
            std::process::exit(1);
        }
    }
}

pub(crate) struct Args {
    guest: PathBuf,
    cli: Option<PathBuf>,
    out: PathBuf,
    /// Where the ledgers are created (a temporary folder inside it).
    dir: Option<PathBuf>,
    /// Figures to run (1 to 13); all when empty.
    only: Vec<u32>,
    /// `--ab`: the other build to compare with.
    ab: Option<ab::Other>,
}

impl Args {
    fn wants(&self, figure: u32) -> bool {
        self.only.is_empty() || self.only.contains(&figure)
    }

    /// The `stephost` binary: `--cli`, or the one next to the bench's
    /// executable, if it is there.
    fn cli_path(&self) -> Option<PathBuf> {
        let cli = self.cli.clone().or_else(|| {
            std::env::current_exe()
                .ok()
                .and_then(|exe| exe.parent().map(|dir| dir.join("stephost")))
        });
        cli.filter(|path| path.is_file())
    }

    /// Where the ledgers' temporary folders go.
    fn scratch(&self) -> PathBuf {
        self.dir
            .clone()
            .unwrap_or_else(|| workspace_root().join("target"))
    }
}

fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

const USAGE: &str = "usage: stephost-bench [--guest bench_guest.wasm] [--cli path/to/stephost] \
                     [--out results.json] [--dir DIR] [--only 1,5]\n       \
                     [--ab OTHER_BENCH [--ab-cli OTHER_STEPHOST] [--ab-guest OTHER_GUEST.wasm] \
                     [--ab-rounds N]]\nSee bench/README.md.";

fn parse_args(args: impl IntoIterator<Item = String>) -> Res<Args> {
    let root = workspace_root();
    let mut parsed = Args {
        guest: root.join("target/guest-wasm/wasm32-wasip2/release/bench_guest.wasm"),
        cli: None,
        out: root.join("target/bench/results.json"),
        dir: None,
        only: Vec::new(),
        ab: None,
    };
    let (mut ab_cli, mut ab_guest, mut ab_rounds) = (None, None, None);
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .ok_or_else(|| format!("{name} needs a value (try --help)"))
        };
        match arg.as_str() {
            "--guest" => parsed.guest = value("--guest")?.into(),
            "--cli" => parsed.cli = Some(value("--cli")?.into()),
            "--out" => parsed.out = value("--out")?.into(),
            "--dir" => parsed.dir = Some(value("--dir")?.into()),
            "--only" => {
                for n in value("--only")?.split(',') {
                    let n: u32 = n
                        .trim()
                        .parse()
                        .map_err(|_| format!("--only: bad figure {n:?}"))?;
                    parsed.only.push(n);
                }
            }
            "--ab" => {
                parsed.ab = Some(ab::Other {
                    bench: value("--ab")?.into(),
                    cli: None,
                    guest: None,
                    rounds: ab::ROUNDS,
                })
            }
            "--ab-cli" => ab_cli = Some(PathBuf::from(value("--ab-cli")?)),
            "--ab-guest" => ab_guest = Some(PathBuf::from(value("--ab-guest")?)),
            "--ab-rounds" => {
                let n = value("--ab-rounds")?;
                ab_rounds = Some(
                    n.parse::<usize>()
                        .ok()
                        .filter(|&n| n > 0)
                        .ok_or_else(|| format!("--ab-rounds: bad count {n:?}"))?,
                );
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?} (try --help)").into()),
        }
    }
    match &mut parsed.ab {
        Some(other) => {
            other.cli = ab_cli;
            other.guest = ab_guest;
            other.rounds = ab_rounds.unwrap_or(ab::ROUNDS);
        }
        None if ab_cli.is_some() || ab_guest.is_some() || ab_rounds.is_some() => {
            return Err("--ab-cli, --ab-guest and --ab-rounds go with --ab OTHER_BENCH".into());
        }
        None => {}
    }
    Ok(parsed)
}

fn main_inner() -> Res<()> {
    let args = parse_args(std::env::args().skip(1))?;
    let module = std::fs::read(&args.guest).map_err(|e| {
        format!(
            "cannot read the guest {}: {e}\nbuild it first: cargo build --release \
             --target wasm32-wasip2 --target-dir target/guest-wasm -p bench-guest",
            args.guest.display()
        )
    })?;
    let started = Instant::now();
    let results = match &args.ab {
        Some(other) => ab::run(&args, other, &module)?,
        None => suite(&args, &module)?,
    };
    let elapsed = started.elapsed();
    let machine = machine_info(&workspace_root(), &args.scratch());
    let mut results = results;
    results["machine"] = machine.clone();
    results["elapsed_s"] = json!(elapsed.as_secs_f64());
    if let Some(parent) = args.out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&args.out, serde_json::to_string_pretty(&results)? + "\n")?;
    println!();
    println!(
        "machine: {} cores, kernel {}, {}; took {:.0} s",
        machine["nproc"],
        machine["kernel"].as_str().unwrap_or("?"),
        machine["date"].as_str().unwrap_or("?"),
        elapsed.as_secs_f64()
    );
    println!("written to {}", args.out.display());
    Ok(())
}

/// This build's suite, in a fresh temporary folder under the scratch
/// folder: prints its table and notes and returns its results (the
/// figures, notes and counts; `main` adds the machine).
pub(crate) fn suite(args: &Args, module: &[u8]) -> Res<Value> {
    let scratch = args.scratch();
    std::fs::create_dir_all(&scratch)?;
    // The ledgers live on the same disk as the repository (not /tmp, which
    // may be a tmpfs where fsync costs nothing).
    let dir = tempfile::Builder::new()
        .prefix("bench-")
        .tempdir_in(&scratch)?;
    let started = Instant::now();
    let mut bench = Bench::new(dir.path(), module.to_vec())?;
    bench.run_all(args)?;
    let elapsed = started.elapsed();
    bench.print_table();
    println!("suite took {:.0} s", elapsed.as_secs_f64());
    Ok(json!({
        "suite": "stephost-bench",
        "suite_s": elapsed.as_secs_f64(),
        "counts": {
            "floor_warmup_commits": floor::FLOOR_WARMUP,
            "floor_commits": floor::FLOOR_COMMITS,
            "warmup_writes": bench.warmup_writes,
            "write_runs": WRITE_RUNS,
            "write_run_writes": WRITE_RUN_WRITES,
            "observes": OBSERVES,
            "reads": bench.reads,
            "replay_calls": REPLAY_CALLS,
            "starts": STARTS,
            "cli_starts": CLI_STARTS,
            "worker_runs": WORKER_RUNS,
            "worker_slots": WORKER_SLOTS,
            "group_runs": GROUP_RUNS,
            "group_writes_per_run": GROUP_WRITES,
            "group_rounds": GROUP_ROUNDS,
            "resume_calls": RESUME_CALLS,
            "pending_runs": PENDING_RUNS,
        },
        "figures": bench.rows.iter().map(Row::to_json).collect::<Vec<_>>(),
        "notes": bench.notes,
    }))
}

struct Bench {
    dir: PathBuf,
    module: Vec<u8>,
    /// The gate's directory (see [`Gate`]).
    gate: PathBuf,
    config: Config,
    rows: Vec<Row>,
    notes: Vec<String>,
    /// How many reads figure 2 made.
    reads: u64,
    /// Figure 1, µs per write, for figure 5's comparison.
    single_write_us: Option<f64>,
    /// Writes made before figure 1 to bring the ledger's WAL to its steady
    /// state.
    warmup_writes: u64,
}

/// The effects the guest uses. `gate.read` is a command that blocks on a
/// shared `flock` of `<gate>/gate.lock` while the bench holds it exclusively
/// (see [`Gate`]); it first leaves an `arrived.*` file so the bench can
/// count the runs waiting.
fn config_text(gate: &Path) -> String {
    let script = "mktemp \"$0/arrived.XXXXXX\" >/dev/null && flock -s \"$0/gate.lock\" true \
                  && echo '{}'";
    format!(
        r#"
[limits]
calls_max = 1000000

[effects."noop.write"]
kind = "echo"
class = "write"

[effects."noop.read"]
kind = "echo"
class = "read"

[effects."gate.read"]
kind = "command"
class = "read"
argv = ["sh", "-c", {script}, {gate}]
timeout_ms = 120000
"#,
        script = Value::String(script.to_string()),
        gate = Value::String(gate.display().to_string()),
    )
}

fn host_options(config: &Config) -> HostOptions {
    HostOptions {
        limits: config.limits.clone(),
        effects: config
            .effects()
            .expect("the bench configuration was checked at start"),
        log_sink: None,
        // A long-lived host, as an embedding would run it: instances come
        // from a pool (figure 5's worker sizes its own).
        instance_pool: 4,
        telemetry: telemetry(),
        ..HostOptions::default()
    }
}

/// The exporter the `OTEL_*` environment asks for, one for the process, as
/// `stephost` sets it up: none unless an endpoint is set (for an A/B of
/// traces off and on).
fn telemetry() -> Option<std::sync::Arc<stephost_runtime::telemetry::Telemetry>> {
    static TELEMETRY: std::sync::OnceLock<
        Option<std::sync::Arc<stephost_runtime::telemetry::Telemetry>>,
    > = std::sync::OnceLock::new();
    TELEMETRY
        .get_or_init(|| {
            stephost_runtime::telemetry::Telemetry::from_env()
                .expect("the OTEL_* environment is one stephost can export to")
        })
        .clone()
}

/// A host over the SQLite ledger at `db` (created if absent).
fn open_host(db: &Path, options: HostOptions) -> Res<Host> {
    let pool = Ledger::sqlite(db).open(PoolOptions::default())?;
    Ok(Host::open(pool, options)?)
}

fn progress(what: &str) {
    eprintln!("[bench] {what}");
}

impl Bench {
    fn new(dir: &Path, module: Vec<u8>) -> Res<Self> {
        let gate = dir.join("gate");
        std::fs::create_dir_all(&gate)?;
        let config = Config::parse(&config_text(&gate))?;
        config.effects()?;
        Ok(Bench {
            dir: dir.to_path_buf(),
            module,
            gate,
            config,
            rows: Vec::new(),
            notes: Vec::new(),
            reads: READS,
            single_write_us: None,
            warmup_writes: 0,
        })
    }

    fn options(&self) -> HostOptions {
        host_options(&self.config)
    }

    fn host(&self, db: &str) -> Res<Host> {
        open_host(&self.dir.join(db), self.options())
    }

    fn note(&mut self, text: String) {
        self.notes.push(text);
    }

    fn floor(&mut self, tag: &str) -> Res<f64> {
        let floor = floor_us(&self.dir, tag)?;
        progress(&format!("floor ({tag}): {floor:.0} µs per fsync'd commit"));
        self.rows
            .push(Row::new(&format!("floor ({tag})"), floor, "µs/commit"));
        Ok(floor)
    }

    fn run_all(&mut self, args: &Args) -> Res<()> {
        let floor = self.floor("start")?;
        let mut host = self.host("runs.db")?;
        // Warm: compile the component once; take the ledger's WAL past its
        // first checkpoint (a long-lived ledger's WAL is reused, not grown).
        self.run(&mut host, json!({"mode": "none"}))?;
        self.warm_wal(&mut host, "runs.db")?;
        let none_us = mean_us(&self.repeat(&mut host, json!({"mode": "none"}), 20)?);

        if args.wants(1) {
            self.write_effect(&mut host, none_us)?;
        }
        if args.wants(2) {
            self.observe_and_read(&mut host, none_us, floor)?;
        }
        if args.wants(3) {
            self.replay(&mut host)?;
        }
        if args.wants(4) {
            self.start_of_run(&mut host, floor, args)?;
        }
        if args.wants(5) {
            self.group_commit(&mut host, none_us)?;
            self.as_users_start()?;
        }
        drop(host);
        if args.wants(1) || args.wants(5) {
            match args.cli_path() {
                Some(cli) => {
                    self.through_binary(&cli, &args.guest, args.wants(1), args.wants(5))?
                }
                None => self.note(
                    "1 and 5 through the binary skipped: no `stephost` binary next to \
                     stephost-bench (build it with `cargo build -p stephost`, or pass --cli PATH)"
                        .to_string(),
                ),
            }
        }
        if args.wants(6) {
            self.resume()?;
        }
        if args.wants(7) {
            self.memory()?;
        }
        if args.wants(12) {
            self.conversation()?;
        }
        if args.wants(13) {
            self.web()?;
        }
        if args.wants(14) {
            self.children()?;
        }
        // Figure 11's PostgreSQL rows are measured beside figure 8's floor.
        if args.wants(8) || args.wants(9) || args.wants(10) || args.wants(11) || args.wants(14) {
            self.postgres(args)?;
        }
        if args.wants(11) {
            self.server(args)?;
        }
        if args.wants(15) {
            self.promises(args)?;
        }
        Ok(())
    }

    /// Runs the guest to completion; its wall time and output.
    fn run(&self, host: &mut Host, input: Value) -> Res<(Duration, Value, RunReport)> {
        let text = input.to_string();
        let t = Instant::now();
        let report = host.run(&self.module, WHAT, &text, None)?;
        let took = t.elapsed();
        let output = completed(&report)?;
        Ok((took, output, report))
    }

    /// Runs of `WARMUP_WRITES` writes until one leaves the WAL of ledger
    /// `db` no larger than it found it: the log has passed its first
    /// checkpoint and started over, so figure 1's writes overwrite it, as a
    /// long-lived ledger's do. Writes that grow the file cost more (each
    /// fsync also writes the file's metadata: about twice the cost on the
    /// project's disk), and how many writes fill the log to its checkpoint
    /// depends on the pages each commits, so this is measured rather than
    /// counted.
    fn warm_wal(&mut self, host: &mut Host, db: &str) -> Res<()> {
        let mut wal = self.dir.join(db).into_os_string();
        wal.push("-wal");
        let size = || std::fs::metadata(&wal).map_or(0, |m| m.len());
        let input = json!({"mode": "write", "count": WARMUP_WRITES});
        let mut before = size();
        let mut warmed = false;
        for _ in 0..WARMUP_ROUNDS_MAX {
            self.run(host, input.clone())?;
            self.warmup_writes += WARMUP_WRITES;
            let after = size();
            if after <= before {
                warmed = true;
                break;
            }
            before = after;
        }
        // The figure itself is still measured, with a note.
        if !warmed {
            self.note(format!(
                "warm-up: the ledger's WAL still grew after {} writes; figure 1 may include \
                 writes that grow it",
                self.warmup_writes
            ));
        }
        Ok(())
    }

    fn repeat(&self, host: &mut Host, input: Value, n: usize) -> Res<Vec<Duration>> {
        (0..n)
            .map(|_| Ok(self.run(host, input.clone())?.0))
            .collect()
    }

    /// Figure 1: a floor, `WRITE_RUNS` runs of `WRITE_RUN_WRITES` writes on
    /// the warm ledger, a floor again. A run's µs per write is its wall time
    /// less a `none` run's (which holds the run's own start and end
    /// commits), over its writes; the median run is shown, its ratio over
    /// the mean of the two floors.
    fn write_effect(&mut self, host: &mut Host, none_us: f64) -> Res<()> {
        let before = floor_us(&self.dir, "before 1")?;
        progress(&format!(
            "1 write effect: {WRITE_RUNS} runs of {WRITE_RUN_WRITES} writes (floor before: \
             {before:.0} µs)"
        ));
        let cpu_before = cpu_seconds()?;
        let input = json!({"mode": "write", "count": WRITE_RUN_WRITES});
        let per_write = self
            .repeat(host, input, WRITE_RUNS)?
            .into_iter()
            .map(|took| (us(took) - none_us) / WRITE_RUN_WRITES as f64)
            .collect::<Vec<_>>();
        let cpu = cpu_seconds()? - cpu_before;
        let after = floor_us(&self.dir, "after 1")?;
        self.push_floor("around 1", before, after);
        let floor = (before + after) / 2.0;
        let median = median_by(per_write.clone(), |v| *v);
        self.single_write_us = Some(median);
        self.rows
            .push(Row::new(report::WRITE_EFFECT, median, "µs/write").over_floor(floor));
        let ratios: Vec<String> = per_write
            .iter()
            .map(|v| format!("{:.2}", v / floor))
            .collect();
        self.note(format!(
            "1: {WRITE_RUNS} runs of {WRITE_RUN_WRITES} writes, between a floor just before \
             ({before:.0} µs) and one just after ({after:.0} µs); a run's µs per write = (its \
             wall time - mean of a `none` run, {none_us:.0} µs, which holds the run's own \
             start and end commits) / {WRITE_RUN_WRITES}; over the mean of the two floors: {}; \
             the median run shown. {:.0} µs of CPU a write (USER_HZ ticks: coarse), the runs' \
             starts and ends included. {} writes made before took the ledger's WAL past its \
             first checkpoint, so these overwrite it",
            ratios.join(", "),
            cpu * 1e6 / (WRITE_RUNS as u64 * WRITE_RUN_WRITES) as f64,
            self.warmup_writes
        ));
        Ok(())
    }

    fn observe_and_read(&mut self, host: &mut Host, none_us: f64, floor: f64) -> Res<()> {
        progress(&format!("2 observe: 3 runs of {OBSERVES} clock calls"));
        let observe =
            median_us(&self.repeat(host, json!({"mode": "observe", "count": OBSERVES}), 3)?);
        let per_observe = (observe - none_us) / OBSERVES as f64;
        self.rows
            .push(Row::new("2 observe call", per_observe, "µs/call").over_floor(floor));

        // A probe first: if a read costs an fsync, 20,000 of them take minutes.
        let (probe, _, _) = self.run(host, json!({"mode": "read", "count": 200}))?;
        let probe_us = ((us(probe) - none_us) / 200.0).max(0.01);
        let affordable = (READS_BUDGET_US / probe_us) as u64;
        if affordable < READS {
            self.reads = affordable.max(READS_MIN);
            self.note(format!(
                "2: a probe of 200 reads took {probe_us:.0} µs per read, so figure 2 makes \
                 {} reads instead of {READS} (to keep each run under about {:.0} s)",
                self.reads,
                READS_BUDGET_US / 1e6
            ));
        }
        let reads = self.reads;
        progress(&format!("2 read: 3 runs of {reads} no-op reads"));
        let read = median_us(&self.repeat(host, json!({"mode": "read", "count": reads}), 3)?);
        let per_read = (read - none_us) / reads as f64;
        self.rows
            .push(Row::new("2 read call (no-op)", per_read, "µs/call").over_floor(floor));
        self.note(
            "2: (median wall time of 3 runs of N calls - mean `none` run) / N; this includes \
             writing the calls' ledger rows, whenever the host commits them"
                .to_string(),
        );
        Ok(())
    }

    /// Figure 3: replay of a recorded run of 100,000 calls.
    fn replay(&mut self, host: &mut Host) -> Res<()> {
        progress(&format!(
            "3 replay: recording a run of {REPLAY_CALLS} clock calls"
        ));
        let (record, _, report) =
            self.run(host, json!({"mode": "observe", "count": REPLAY_CALLS}))?;
        // The recording's last checkpoint and the kernel's writeback of
        // its 40 MB are not the replay's work: both are done before the
        // replays are timed, so that they do not share the two cores.
        let db = self.dir.join("runs.db");
        rusqlite::Connection::open(&db)?.query_row(
            "PRAGMA wal_checkpoint(TRUNCATE)",
            [],
            |_| Ok(()),
        )?;
        std::fs::File::open(&db)?.sync_all()?;
        progress("3 replay: 3 replays");
        let mut times = Vec::new();
        for _ in 0..3 {
            let t = Instant::now();
            let replayed = host.replay(&report.run_id, None)?;
            times.push(t.elapsed());
            match replayed.verdict {
                ReplayVerdict::Consistent { calls, .. } if calls == REPLAY_CALLS => {}
                other => return Err(format!("replay of the 100,000-call run: {other:?}").into()),
            }
        }
        let secs = median_us(&times) / 1e6;
        let rate = REPLAY_CALLS as f64 / secs;
        self.rows.push(Row::new("3 replay", rate, "calls/s"));
        self.note(format!(
            "3: median of 3 `Host::replay` calls of a recorded run of {REPLAY_CALLS} clock calls \
             ({:.0} ms), including reading the run and its calls out of the ledger; recording it \
             took {:.0} ms (its WAL was checkpointed and the file synced before the replays)",
            secs * 1e3,
            record.as_secs_f64() * 1e3
        ));
        Ok(())
    }

    /// Figure 4: the start of a run, in process and from the command line.
    fn start_of_run(&mut self, host: &mut Host, floor: f64, args: &Args) -> Res<()> {
        progress(&format!("4 start: {STARTS} `none` runs on one warm host"));
        let whole = mean_us(&self.repeat(host, json!({"mode": "none"}), STARTS)?);
        self.rows
            .push(Row::new("4 run of a no-op step, whole", whole, "µs/run").over_floor(floor));

        progress(&format!("4 start: {STARTS} runs to the guest's first call"));
        let mut to_first = Vec::new();
        for _ in 0..STARTS {
            let t0 = now_ns();
            let (_, output, _) = self.run(host, json!({"mode": "stamp"}))?;
            to_first.push(since_us(t0, &output)?);
        }
        let first = to_first.iter().sum::<f64>() / to_first.len() as f64;
        self.rows
            .push(Row::new("4 start to guest's first call", first, "µs").over_floor(floor));

        // The same with the step loaded once (`Host::load`), as an
        // embedding starting many runs of one step would: no run looks at
        // the module's bytes again.
        progress(&format!("4 start: {STARTS} runs of a step loaded once"));
        let step = host.load(&self.module, WHAT)?;
        let none = json!({"mode": "none"}).to_string();
        let stamp = json!({"mode": "stamp"}).to_string();
        let mut wholes = Vec::new();
        let mut to_first = Vec::new();
        for _ in 0..STARTS {
            let t = Instant::now();
            completed(&host.run_loaded(&step, &none, None)?)?;
            wholes.push(t.elapsed());
            let t0 = now_ns();
            let output = completed(&host.run_loaded(&step, &stamp, None)?)?;
            to_first.push(since_us(t0, &output)?);
        }
        let whole = mean_us(&wholes);
        self.rows
            .push(Row::new("4 … whole, step loaded once", whole, "µs/run").over_floor(floor));
        let first = to_first.iter().sum::<f64>() / to_first.len() as f64;
        self.rows
            .push(Row::new("4 … to first call, step loaded once", first, "µs").over_floor(floor));

        progress(&format!("4 start: {STARTS} replays of a `none` run"));
        let (_, _, none) = self.run(host, json!({"mode": "none"}))?;
        let mut replays = Vec::new();
        for _ in 0..STARTS {
            let t = Instant::now();
            host.replay(&none.run_id, None)?;
            replays.push(t.elapsed());
        }
        let replay = mean_us(&replays);
        self.rows.push(Row::new(
            "4 replay of a no-op run (no ledger writes)",
            replay,
            "µs/run",
        ));
        self.note(format!(
            "4: `whole` is `Host::run` of a step that returns at once (look up the run id, \
             instantiate, call, finish: the new run's row is written, claimed, by its one \
             commit, the fsync'd end), mean of {STARTS}; \
             `start to guest's first call` is from before `Host::run` to the host's clock value \
             read by the guest's first call (the guest's first instruction is just before), \
             mean of {STARTS}; the `step loaded once` rows are the same with \
             `Host::run_loaded` of a step loaded once by `Host::load` (no run looks at the \
             module's bytes again); the replay row is `Host::replay` of a finished no-op run \
             (reads it from the ledger, instantiates, calls; writes nothing), mean of {STARTS}"
        ));

        match args.cli_path() {
            Some(cli) => {
                progress(&format!(
                    "4 CLI: {CLI_STARTS} cold `stephost run` processes ({})",
                    cli.display()
                ));
                let miss = self.cli_cold_start(&cli, &args.guest, "off")?;
                self.rows.push(Row::new(
                    "4 CLI cold `stephost run`, compiled-cache miss",
                    miss,
                    "ms",
                ));
                let cache = self.dir.join("cli-cache");
                let hit = self.cli_cold_start(&cli, &args.guest, &cache.display().to_string())?;
                self.rows.push(Row::new(
                    "4 CLI cold `stephost run`, compiled-cache hit",
                    hit,
                    "ms",
                ));
                self.note(format!(
                    "4: CLI cold start: median of {CLI_STARTS} child processes `{} run \
                     bench_guest.wasm --input '{{\"mode\":\"none\",\"count\":0}}'` on one ledger \
                     (after one untimed run); `miss` with `--cache-dir off` (every process \
                     compiles the component), `hit` with a compiled-component cache on disk",
                    cli.display()
                ));
            }
            None => self.note(
                "4: CLI cold start skipped: no `stephost` binary next to stephost-bench \
                 (build it with `cargo build -p stephost`, or pass --cli PATH)"
                    .to_string(),
            ),
        }
        self.worker_short_runs()
    }

    /// Figure 4's worker row: how many short runs a worker starts and
    /// finishes per second, all its per-run costs included (claiming,
    /// the run's ledger connection, instantiating, its commits).
    fn worker_short_runs(&mut self) -> Res<()> {
        let db = self.dir.join("short-runs.db");
        let cache = self.dir.join("short-runs-cache");
        let config = &self.config;
        let options = || HostOptions {
            cache_dir: Some(cache.clone()),
            ..host_options(config)
        };
        let worker_options = self.worker_options(WORKER_SLOTS, "bench-short-runs");
        let mut host = open_host(&db, options())?;
        let ledger = Ledger::sqlite(&db);
        let never = AtomicBool::new(false);
        // A first worker compiles the component into the disk cache; the
        // measured one loads it from there, as a restarted worker would.
        host.submit(&self.module, WHAT, r#"{"mode":"none"}"#, None)?;
        let warm = worker::run(&ledger, &options, &worker_options, &never)?;
        if warm.completed != 1 {
            return Err(format!("the short runs' first worker: {warm:?}").into());
        }
        progress(&format!(
            "4 worker: {WORKER_RUNS} runs of 2 writes, {WORKER_SLOTS} at once"
        ));
        let input = json!({"mode": "write", "count": 2}).to_string();
        for _ in 0..WORKER_RUNS {
            host.submit(&self.module, WHAT, &input, None)?;
        }
        let t = Instant::now();
        let report = worker::run(&ledger, &options, &worker_options, &never)?;
        let took = t.elapsed().as_secs_f64();
        if report.completed != WORKER_RUNS {
            return Err(format!("the short runs' worker: {report:?}").into());
        }
        self.rows.push(Row::new(
            &format!("4 worker, runs of 2 writes, {WORKER_SLOTS} at once"),
            WORKER_RUNS as f64 / took,
            "runs/s",
        ));
        self.note(format!(
            "4: worker: {WORKER_RUNS} submitted runs of 2 writes each, executed by \
             `worker::run` ({WORKER_SLOTS} at once, until none is left) in {:.0} ms, from its \
             start to its return: claims, each run's ledger connection and instance, its \
             commits (each write's `started` row and the run's end are fsync'd; the commits of \
             runs at once share fsyncs). A worker before it compiled the step into a disk \
             cache, which this one loads it from",
            took * 1e3
        ));
        Ok(())
    }

    fn cli_cold_start(&self, cli: &Path, guest: &Path, cache_dir: &str) -> Res<f64> {
        let db = self.dir.join("cli.db");
        let once = || -> Res<Duration> {
            let t = Instant::now();
            let out = Command::new(cli)
                .current_dir(&self.dir)
                .env_remove("STEPHOST_DB")
                .env_remove("STEPHOST_LEDGER")
                .env_remove("STEPHOST_CACHE_DIR")
                .env_remove("STEPHOST_CONFIG")
                .arg("--db")
                .arg(&db)
                .args(["--cache-dir", cache_dir])
                .arg("run")
                .arg(guest)
                .args(["--input", r#"{"mode":"none","count":0}"#])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .output()?;
            let took = t.elapsed();
            if !out.status.success() {
                return Err(format!(
                    "{} run failed ({}): {}",
                    cli.display(),
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                )
                .into());
            }
            Ok(took)
        };
        once()?;
        let times = (0..CLI_STARTS).map(|_| once()).collect::<Res<Vec<_>>>()?;
        Ok(median_us(&times) / 1e3)
    }

    /// Figure 5: 64 concurrent runs in one worker, sharing fsyncs.
    fn group_commit(&mut self, host: &mut Host, none_us: f64) -> Res<()> {
        let db = self.dir.join("group.db");
        let floor_before = floor_us(&self.dir, "before 5")?;
        // The single-run rate under the same disk conditions.
        progress(&format!(
            "5 group commit: a single run of {SINGLE_WRITES} writes first"
        ));
        let (took, _, _) = self.run(host, json!({"mode": "write", "count": SINGLE_WRITES}))?;
        let single = 1e6 * SINGLE_WRITES as f64 / (us(took) - none_us);
        progress(&format!(
            "5 group commit: {GROUP_RUNS} runs of {GROUP_WRITES} writes, one warm worker"
        ));
        // Each round's runs sleep until a start time the bench gives them,
        // far enough ahead for all of them to be claimed and started by
        // then; a round in which one arrived late is made again with twice
        // the lead.
        let input = json!({"mode": "write", "count": GROUP_WRITES, "stamps": true});
        let round = |host: &mut Host| -> Res<(Vec<String>, f64, Duration, Duration)> {
            let (ids, (cpu, wall), lead) = self.started_together(
                host,
                "5 group commit",
                &input,
                GROUP_LEAD,
                4,
                |host, ids, start_at, _| {
                    std::thread::sleep(Duration::from_nanos(start_at.saturating_sub(now_ns())));
                    let cpu = cpu_seconds()?;
                    let t = Instant::now();
                    wait_completed(host, ids)?;
                    Ok(((cpu_seconds()? - cpu, t.elapsed()), start_at))
                },
            )?;
            Ok((ids, cpu, wall, lead))
        };
        // The first round grows the ledger's WAL file to its working size
        // (as a long-lived ledger's is, and as the floor's is before it is
        // measured: extending the file costs every fsync a metadata
        // write); the next `GROUP_ROUNDS` are measured.
        let (rounds, worker) = self.with_warm_worker(&db, "bench-group", |host| {
            round(host)?;
            (0..GROUP_ROUNDS)
                .map(|_| round(host))
                .collect::<Res<Vec<_>>>()
        })?;
        let floor_after = floor_us(&self.dir, "after 5")?;
        let floor = (floor_before + floor_after) / 2.0;
        self.push_floor("around 5", floor_before, floor_after);

        // Each round's rate, from the earliest of its runs' clock reads just
        // before their writes (`first_ns`) to its last run's end; the round
        // with the median rate is the figure.
        let host = open_host(&db, self.options())?;
        let mut measured = Vec::with_capacity(GROUP_ROUNDS);
        let leads: Vec<String> = rounds.iter().map(|r| r.3.as_millis().to_string()).collect();
        for (ids, cpu, wall, _) in rounds {
            let mut first_ns = u64::MAX;
            let mut last_first_ns = 0;
            let mut last_ms = 0i64;
            for id in &ids {
                let first = output_u64(&host, id, "first_ns")?;
                first_ns = first_ns.min(first);
                last_first_ns = last_first_ns.max(first);
                last_ms = last_ms.max(host.store().run(id)?.updated_at_ms);
            }
            let window_s = ((last_ms as f64) * 1e6 - first_ns as f64).max(1e6) / 1e9;
            let writes = (GROUP_RUNS as u64 * GROUP_WRITES) as f64;
            let spread_ms = (last_first_ns - first_ns) as f64 / 1e6;
            measured.push((writes / window_s, window_s, cpu, wall, spread_ms));
        }
        let commits = worker.commits.commits;
        let rates: Vec<String> = measured.iter().map(|m| format!("{:.0}", m.0)).collect();
        let (rate, window_s, cpu, wall, spread_ms) = median_by(measured, |m| m.0);
        self.rows
            .push(Row::new("5 group commit", rate, "writes/s").with_ratio(rate / single, floor));
        self.note(format!(
            "5: a worker (`worker::run`, concurrency {GROUP_RUNS}) first runs one no-op run so \
             its component cache is warm; then, {} times, {GROUP_RUNS} runs of {GROUP_WRITES} \
             writes each are submitted and claimed, each told to start at the same time, {} ms \
             after the first submission (the bench guest sleeps until then, on the worker's \
             timers; a round in which a run arrived late is made again with twice the lead, up \
             to {} ms; the measured rounds' leads: {} ms); the \
             first round grows the ledger's WAL file to its working size, as the floor's is \
             grown before it is measured; over each of the others, writes/s over the window \
             from the earliest of the runs' clock reads just before their writes to the last \
             run's end (ms \
             resolution): {} writes/s, the median shown (its window {:.0} ms; its runs' first \
             calls within {spread_ms:.1} ms of each other); ratio = that rate \
             / the rate of a single run of {SINGLE_WRITES} writes made just before ({single:.0} \
             writes/s; figure 1's: {}); the floor is the mean of the floors just before and \
             after. In that round, from the start time to the last run's end the process \
             used {cpu:.2} s of CPU in {:.2} s ({:.1} of {} cores busy). Over the worker's \
             life (the warm run and all rounds), the runs' {} commits took {} transactions and \
             {} fsyncs: {:.1} commits per fsync, {:.1} per transaction",
            GROUP_ROUNDS + 1,
            GROUP_LEAD.as_millis(),
            (GROUP_LEAD * 2u32.pow(GROUP_RETRIES)).as_millis(),
            leads.join(", "),
            rates.join(", "),
            window_s * 1e3,
            self.single_write_us
                .map_or("n/a".to_string(), |us| format!("{:.0} writes/s", 1e6 / us)),
            wall.as_secs_f64(),
            cpu / wall.as_secs_f64(),
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            worker.commits.commits,
            worker.commits.transactions,
            worker.commits.fsyncs,
            commits as f64 / worker.commits.fsyncs.max(1) as f64,
            commits as f64 / worker.commits.transactions.max(1) as f64,
        ));
        Ok(())
    }
    /// Figure 5, as users start runs, on this bench's SQLite ledger.
    fn as_users_start(&mut self) -> Res<()> {
        let db = self.dir.join("users.db");
        let mut host = open_host(&db, self.options())?;
        // A warm cache and a WAL of its working size, as for the figure.
        self.run(&mut host, json!({"mode": "none"}))?;
        self.warm_wal(&mut host, "users.db")?;
        self.users_start(report::USERS_START, &Ledger::sqlite(&db), &mut host)
    }

    /// `GROUP_RUNS` runs of `USERS_WRITES` writes submitted with no gate
    /// by `host`, then one worker of concurrency `GROUP_RUNS` on `ledger`
    /// that claims them as it finds them: rows `figure` (steps a second)
    /// and its transactions and fsyncs per write, and the process's CPU
    /// per write, user and kernel apart.
    pub(crate) fn users_start(
        &mut self,
        figure: &str,
        ledger: &dyn stephost_core::store::Opener,
        host: &mut Host,
    ) -> Res<()> {
        progress(&format!(
            "{figure}: {GROUP_RUNS} runs of {USERS_WRITES} writes, one worker"
        ));
        let input = json!({"mode": "write", "count": USERS_WRITES}).to_string();
        let ids = (0..GROUP_RUNS)
            .map(|_| Ok(host.submit(&self.module, WHAT, &input, None)?.run_id))
            .collect::<Res<Vec<_>>>()?;
        let options = self.worker_options(GROUP_RUNS, "bench-users");
        let never = AtomicBool::new(false);
        // The worker loads the step compiled by a host before it, from a
        // disk cache, as `stephost worker` does: no compile is measured.
        let cache = self.dir.join("users-cache");
        let cached = || HostOptions {
            cache_dir: Some(cache.clone()),
            ..host_options(&self.config)
        };
        Host::open(ledger.open(Default::default())?, cached())?.load(&self.module, WHAT)?;
        let cpu = procstat::process_cpu_split_us().ok_or("no /proc/self/stat")?;
        let t = Instant::now();
        let report = worker::run(ledger, &cached, &options, &never)?;
        let wall = t.elapsed().as_secs_f64();
        let after = procstat::process_cpu_split_us().ok_or("no /proc/self/stat")?;
        if report.completed != ids.len() {
            return Err(format!("{figure}: {report:?}").into());
        }
        let writes = (GROUP_RUNS as u64 * USERS_WRITES) as f64;
        let rate = writes / wall;
        let (user, kernel) = ((after.0 - cpu.0) / writes, (after.1 - cpu.1) / writes);
        let c = report.commits;
        let per = |n: u64| n as f64 / writes;
        progress(&format!(
            "{figure}: {rate:.0} steps/s, {:.3} fsyncs and {:.3} transactions a write, CPU \
             {user:.0} + {kernel:.0} µs a write (user + kernel)",
            per(c.fsyncs),
            per(c.transactions)
        ));
        let tag = figure.split(' ').next().unwrap_or(figure);
        self.rows.push(Row::new(figure, rate, "writes/s"));
        for (what, value, unit) in [
            ("fsyncs per write", per(c.fsyncs), "fsyncs"),
            (
                "transactions per write",
                per(c.transactions),
                "transactions",
            ),
            ("CPU per write, user", user, "µs/write"),
            ("CPU per write, kernel", kernel, "µs/write"),
        ] {
            self.rows
                .push(Row::new(&format!("{tag} … {what}"), value, unit));
        }
        self.note(format!(
            "{figure}: {GROUP_RUNS} runs of {USERS_WRITES} writes submitted one after another \
             with no gate, then a worker (`worker::run`, concurrency {GROUP_RUNS}, exit when \
             idle; the step compiled into a disk cache before, as for `stephost worker`) claims \
             them as it finds them; steps/s = writes over the worker's whole life ({wall:.2} s); its {} commits took {} transactions and {} fsyncs; CPU: this \
             process's (every thread's; not a database server's) over the worker's life, per \
             write, user and kernel apart (10 ms ticks)",
            c.commits, c.transactions, c.fsyncs
        ));
        Ok(())
    }

    fn started_together<T>(
        &self,
        host: &mut Host,
        figure: &str,
        input: &Value,
        mut lead: Duration,
        retries: u32,
        mut measure: impl FnMut(&mut Host, &[String], u64, Duration) -> Res<(T, u64)>,
    ) -> Res<(Vec<String>, T, Duration)> {
        let mut retry = 0;
        loop {
            let start_at = now_ns() + lead.as_nanos() as u64;
            let mut input = input.clone();
            input["start_at_ns"] = json!(start_at);
            let input = input.to_string();
            let ids = (0..GROUP_RUNS)
                .map(|_| Ok(host.submit(&self.module, WHAT, &input, None)?.run_id))
                .collect::<Res<Vec<_>>>()?;
            let (measured, arrive_by) = measure(host, &ids, start_at, lead)?;
            let late = arrived_after(host, &ids, arrive_by)?;
            if late == 0 {
                return Ok((ids, measured, lead));
            }
            if retry == retries {
                return Err(format!(
                    "{figure}: {late} of {GROUP_RUNS} runs arrived too late, even told to start \
                     {} ms after they were submitted",
                    lead.as_millis()
                )
                .into());
            }
            retry += 1;
            lead *= 2;
            progress(&format!(
                "{figure}: {late} runs arrived too late; again, {} ms ahead",
                lead.as_millis()
            ));
        }
    }

    fn push_floor(&mut self, tag: &str, before: f64, after: f64) {
        progress(&format!(
            "floor {tag}: {before:.0} µs before, {after:.0} µs after"
        ));
        self.rows.push(Row::new(
            &format!("floor ({tag}: mean of before, after)"),
            (before + after) / 2.0,
            "µs/commit",
        ));
    }

    /// Runs `body` beside a worker on `db` whose compiled-component cache is
    /// warm (it has completed one no-op run); then shuts the worker down.
    fn with_warm_worker<T>(
        &self,
        db: &Path,
        id: &str,
        body: impl FnOnce(&mut Host) -> Res<T>,
    ) -> Res<(T, WorkerReport)> {
        let mut host = open_host(db, self.options())?;
        let ledger = Ledger::sqlite(db);
        let warm = host
            .submit(&self.module, WHAT, r#"{"mode":"none"}"#, None)?
            .run_id;
        let shutdown = AtomicBool::new(false);
        let mut options = self.worker_options(GROUP_RUNS, id);
        options.exit_when_idle = false;
        std::thread::scope(|scope| -> Res<(T, WorkerReport)> {
            let worker = scope.spawn(|| {
                worker::run(&ledger, &|| host_options(&self.config), &options, &shutdown)
            });
            let result =
                wait_completed(&host, std::slice::from_ref(&warm)).and_then(|()| body(&mut host));
            shutdown.store(true, Ordering::SeqCst);
            let report = worker.join().map_err(|_| "the worker panicked")??;
            if report.failed + report.abandoned + report.parked > 0 {
                return Err(format!("worker {id}: {report:?}").into());
            }
            Ok((result?, report))
        })
    }

    fn worker_options(&self, concurrency: usize, id: &str) -> WorkerOptions {
        WorkerOptions {
            concurrency,
            exit_when_idle: true,
            poll_ms: 1,
            worker_id: id.to_string(),
            ..WorkerOptions::default()
        }
    }

    /// Figure 14: a parent that starts `CHILDREN` children of one durable
    /// write each and joins them, through one worker, beside one step of as
    /// many writes through the same worker: time to the end, fsyncs and CPU
    /// per child (and per write).
    fn children(&mut self) -> Res<()> {
        let cache = self.dir.join("children-cache");
        // The children are runs of the bench step itself, by name.
        let step = self.dir.join("bench-step.wasm");
        std::fs::write(&step, &self.module)?;
        let options = || HostOptions {
            cache_dir: Some(cache.clone()),
            steps: std::collections::BTreeMap::from([("bench".to_string(), step.clone())]),
            ..host_options(&self.config)
        };
        let worker_options = self.worker_options(CHILDREN_SLOTS, "bench-children");
        let never = AtomicBool::new(false);
        let measure = |name: &str, input: Value| -> Res<(f64, u64, f64)> {
            let db = self.dir.join(format!("{name}.db"));
            let mut host = open_host(&db, options())?;
            host.load(&self.module, WHAT)?;
            let ledger = Ledger::sqlite(&db);
            host.submit(&self.module, WHAT, &input.to_string(), Some("top"))?;
            let cpu = procstat::process_cpu_split_us().ok_or("no /proc/self/stat")?;
            let t = Instant::now();
            let report = worker::run(&ledger, &options, &worker_options, &never)?;
            let wall = t.elapsed().as_secs_f64();
            let after = procstat::process_cpu_split_us().ok_or("no /proc/self/stat")?;
            let top = host.store().run("top")?;
            if top.status != RunStatus::Completed {
                return Err(format!("14 {name}: {top:?} ({report:?})").into());
            }
            let cpu_us = (after.0 - cpu.0) + (after.1 - cpu.1);
            Ok((wall, report.commits.fsyncs, cpu_us))
        };
        progress(&format!(
            "14 children: one step of {CHILDREN} writes, one worker"
        ));
        let (writes_wall, writes_fsyncs, writes_cpu) = measure(
            "children-writes",
            json!({"mode": "write", "count": CHILDREN}),
        )?;
        progress(&format!(
            "14 children: a parent of {CHILDREN} children of one write each, one worker"
        ));
        let (wall, fsyncs, cpu) =
            measure("children", json!({"mode": "children", "count": CHILDREN}))?;
        let n = CHILDREN as f64;
        self.rows.push(Row::new(
            &format!("14 {CHILDREN} writes in one step, to its end"),
            writes_wall * 1e3,
            "ms",
        ));
        self.rows.push(
            Row::new(report::CHILDREN_JOINED, wall * 1e3, "ms").with_ratio(wall / writes_wall, 0.0),
        );
        self.rows.push(Row::new(
            report::CHILD_FSYNCS_OVER_WRITE,
            (fsyncs as f64 - writes_fsyncs as f64) / n,
            "fsyncs",
        ));
        for (what, value, unit) in [
            ("fsyncs per child", fsyncs as f64 / n, "fsyncs"),
            (
                "fsyncs per write in one step",
                writes_fsyncs as f64 / n,
                "fsyncs",
            ),
            ("CPU per child", cpu / n, "µs"),
            ("CPU per write in one step", writes_cpu / n, "µs"),
        ] {
            self.rows
                .push(Row::new(&format!("14 … {what}"), value, unit));
        }
        self.note(format!(
            "14: children: a parent step starts {CHILDREN} child runs (each a step of one \
             `noop.write`) in one join set, then joins them; one worker (`worker::run`, \
             concurrency {CHILDREN_SLOTS}, the step compiled into a disk cache before) runs the \
             parent, the children and the parent again after they end, until none is left \
             ({:.0} ms, {fsyncs} fsyncs, {:.0} ms CPU: user and kernel, every thread of this \
             process); beside it, one step of {CHILDREN} writes through the same worker \
             ({:.0} ms, {writes_fsyncs} fsyncs). A start is one durable commit with its child's \
             row; a child's end is one with the arrival in its parent's inbox; a join that \
             finds its child ended commits its `started` row and its outcome",
            wall * 1e3,
            cpu / 1e3,
            writes_wall * 1e3
        ));
        Ok(())
    }

    /// Figure 6: resuming a run with 10,000 recorded calls.
    fn resume(&mut self) -> Res<()> {
        let db = self.dir.join("resume.db");
        let mut host = open_host(&db, self.options())?;
        let ledger = Ledger::sqlite(&db);
        let input = json!({"mode": "resume", "count": RESUME_CALLS}).to_string();
        let run_id = host.submit(&self.module, WHAT, &input, None)?.run_id;
        progress(&format!(
            "6 resume: recording {RESUME_CALLS} calls, stopping the worker at the gate after them"
        ));
        // A worker executes the run. While it waits at the gate after its
        // 10,000 clock calls, the worker is told to shut down; the gate
        // opens, and the run stops before its next call (a write) and is
        // released, with 10,001 calls recorded.
        let shutdown = AtomicBool::new(false);
        let mut options = self.worker_options(1, "bench-resume");
        options.exit_when_idle = false;
        let gate = Gate::close(&self.gate)?;
        let report = std::thread::scope(|scope| -> Res<_> {
            let worker = scope.spawn(|| {
                worker::run(&ledger, &|| host_options(&self.config), &options, &shutdown)
            });
            let arrived = gate.wait_arrived(1);
            shutdown.store(true, Ordering::SeqCst);
            // Let the worker see the shutdown and tell the run to drain.
            std::thread::sleep(Duration::from_millis(100));
            let opened = gate.open();
            let report = worker.join().map_err(|_| "the worker panicked")?;
            arrived?;
            opened?;
            Ok(report?)
        })?;
        if report.released != 1 {
            return Err(format!("resume: the worker did not release the run: {report:?}").into());
        }
        // Warm the compiled-component cache of this host, as a worker's is.
        self.run(&mut host, json!({"mode": "none"}))?;
        let before = counter(&host, "resume_latency_sum_us")?;
        progress("6 resume: resuming");
        let t = Instant::now();
        let resumed = host.resume(&run_id)?;
        let whole = t.elapsed();
        completed(&resumed)?;
        let to_first_live = counter(&host, "resume_latency_sum_us")? - before;
        if resumed.stats.replayed != RESUME_CALLS + 1 || resumed.stats.live != 1 {
            return Err(format!("resume: unexpected stats {:?}", resumed.stats).into());
        }
        self.rows.push(Row::new(
            "6 resume to first live call (host metric)",
            to_first_live as f64 / 1e3,
            "ms",
        ));
        self.rows
            .push(Row::new("6 resume, whole call", us(whole) / 1e3, "ms"));
        self.note(format!(
            "6: a run recorded {RESUME_CALLS} clock calls and one write, then was stopped by a \
             worker shutdown before its last write and released; `Host::resume` (warm component \
             cache) replayed {} calls and made {} live write. `to first live call` is the host's \
             own resume-latency metric (from the start of the execution, after the run is read \
             from the ledger, to the first live call: a history this long is read while it is \
             replayed, so this includes reading it); `whole call` is the \
             wall time of `Host::resume`: claim, reading the history, replay, the live write \
             and finishing the run",
            resumed.stats.replayed, resumed.stats.live
        ));
        Ok(())
    }

    /// Figure 7: resident memory per active run and per pending run.
    fn memory(&mut self) -> Res<()> {
        progress(&format!(
            "7 memory: RSS of a warm worker, idle and with {GROUP_RUNS} runs in flight"
        ));
        let db = self.dir.join("memory.db");
        // The runs sleep until a time far enough ahead for all of them to
        // be claimed and started; RSS is read three quarters of the way
        // there. A try in which a run arrived after that is made again
        // with twice the lead.
        let input = json!({"mode": "none"});
        let ((idle, busy, lead, idle_after), _) =
            self.with_warm_worker(&db, "bench-memory", |host| {
                let idle = rss_bytes()?;
                let (_, busy, lead) = self.started_together(
                    host,
                    "7 memory",
                    &input,
                    MEMORY_LEAD,
                    3,
                    |host, ids, start_at, lead| {
                        let measure_at = start_at - (lead / 4).as_nanos() as u64;
                        std::thread::sleep(Duration::from_nanos(
                            measure_at.saturating_sub(now_ns()),
                        ));
                        let measured_at = now_ns();
                        let busy = rss_bytes()?;
                        wait_completed(host, ids)?;
                        Ok((busy, measured_at))
                    },
                )?;
                // The idle worker again, the runs gone: memory the warm-up
                // left behind may have been given back meanwhile.
                std::thread::sleep(Duration::from_millis(200));
                Ok((idle, busy, lead, rss_bytes()?))
            })?;
        // The baseline is the lower of the idle worker's readings, before
        // and after the runs: a figure above what the runs added is not
        // made smaller by memory given back while they ran.
        let baseline = idle.min(idle_after);
        let per_active = (busy as f64 - baseline as f64) / GROUP_RUNS as f64;
        if per_active > 0.0 {
            self.rows
                .push(Row::new("7 RSS per active run", per_active / 1024.0, "KiB"));
        } else {
            self.note(format!(
                "7 RSS per active run: not measured: RSS with {GROUP_RUNS} runs active ({} KiB) \
                 was not above the idle worker's ({} KiB before, {} KiB after)",
                busy / 1024,
                idle / 1024,
                idle_after / 1024
            ));
        }

        progress(&format!(
            "7 memory: RSS over 2 × {PENDING_RUNS} pending runs"
        ));
        let mut host = self.host("pending.db")?;
        let input = json!({"mode": "none"}).to_string();
        let mut submit_many = || -> Res<(f64, Duration)> {
            let before = rss_bytes()?;
            let t = Instant::now();
            for _ in 0..PENDING_RUNS {
                host.submit(&self.module, WHAT, &input, None)?;
            }
            let took = t.elapsed();
            Ok((rss_bytes()? as f64 - before as f64, took))
        };
        let (first, first_took) = submit_many()?;
        let (second, second_took) = submit_many()?;
        let per_pending = second / PENDING_RUNS as f64;
        self.rows
            .push(Row::new(report::RSS_PENDING, per_pending, "bytes"));
        self.note(format!(
            "7: per active run = (RSS while {GROUP_RUNS} runs of a warm worker sleep in their \
             step, on the worker's timers - RSS of the idle warm worker, the lower of its \
             readings before and after the runs) / {GROUP_RUNS}: the \
             store, the guest's memory, the run's fiber stack and its own SQLite connection; \
             the runs were told to start {} ms after the first submission and RSS was read \
             three quarters of the way there (a try in which a run had not arrived by then is \
             made again with twice the lead, up to {} ms). Per pending run = RSS \
             growth over {PENDING_RUNS} `Host::submit` calls made after {PENDING_RUNS} others \
             ({:.0} KiB in all, {:.1} s); the first {PENDING_RUNS} grew RSS by {:.0} KiB \
             ({:.1} s): SQLite's page cache (bounded, 2 MiB per connection by default) filling \
             up. Pending runs exist only as ledger rows; pending stands in for suspended, since \
             neither holds an instance",
            lead.as_millis(),
            (MEMORY_LEAD * 2u32.pow(MEMORY_RETRIES)).as_millis(),
            second / 1024.0,
            second_took.as_secs_f64(),
            first / 1024.0,
            first_took.as_secs_f64(),
        ));
        Ok(())
    }

    fn print_table(&self) {
        report::print_rows(&self.rows);
        println!();
        for note in &self.notes {
            println!("- {note}");
        }
    }
}
fn completed(report: &RunReport) -> Res<Value> {
    if report.status != RunStatus::Completed {
        return Err(format!(
            "run {} ended {}: {}",
            report.run_id,
            report.status.as_str(),
            report.error.as_deref().unwrap_or("")
        )
        .into());
    }
    Ok(serde_json::from_str(
        report.output.as_deref().unwrap_or("null"),
    )?)
}

/// Waits until every run in `ids` has completed (two minutes at most; a
/// run waiting for its timer is waited for too); an error if one ends
/// otherwise. Looks at one run per poll, so as to disturb the runs as
/// little as can be.
pub(crate) fn wait_completed(host: &Host, ids: &[String]) -> Res<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut done = 0;
    while let Some(id) = ids.get(done) {
        match host.store().run(id)?.status {
            RunStatus::Completed => {
                done += 1;
                continue;
            }
            RunStatus::Pending | RunStatus::Running | RunStatus::Waiting => {}
            other => return Err(format!("run {id} ended {}", other.as_str()).into()),
        }
        if Instant::now() > deadline {
            let left = ids.len() - done;
            return Err(format!("{left} runs did not complete in two minutes").into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// Holds runs at a call: while the bench holds `gate.lock` exclusively,
/// every `gate.read` call waits; opening the gate lets them all go (figure 6
/// stops a run there).
struct Gate {
    dir: PathBuf,
    lock: std::fs::File,
}

impl Gate {
    fn close(dir: &Path) -> Res<Gate> {
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            if entry.file_name().to_string_lossy().starts_with("arrived.") {
                std::fs::remove_file(entry.path())?;
            }
        }
        let lock = std::fs::File::create(dir.join("gate.lock"))?;
        lock.lock()?;
        Ok(Gate {
            dir: dir.to_path_buf(),
            lock,
        })
    }

    /// Waits until `n` calls wait at the gate (two minutes at most).
    fn wait_arrived(&self, n: usize) -> Res<()> {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let arrived = std::fs::read_dir(&self.dir)?
                .filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with("arrived."))
                .count();
            if arrived >= n {
                // Each has left its mark; give it time to reach `flock`.
                std::thread::sleep(Duration::from_millis(50));
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("only {arrived} of {n} runs reached the gate").into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn open(self) -> Res<()> {
        self.lock.unlock()?;
        Ok(())
    }
}

fn counter(host: &Host, name: &str) -> Res<i64> {
    Ok(host
        .store()
        .counters()?
        .into_iter()
        .find(|(n, _)| n == name)
        .map_or(0, |(_, v)| v))
}

/// µs from `t0_ns` to the clock value a `stamp` run's first call read.
fn since_us(t0_ns: u64, stamp_output: &Value) -> Res<f64> {
    let first = stamp_output["first_ns"]
        .as_u64()
        .ok_or("the stamp run returned no first_ns")?;
    Ok(first.saturating_sub(t0_ns) as f64 / 1e3)
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn mean_us(times: &[Duration]) -> f64 {
    times.iter().map(|d| us(*d)).sum::<f64>() / times.len().max(1) as f64
}

/// Of repeated measurements (at least one), the one whose `key` is the
/// median (of an even count, the upper of the middle two).
fn median_by<T: Copy>(mut measured: Vec<T>, key: impl Fn(&T) -> f64) -> T {
    measured.sort_by(|a, b| key(a).total_cmp(&key(b)));
    measured[measured.len() / 2]
}

fn median_us(times: &[Duration]) -> f64 {
    let mut v: Vec<f64> = times.iter().map(|d| us(*d)).collect();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// How many of the finished runs `ids` of the bench guest arrived (read
/// the clock before their sleep) after `t_ns`.
fn arrived_after(host: &Host, ids: &[String], t_ns: u64) -> Res<usize> {
    let mut late = 0;
    for id in ids {
        if output_u64(host, id, "arrived_ns")? > t_ns {
            late += 1;
        }
    }
    Ok(late)
}

/// A number a finished run of the bench guest returned under `key`.
fn output_u64(host: &Host, run_id: &str, key: &str) -> Res<u64> {
    let run = host.store().run(run_id)?;
    let output: Value = serde_json::from_str(run.output.as_deref().unwrap_or("null"))?;
    output[key]
        .as_u64()
        .ok_or_else(|| format!("run {run_id} returned no {key}: {output}").into())
}

/// CPU time (user + system) of this process so far, from /proc/self/stat
/// (in USER_HZ ticks, which Linux fixes at 100 per second).
fn cpu_seconds() -> Res<f64> {
    Ok(procstat::process_cpu_us()
        .ok_or("cannot read this process's CPU time from /proc/self/stat")?
        / 1e6)
}

/// Resident memory of this process (`VmRSS` in /proc/self/status).
fn rss_bytes() -> Res<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .ok_or("no VmRSS in /proc/self/status")?;
    Ok(kib * 1024)
}

fn machine_info(root: &Path, ledger_dir: &Path) -> Value {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let cpu = read("/proc/cpuinfo").and_then(|c| {
        c.lines()
            .find_map(|l| l.strip_prefix("model name"))
            .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
    });
    let mem_kib = read("/proc/meminfo").and_then(|m| {
        m.lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    });
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(root)
            .args(args)
            .stderr(Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let ms = (now_ns() / 1_000_000) as i64;
    json!({
        "nproc": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "kernel": read("/proc/sys/kernel/osrelease").map(|k| k.trim().to_string()),
        "cpu": cpu,
        "mem_total_kib": mem_kib,
        "date": stephost_core::clock::format_time(ms),
        "commit": git(&["rev-parse", "--short", "HEAD"]),
        "dirty": git(&["status", "--porcelain"]).map(|s| !s.is_empty()),
        "ledger_dir": ledger_dir.display().to_string(),
        "profile": if cfg!(debug_assertions) { "dev" } else { "release" },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bench_configuration_is_valid() {
        let config = Config::parse(&config_text(Path::new("/nowhere/gate"))).unwrap();
        config.effects().unwrap();
        assert_eq!(config.limits.calls_max, 1_000_000);
    }

    #[test]
    fn medians_and_means() {
        let ms = |v: &[u64]| {
            v.iter()
                .map(|&m| Duration::from_millis(m))
                .collect::<Vec<_>>()
        };
        assert_eq!(median_us(&ms(&[3, 1, 2])), 2_000.0);
        assert_eq!(median_us(&ms(&[4, 1, 2, 3])), 2_500.0);
        assert_eq!(mean_us(&ms(&[1, 2, 3])), 2_000.0);
        assert!(median_us(&[]).is_nan());
        // The measurement with the median key, whole.
        let runs = vec![(1.3, "b"), (0.9, "a"), (1.1, "c")];
        assert_eq!(median_by(runs, |r| r.0), (1.1, "c"));
        assert_eq!(median_by(vec![(2.0, 1), (1.0, 2)], |r| r.0), (2.0, 1));
    }

    #[test]
    fn this_process_has_memory_and_cpu_time() {
        assert!(rss_bytes().unwrap() > 0);
        assert!(cpu_seconds().unwrap() >= 0.0);
    }

    fn args(list: &[&str]) -> Res<Args> {
        parse_args(list.iter().map(|s| s.to_string()))
    }

    #[test]
    fn the_arguments_of_a_suite_and_of_an_ab() {
        let plain = args(&["--only", "1, 5", "--dir", "/d"]).unwrap();
        assert_eq!(plain.only, [1, 5]);
        assert!(plain.wants(5) && !plain.wants(2));
        assert_eq!(plain.scratch(), PathBuf::from("/d"));
        assert!(plain.ab.is_none());

        let ab = args(&["--ab", "/o/bench", "--ab-cli", "/o/cli", "--ab-rounds", "3"]).unwrap();
        let other = ab.ab.unwrap();
        assert_eq!(other.bench, PathBuf::from("/o/bench"));
        assert_eq!(other.cli, Some(PathBuf::from("/o/cli")));
        assert_eq!((other.guest, other.rounds), (None, 3));
        assert_eq!(args(&["--ab", "/o/bench"]).unwrap().ab.unwrap().rounds, 2);

        for bad in [
            &["--ab-cli", "/o/cli"][..],
            &["--ab", "/o", "--ab-rounds", "0"],
            &["--only", "x"],
            &["--ab"],
            &["--what"],
        ] {
            assert!(args(bad).is_err(), "{bad:?}");
        }
    }

    /// The bench guest (built by `build.rs`) in each mode the suite uses,
    /// on a host over a fresh ledger: the outputs the suite reads.
    #[test]
    fn the_bench_guest_answers_every_mode_the_suite_uses() {
        let dir = tempfile::tempdir().unwrap();
        let bench = Bench::new(dir.path(), std::fs::read(env!("BENCH_GUEST")).unwrap()).unwrap();
        let mut host = bench.host("test.db").unwrap();
        for mode in ["none", "write", "read", "observe"] {
            let (_, output, report) = bench
                .run(&mut host, json!({"mode": mode, "count": 3, "stamps": true}))
                .unwrap();
            let calls = if mode == "none" { 0 } else { 3 };
            assert_eq!(output["calls"], calls, "{mode}: {output}");
            let recorded = host.store().calls(&report.run_id, 1, usize::MAX).unwrap();
            // `stamps` adds a clock call before and after.
            let stamps = if mode == "none" { 0 } else { 2 };
            assert_eq!(recorded.len(), calls + stamps, "{mode}");
        }
        let t0 = now_ns();
        let (_, output, _) = bench.run(&mut host, json!({"mode": "stamp"})).unwrap();
        assert!(since_us(t0, &output).unwrap() > 0.0);
        let start_at = now_ns() + 1_000_000;
        let (_, output, report) = bench
            .run(
                &mut host,
                json!({"mode": "none", "start_at_ns": start_at, "stamps": true}),
            )
            .unwrap();
        assert!(output["arrived_ns"].as_u64().unwrap() <= start_at);
        assert!(output_u64(&host, &report.run_id, "arrived_ns").unwrap() > 0);
        let replayed = host.replay(&report.run_id, None).unwrap();
        assert!(matches!(replayed.verdict, ReplayVerdict::Consistent { .. }));
    }
}
