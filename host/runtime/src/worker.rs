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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use stephost_core::journal::{Counters, RunControl};
use stephost_core::lifecycle::{self, ClaimMode};
use stephost_core::store::{CommitCounts, Opener, PoolOptions};
use stephost_core::{Claim, Pool, RunStatus, Store, StoreError};

use crate::engine::StepEngine;
use crate::error::HostError;
use crate::options::HostOptions;
use crate::runner::{Host, RunReport};

#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// Runs executed at once.
    pub concurrency: usize,
    /// How long a claim lasts unless renewed.
    pub lease_ms: i64,
    /// This worker's owner name in claims.
    pub worker_id: String,
    /// Pause between looks for runnable runs when there is nothing to do,
    /// on a ledger that cannot tell the worker when a run becomes due (a
    /// SQLite file where inotify is not available); a run of this worker
    /// that ends cuts it short.
    pub poll_ms: u64,
    /// The same pause on a ledger that wakes the worker when a run becomes
    /// due (PostgreSQL's notifications, a SQLite file's wake file): a
    /// fallback, in case one is lost. A run the worker saw due sooner (a
    /// timer, a lapsing lease) cuts it short too.
    pub notified_poll_ms: u64,
    /// Stop once no run is runnable and none is active (for scripts and tests).
    pub exit_when_idle: bool,
    /// Told the id of each run whose execution by this worker ended (as
    /// its row was left: finished, waiting, parked or released), before
    /// the worker looks for more.
    pub on_end: Option<EndHook>,
    /// Finished runs this worker deletes in the background (`[retention]`).
    pub retention: Option<crate::retention::RetentionConfig>,
}

/// What a worker tells when one of its runs' executions ends.
#[derive(Clone)]
pub struct EndHook(pub Arc<dyn Fn(&str) + Send + Sync>);

impl std::fmt::Debug for EndHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EndHook")
    }
}

impl Default for WorkerOptions {
    fn default() -> Self {
        WorkerOptions {
            concurrency: 4,
            lease_ms: 30_000,
            worker_id: crate::owner::this_process(),
            poll_ms: 200,
            notified_poll_ms: 5_000,
            exit_when_idle: false,
            on_end: None,
            retention: None,
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
    pub cancelled: usize,
    pub abandoned: usize,
    pub claim_conflicts: usize,
    pub lease_losses: usize,
    /// Runs not claimed, or stopped, because their record does not verify
    /// against the chain key.
    pub integrity_refusals: usize,
    /// Schedules' slots this worker fired (each a run it recorded).
    pub scheduled: usize,
    /// How the runs' commits shared transactions and fsyncs (with
    /// `concurrency` above 1; zeros otherwise).
    pub commits: CommitCounts,
}

struct Active {
    claim: Claim,
    control: Arc<RunControl>,
    /// The trace the run reports into, for the worker's lines about it.
    trace_id: String,
}

/// Runs a worker will not claim again: their record does not verify. Kept
/// by run id and the row's version, so a run whose row changes (restored
/// from a backup) is looked at again; bounded.
#[derive(Default)]
struct Refused(std::collections::HashSet<(String, i64)>);

impl Refused {
    /// Most runs remembered; past it the set starts over.
    const RUNS_MAX: usize = 10_000;

    fn contains(&self, run: &stephost_core::RunRecord) -> bool {
        self.0.contains(&(run.run_id.clone(), run.version))
    }

    /// Whether the run was refused at any version.
    fn contains_run(&self, run_id: &str) -> bool {
        self.0.iter().any(|(id, _)| id == run_id)
    }

    fn insert(&mut self, run: &stephost_core::RunRecord) {
        self.remember(run.run_id.clone(), run.version);
    }

    fn remember(&mut self, run_id: String, version: i64) {
        if self.0.len() >= Self::RUNS_MAX {
            self.0.clear();
        }
        self.0.insert((run_id, version));
    }

    /// A run this worker executed stopped on a record that does not
    /// verify (its calls, checked as they were replayed): its claim lapses
    /// and it is not claimed again, at the version its row has now.
    fn note(&mut self, store: &dyn Store, finished: &Finished, report: &mut WorkerReport) {
        let (run_id, result) = finished;
        if let Err(HostError::Integrity(_)) = result {
            report.integrity_refusals += 1;
            if let Ok(run) = store.run(run_id) {
                self.insert(&run);
            }
        }
    }
}

type Finished = (String, Result<RunReport, HostError>);

/// How often an idle worker looks whether it was told to stop.
const SHUTDOWN_CHECK: Duration = Duration::from_millis(100);

/// Sets its flag when dropped (when a scope's closure returns, before the
/// scope joins its threads).
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// What wakes the worker's loop.
enum Event {
    /// A run of this worker ended.
    Finished(Finished),
    /// The ledger says a run may have become due.
    Due,
}

impl WorkerOptions {
    /// A worker's options from its flags: at least one run at once, and a
    /// lease of at least 100 ms.
    pub fn new(concurrency: usize, lease_ms: i64, worker_id: String) -> Self {
        WorkerOptions {
            concurrency: concurrency.max(1),
            lease_ms: lease_ms.max(100),
            worker_id,
            ..WorkerOptions::default()
        }
    }

    /// These options with the pause between looks for runnable runs set to
    /// `poll_ms` whatever the ledger (the `--poll-ms` flag), if given.
    pub fn polling(self, poll_ms: Option<u64>) -> Self {
        match poll_ms {
            Some(ms) => WorkerOptions {
                poll_ms: ms.max(1),
                notified_poll_ms: ms.max(1),
                ..self
            },
            None => self,
        }
    }
}

/// Runs a worker over `ledger` until `shutdown` is set (or, with
/// `exit_when_idle`, until there is nothing left to do). The hosts it runs
/// runs with take `make_options()`, with this worker's owner name and lease.
pub fn run(
    ledger: &dyn Opener,
    make_options: &(dyn Fn() -> HostOptions + Sync),
    options: &WorkerOptions,
    shutdown: &AtomicBool,
) -> Result<WorkerReport, HostError> {
    let make_options = &|| HostOptions {
        owner: options.worker_id.clone(),
        lease_ms: options.lease_ms,
        ..make_options()
    };
    // A worker lives for many runs: their instances come from a pool with
    // a slot for each run it may hold at once (and one for a replay).
    let mut host_options = make_options();
    host_options.instance_pool = options.concurrency as u32 + 1;
    let engine = Arc::new(StepEngine::with_options(
        host_options.cache_dir.as_deref(),
        host_options.instance_pool(),
    )?);
    // With several runs at once, their commits share transactions and
    // fsyncs, and the runs are tasks on a thread per core.
    let concurrent = options.concurrency > 1;
    let pool = ledger.open(PoolOptions {
        group_commit: concurrent,
    })?;
    let store = pool.store()?;
    let schedules = pool.schedules()?;
    // When to look at the schedules again: at the earliest next slot, and
    // at least every poll (a schedule added meanwhile).
    let mut schedules_look_at = i64::MIN;
    let idle = Arc::new(IdleHosts::default());
    let tasks = match concurrent {
        true => Some(task_runtime(options.concurrency)?),
        false => None,
    };
    let active: Arc<Mutex<HashMap<String, Active>>> = Arc::default();
    let (done_tx, done_rx) = mpsc::channel::<Event>();
    let due_tx = std::sync::Mutex::new(done_tx.clone());
    let notified = pool.watch_due(Arc::new(move || {
        let _ = due_tx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(Event::Due);
    }))?;
    let poll = Duration::from_millis(match notified {
        true => options.notified_poll_ms,
        false => options.poll_ms,
    });
    let mut report = WorkerReport::default();
    // Runs whose record does not verify (by id and the version seen): not
    // claimed again until their row changes.
    let mut refused = Refused::default();
    let signer = host_options.signer.clone();
    let mut last_renewal = Instant::now();
    let renew_every = Duration::from_millis((options.lease_ms / 3).max(10) as u64);

    let retention = match &options.retention {
        Some(config) => Some((pool.retention()?, config)),
        None => None,
    };
    // Set when the loop ends, however it ends: the retention thread stops.
    let stopped = AtomicBool::new(false);
    std::thread::scope(|scope| -> Result<(), HostError> {
        let _stop_retention = SetOnDrop(&stopped);
        if let Some((retention, config)) = &retention {
            let stopped = &stopped;
            std::thread::Builder::new()
                .name("retention".into())
                .spawn_scoped(scope, move || {
                    crate::retention::keep(retention.as_ref(), config, stopped)
                })
                .map_err(|e| {
                    HostError::BadInput(format!("cannot start the retention thread: {e}"))
                })?;
        }
        loop {
            while let Ok(event) = done_rx.try_recv() {
                if let Event::Finished(finished) = event {
                    refused.note(store.as_ref(), &finished, &mut report);
                    collect(&active, &mut report, finished);
                }
            }
            if last_renewal.elapsed() >= renew_every {
                renew_all(store.as_ref(), &active, &mut report);
                last_renewal = Instant::now();
            }
            if shutdown.load(Ordering::SeqCst) {
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
            // When the earliest run not yet due will be.
            let mut next_due: Option<i64> = None;
            let now = stephost_core::clock::now_ms();
            if now >= schedules_look_at {
                let poll_ms = poll.as_millis().min(i64::MAX as u128) as i64;
                schedules_look_at = now.saturating_add(poll_ms);
                match crate::schedules::fire_due(store.as_ref(), schedules.as_ref(), &signer, now) {
                    Ok(fired) => {
                        report.scheduled += fired.runs.len();
                        if let Some(at) = fired.next_at_ms {
                            schedules_look_at = schedules_look_at.min(at);
                        }
                    }
                    // A busy ledger: look again on the next round.
                    Err(e) => {
                        crate::logs::error("worker", None, format_args!("firing schedules: {e}"));
                    }
                }
            }
            if free > 0 {
                let listed = match store.due_runs(free * 4 + 8) {
                    Ok(runs) => runs,
                    // A busy ledger: look again on the next round.
                    Err(e) => {
                        crate::logs::error("worker", None, format_args!("listing due runs: {e}"));
                        Vec::new()
                    }
                };
                let now = stephost_core::clock::now_ms();
                next_due = listed
                    .iter()
                    .filter_map(lifecycle::due_at)
                    .find(|due| *due > now);
                for run in &listed {
                    if claimed == free {
                        break;
                    }
                    if active_lock(&active).contains_key(&run.run_id)
                        || refused.contains(run)
                        || lifecycle::check_claimable(
                            run,
                            &options.worker_id,
                            now,
                            ClaimMode::Due,
                            &crate::owner::is_alive,
                        )
                        .is_err()
                    {
                        continue;
                    }
                    let trace_id = run.trace().trace_id;
                    if let Err(e) = lifecycle::check_sealed(&signer, run) {
                        run_warning(
                            &run.run_id,
                            &trace_id,
                            format_args!("not claiming run {}: {e}", run.run_id),
                        );
                        refused.insert(run);
                        report.integrity_refusals += 1;
                        continue;
                    }
                    let claim = match lifecycle::claim_read(
                        store.as_ref(),
                        run,
                        &options.worker_id,
                        options.lease_ms,
                        now,
                        ClaimMode::Due,
                        &crate::owner::is_alive,
                    ) {
                        Ok(claim) => claim,
                        Err(
                            StoreError::VersionConflict { .. }
                            | StoreError::ClaimedElsewhere { .. }
                            | StoreError::NotClaimable { .. },
                        ) => {
                            report.claim_conflicts += 1;
                            continue;
                        }
                        // A busy ledger: try again on the next round.
                        Err(e) => {
                            run_warning(
                                &run.run_id,
                                &trace_id,
                                format_args!("claiming {}: {e}", run.run_id),
                            );
                            continue;
                        }
                    };
                    stephost_core::crash::point("after-claim", 0);
                    claimed += 1;
                    let control = Arc::new(RunControl::holding(claim.lease_until_ms));
                    active_lock(&active).insert(
                        run.run_id.clone(),
                        Active {
                            claim: claim.clone(),
                            control: control.clone(),
                            trace_id,
                        },
                    );
                    let started = Started {
                        host: idle.take().map_or_else(
                            || RunHost::New {
                                engine: engine.clone(),
                                pool: pool.clone(),
                                options: make_options(),
                            },
                            RunHost::Idle,
                        ),
                        idle: idle.clone(),
                        run_id: run.run_id.clone(),
                        claim,
                        control,
                        done: done_tx.clone(),
                        on_end: options.on_end.clone(),
                    };
                    match &tasks {
                        Some(tasks) => started.spawn_task(tasks),
                        None => {
                            scope.spawn(move || started.on_this_thread());
                        }
                    }
                }
            }
            if claimed == 0 {
                if options.exit_when_idle && active_lock(&active).is_empty() {
                    let now = stephost_core::clock::now_ms();
                    // Nothing due, and nobody else holds a run that may
                    // come back (a held run is due when its lease runs out);
                    // runs refused for their record do not count.
                    let idle = store.due_runs(64).is_ok_and(|runs| {
                        runs.iter()
                            .filter(|r| !refused.contains_run(&r.run_id))
                            .all(|r| r.status != RunStatus::Running && !lifecycle::is_due(r, now))
                    });
                    if idle {
                        break;
                    }
                }
                // Look again after the poll, when a run seen is due, or as
                // soon as one of this worker's runs ends (its slot is free
                // for the next run) or the ledger says a run became due.
                let next_due =
                    Some(next_due.map_or(schedules_look_at, |d| d.min(schedules_look_at)));
                let until_due = next_due.map(|due| {
                    Duration::from_millis((due - stephost_core::clock::now_ms()).max(1) as u64)
                });
                let wait = until_due.map_or(poll, |d| d.min(poll));
                // In slices, so that a signal to stop is seen however long
                // the poll is.
                let until = Instant::now() + wait;
                loop {
                    let slice = until
                        .saturating_duration_since(Instant::now())
                        .min(SHUTDOWN_CHECK);
                    match done_rx.recv_timeout(slice) {
                        Ok(Event::Finished(finished)) => {
                            refused.note(store.as_ref(), &finished, &mut report);
                            collect(&active, &mut report, finished);
                            break;
                        }
                        Ok(Event::Due) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
                        Err(mpsc::RecvTimeoutError::Timeout) => {
                            if shutdown.load(Ordering::SeqCst)
                                || Instant::now() >= until
                                || last_renewal.elapsed() >= renew_every
                            {
                                break;
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    })?;
    while let Ok(event) = done_rx.try_recv() {
        if let Event::Finished(finished) = event {
            collect(&active, &mut report, finished);
        }
    }
    report.commits = pool.commit_counts();
    let _ = store.add_counters(&counters(&report));
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
    /// A new one, with a store and a writer of its own.
    New {
        engine: Arc<StepEngine>,
        pool: Arc<dyn Pool>,
        options: HostOptions,
    },
}

impl RunHost {
    fn open(self) -> Result<Host, HostError> {
        match self {
            RunHost::Idle(host) => Ok(host),
            RunHost::New {
                engine,
                pool,
                options,
            } => Host::with_engine(engine, pool, options),
        }
    }
}

/// A claimed run on its way to a thread or a task.
struct Started {
    host: RunHost,
    idle: Arc<IdleHosts>,
    run_id: String,
    claim: Claim,
    control: Arc<RunControl>,
    done: mpsc::Sender<Event>,
    on_end: Option<EndHook>,
}

impl Started {
    /// Executes the run on this thread.
    fn on_this_thread(self) {
        let Started {
            host,
            idle,
            run_id,
            claim,
            control,
            done,
            on_end,
        } = self;
        let result = host.open().and_then(|mut host| {
            // A panic must not leave the run looking active (renewed
            // forever, never taken over).
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                host.execute_claimed(&run_id, claim, control)
            }))
            .unwrap_or_else(|_| Err(panicked(&run_id)));
            if result.is_ok() {
                idle.give_back(host);
            }
            result
        });
        if let Some(EndHook(hook)) = &on_end {
            hook(&run_id);
        }
        let _ = done.send(Event::Finished((run_id, result)));
    }

    /// Executes the run as a task of `tasks`.
    fn spawn_task(self, tasks: &tokio::runtime::Runtime) {
        let Started {
            host,
            idle,
            run_id,
            claim,
            control,
            done,
            on_end,
        } = self;
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
            if let Some(EndHook(hook)) = &on_end {
                hook(&run_id);
            }
            let _ = done.send(Event::Finished((run_id, result)));
        });
    }
}

fn panicked(run_id: &str) -> HostError {
    HostError::Internal(format!(
        "executing run {run_id} panicked; its claim lapses and another worker resumes it"
    ))
}

/// Hosts of this worker's finished runs, for its next runs: a host's store
/// and writer, with the statements they have prepared, outlive its run.
/// Only a run that ended without an error gives its host back; there are
/// never more hosts than runs at once.
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
    store: &dyn Store,
    active: &Mutex<HashMap<String, Active>>,
    report: &mut WorkerReport,
) {
    let now = stephost_core::clock::now_ms();
    for a in active_lock(active).values() {
        match lifecycle::renew(store, &a.claim, now) {
            // Renewed, or the run just finished, waits or was released by
            // its own task or thread.
            Ok(_) => a.control.renewed(lifecycle::renewed_lease(&a.claim, now)),
            Err(StoreError::Fenced { .. }) => {
                if !a.control.lost.swap(true, Ordering::SeqCst) {
                    report.lease_losses += 1;
                    run_warning(
                        &a.claim.run_id,
                        &a.trace_id,
                        format_args!(
                            "lost the claim on run {}; it stops before its next call",
                            a.claim.run_id
                        ),
                    );
                }
            }
            // A busy or failing ledger: try again next round; the lease
            // still has two thirds of its time.
            Err(e) => run_warning(
                &a.claim.run_id,
                &a.trace_id,
                format_args!("renewing {}: {e}", a.claim.run_id),
            ),
        }
    }
}

/// A run of this worker has ended: its slot is free, and its result
/// counted.
fn collect(active: &Mutex<HashMap<String, Active>>, report: &mut WorkerReport, finished: Finished) {
    let (run_id, result) = finished;
    let trace_id = active_lock(active).remove(&run_id).map(|a| a.trace_id);
    tally(report, &run_id, trace_id.as_deref(), result);
}

/// A warning about run `run_id`, naming the trace it reports into.
fn run_warning(run_id: &str, trace_id: &str, message: std::fmt::Arguments<'_>) {
    crate::logs::run_line(
        crate::logs::Level::Warn,
        "worker",
        Some(run_id),
        Some(trace_id),
        message,
    );
}

/// Counts a run's end and says it; `trace_id` is the trace it reported
/// into, if known (its report has it when it ended).
fn tally(
    report: &mut WorkerReport,
    run_id: &str,
    trace_id: Option<&str>,
    result: Result<RunReport, HostError>,
) {
    match result {
        Ok(r) => {
            match r.status {
                RunStatus::Completed => report.completed += 1,
                RunStatus::Failed | RunStatus::Diverged => report.failed += 1,
                RunStatus::Parked => report.parked += 1,
                RunStatus::Waiting => report.waiting += 1,
                RunStatus::Pending | RunStatus::Running => report.released += 1,
                RunStatus::Cancelled => report.cancelled += 1,
            }
            crate::logs::run_line(
                crate::logs::Level::Info,
                "worker",
                Some(run_id),
                Some(&r.trace_id),
                format_args!("run {run_id} {}", r.status.as_str()),
            );
        }
        Err(e) => {
            report.abandoned += 1;
            crate::logs::run_line(
                crate::logs::Level::Error,
                "worker",
                Some(run_id),
                trace_id,
                format_args!("run {run_id} abandoned: {e}"),
            );
        }
    }
}

fn counters(report: &WorkerReport) -> Counters {
    let mut c = Counters::new();
    c.insert("claim_conflict_total", report.claim_conflicts as i64);
    c.insert("lease_loss_total", report.lease_losses as i64);
    c.insert("integrity_refusal_total", report.integrity_refusals as i64);
    let commits = &report.commits;
    c.insert("group_commit_commit_total", commits.commits as i64);
    c.insert(
        "group_commit_transaction_total",
        commits.transactions as i64,
    );
    c.insert("group_commit_fsync_total", commits.fsyncs as i64);
    c
}
