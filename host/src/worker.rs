//! A worker: claims runnable runs by compare-and-set and executes up to
//! `concurrency` of them at once, renewing their leases in the background.
//! A run whose lease cannot be renewed is stopped before its next external
//! call; on shutdown the worker stops claiming, lets active runs reach their
//! next call boundary, releases their claims and returns.
//!
//! With `concurrency` above 1, the runs' commits go through one group
//! committer and the runs are tasks of an async runtime with a thread per
//! core (see [`Host::execute_claimed_task`]): a run waiting for its write's
//! fsync holds no thread, and the fsync's writers are woken by queueing
//! their tasks. Each run has its own ledger connection (a finished run's is
//! kept for the next). With `concurrency` 1, the run executes on a thread
//! of its own, its durable writes committed on its own connection.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::engine::StepEngine;
use crate::error::HostError;
use crate::journal::RunControl;
use crate::ledger::group::CommitHandle;
use crate::ledger::{
    Claim, CommitCounts, GroupCommitter, GroupLedger, Ledger, LedgerError, RunStatus, SqliteLedger,
};
use crate::runner::{Host, HostOptions, RunReport};

#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// Runs executed at once.
    pub concurrency: usize,
    /// How long a claim lasts unless renewed.
    pub lease_ms: i64,
    /// This worker's owner name in claims.
    pub worker_id: String,
    /// Pause between looks for runnable runs when there is nothing to do;
    /// a run of this worker that ends cuts it short.
    pub poll_ms: u64,
    /// Stop once no run is runnable and none is active (for scripts and tests).
    pub exit_when_idle: bool,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        WorkerOptions {
            concurrency: 4,
            lease_ms: 30_000,
            worker_id: crate::owner::this_process(),
            poll_ms: 200,
            exit_when_idle: false,
        }
    }
}

/// What a worker did, for its exit report.
#[derive(Debug, Default, Clone)]
pub struct WorkerReport {
    pub completed: usize,
    pub failed: usize,
    pub parked: usize,
    pub released: usize,
    pub waiting: usize,
    pub abandoned: usize,
    pub claim_conflicts: usize,
    pub lease_losses: usize,
    /// How the runs' commits shared transactions and fsyncs (with
    /// `concurrency` above 1; zeros otherwise).
    pub commits: CommitCounts,
}

struct Active {
    claim: Claim,
    control: Arc<RunControl>,
}

type Finished = (String, Result<RunReport, HostError>);

/// Runs a worker until `shutdown` is set (or, with `exit_when_idle`, until
/// there is nothing left to do).
pub fn run(
    db: &Path,
    make_options: &(dyn Fn() -> HostOptions + Sync),
    options: &WorkerOptions,
    shutdown: &AtomicBool,
) -> Result<WorkerReport, HostError> {
    // A worker lives for many runs: their instances come from a pool with
    // a slot for each run it may hold at once (and one for a replay).
    let mut host_options = make_options();
    host_options.instance_pool = options.concurrency as u32 + 1;
    let engine = Arc::new(StepEngine::with_options(
        host_options.cache_dir.as_deref(),
        host_options.instance_pool(),
    )?);
    let mut ledger = SqliteLedger::open(db)?;
    // With several runs at once, their writes share transactions and fsyncs.
    let committer = if options.concurrency > 1 {
        Some(GroupCommitter::start(db)?)
    } else {
        None
    };
    // Declared after the committer, so dropped before it: their ledgers
    // hold handles to its queue, which must close for it to stop.
    let idle = Arc::new(IdleHosts::default());
    // With a committer, runs are tasks on a few threads (see
    // `Host::execute_claimed_task`); dropped first, once every run is done.
    let tasks = match &committer {
        Some(_) => Some(task_runtime(options.concurrency)?),
        None => None,
    };
    let active: Arc<Mutex<HashMap<String, Active>>> = Arc::default();
    let (done_tx, done_rx) = mpsc::channel::<Finished>();
    let mut report = WorkerReport::default();
    let mut last_renewal = Instant::now();
    let renew_every = Duration::from_millis((options.lease_ms / 3).max(10) as u64);

    std::thread::scope(|scope| -> Result<(), HostError> {
        loop {
            // Collect finished runs.
            while let Ok(finished) = done_rx.try_recv() {
                collect(&active, &mut report, finished);
            }
            if last_renewal.elapsed() >= renew_every {
                renew_all(&mut ledger, &active, &mut report);
                last_renewal = Instant::now();
            }
            let draining = shutdown.load(Ordering::SeqCst);
            if draining {
                for a in active_lock(&active).values() {
                    a.control.drain.store(true, Ordering::SeqCst);
                }
                if active_lock(&active).is_empty() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            let free = options
                .concurrency
                .saturating_sub(active_lock(&active).len());
            let mut claimed = 0;
            if free > 0 {
                let now = crate::clock::now_ms();
                let candidates = match ledger.runnable(now, free * 4 + 8) {
                    Ok(c) => c,
                    // A busy ledger: look again on the next round.
                    Err(e) => {
                        eprintln!("stephost worker: listing runnable runs: {e}");
                        Vec::new()
                    }
                };
                for run in candidates {
                    if claimed == free {
                        break;
                    }
                    if active_lock(&active).contains_key(&run.run_id) {
                        continue;
                    }
                    let claimable = match (&run.owner, run.lease_until_ms) {
                        (Some(owner), Some(until)) => {
                            until <= now || !crate::owner::is_alive(owner)
                        }
                        _ => true,
                    };
                    if !claimable {
                        continue;
                    }
                    let claim = match ledger.claim_due(
                        &run.run_id,
                        &options.worker_id,
                        options.lease_ms,
                        now,
                        &crate::owner::is_alive,
                    ) {
                        Ok(claim) => claim,
                        Err(
                            LedgerError::VersionConflict { .. }
                            | LedgerError::ClaimedElsewhere { .. }
                            | LedgerError::NotClaimable { .. },
                        ) => {
                            report.claim_conflicts += 1;
                            continue;
                        }
                        // A busy ledger: try again on the next round.
                        Err(e) => {
                            eprintln!("stephost worker: claiming {}: {e}", run.run_id);
                            continue;
                        }
                    };
                    crate::crash::point("after-claim", 0);
                    claimed += 1;
                    let control = Arc::new(RunControl::default());
                    active_lock(&active).insert(
                        run.run_id.clone(),
                        Active {
                            claim: claim.clone(),
                            control: control.clone(),
                        },
                    );
                    let tx = done_tx.clone();
                    let host = idle.take().map_or_else(
                        || RunHost::New {
                            db: db.to_path_buf(),
                            engine: engine.clone(),
                            commits: committer.as_ref().map(GroupCommitter::handle),
                            options: make_options(),
                        },
                        RunHost::Idle,
                    );
                    if let Some(tasks) = &tasks {
                        spawn_task(
                            tasks,
                            host,
                            idle.clone(),
                            run.run_id.clone(),
                            claim,
                            control,
                            tx,
                        );
                        continue;
                    }
                    let idle = &idle;
                    scope.spawn(move || {
                        let run_id = run.run_id.clone();
                        let result = host.open().and_then(|mut host| {
                            // A panic must not leave the run looking active
                            // (renewed forever, never taken over).
                            let result =
                                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                    host.execute_claimed(&run_id, claim, control)
                                }))
                                .unwrap_or_else(|_| Err(panicked(&run_id)));
                            if result.is_ok() {
                                idle.give_back(host);
                            }
                            result
                        });
                        let _ = tx.send((run_id, result));
                    });
                }
            }
            if claimed == 0 {
                if options.exit_when_idle && active_lock(&active).is_empty() {
                    let now = crate::clock::now_ms();
                    if ledger.runnable(now, 1).is_ok_and(|w| w.is_empty()) {
                        break;
                    }
                }
                // Look again after `poll_ms`, or as soon as one of this
                // worker's runs ends: its slot is free for the next run
                // (sleeping out the interval left it idle, up to 200 ms by
                // default, after every run).
                if let Ok(finished) = done_rx.recv_timeout(Duration::from_millis(options.poll_ms)) {
                    collect(&active, &mut report, finished);
                }
            }
        }
        Ok(())
    })?;
    while let Ok((run_id, result)) = done_rx.try_recv() {
        tally(&mut report, &run_id, result);
    }
    if let Some(committer) = &committer {
        report.commits = committer.counts();
    }
    let _ = ledger.add_counters(&counters(&report));
    Ok(report)
}

/// The runtime a worker's runs are tasks of: a thread per core (and no
/// more than runs at once).
fn task_runtime(concurrency: usize) -> Result<tokio::runtime::Runtime, HostError> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores.min(concurrency).max(1))
        .thread_name("stephost-run")
        // WASI clocks' sleeps and polls wait on the runtime's timers.
        .enable_time()
        .build()
        .map_err(|e| HostError::Internal(format!("cannot start the worker's runtime: {e}")))
}

/// The host a run executes on.
enum RunHost {
    /// A finished run's, idle.
    Idle(Host),
    /// A new one, with a connection of its own whose writes go through
    /// the worker's committer, if it has one, or a committer of its own.
    New {
        db: std::path::PathBuf,
        engine: Arc<StepEngine>,
        commits: Option<CommitHandle>,
        options: HostOptions,
    },
}

impl RunHost {
    fn open(self) -> Result<Host, HostError> {
        match self {
            RunHost::Idle(host) => Ok(host),
            RunHost::New {
                db,
                engine,
                commits,
                options,
            } => {
                let direct = SqliteLedger::open(&db)?;
                let ledger = Box::new(match commits {
                    Some(commits) => GroupLedger::new(direct, commits),
                    None => GroupLedger::pipelined(direct),
                });
                Ok(Host::with_engine(engine, ledger, options))
            }
        }
    }
}

/// Executes a claimed run as a task of `tasks` on `host`, given back to
/// `idle` after a run without an error; its result goes to `done`.
fn spawn_task(
    tasks: &tokio::runtime::Runtime,
    host: RunHost,
    idle: Arc<IdleHosts>,
    run_id: String,
    claim: Claim,
    control: Arc<RunControl>,
    done: mpsc::Sender<Finished>,
) {
    let id = run_id.clone();
    let work = tasks.spawn(async move {
        let mut host = host.open()?;
        let result = host.execute_claimed_task(&id, claim, control).await;
        if result.is_ok() {
            idle.give_back(host);
        }
        result
    });
    // A panic must not leave the run looking active (renewed forever,
    // never taken over).
    tasks.spawn(async move {
        let result = work.await.unwrap_or_else(|_| Err(panicked(&run_id)));
        let _ = done.send((run_id, result));
    });
}

fn panicked(run_id: &str) -> HostError {
    HostError::Internal(format!(
        "executing run {run_id} panicked; its claim lapses and another worker resumes it"
    ))
}

/// Hosts of this worker's finished runs, for its next runs: a host's
/// ledger connection, with the statements it has prepared, outlives its run
/// (opening a connection and preparing the statements a run uses took about
/// 0.1 ms a run alone, and more beside 64 running runs). Only a run that
/// ended without an error gives its host back; there are never more hosts
/// than runs at once.
#[derive(Default)]
struct IdleHosts(Mutex<Vec<Host>>);

impl IdleHosts {
    fn take(&self) -> Option<Host> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).pop()
    }

    fn give_back(&self, host: Host) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(host);
    }
}

fn active_lock(
    active: &Mutex<HashMap<String, Active>>,
) -> std::sync::MutexGuard<'_, HashMap<String, Active>> {
    active.lock().unwrap_or_else(|p| p.into_inner())
}

/// Extends every active claim's lease; a claim that cannot be renewed is
/// marked lost so that its run stops before its next external call.
fn renew_all(
    ledger: &mut SqliteLedger,
    active: &Mutex<HashMap<String, Active>>,
    report: &mut WorkerReport,
) {
    let now = crate::clock::now_ms();
    for a in active_lock(active).values() {
        match ledger.renew(&a.claim, now) {
            Ok(()) => {}
            // The run just finished or was released by its own task or thread.
            Err(LedgerError::Fenced { held, newest, .. }) if held == newest => {}
            Err(LedgerError::Fenced { .. }) => {
                if !a.control.lost.swap(true, Ordering::SeqCst) {
                    report.lease_losses += 1;
                    eprintln!(
                        "stephost worker: lost the claim on run {}; it stops before its next call",
                        a.claim.run_id
                    );
                }
            }
            // A busy or failing ledger: try again next round; the lease
            // still has two thirds of its time.
            Err(e) => eprintln!("stephost worker: renewing {}: {e}", a.claim.run_id),
        }
    }
}

/// A run of this worker has ended: its slot is free, and its result
/// counted.
fn collect(active: &Mutex<HashMap<String, Active>>, report: &mut WorkerReport, finished: Finished) {
    let (run_id, result) = finished;
    active_lock(active).remove(&run_id);
    tally(report, &run_id, result);
}

fn tally(report: &mut WorkerReport, run_id: &str, result: Result<RunReport, HostError>) {
    match result {
        Ok(r) => {
            match r.status {
                RunStatus::Completed => report.completed += 1,
                RunStatus::Failed | RunStatus::Diverged => report.failed += 1,
                RunStatus::Parked => report.parked += 1,
                RunStatus::Waiting => report.waiting += 1,
                RunStatus::Pending | RunStatus::Running => report.released += 1,
            }
            eprintln!("stephost worker: run {run_id} {}", r.status.as_str());
        }
        Err(e) => {
            report.abandoned += 1;
            eprintln!("stephost worker: run {run_id} abandoned: {e}");
        }
    }
}

fn counters(report: &WorkerReport) -> crate::journal::Counters {
    let mut c = crate::journal::Counters::new();
    c.insert("claim_conflict_total", report.claim_conflicts as i64);
    c.insert("lease_loss_total", report.lease_losses as i64);
    let commits = &report.commits;
    c.insert("group_commit_commit_total", commits.commits as i64);
    c.insert(
        "group_commit_transaction_total",
        commits.transactions as i64,
    );
    c.insert("group_commit_fsync_total", commits.fsyncs as i64);
    c
}
