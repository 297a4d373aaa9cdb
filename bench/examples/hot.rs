//! One workload of the bench in a loop, for profilers:
//! `cargo build -p stephost-bench --example hot && perf record target/debug/examples/hot write 2000 10 /dev/shm`.
//! Arguments: mode (`write`, `read`, `observe`, `none`, or `replay`: one
//! recorded run of clock calls replayed again and again; `load`: its calls
//! read out of the ledger again and again; `group`: rounds of 64 runs (or `GROUP_RUNS=N`) of
//! writes at once in one worker, as figure 5; `short`: that many runs
//! submitted, then executed by one worker 4 at once (or `GROUP_RUNS=N`), as
//! figure 4's worker row with `short 2 1000`, printing runs/s and the
//! process's CPU per run),
//! calls per run, runs (rounds),
//! and the folder for the ledger (default `target`; `LEDGER=URL` names
//! another ledger, e.g. a PostgreSQL one). Prints µs per call
//! and the CPU µs per call of each thread of the process, which on a shared
//! machine moves less from run to run than wall time (for `group`, how many
//! commits shared a transaction and an fsync, and the CPU µs per write of
//! the whole process, since the worker's threads end with each round).

use std::time::Instant;

#[path = "../src/procstat.rs"]
mod procstat;

use stephost_core::store::Opener;
use stephost_core::store::{CommitCounts, PoolOptions};
use stephost_ledger::Ledger;
use stephost_runtime::HostOptions;
use stephost_runtime::config::Config;
use stephost_runtime::runner::Host;
use stephost_runtime::worker::{self, WorkerOptions};

/// A host over the SQLite ledger at `db`, or the ledger `LEDGER` names
/// (e.g. a PostgreSQL URL).
fn open_host(
    db: &std::path::Path,
    options: HostOptions,
) -> Result<Host, Box<dyn std::error::Error>> {
    let ledger = match std::env::var("LEDGER") {
        Ok(url) => Ledger::parse(&url)?,
        Err(_) => Ledger::sqlite(db),
    };
    let pool = ledger.open(PoolOptions::default())?;
    Ok(Host::open(pool, options)?)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    stephost::allocator::configure();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map_or("write", String::as_str);
    let count: u64 = args.get(1).map_or(Ok(2000), |s| s.parse())?;
    let runs: u32 = args.get(2).map_or(Ok(10), |s| s.parse())?;
    let dir = args.get(3).map_or("target", String::as_str);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let module =
        std::fs::read(root.join("target/guest-wasm/wasm32-wasip2/release/bench_guest.wasm"))?;
    let config = Config::parse(
        "[limits]\ncalls_max = 10000000\n[effects.\"noop.write\"]\nkind = \"echo\"\nclass = \"write\"\n\
         [effects.\"noop.read\"]\nkind = \"echo\"\nclass = \"read\"\n",
    )?;
    let options = HostOptions {
        limits: config.limits.clone(),
        effects: config.effects()?,
        instance_pool: if std::env::var_os("NO_POOL").is_some() {
            0
        } else {
            4
        },
        ..HostOptions::default()
    };
    let tmp = tempfile::tempdir_in(dir)?;
    // KEEP=1 leaves the ledger behind, for a look at its pages.
    let (_removed, tmp) = if std::env::var_os("KEEP").is_some() {
        let kept = tmp.keep();
        eprintln!("the ledger stays in {}", kept.display());
        (None, kept)
    } else {
        let path = tmp.path().to_path_buf();
        (Some(tmp), path)
    };
    if mode == "group" {
        return group(&tmp.join("hot.db"), &module, &config, count, runs);
    }
    if mode == "short" {
        return short(&tmp.join("hot.db"), &module, &config, count, runs);
    }
    let mut host = open_host(&tmp.join("hot.db"), options)?;
    let guest_mode = if mode == "replay" || mode == "load" {
        "observe"
    } else {
        mode
    };
    let input = serde_json::json!({"mode": guest_mode, "count": count}).to_string();
    let step = host.load(&module, "bench_guest.wasm")?;
    let recorded = host.run_loaded(&step, &input, None)?;
    let run = |host: &mut Host| -> Result<(), Box<dyn std::error::Error>> {
        if mode == "load" {
            host.store().calls(&recorded.run_id, 1, usize::MAX)?;
        } else if mode == "replay" {
            host.replay(&recorded.run_id, None)?;
        } else {
            host.run_loaded(&step, &input, None)?;
        }
        Ok(())
    };
    let mut per = Vec::new();
    let before = thread_cpu();
    for _ in 0..runs {
        let t = Instant::now();
        run(&mut host)?;
        per.push(t.elapsed().as_secs_f64() * 1e6 / count.max(1) as f64);
    }
    let after = thread_cpu();
    per.sort_by(f64::total_cmp);
    println!(
        "{mode}: µs per call: min {:.2}, median {:.2} ({runs} runs of {count})",
        per[0],
        per[per.len() / 2]
    );
    print_cpu(&before, &after, f64::from(runs) * count.max(1) as f64);
    Ok(())
}

/// CPU time (µs) of each thread of this process, by thread id, with its name.
fn thread_cpu() -> std::collections::BTreeMap<u64, (String, f64)> {
    let mut out = std::collections::BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for task in tasks.flatten() {
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        if let Some(used) = procstat::cpu_of(&stat) {
            let tid = task.file_name().to_string_lossy().parse().unwrap_or(0);
            out.insert(tid, used);
        }
    }
    out
}

/// Prints CPU µs per call of each thread that used any between `before`
/// and `after` (threads that ended in between are not seen).
fn print_cpu(
    before: &std::collections::BTreeMap<u64, (String, f64)>,
    after: &std::collections::BTreeMap<u64, (String, f64)>,
    calls: f64,
) {
    let mut parts = Vec::new();
    let mut total = 0.0;
    for (tid, (name, cpu)) in after {
        let used = cpu - before.get(tid).map_or(0.0, |(_, c)| *c);
        if used > 0.0 {
            total += used;
            parts.push(format!("{name} {:.2}", used / calls));
        }
    }
    println!(
        "cpu µs per call: {:.2} ({})",
        total / calls,
        parts.join(", ")
    );
}

/// `short`: `runs` runs of `count` writes, submitted first, then executed
/// by one worker, 4 at once (or `GROUP_RUNS=N`), as figure 4's worker row.
fn short(
    db: &std::path::Path,
    module: &[u8],
    config: &Config,
    count: u64,
    runs: u32,
) -> Result<(), Box<dyn std::error::Error>> {
    let slots = group_runs(4);
    let make = || worker_host_options(db, config);
    let mut host = open_host(db, make())?;
    let ledger = Ledger::sqlite(db);
    let worker = worker_options(slots);
    let never = std::sync::atomic::AtomicBool::new(false);
    // A first worker fills the compiled-component cache.
    host.submit(module, "bench_guest.wasm", r#"{"mode":"none"}"#, None)?;
    worker::run(&ledger, &make, &worker, &never)?;
    let input = serde_json::json!({"mode": "write", "count": count}).to_string();
    for _ in 0..runs {
        host.submit(module, "bench_guest.wasm", &input, None)?;
    }
    let cpu = procstat::process_cpu_us().unwrap_or(0.0);
    let t = Instant::now();
    let report = worker::run(&ledger, &make, &worker, &never)?;
    let took = t.elapsed().as_secs_f64();
    let cpu = procstat::process_cpu_us().unwrap_or(0.0) - cpu;
    if report.completed != runs as usize {
        return Err(format!("{report:?}").into());
    }
    println!(
        "short: {:.0} runs/s ({runs} runs of {count} writes, {slots} at once); {:.0} µs of CPU \
         a run; {:.1} commits per fsync",
        f64::from(runs) / took,
        cpu / f64::from(runs),
        report.commits.commits as f64 / report.commits.fsyncs.max(1) as f64,
    );
    Ok(())
}

/// Rounds of 64 runs (or `GROUP_RUNS=N`) of `count` writes each, executed by one worker at
/// once; prints µs per write (wall time of a round / writes in it).
fn group(
    db: &std::path::Path,
    module: &[u8],
    config: &Config,
    count: u64,
    rounds: u32,
) -> Result<(), Box<dyn std::error::Error>> {
    let runs = group_runs(64);
    let make = || worker_host_options(db, config);
    let mut host = open_host(db, make())?;
    let ledger = Ledger::sqlite(db);
    let input = serde_json::json!({"mode": "write", "count": count}).to_string();
    let worker = worker_options(runs);
    let never = std::sync::atomic::AtomicBool::new(false);
    let mut per = Vec::new();
    let mut cpu_us = 0.0;
    let mut shared = CommitCounts::default();
    for round in 0..=rounds {
        for _ in 0..runs {
            host.submit(module, "bench_guest.wasm", &input, None)?;
        }
        let cpu = procstat::process_cpu_us().unwrap_or(0.0);
        let t = Instant::now();
        let report = worker::run(&ledger, &make, &worker, &never)?;
        if report.completed != runs {
            return Err(format!("round {round}: {report:?}").into());
        }
        shared.commits += report.commits.commits;
        shared.transactions += report.commits.transactions;
        shared.fsyncs += report.commits.fsyncs;
        // Round 0 fills the compiled-component cache.
        if round > 0 {
            per.push(t.elapsed().as_secs_f64() * 1e6 / (runs as u64 * count) as f64);
            cpu_us += procstat::process_cpu_us().unwrap_or(0.0) - cpu;
        }
    }
    per.sort_by(f64::total_cmp);
    if per.is_empty() {
        return Err("give at least one round".into());
    }
    println!(
        "group: µs per write: min {:.2}, median {:.2} ({rounds} rounds of {runs} runs of {count}); \
         {:.1} commits per transaction, {:.1} per fsync",
        per[0],
        per[per.len() / 2],
        shared.commits as f64 / shared.transactions.max(1) as f64,
        shared.commits as f64 / shared.fsyncs.max(1) as f64,
    );
    // The worker's threads end with each round, so only the process's
    // total is left to read.
    println!(
        "cpu µs per write: {:.2} (all threads)",
        cpu_us / (f64::from(rounds) * (runs as u64 * count) as f64)
    );
    Ok(())
}

/// Runs at once: `GROUP_RUNS=N`, or `default`.
fn group_runs(default: usize) -> usize {
    std::env::var("GROUP_RUNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

/// A worker's hosts: the effects of `config`, a compiled-component cache
/// next to `db`.
fn worker_host_options(db: &std::path::Path, config: &Config) -> HostOptions {
    HostOptions {
        limits: config.limits.clone(),
        effects: config.effects().expect("effects parsed before"),
        cache_dir: Some(db.with_extension("cache")),
        ..HostOptions::default()
    }
}

/// A worker of `concurrency` runs at once that stops when nothing is left.
fn worker_options(concurrency: usize) -> WorkerOptions {
    WorkerOptions {
        concurrency,
        exit_when_idle: true,
        poll_ms: 1,
        ..Default::default()
    }
}
