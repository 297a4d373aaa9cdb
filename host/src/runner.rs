//! Runs, resumes and replays steps: the library behind the CLI.

use std::path::Path;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use wasmtime::component::{InstancePre as ComponentPre, ResourceTable};
use wasmtime::{Store, StoreLimits, StoreLimitsBuilder, Trap};
use wasmtime_wasi::WasiCtxBuilder;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;

use crate::command::{self, Preview1State};
use crate::crash;
use crate::effects::Effects;
use crate::engine::{Entry, Loaded, StepEngine};
use crate::error::HostError;
use crate::ids;
use crate::imports::wasi::{RecordedMonotonicClock, RecordedRng, RecordedWallClock};
use crate::imports::{StepState, lock};
use crate::journal::{CallErrorKind, Journal, Mode, Outcome, RunControl, Stats, Stop};
use crate::ledger::{
    Claim, GroupLedger, History, Ledger, LedgerError, LogRecord, NewRun, RunEnd, RunRecord,
    RunStatus, SqliteLedger, WriteOp,
};
use crate::limits::Limits;
use crate::replay::{Fixture, ReplayReport, ReplayVerdict};

/// Receives each log line of a run: run id, line, whether it is a replay
/// of a line already written.
pub type RunLogSink = Arc<dyn Fn(&str, &crate::ledger::LogRecord, bool) + Send + Sync>;

/// How a host runs steps.
pub struct HostOptions {
    pub limits: Limits,
    pub effects: Effects,
    /// How long a claim lasts without a ledger write renewing it.
    pub lease_ms: i64,
    /// Who claims runs (see [`crate::owner`]).
    pub owner: String,
    /// Where the step's log lines go besides the ledger.
    pub log_sink: Option<RunLogSink>,
    /// Where compiled components are kept between processes (`None`: only
    /// in memory).
    pub cache_dir: Option<std::path::PathBuf>,
    /// Instances to keep in a pool for reuse (see
    /// [`crate::engine::InstancePool`]); 0 allocates each run's instance on
    /// its own, which suits a process that executes one run.
    pub instance_pool: u32,
}

impl HostOptions {
    /// The instance pool these options ask for, if any. A limit on memory
    /// above what a pool slot holds turns the pool off.
    pub fn instance_pool(&self) -> Option<crate::engine::InstancePool> {
        let fits = self.limits.memory_bytes_max <= crate::engine::InstancePool::MEMORY_BYTES_MAX;
        (self.instance_pool > 0 && fits).then_some(crate::engine::InstancePool {
            instances: self.instance_pool,
            memory_bytes_max: self.limits.memory_bytes_max,
        })
    }
}

impl Default for HostOptions {
    fn default() -> Self {
        HostOptions {
            limits: Limits::default(),
            effects: Effects::default(),
            lease_ms: 60_000,
            owner: crate::owner::this_process(),
            log_sink: None,
            cache_dir: None,
            instance_pool: 0,
        }
    }
}

/// A person's decision on a call whose outcome is unknown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// The operation happened; the guest sees this response (JSON).
    Succeeded(String),
    /// The operation did not happen; the guest sees `rejected` with this message.
    Failed(String),
}

/// What `upgrade` did with one run.
#[derive(Debug, Clone, Serialize)]
pub struct UpgradeOutcome {
    pub run_id: String,
    pub from: String,
    pub to: String,
    /// Whether the run is now pinned to the new module.
    pub moved: bool,
    /// The replay that decided it.
    pub report: ReplayReport,
}

/// What became of a run.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub run_id: String,
    pub status: RunStatus,
    pub output: Option<String>,
    pub error: Option<String>,
    /// For a waiting run: when a worker looks at it again.
    pub wake_at_ms: Option<i64>,
    /// For a finished WASI command: its exit status.
    pub exit_code: Option<i32>,
    pub stats: Stats,
}

impl RunReport {
    fn from_record(run: &RunRecord, stats: Stats) -> Self {
        RunReport {
            run_id: run.run_id.clone(),
            status: run.status,
            output: run.output.clone(),
            error: run.error.clone(),
            wake_at_ms: run.wake_at_ms,
            exit_code: run.exit_code,
            stats,
        }
    }
}

/// Whether the run an execution starts is in the ledger yet.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Start {
    /// Recorded and claimed before the execution.
    Recorded,
    /// New: recorded, claimed, by the execution's first commit.
    Creating,
}

/// A host over one ledger.
pub struct Host {
    engine: Arc<StepEngine>,
    ledger: Option<Box<dyn Ledger>>,
    options: HostOptions,
    /// Digests of the modules this host has put in its ledger (modules are
    /// never removed), so that starting a run does not ask again.
    stored: std::collections::HashSet<String>,
}

impl Host {
    /// Opens the SQLite ledger at `db`, creating it if absent. Calls
    /// buffered past the journal's limit are applied by a committer thread
    /// of the ledger's own while the step goes on
    /// ([`GroupLedger::pipelined`]).
    pub fn open(db: &Path, options: HostOptions) -> Result<Self, HostError> {
        let ledger = GroupLedger::pipelined(SqliteLedger::open(db)?);
        Ok(Host {
            engine: Arc::new(StepEngine::with_options(
                options.cache_dir.as_deref(),
                options.instance_pool(),
            )?),
            ledger: Some(Box::new(ledger)),
            options,
            stored: Default::default(),
        })
    }

    /// A host over an open ledger, sharing a compiled-component cache.
    pub fn with_engine(
        engine: Arc<StepEngine>,
        ledger: Box<dyn Ledger>,
        options: HostOptions,
    ) -> Self {
        Host {
            engine,
            ledger: Some(ledger),
            options,
            stored: Default::default(),
        }
    }

    pub fn ledger(&self) -> &dyn Ledger {
        self.ledger
            .as_deref()
            .expect("the ledger is back after every run")
    }

    pub fn ledger_mut(&mut self) -> &mut dyn Ledger {
        self.ledger
            .as_deref_mut()
            .expect("the ledger is back after every run")
    }

    pub fn engine(&self) -> &Arc<StepEngine> {
        &self.engine
    }

    /// Records a run of `module` on `input` without executing it: a worker
    /// will claim it. Submitting the same run id with the same module and
    /// input returns the existing run; with another it is refused.
    pub fn submit(
        &mut self,
        module: &[u8],
        what: &str,
        input: &str,
        run_id: Option<&str>,
    ) -> Result<RunRecord, HostError> {
        let (loaded, run_id) = self.store_module(module, what, input, run_id)?;
        Ok(self
            .ledger_mut()
            .create_run(new_run(&loaded, &run_id, input, true))?)
    }

    /// Checks the input, loads the module and keeps its bytes in the
    /// ledger; the run id to use.
    fn store_module(
        &mut self,
        module: &[u8],
        what: &str,
        input: &str,
        run_id: Option<&str>,
    ) -> Result<(Arc<Loaded>, String), HostError> {
        check_json(input, "input", &self.options.limits)?;
        let loaded = self.load(module, what)?;
        let run_id = run_id.map(str::to_string).unwrap_or_else(ids::new_run_id);
        Ok((loaded, run_id))
    }

    /// Loads a step for many runs: compiles it (or takes it from a cache)
    /// and keeps its bytes in the ledger. [`Host::run_loaded`] then starts
    /// runs of it without looking at its bytes again.
    pub fn load(&mut self, module: &[u8], what: &str) -> Result<Arc<Loaded>, HostError> {
        let loaded = self.engine.load(module, what)?;
        if !self.stored.contains(&loaded.digest) {
            self.ledger_mut().put_module(&loaded.digest, module)?;
            self.stored.insert(loaded.digest.clone());
        }
        Ok(loaded)
    }

    /// Starts a new run of `module` (or continues the run `run_id` if it
    /// exists with the same module and input).
    pub fn run(
        &mut self,
        module: &[u8],
        what: &str,
        input: &str,
        run_id: Option<&str>,
    ) -> Result<RunReport, HostError> {
        let (loaded, run_id) = self.store_module(module, what, input, run_id)?;
        self.start(&loaded, &run_id, input)
    }

    /// Like [`Host::run`], for a step loaded by [`Host::load`] of this host.
    pub fn run_loaded(
        &mut self,
        loaded: &Arc<Loaded>,
        input: &str,
        run_id: Option<&str>,
    ) -> Result<RunReport, HostError> {
        check_json(input, "input", &self.options.limits)?;
        let run_id = run_id.map(str::to_string).unwrap_or_else(ids::new_run_id);
        self.start(loaded, &run_id, input)
    }

    fn start(
        &mut self,
        loaded: &Loaded,
        run_id: &str,
        input: &str,
    ) -> Result<RunReport, HostError> {
        let owner = self.options.owner.clone();
        let lease_ms = self.options.lease_ms;
        // A run id not in the ledger: the run is recorded, claimed by this
        // host, with the execution's first commit (see
        // `Journal::create_run_with_first_commit`), not by a transaction of
        // its own before the guest starts. Should another process start the
        // same id meanwhile, that commit fails as claimed elsewhere, before
        // anything of this execution has left the host.
        match self.ledger().run(run_id) {
            Err(LedgerError::UnknownRun(_)) => {
                let run = new_run(loaded, run_id, input, false);
                let claim = Claim::first(run_id, &owner, lease_ms, run.now_ms);
                let record = RunRecord::claimed(&run, &claim);
                crash::point("after-claim", 0);
                return self.execute_with(&record, claim, loaded, None, Start::Creating);
            }
            Err(e) => return Err(e.into()),
            Ok(_) => {}
        }
        // An existing run is claimed as it is (or returned, if finished).
        let (run, claim) = self.ledger_mut().create_claimed(
            new_run(loaded, run_id, input, false),
            &owner,
            lease_ms,
            &crate::owner::is_alive,
        )?;
        let Some(claim) = claim else {
            return Ok(RunReport::from_record(&run, Stats::default()));
        };
        crash::point("after-claim", 0);
        self.execute_with(&run, claim, loaded, None, Start::Recorded)
    }

    /// Continues an interrupted run: replays its recorded calls, reconciles
    /// one left in flight, then goes live.
    pub fn resume(&mut self, run_id: &str) -> Result<RunReport, HostError> {
        self.resume_with(run_id, None)
    }

    /// Like [`Host::resume`], insisting on a module: refused (naming both
    /// versions) unless it is the one the run is pinned to.
    pub fn resume_with(
        &mut self,
        run_id: &str,
        module: Option<(&[u8], &str)>,
    ) -> Result<RunReport, HostError> {
        let run = self.ledger().run(run_id)?;
        let mismatch = if !crate::engine::provides(&run.world) {
            Some(format!(
                "run {run_id} was started under {} and this stephost provides {} and {}; \
                 resume it with a stephost that provides {}",
                run.world,
                crate::engine::WORLD,
                crate::engine::COMMAND_WORLD,
                run.world
            ))
        } else if let Some((bytes, what)) = module
            && crate::ids::module_digest(bytes) != run.module_digest
        {
            let named = |step: Option<&str>| step.unwrap_or("no declared version").to_string();
            Some(format!(
                "run {run_id} is pinned to module {} ({}, {}); {what} is module {} ({}); \
                 move the run with `stephost upgrade {run_id} --module {what}`, which \
                 replays its history against the new build first",
                run.module_digest,
                named(run.step.as_deref()),
                run.world,
                crate::ids::module_digest(bytes),
                named(crate::engine::declared_step(bytes).as_deref())
            ))
        } else {
            None
        };
        if let Some(message) = mismatch {
            let mut counters = crate::journal::Counters::new();
            counters.insert("workflow_version_mismatch_total", 1);
            let _ = self.ledger_mut().add_counters(&counters);
            return Err(HostError::VersionMismatch(message));
        }
        match run.status {
            RunStatus::Completed | RunStatus::Failed => {
                return Ok(RunReport::from_record(&run, Stats::default()));
            }
            RunStatus::Diverged => {
                return Err(HostError::BadInput(format!(
                    "run {run_id} diverged from its recording and cannot resume: {}",
                    run.error.as_deref().unwrap_or("")
                )));
            }
            RunStatus::Pending | RunStatus::Running | RunStatus::Waiting | RunStatus::Parked => {}
        }
        let loaded = self.load_pinned(&run)?;
        self.claim_and_execute(run, loaded)
    }

    /// The module a run is pinned to: from the engine's cache, or read from
    /// the ledger by its digest and compiled.
    fn load_pinned(&self, run: &RunRecord) -> Result<Arc<Loaded>, HostError> {
        if let Some(loaded) = self.engine.cached(&run.module_digest) {
            return Ok(loaded);
        }
        // A compile takes its thread for a while: a run executed as a task
        // tells its runtime.
        crate::effects::blocking(|| {
            let module = self.ledger().module(&run.module_digest)?;
            Ok(self
                .engine
                .load_digested(&module, run.module_digest.clone(), &run.module_digest)?)
        })
    }

    fn claim_and_execute(
        &mut self,
        run: RunRecord,
        loaded: Arc<Loaded>,
    ) -> Result<RunReport, HostError> {
        let owner = self.options.owner.clone();
        let lease_ms = self.options.lease_ms;
        let claim = self.ledger_mut().claim(
            &run.run_id,
            &owner,
            lease_ms,
            crate::clock::now_ms(),
            &crate::owner::is_alive,
        )?;
        crash::point("after-claim", 0);
        self.execute_with(&run, claim, &loaded, None, Start::Recorded)
    }

    /// Executes a run under a claim taken elsewhere (by a worker's claim
    /// loop); `control` lets the worker stop it at a call boundary.
    pub fn execute_claimed(
        &mut self,
        run_id: &str,
        claim: Claim,
        control: Arc<RunControl>,
    ) -> Result<RunReport, HostError> {
        let (run, loaded) = self.claimed(run_id)?;
        self.execute_with(&run, claim, &loaded, Some(control), Start::Recorded)
    }

    /// A claimed run's record and its step, loaded (compiled if need be).
    fn claimed(&self, run_id: &str) -> Result<(RunRecord, Arc<Loaded>), HostError> {
        let run = self.ledger().run(run_id)?;
        let loaded = self.load_pinned(&run)?;
        Ok((run, loaded))
    }

    fn execute_with(
        &mut self,
        run: &RunRecord,
        claim: Claim,
        loaded: &Loaded,
        control: Option<Arc<RunControl>>,
        start: Start,
    ) -> Result<RunReport, HostError> {
        let ledger = self.ledger.take().expect("ledger present");
        let result = self.execute(run, claim, ledger, loaded, control, start);
        self.put_back(result)
    }

    /// [`Host::execute_claimed`] as a task of an async runtime (a worker's):
    /// a step runs on a fiber, and each write's durable `started` commit,
    /// which the worker's committer makes, is awaited, so that the thread
    /// goes on with the worker's other runs meanwhile. A command runs as
    /// with `execute_claimed`, the runtime told that it blocks.
    pub async fn execute_claimed_task(
        &mut self,
        run_id: &str,
        claim: Claim,
        control: Arc<RunControl>,
    ) -> Result<RunReport, HostError> {
        let (run, loaded) = self.claimed(run_id)?;
        let pre = match self.engine.task_pre(&loaded) {
            Some(pre) => pre.map_err(HostError::Internal)?.clone(),
            None => {
                return crate::effects::blocking(|| {
                    self.execute_with(&run, claim, &loaded, Some(control), Start::Recorded)
                });
            }
        };
        let ledger = self.ledger.take().expect("ledger present");
        let result = match self.journal_for(&run, claim, ledger, Some(control), Start::Recorded) {
            Ok(journal) => {
                let guest =
                    invoke_task(&self.engine, &pre, &journal, &run.input, &self.options).await;
                self.conclude(&run, journal, guest, None)
                    .commit_task()
                    .await
            }
            Err((ledger, error)) => Ok((ledger, Err(error))),
        };
        self.put_back(result)
    }

    /// The ledger of a finished execution back in the host; the run's
    /// report.
    fn put_back(&mut self, result: Executed) -> Result<RunReport, HostError> {
        let (mut ledger, report) = match result {
            Ok(done) => done,
            Err(ledger) => (
                ledger,
                Err(HostError::Internal(
                    "the run's journal was still shared".into(),
                )),
            ),
        };
        // A run that stopped early (fenced, a failed write) may leave
        // writes in flight: they land, or fail, before the next use of the
        // ledger, and the first failure is the run's if nothing failed
        // before it.
        let landed = ledger.landed();
        self.ledger = Some(ledger);
        report.and_then(|report| landed.map(|()| report).map_err(HostError::from))
    }

    fn execute(
        &self,
        run: &RunRecord,
        claim: Claim,
        ledger: Box<dyn Ledger>,
        loaded: &Loaded,
        control: Option<Arc<RunControl>>,
        start: Start,
    ) -> Executed {
        let journal = match self.journal_for(run, claim, ledger, control, start) {
            Ok(journal) => journal,
            Err((ledger, error)) => return Ok((ledger, Err(error))),
        };
        let (guest, exit_code) = invoke(
            &self.engine,
            loaded,
            &journal,
            &run.input,
            &self.options,
            false,
        );
        self.conclude(run, journal, guest, exit_code).commit()
    }

    /// The journal of an execution of `run` under `claim`, over its
    /// recorded history; or the ledger back with the error that stopped it
    /// before the step began.
    fn journal_for(
        &self,
        run: &RunRecord,
        claim: Claim,
        ledger: Box<dyn Ledger>,
        control: Option<Arc<RunControl>>,
        start: Start,
    ) -> Result<Arc<Mutex<Journal>>, NotStarted> {
        // Every ledger write needs a claim, so a run claimed for the first
        // time (fencing token 1) has recorded nothing: no history to read.
        let loaded_history = if claim.fence == 1 {
            Ok((
                History::loaded(&run.run_id, Vec::new()),
                Vec::<LogRecord>::new(),
            ))
        } else {
            ledger
                .history(&run.run_id)
                .and_then(|history| Ok((history, ledger.logs(&run.run_id)?)))
        };
        let (history, logs) = match loaded_history {
            Ok(v) => v,
            Err(e) => return Err((ledger, e.into())),
        };
        let mut journal = Journal::new(
            &run.run_id,
            Mode::Live { ledger, claim },
            history,
            &logs,
            self.options.limits.clone(),
        );
        if start == Start::Creating {
            journal.create_run_with_first_commit(run.clone());
        }
        if let Some(control) = control {
            journal.set_control(control);
        }
        if let Some(sink) = &self.options.log_sink {
            let sink = sink.clone();
            let run_id = run.run_id.clone();
            journal.set_log_sink(Box::new(move |rec, replayed| sink(&run_id, rec, replayed)));
        }
        Ok(Arc::new(Mutex::new(journal)))
    }

    /// How an execution of `run` ended (the step's result, or the stop its
    /// journal holds): done, or with the last durable commit to make, which
    /// carries every buffered write (see [`Ended`]).
    fn conclude(
        &self,
        run: &RunRecord,
        journal: Arc<Mutex<Journal>>,
        guest: GuestResult,
        exit_code: Option<i32>,
    ) -> Ended {
        let journal = match Arc::try_unwrap(journal) {
            Ok(m) => m.into_inner().unwrap_or_else(|p| p.into_inner()),
            Err(_) => unreachable_shared(),
        };
        let resumed = journal.history_len() > 0;
        let stats = journal.stats;
        let stop = journal.stop().cloned();
        let limits = journal.limits().clone();
        let mut counters = journal.counters().clone();
        let first_live_after = journal.first_live_after;
        if stats.replayed > 0 {
            counters.insert("replayed_step_total", 1);
        }
        if resumed {
            counters.insert("workflow_resume_total", 1);
            if let Some(latency) = first_live_after {
                crate::metrics::resume_latency(latency, &mut counters);
            }
        }
        let mut journal = journal;
        let mut stop = stop;
        let unreached = journal.unreached().unwrap_or_else(|e| {
            stop.get_or_insert(Stop::reading_history(e));
            None
        });
        let diverged_at = match (&stop, &unreached) {
            (Some(Stop::Diverged(d)), _) => Some(d.seq),
            (None, Some(u)) if guest.is_ok() => Some(u.seq),
            _ => None,
        };
        let in_flight = diverged_at
            .map(|seq| journal.in_flight_writes_from(seq))
            .transpose()
            .unwrap_or_else(|e| {
                stop = Some(Stop::reading_history(e));
                None
            })
            .unwrap_or_default();
        let mut pending = journal.take_pending();
        let Mode::Live { mut ledger, claim } = journal.into_mode() else {
            unreachable_shared()
        };
        let end = match stop {
            Some(Stop::Fenced(m)) => return Ended::Done(Ok((ledger, Err(HostError::Fenced(m))))),
            Some(Stop::Released { .. }) => {
                pending.push(WriteOp::Counters(counters));
                // At a worker's shutdown, as a task: the commit and the
                // release wait for the committer, the runtime told.
                let released = crate::effects::blocking(|| {
                    ledger
                        .commit_taking(&claim, &mut pending)
                        .and_then(|()| ledger.release(&claim))
                })
                .map_err(HostError::from)
                .and_then(|()| Ok(ledger.run(&run.run_id)?))
                .map(|record| RunReport::from_record(&record, stats));
                return Ended::Done(Ok((ledger, released)));
            }
            Some(Stop::Suspended { wake_at_ms, .. }) => {
                pending.push(WriteOp::Suspend {
                    wake_at_ms,
                    now_ms: crate::clock::now_ms(),
                });
                pending.push(WriteOp::Counters(counters));
                return Ended::Commit(LastCommit {
                    ledger,
                    claim,
                    ops: pending,
                    run_id: run.run_id.clone(),
                    stats,
                });
            }
            Some(Stop::Ledger(m)) => {
                return Ended::Done(Ok((ledger, Err(HostError::LedgerWrite(m)))));
            }
            Some(Stop::LedgerRead { message, corrupt }) => {
                return Ended::Done(Ok((ledger, Err(Stop::read_error(message, corrupt)))));
            }
            // Damaged records: leave the run as it is for a person to look at.
            Some(Stop::Corrupt(m)) => {
                return Ended::Done(Ok((
                    ledger,
                    Err(HostError::Ledger(crate::ledger::LedgerError::Corrupt(m))),
                )));
            }
            Some(Stop::ReplayEnd { reason, .. }) => {
                return Ended::Done(Ok((ledger, Err(HostError::Internal(reason)))));
            }
            Some(Stop::Diverged(d)) => diverged(
                format!("diverged: {d}"),
                &in_flight,
                &mut pending,
                &mut counters,
            ),
            Some(Stop::Parked { seq, name, reason }) => RunEnd::Parked {
                error: format!("unknown_outcome: call #{seq} ({name}): {reason}"),
            },
            Some(Stop::Limit(m)) => RunEnd::Failed {
                error: format!("limit: {m}"),
                exit_code: None,
            },
            // A resumed step that ends before reaching every recorded call
            // is not the run that was recorded.
            None if guest.is_ok() && unreached.is_some() => diverged(
                format!("diverged: {}", unreached.expect("checked just above")),
                &in_flight,
                &mut pending,
                &mut counters,
            ),
            None => match guest {
                Ok(Ok(output)) => match check_json(&output, "output", &limits) {
                    Ok(()) => {
                        crash::point("before-complete", stats.replayed + stats.live);
                        RunEnd::Completed { output, exit_code }
                    }
                    Err(e) => RunEnd::Failed {
                        error: format!("invalid_output: {e}"),
                        exit_code,
                    },
                },
                Ok(Err(message)) => RunEnd::Failed {
                    error: format!("step_error: {message}"),
                    exit_code,
                },
                Err(trap) => RunEnd::Failed {
                    error: classify_trap(&trap, &limits),
                    exit_code,
                },
            },
        };
        // The end rides with every buffered write, and the execution's
        // metric counters, in one durable commit.
        pending.push(WriteOp::Finish(end, crate::clock::now_ms()));
        pending.push(WriteOp::Counters(counters));
        Ended::Commit(LastCommit {
            ledger,
            claim,
            ops: pending,
            run_id: run.run_id.clone(),
            stats,
        })
    }

    /// Replays a recorded run offline: no I/O, no ledger writes. With
    /// `module`, against a new build of the step.
    pub fn replay(
        &self,
        run_id: &str,
        module: Option<(&[u8], &str)>,
    ) -> Result<ReplayReport, HostError> {
        let run = self.ledger().run(run_id)?;
        let loaded = match module {
            Some((bytes, what)) => self.engine.load(bytes, what)?,
            None => self.load_pinned(&run)?,
        };
        // A long history is read while the first of it is replayed.
        let history = self.ledger().history(run_id)?;
        let fixture = Fixture::new(&run, Vec::new());
        replay_loaded(&self.engine, &fixture, history, &loaded, &self.options)
    }

    /// Records a person's decision on a call parked as `unknown`; the run
    /// can then be resumed and the guest sees the decided outcome.
    pub fn resolve(
        &mut self,
        run_id: &str,
        seq: u64,
        resolution: Resolution,
        by: &str,
    ) -> Result<(), HostError> {
        if by.trim().is_empty() {
            return Err(HostError::BadInput("--by must name who decided".into()));
        }
        let (state, outcome) = match resolution {
            Resolution::Succeeded(response) => {
                check_json(&response, "the resolved response", &self.options.limits)?;
                (
                    crate::ledger::CallState::Succeeded,
                    Outcome::Ok(serde_json::Value::String(response)),
                )
            }
            Resolution::Failed(message) => (
                crate::ledger::CallState::Failed,
                Outcome::error(
                    CallErrorKind::Rejected,
                    format!("resolved as failed by {by}: {message}"),
                ),
            ),
        };
        self.ledger_mut().resolve_call(
            run_id,
            seq,
            state,
            &outcome.to_json(),
            by,
            crate::clock::now_ms(),
        )?;
        Ok(())
    }

    /// Replays an unfinished run's history against `module` with no I/O; if
    /// every recorded call matches, pins the run to it; if not, changes
    /// nothing and reports the first divergent call.
    pub fn upgrade(
        &mut self,
        run_id: &str,
        module: &[u8],
        what: &str,
    ) -> Result<UpgradeOutcome, HostError> {
        let run = self.ledger().run(run_id)?;
        if run.status.is_final() {
            return Err(HostError::BadInput(format!(
                "run {run_id} is {}; only unfinished runs are upgraded",
                run.status.as_str()
            )));
        }
        let fixture = self.export(run_id)?;
        let report = replay_fixture(&self.engine, fixture, module, what, &self.options)?;
        let compatible = matches!(
            report.verdict,
            ReplayVerdict::Consistent { .. } | ReplayVerdict::Incomplete { .. }
        );
        if !compatible {
            let mut counters = crate::journal::Counters::new();
            counters.insert("workflow_version_mismatch_total", 1);
            let _ = self.ledger_mut().add_counters(&counters);
            return Ok(UpgradeOutcome {
                run_id: run_id.to_string(),
                from: run.module_digest,
                to: report.module_digest.clone(),
                moved: false,
                report,
            });
        }
        let ledger = self.ledger_mut();
        ledger.put_module(&report.module_digest, module)?;
        ledger.repin(
            run_id,
            &run.module_digest,
            &report.module_digest,
            crate::engine::declared_step(module).as_deref(),
            crate::clock::now_ms(),
            &crate::owner::is_alive,
        )?;
        Ok(UpgradeOutcome {
            run_id: run_id.to_string(),
            from: run.module_digest,
            to: report.module_digest.clone(),
            moved: true,
            report,
        })
    }

    /// A portable copy of a run: module digest, input, calls, output.
    pub fn export(&self, run_id: &str) -> Result<Fixture, HostError> {
        let run = self.ledger().run(run_id)?;
        let calls = self.ledger().calls(run_id)?;
        Ok(Fixture::new(&run, calls))
    }
}

fn unreachable_shared() -> ! {
    // The store, and with it every clone of the journal, is dropped when
    // `invoke` returns.
    panic!("journal still shared after the store was dropped")
}

/// Replays `fixture` against `module` with no I/O.
pub fn replay_fixture(
    engine: &StepEngine,
    fixture: Fixture,
    module: &[u8],
    what: &str,
    options: &HostOptions,
) -> Result<ReplayReport, HostError> {
    let loaded = engine.load(module, what)?;
    let mut fixture = fixture;
    // The recorded calls move into the journal: no copy of the history.
    let history = History::loaded(&fixture.run_id, std::mem::take(&mut fixture.calls));
    replay_loaded(engine, &fixture, history, &loaded, options)
}

/// Replays the run `fixture` describes, whose calls are `history`, against
/// a loaded module with no I/O.
fn replay_loaded(
    engine: &StepEngine,
    fixture: &Fixture,
    history: History,
    loaded: &Loaded,
    options: &HostOptions,
) -> Result<ReplayReport, HostError> {
    let complete = fixture.status.is_final();
    let mut journal = Journal::new(
        &fixture.run_id,
        Mode::Replay,
        history,
        &[],
        options.limits.clone(),
    );
    journal.set_recording_complete(complete);
    let journal = Arc::new(Mutex::new(journal));
    let (guest, _exit_code) = invoke(engine, loaded, &journal, &fixture.input, options, true);
    let mut journal = lock(&journal);
    let calls = journal.calls_made();
    let verdict = match (journal.stop().cloned(), guest) {
        // The recording could not be read: no verdict on the module.
        (Some(Stop::LedgerRead { message, corrupt }), _) => {
            return Err(Stop::read_error(message, corrupt));
        }
        (Some(Stop::Diverged(d)), _) => ReplayVerdict::Diverged { divergence: *d },
        (Some(Stop::ReplayEnd { seq, reason }), _) => ReplayVerdict::Incomplete {
            calls: seq - 1,
            reason,
        },
        (Some(other), _) => ReplayVerdict::StepFailed {
            error: other.to_string(),
        },
        (None, guest) => match journal.unreached().map_err(|e| match e {
            LedgerError::Corrupt(_) => HostError::from(e),
            other => HostError::LedgerRead(other.to_string()),
        })? {
            Some(divergence) => ReplayVerdict::Diverged { divergence },
            None => verdict_for_end(fixture, guest, calls, &options.limits),
        },
    };
    Ok(ReplayReport {
        run_id: fixture.run_id.clone(),
        recorded_status: fixture.status,
        module_digest: loaded.digest.clone(),
        verdict,
    })
}

fn verdict_for_end(
    fixture: &Fixture,
    guest: Result<Result<String, String>, wasmtime::Error>,
    calls: u64,
    limits: &Limits,
) -> ReplayVerdict {
    let new_end = match guest {
        Ok(Ok(output)) => Ok(output),
        Ok(Err(message)) => Err(format!("step_error: {message}")),
        Err(trap) => Err(classify_trap(&trap, limits)),
    };
    match (fixture.status, new_end) {
        (RunStatus::Completed, Ok(new)) => {
            let recorded = fixture.output.clone().unwrap_or_default();
            if same_json(&recorded, &new) {
                ReplayVerdict::Consistent {
                    calls,
                    output: Some(new),
                }
            } else {
                ReplayVerdict::OutputDiffers { recorded, new }
            }
        }
        (RunStatus::Failed, Err(new)) if fixture.error.as_deref() == Some(new.as_str()) => {
            ReplayVerdict::Consistent {
                calls,
                output: None,
            }
        }
        (RunStatus::Completed | RunStatus::Failed, new) => ReplayVerdict::EndDiffers {
            recorded: fixture
                .output
                .clone()
                .or_else(|| fixture.error.clone())
                .unwrap_or_default(),
            new: new.unwrap_or_else(|e| e),
        },
        // The recording stops before the end (interrupted or parked run):
        // every recorded call matched.
        (_, Ok(output)) => ReplayVerdict::Consistent {
            calls,
            output: Some(output),
        },
        (_, Err(error)) => ReplayVerdict::StepFailed { error },
    }
}

fn same_json(a: &str, b: &str) -> bool {
    match (
        serde_json::from_str::<serde_json::Value>(a),
        serde_json::from_str::<serde_json::Value>(b),
    ) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

/// The end of a run that diverged from its recording. Writes it left in
/// flight (recorded `started`, never settled) become `unknown` in the same
/// commit, for a person to check at the receiver: the run will not resume,
/// so nothing else would ever look at them.
fn diverged(
    mut error: String,
    in_flight: &[u64],
    pending: &mut Vec<WriteOp>,
    counters: &mut crate::journal::Counters,
) -> RunEnd {
    for &seq in in_flight {
        pending.push(WriteOp::Outcome {
            seq,
            state: crate::ledger::CallState::Unknown,
            outcome: None,
            now_ms: crate::clock::now_ms(),
            chain: None,
        });
        *counters.entry("side_effect_unknown_total").or_insert(0) += 1;
    }
    if !in_flight.is_empty() {
        let seqs: Vec<String> = in_flight.iter().map(|s| format!("#{s}")).collect();
        error.push_str(&format!(
            "; the write(s) {} were in flight and are now unknown: check the receiver \
             by their operation ids",
            seqs.join(", ")
        ));
    }
    RunEnd::Diverged { error }
}

/// The ledger row of a new run of `loaded`.
fn new_run<'a>(loaded: &'a Loaded, run_id: &'a str, input: &'a str, durable: bool) -> NewRun<'a> {
    NewRun {
        run_id,
        module_digest: &loaded.digest,
        step: loaded.step.as_deref(),
        world: loaded.world(),
        durable,
        input,
        now_ms: crate::clock::now_ms(),
    }
}

/// Most linear memories one run's component may create.
pub(crate) const MEMORIES_MAX: usize = 8;
/// Most tables one run's component may create.
pub(crate) const TABLES_MAX: usize = 64;
/// Most core instances one run's component may create.
pub(crate) const INSTANCES_MAX: usize = 64;
/// Most elements a table may grow to.
pub(crate) const TABLE_ELEMENTS_MAX: usize = 1_000_000;

/// What a step returned (its output or error message), or the trap that
/// ended it.
type GuestResult = Result<Result<String, String>, wasmtime::Error>;

/// An execution's end: the ledger back with the run's report, or the ledger
/// alone if the journal was still shared.
type Executed = Result<(Box<dyn Ledger>, Result<RunReport, HostError>), Box<dyn Ledger>>;

/// How an execution ends: done, or with its last durable commit (the
/// run's end, or its suspension, with every buffered write) to make.
enum Ended {
    Done(Executed),
    Commit(LastCommit),
}

/// An execution's last durable commit, and what follows it.
struct LastCommit {
    ledger: Box<dyn Ledger>,
    claim: Claim,
    ops: Vec<WriteOp>,
    run_id: String,
    stats: Stats,
}

impl Ended {
    /// Makes the last commit, if any, waiting for it.
    fn commit(self) -> Executed {
        match self {
            Ended::Done(executed) => executed,
            Ended::Commit(mut last) => {
                let committed = last.ledger.commit_taking(&last.claim, &mut last.ops);
                last.report(committed)
            }
        }
    }

    /// Makes the last commit, if any, awaiting it when the ledger leaves it
    /// pending (a run executed as a task: see
    /// [`Host::execute_claimed_task`]).
    async fn commit_task(self) -> Executed {
        match self {
            Ended::Done(executed) => executed,
            Ended::Commit(mut last) => {
                let committed = match last.ledger.commit_durable(&last.claim, &mut last.ops) {
                    Ok(Some(pending)) => {
                        let answered = pending.await;
                        last.ledger.settle_durable(&last.claim, answered)
                    }
                    Ok(None) => Ok(()),
                    Err(e) => Err(e),
                };
                last.report(committed)
            }
        }
    }
}

impl LastCommit {
    /// The run's report once the commit is made (or the commit's error).
    fn report(self, committed: Result<(), LedgerError>) -> Executed {
        let LastCommit {
            ledger,
            run_id,
            stats,
            ..
        } = self;
        let report = committed
            .map_err(HostError::from)
            .and_then(|()| Ok(ledger.run(&run_id)?))
            .map(|record| RunReport::from_record(&record, stats));
        Ok((ledger, report))
    }
}

/// The ledger back, and the error that stopped an execution before its
/// step began.
type NotStarted = (Box<dyn Ledger>, HostError);

/// Fuel a step run as a task burns between yields to the runtime's other
/// runs: one that computes for long does not hold its thread.
const TASK_YIELD_FUEL: u64 = 10_000_000;

/// [`invoke`] of a step as a task (see [`Host::execute_claimed_task`]).
async fn invoke_task(
    engine: &StepEngine,
    pre: &ComponentPre<StepState>,
    journal: &Arc<Mutex<Journal>>,
    input: &str,
    options: &HostOptions,
) -> GuestResult {
    let wasi = wasi_builder(journal, options, false);
    let mut store = new_store(engine, journal, wasi, options)?;
    store.fuel_async_yield_interval(Some(TASK_YIELD_FUEL))?;
    let instance = pre.instantiate_async(&mut store).await?;
    let run = instance.get_typed_func::<(&str,), (Result<String, String>,)>(&mut store, "run")?;
    let (result,) = run.call_async(&mut store, (input,)).await?;
    Ok(result)
}

/// Instantiates the step in a fresh store and calls `run` (a step) or
/// `wasi:cli/run` (a command, whose exit status comes back too).
fn invoke(
    engine: &StepEngine,
    loaded: &Loaded,
    journal: &Arc<Mutex<Journal>>,
    input: &str,
    options: &HostOptions,
    replay: bool,
) -> (GuestResult, Option<i32>) {
    match &loaded.entry {
        Entry::Step(pre) => {
            let wasi = wasi_builder(journal, options, replay);
            let result = new_store(engine, journal, wasi, options)
                .and_then(|mut store| pre.instantiate(&mut store)?.call_run(&mut store, input));
            (result, None)
        }
        Entry::Command(pre) => {
            let mut wasi = wasi_builder(journal, options, replay);
            let stdout = command::wire_stdio(&mut wasi, input, options.limits.payload_bytes_max);
            let ran = new_store(engine, journal, wasi, options)
                .and_then(|mut store| command::run_component(pre, &mut store));
            command_end(ran, &stdout)
        }
        Entry::Preview1(pre) => {
            let mut wasi = wasi_builder(journal, options, replay);
            let stdout = command::wire_stdio(&mut wasi, input, options.limits.payload_bytes_max);
            let state = Preview1State {
                wasi: wasi.build_p1(),
                limits: store_limits(&options.limits),
                journal: journal.clone(),
            };
            let mut store = Store::new(engine.engine(), state);
            store.limiter(|s| &mut s.limits);
            let ran = store
                .set_fuel(options.limits.fuel_max)
                .and_then(|()| command::run_preview1(pre, &mut store));
            command_end(ran, &stdout)
        }
    }
}

/// A command's end: its result and exit status, or the trap that ended it.
fn command_end(
    ran: Result<i32, wasmtime::Error>,
    stdout: &MemoryOutputPipe,
) -> (GuestResult, Option<i32>) {
    match ran {
        Ok(code) => (Ok(command::result(code, &stdout.contents())), Some(code)),
        Err(trap) => (Err(trap), None),
    }
}

/// WASI for a run: clocks and randomness recorded in its journal, no
/// network, output to the host's stderr (nowhere on replay).
fn wasi_builder(
    journal: &Arc<Mutex<Journal>>,
    options: &HostOptions,
    replay: bool,
) -> WasiCtxBuilder {
    let run_id = lock(journal).run_id().to_string();
    let limits = &options.limits;
    let mut wasi = WasiCtxBuilder::new();
    if !replay {
        wasi.stdout(std::io::stderr()).stderr(std::io::stderr());
    }
    wasi.wall_clock(RecordedWallClock(journal.clone()))
        .monotonic_clock(RecordedMonotonicClock::new(journal.clone()))
        .secure_random(RecordedRng {
            journal: journal.clone(),
            interface: "wasi:random/random",
        })
        .insecure_random(RecordedRng {
            journal: journal.clone(),
            interface: "wasi:random/insecure",
        })
        .insecure_random_seed(ids::insecure_seed(&run_id))
        .max_random_size(limits.payload_bytes_max)
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false);
    wasi
}

/// A store for one execution, with the run's limits.
fn new_store(
    engine: &StepEngine,
    journal: &Arc<Mutex<Journal>>,
    mut wasi: WasiCtxBuilder,
    options: &HostOptions,
) -> Result<Store<StepState>, wasmtime::Error> {
    let limits = &options.limits;
    let state = StepState {
        journal: journal.clone(),
        effects: options.effects.clone(),
        wasi: wasi.build(),
        table: ResourceTable::new(),
        limits: store_limits(limits),
        sleep: std::thread::sleep,
    };
    let mut store = Store::new(engine.engine(), state);
    store.limiter(|s| &mut s.limits);
    store.set_fuel(limits.fuel_max)?;
    Ok(store)
}

/// The memory and table limits of one execution.
fn store_limits(limits: &Limits) -> StoreLimits {
    StoreLimitsBuilder::new()
        .memory_size(usize::try_from(limits.memory_bytes_max).unwrap_or(usize::MAX))
        // A component may hold several memories and tables: bound their
        // number too, or a hostile guest multiplies the memory limit.
        .memories(MEMORIES_MAX)
        .tables(TABLES_MAX)
        .instances(INSTANCES_MAX)
        .table_elements(TABLE_ELEMENTS_MAX)
        .trap_on_grow_failure(true)
        .build()
}

/// A typed description of a trap: `kind: message`.
fn classify_trap(err: &wasmtime::Error, limits: &Limits) -> String {
    if let Some(trap) = err.downcast_ref::<Trap>() {
        return match trap {
            Trap::OutOfFuel => format!(
                "fuel_exhausted: the step executed more than fuel_max = {} instructions; \
                 raise [limits] fuel_max if it is meant to compute this long",
                limits.fuel_max
            ),
            Trap::UnreachableCodeReached => "trap: the guest executed `unreachable` \
                (a Rust step panicked or aborted; its message is on stderr)"
                .to_string(),
            other => format!("trap: {other}"),
        };
    }
    let text = format!("{err:#}");
    if text.contains("forcing trap when growing memory") {
        return format!(
            "memory_limit: the step tried to grow its memory past memory_bytes_max = {} bytes",
            limits.memory_bytes_max
        );
    }
    format!("trap: {text}")
}

/// Checks that `text` is JSON within the payload limit.
fn check_json(text: &str, what: &str, limits: &Limits) -> Result<(), HostError> {
    if text.len() as u64 > limits.payload_bytes_max {
        return Err(HostError::BadInput(format!(
            "{what} is {} bytes; payload_bytes_max is {}",
            text.len(),
            limits.payload_bytes_max
        )));
    }
    serde_json::from_str::<serde::de::IgnoredAny>(text)
        .map(|_| ())
        .map_err(|e| HostError::BadInput(format!("{what} is not valid JSON: {e}")))
}
