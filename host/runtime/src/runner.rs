//! A host over one ledger: starts, resumes and replays runs of steps.

use std::collections::HashSet;
use std::sync::Arc;

use serde::Serialize;
use stephost_core::journal::{RunControl, Stats};
use stephost_core::lifecycle::{self, ClaimMode};
use stephost_core::{
    Claim, NewRun, Pool, RunBudget, RunRecord, RunStatus, RunTrace, Store, StoreError, Writer,
};

use crate::engine::{Loaded, StepEngine};
use crate::error::HostError;
use crate::execution::{self, Executed, Start};
use crate::instance::{check_json, invoke, invoke_task};
use crate::options::{HostOptions, RunOptions};
use crate::replay::{Fixture, ReplayReport, ReplayVerdict, replay_fixture, replay_loaded};
use crate::telemetry::Execution;

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
    /// The trace the run reports into (32 hex digits).
    pub trace_id: String,
}

impl RunReport {
    pub fn from_record(run: &RunRecord, stats: Stats) -> Self {
        RunReport {
            run_id: run.run_id.clone(),
            status: run.status,
            output: run.output.clone(),
            error: run.error.clone(),
            wake_at_ms: run.wake_at_ms,
            exit_code: run.exit_code,
            stats,
            trace_id: run.trace().trace_id,
        }
    }
}

/// Whether an execution's journal has stopped before its guest runs (a
/// run cancelled while it was pending or waiting): it is ended, not run.
fn not_to_run(journal: &Arc<std::sync::Mutex<stephost_core::journal::Journal>>) -> bool {
    crate::imports::lock(journal).stop().is_some()
}

/// The guest result of an execution that did not run its guest.
fn not_run() -> crate::instance::GuestResult {
    Err(wasmtime::Error::msg("the step was not run"))
}

/// A host over one ledger.
pub struct Host {
    engine: Arc<StepEngine>,
    pool: Arc<dyn Pool>,
    store: Box<dyn Store>,
    /// The writer executions take in turn (its connection outlives each).
    writer: Option<Box<dyn Writer>>,
    options: HostOptions,
    /// Digests of the modules this host has put in its ledger (modules are
    /// never removed), so that starting a run does not ask again.
    stored: HashSet<String>,
}

impl Host {
    /// A host over `pool` with an engine of its own.
    pub fn open(pool: Arc<dyn Pool>, options: HostOptions) -> Result<Self, HostError> {
        let engine = Arc::new(StepEngine::with_options(
            options.cache_dir.as_deref(),
            options.instance_pool(),
        )?);
        Self::with_engine(engine, pool, options)
    }

    /// A host over `pool`, sharing a compiled-component cache.
    pub fn with_engine(
        engine: Arc<StepEngine>,
        pool: Arc<dyn Pool>,
        mut options: HostOptions,
    ) -> Result<Self, HostError> {
        crate::effects_host::install();
        if options.services.flows.is_none() {
            options.services.flows = Some(pool.flows()?);
        }
        if options.children.is_none() {
            options.children = Some(Arc::new(crate::imports::runs::ChildSteps::new(
                options.steps.clone(),
                engine.clone(),
                pool.store()?,
                options.signer.clone(),
                pool.tree_spends()?,
                options.limits.clone(),
            )));
        }
        Ok(Host {
            engine,
            store: pool.store()?,
            pool,
            writer: None,
            options,
            stored: HashSet::new(),
        })
    }

    pub fn store(&self) -> &dyn Store {
        self.store.as_ref()
    }

    pub fn engine(&self) -> &Arc<StepEngine> {
        &self.engine
    }

    pub fn options(&self) -> &HostOptions {
        &self.options
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
        self.submit_with(module, what, input, run_id, RunOptions::default())
    }

    /// Like [`Host::submit`], the run with a model budget of its own
    /// (each bound it sets replaces `[limits]`'s for this run) and, if
    /// given, in the caller's trace.
    pub fn submit_with(
        &mut self,
        module: &[u8],
        what: &str,
        input: &str,
        run_id: Option<&str>,
        given: RunOptions,
    ) -> Result<RunRecord, HostError> {
        let (loaded, run_id) = self.store_module(module, what, input, run_id)?;
        let kept = self.kept_input(&run_id, input);
        let new = new_run(&loaded, &run_id, &kept, given.budget);
        let found = self
            .store
            .insert_run(&self.sealed(new.record(None), given.trace))?;
        same_run(&new, &found)?;
        Ok(found)
    }

    /// A new run's row, in `trace` (else a trace of its own), sealed with
    /// nothing recorded yet.
    fn sealed(&self, run: RunRecord, trace: Option<RunTrace>) -> RunRecord {
        let seal = self
            .options
            .signer
            .seal(&run, &stephost_core::chain::Head::default());
        let trace = trace.unwrap_or_else(|| match &self.options.telemetry {
            Some(telemetry) => telemetry.new_trace(),
            None => RunTrace::new(true),
        });
        RunRecord {
            seal: Some(seal),
            trace: Some(trace),
            ..run
        }
    }

    /// A new run's input as the ledger keeps it (`[redact."input"]`); the
    /// whole input, when values are redacted, held for its executions in
    /// this process.
    fn kept_input(&self, run_id: &str, input: &str) -> String {
        let kept = self.options.effects.kept_input(input);
        if kept != input {
            crate::options::held_inputs().hold(run_id, input);
        }
        kept
    }

    /// The input an execution of `run` is given: the whole one, if this
    /// process holds it, else the ledger's.
    fn input_of(&self, run: &RunRecord) -> String {
        crate::options::held_inputs()
            .get(&run.run_id)
            .filter(|whole| self.options.effects.kept_input(whole) == run.input)
            .unwrap_or_else(|| run.input.clone())
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
        let run_id = chosen_run_id(run_id)?;
        let loaded = self.load(module, what)?;
        Ok((loaded, run_id))
    }

    /// Loads a step for many runs: compiles it (or takes it from a cache)
    /// and keeps its bytes in the ledger. [`Host::run_loaded`] then starts
    /// runs of it without looking at its bytes again.
    pub fn load(&mut self, module: &[u8], what: &str) -> Result<Arc<Loaded>, HostError> {
        let loaded = self.engine.load(module, what)?;
        if !self.stored.contains(&loaded.digest) {
            self.store.put_module(&loaded.digest, module)?;
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
        self.run_with(module, what, input, run_id, RunOptions::default())
    }

    /// Like [`Host::run`], a new run with a model budget of its own and in
    /// the caller's trace, if given (see [`Host::submit_with`]).
    pub fn run_with(
        &mut self,
        module: &[u8],
        what: &str,
        input: &str,
        run_id: Option<&str>,
        given: RunOptions,
    ) -> Result<RunReport, HostError> {
        let (loaded, run_id) = self.store_module(module, what, input, run_id)?;
        self.start(&loaded, &run_id, input, given)
    }

    /// Raises (or sets) unfinished run `run_id`'s own model budget: each
    /// bound `raised` gives replaces the run's; its next execution (a
    /// `resume`, a worker's claim) has it.
    pub fn set_budget(&mut self, run_id: &str, raised: &RunBudget) -> Result<RunRecord, HostError> {
        Ok(lifecycle::set_budget(
            self.store.as_ref(),
            &self.options.signer,
            run_id,
            raised,
            stephost_core::clock::now_ms(),
        )?)
    }

    /// Like [`Host::run`], for a step loaded by [`Host::load`] of this host.
    pub fn run_loaded(
        &mut self,
        loaded: &Arc<Loaded>,
        input: &str,
        run_id: Option<&str>,
    ) -> Result<RunReport, HostError> {
        check_json(input, "input", &self.options.limits)?;
        let run_id = chosen_run_id(run_id)?;
        self.start(loaded, &run_id, input, RunOptions::default())
    }

    fn start(
        &mut self,
        loaded: &Loaded,
        run_id: &str,
        input: &str,
        given: RunOptions,
    ) -> Result<RunReport, HostError> {
        let owner = self.options.owner.clone();
        let kept = self.kept_input(run_id, input);
        let new = new_run(loaded, run_id, &kept, given.budget);
        // A run id not in the ledger: the run is recorded, claimed by this
        // host, with the execution's first commit, not by a transaction of
        // its own before the guest starts. Should another process start the
        // same id meanwhile, that commit fails as claimed elsewhere, before
        // anything of this execution has left the host.
        let run = match self.store.run(run_id) {
            Err(StoreError::UnknownRun(_)) => {
                let claim =
                    lifecycle::first_claim(run_id, &owner, self.options.lease_ms, new.now_ms);
                let record = self.sealed(new.record(Some(&claim)), given.trace);
                stephost_core::crash::point("after-claim", 0);
                return self.execute_with(&record, claim, loaded, None, Start::Creating);
            }
            found => found?,
        };
        // An existing run is claimed as it is (or reported, if finished).
        same_run(&new, &run)?;
        if run.status.is_finished() {
            return Ok(RunReport::from_record(&run, Stats::default()));
        }
        let claim = self.claim(&run)?;
        self.execute_with(&run, claim, loaded, None, Start::Recorded)
    }

    /// Claims `run` for this host, as a person resuming it does.
    fn claim(&self, run: &RunRecord) -> Result<Claim, HostError> {
        lifecycle::check_sealed(&self.options.signer, run)?;
        let claim = lifecycle::claim_read(
            self.store.as_ref(),
            run,
            &self.options.owner,
            self.options.lease_ms,
            stephost_core::clock::now_ms(),
            ClaimMode::Any,
            &crate::owner::is_alive,
        )?;
        stephost_core::crash::point("after-claim", 0);
        Ok(claim)
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
        let run = self.store.run(run_id)?;
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
            && stephost_core::ids::module_digest(bytes) != run.module_digest
        {
            let named = |step: Option<&str>| step.unwrap_or("no declared version").to_string();
            Some(format!(
                "run {run_id} is pinned to module {} ({}, {}); {what} is module {} ({}); \
                 move the run with `stephost upgrade {run_id} --module {what}`, which \
                 replays its history against the new build first",
                run.module_digest,
                named(run.step.as_deref()),
                run.world,
                stephost_core::ids::module_digest(bytes),
                named(crate::engine::declared_step(bytes).as_deref())
            ))
        } else {
            None
        };
        if let Some(message) = mismatch {
            self.count("workflow_version_mismatch_total");
            return Err(HostError::VersionMismatch(message));
        }
        match run.status {
            RunStatus::Completed | RunStatus::Failed => {
                return Ok(RunReport::from_record(&run, Stats::default()));
            }
            RunStatus::Cancelled => return Ok(RunReport::from_record(&run, Stats::default())),
            RunStatus::Diverged => {
                return Err(HostError::BadInput(format!(
                    "run {run_id} diverged from its recording and cannot resume: {}",
                    run.error.as_deref().unwrap_or("")
                )));
            }
            RunStatus::Pending | RunStatus::Running | RunStatus::Waiting | RunStatus::Parked => {}
        }
        let loaded = self.load_pinned(&run)?;
        let claim = self.claim(&run)?;
        self.execute_with(&run, claim, &loaded, None, Start::Recorded)
    }

    /// Cancels run `run_id` and every run below it
    /// ([`stephost_core::Store::cancel`]), then ends here those of them
    /// that nobody holds and that were pending or waiting (a run held by a
    /// worker stops at its next call; a parked one when a person has
    /// settled it). The runs marked, and each one's report once ended here.
    pub fn cancel(
        &mut self,
        run_id: &str,
        request: &stephost_core::CancelRequest,
    ) -> Result<Vec<(String, Option<RunReport>)>, HostError> {
        let marked = self.store.cancel(run_id, request)?;
        let mut reports = Vec::with_capacity(marked.len());
        for id in marked {
            let run = self.store.run(&id)?;
            let idle = matches!(run.status, RunStatus::Pending | RunStatus::Waiting)
                && run.owner.is_none();
            let report = match idle {
                true => match self.resume(&id) {
                    Ok(report) => Some(report),
                    // Taken meanwhile by a worker, which ends it.
                    Err(HostError::Ledger(stephost_core::StoreError::ClaimedElsewhere {
                        ..
                    })) => None,
                    Err(e) => return Err(e),
                },
                false => None,
            };
            reports.push((id, report));
        }
        Ok(reports)
    }

    /// Adds one to a metric counter; a counter that cannot be written is
    /// not worth failing the command for.
    fn count(&self, name: &'static str) {
        let _ = self
            .store
            .add_counters(&stephost_core::journal::Counters::from([(name, 1)]));
    }

    /// The module a run is pinned to: from the engine's cache, or read from
    /// the ledger by its digest and compiled.
    fn load_pinned(&self, run: &RunRecord) -> Result<Arc<Loaded>, HostError> {
        if let Some(loaded) = self.engine.cached(&run.module_digest) {
            return Ok(loaded);
        }
        // A compile takes its thread for a while: a run executed as a task
        // tells its runtime.
        stephost_effects::blocking(|| {
            let module = self.store.module(&run.module_digest)?;
            // What runs under a pin is the code the digest names, whatever
            // happened to the ledger's copy.
            let found = stephost_core::ids::module_digest(&module);
            if found != run.module_digest {
                return Err(HostError::Integrity(format!(
                    "the ledger's copy of module {} hashes to {found}: it was changed after it \
                     was stored, and run {} will not run it; restore the ledger from a backup",
                    run.module_digest, run.run_id
                )));
            }
            Ok(self
                .engine
                .load_digested(&module, run.module_digest.clone(), &run.module_digest)?)
        })
    }

    /// Executes a run under a claim taken elsewhere (by a worker's claim
    /// loop); `control` lets the worker stop it at a call boundary.
    pub fn execute_claimed(
        &mut self,
        run_id: &str,
        claim: Claim,
        control: Arc<RunControl>,
    ) -> Result<RunReport, HostError> {
        let run = self.store.run(run_id)?;
        let loaded = self.load_pinned(&run)?;
        self.execute_with(&run, claim, &loaded, Some(control), Start::Recorded)
    }

    /// The writer for the next execution: the one the last left, or a new
    /// one from the pool.
    fn take_writer(&mut self) -> Result<Box<dyn Writer>, HostError> {
        match self.writer.take() {
            Some(writer) => Ok(writer),
            None => Ok(self.pool.writer()?),
        }
    }

    fn execute_with(
        &mut self,
        run: &RunRecord,
        claim: Claim,
        loaded: &Loaded,
        control: Option<Arc<RunControl>>,
        start: Start,
    ) -> Result<RunReport, HostError> {
        let traced = self.traced(&claim);
        let writer = self.take_writer()?;
        let executed = match execution::journal_for(
            self.store.as_ref(),
            run,
            claim,
            writer,
            control,
            start,
            &self.options,
        ) {
            Ok(journal) if not_to_run(&journal) => {
                execution::conclude(self.store.as_ref(), journal, not_run(), None).commit()
            }
            Ok(journal) => {
                let input = self.input_of(run);
                let (guest, exit_code) =
                    invoke(&self.engine, loaded, &journal, &input, &self.options);
                execution::conclude(self.store.as_ref(), journal, guest, exit_code).commit()
            }
            Err(not_started) => *not_started,
        };
        self.report(&run.run_id, executed, traced)
    }

    /// The execution under `claim` as its spans need it, when they are
    /// reported.
    fn traced(&self, claim: &Claim) -> Option<Execution> {
        self.options.telemetry.as_ref()?;
        Some(Execution {
            run_id: claim.run_id.clone(),
            fence: claim.fence,
            owner: claim.owner.clone(),
            from: claim.from.clone(),
            start_unix_ns: stephost_core::trace::unix_ns(),
        })
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
        let run = self.store.run(run_id)?;
        let loaded = self.load_pinned(&run)?;
        let pre = match self.engine.task_pre(&loaded) {
            Some(pre) => pre.map_err(HostError::Internal)?.clone(),
            None => {
                return stephost_effects::blocking(|| {
                    self.execute_with(&run, claim, &loaded, Some(control), Start::Recorded)
                });
            }
        };
        let traced = self.traced(&claim);
        let writer = self.take_writer()?;
        let executed = match execution::journal_for(
            self.store.as_ref(),
            &run,
            claim,
            writer,
            Some(control),
            Start::Recorded,
            &self.options,
        ) {
            Ok(journal) if not_to_run(&journal) => {
                execution::conclude(self.store.as_ref(), journal, not_run(), None)
                    .commit_task()
                    .await
            }
            Ok(journal) => {
                let input = self.input_of(&run);
                let guest = invoke_task(&self.engine, &pre, &journal, &input, &self.options).await;
                execution::conclude(self.store.as_ref(), journal, guest, None)
                    .commit_task()
                    .await
            }
            Err(not_started) => *not_started,
        };
        self.report(&run.run_id, executed, traced)
    }

    /// The writer of a finished execution back in the host; its spans
    /// reported (if `traced`); the run's report, read from the ledger.
    fn report(
        &mut self,
        run_id: &str,
        executed: Executed,
        traced: Option<Execution>,
    ) -> Result<RunReport, HostError> {
        let Executed {
            mut writer,
            result,
            timings,
        } = executed;
        // A run that stopped early (fenced, a failed write) may leave
        // commits in flight: they land, or fail, before the writer is used
        // again, and the first failure is the run's if nothing failed
        // before it.
        let landed = writer.landed();
        self.writer = Some(writer);
        if let (Some(telemetry), Some(execution)) = (&self.options.telemetry, traced) {
            telemetry.execution_ended(
                self.store.as_ref(),
                &self.options.effects,
                &execution,
                &timings,
                match (&result, &landed) {
                    (Ok(stats), Ok(())) => Some(*stats),
                    _ => None,
                },
            );
        }
        let stats = result?;
        landed?;
        let run = self.store.run(run_id)?;
        if run.status.is_finished() {
            crate::options::held_inputs().release(run_id);
        }
        Ok(RunReport::from_record(&run, stats))
    }

    /// Replays a recorded run offline: no I/O, no ledger writes. With
    /// `module`, against a new build of the step.
    pub fn replay(
        &self,
        run_id: &str,
        module: Option<(&[u8], &str)>,
    ) -> Result<ReplayReport, HostError> {
        let run = self.store.run(run_id)?;
        let loaded = match module {
            Some((bytes, what)) => self.engine.load(bytes, what)?,
            None => self.load_pinned(&run)?,
        };
        let history = self.store.history(run_id)?;
        let fixture = Fixture::new(&run, Vec::new());
        replay_loaded(&self.engine, &fixture, history, &loaded, &self.options)
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
        let run = self.store.run(run_id)?;
        if run.status.is_finished() {
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
        let outcome = |moved, report: ReplayReport| UpgradeOutcome {
            run_id: run_id.to_string(),
            from: run.module_digest.clone(),
            to: report.module_digest.clone(),
            moved,
            report,
        };
        if !compatible {
            self.count("workflow_version_mismatch_total");
            return Ok(outcome(false, report));
        }
        self.store.put_module(&report.module_digest, module)?;
        lifecycle::repin(
            self.store.as_ref(),
            &self.options.signer,
            run_id,
            &lifecycle::Repin {
                from: &run.module_digest,
                to: &report.module_digest,
                step: crate::engine::declared_step(module).as_deref(),
            },
            stephost_core::clock::now_ms(),
            &crate::owner::is_alive,
        )?;
        Ok(outcome(true, report))
    }

    /// Forks run `source` at call `at` ([`stephost_core::fork`]): a new run,
    /// pending for a worker, with the source's calls before `at` (their
    /// outcomes and operation ids), pinned to `module` (else the source's
    /// build), which must replay those calls with no divergence. The
    /// source is unchanged. Nothing is written unless every check passes.
    pub fn fork(
        &mut self,
        source_id: &str,
        at: u64,
        module: Option<(&[u8], &str)>,
        run_id: Option<&str>,
    ) -> Result<RunRecord, HostError> {
        use stephost_core::fork;
        let source = self.store.run(source_id)?;
        let calls = self.store.calls(source_id, 1, usize::MAX)?;
        fork::check_prefix(&source, &calls, at).map_err(HostError::ForkRefused)?;
        let prefix = &calls[..(at - 1) as usize];
        // The prefix is the source's as its chain says: a changed one is
        // not carried into a fork.
        self.options
            .signer
            .verify_chain(source_id, prefix)
            .map_err(|broken| {
                HostError::Integrity(format!(
                    "run {source_id}'s calls before #{at} do not verify ({broken}); nothing was \
                     forked"
                ))
            })?;
        let loaded = match module {
            Some((bytes, what)) => self.load(bytes, what)?,
            None => self.load_pinned(&source)?,
        };
        // The build must make the prefix's calls: replayed with no I/O.
        let recording = Fixture::new(
            &RunRecord {
                status: RunStatus::Running,
                ..source.clone()
            },
            Vec::new(),
        );
        let history = stephost_core::History::loaded(source_id, prefix.to_vec());
        let report = replay_loaded(&self.engine, &recording, history, &loaded, &self.options)?;
        if let ReplayVerdict::Diverged { divergence } = &report.verdict {
            return Err(HostError::VersionMismatch(format!(
                "build {} does not make run {source_id}'s calls before #{at}: {divergence}; \
                 nothing was forked (fork from an earlier call, or with a build that makes them)",
                loaded.digest
            )));
        }
        let run_id = match run_id {
            Some(id) => {
                stephost_core::ids::check_run_id(id).map_err(HostError::BadInput)?;
                id.to_string()
            }
            None => format!(
                "fork-{}",
                &stephost_core::ids::unique("stephost/fork-id/v1")[..20]
            ),
        };
        let mut run = new_run(&loaded, &run_id, &source.input, source.budget).record(None);
        run.fork = Some(fork::fork_ref(&source, prefix, at));
        // Its row is as its first execution (fencing token 1) would leave
        // it, having recorded the kept calls: a worker's claim is its second,
        // and reads them like any recorded history.
        run.fence = 1;
        run.version = 1;
        let relinked = fork::relink(&self.options.signer, &run_id, prefix);
        let head = relinked
            .last()
            .map_or_else(Default::default, |c| stephost_core::chain::Head {
                seq: c.seq,
                link: c.chain.clone().unwrap_or_default(),
            });
        run.seal = Some(self.options.signer.seal(&run, &head));
        run.trace = Some(match &self.options.telemetry {
            Some(telemetry) => telemetry.new_trace(),
            None => RunTrace::new(true),
        });
        if relinked.is_empty() {
            let found = self.store.insert_run(&run)?;
            if found != run {
                return Err(StoreError::RunExists { run_id }.into());
            }
            return Ok(found);
        }
        // The row and the copied calls in one durable commit, as a run's
        // first commit creates it: a worker finds both or neither.
        let claim = stephost_core::Claim {
            run_id: run_id.clone(),
            owner: String::new(),
            fence: run.fence,
            lease_ms: 0,
            lease_until_ms: 0,
            from: None,
        };
        let mut ops = vec![stephost_core::WriteOp::Create(Box::new(run.clone()))];
        ops.extend(relinked.into_iter().map(stephost_core::WriteOp::Answer));
        let mut writer = self.take_writer()?;
        let committed = writer.commit(&claim, ops).wait();
        self.writer = Some(writer);
        match committed {
            Ok(()) => Ok(self.store.run(&run_id)?),
            Err(StoreError::ClaimedElsewhere { .. }) => {
                Err(StoreError::RunExists { run_id }.into())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The ledger's schedules ([`crate::schedules`]).
    pub fn schedules(&self) -> Result<Arc<dyn stephost_core::schedules::Schedules>, HostError> {
        Ok(self.pool.schedules()?)
    }

    /// Deleting the ledger's finished runs ([`stephost_core::retention`]).
    pub fn retention(&self) -> Result<Arc<dyn stephost_core::retention::Retention>, HostError> {
        Ok(self.pool.retention()?)
    }

    /// Adds a schedule firing `module` (stored in the ledger) or, with no
    /// module, the build of step `step` the ledger last ran. Its input is
    /// kept as given, so one that the configuration would redact is
    /// refused (each firing's row would hold what a run's row never does).
    pub fn add_schedule(
        &mut self,
        module: Option<(&[u8], &str)>,
        step: Option<&str>,
        new: crate::schedules::NewSchedule,
    ) -> Result<stephost_core::schedules::Schedule, HostError> {
        let target = match (module, step) {
            (Some((bytes, what)), _) => {
                let loaded = self.load(bytes, what)?;
                crate::schedules::Target {
                    module_digest: loaded.digest.clone(),
                    world: loaded.world().to_string(),
                    step: loaded.step.clone(),
                }
            }
            (None, Some(step)) => crate::schedules::Target::of_step(self.store.as_ref(), step)?,
            (None, None) => {
                return Err(HostError::BadInput(
                    "a schedule names the build it fires: a module, or a step the ledger has run"
                        .into(),
                ));
            }
        };
        if self.options.effects.kept_input(&new.input) != new.input {
            return Err(HostError::BadInput(
                "the schedule's input holds values the configuration redacts; a schedule keeps \
                 its input whole in the ledger, so give secrets through the configuration, not \
                 the input"
                    .into(),
            ));
        }
        crate::schedules::add(self.pool.schedules()?.as_ref(), target, new)
    }

    /// A portable copy of a run: module digest, input, calls, output.
    pub fn export(&self, run_id: &str) -> Result<Fixture, HostError> {
        crate::replay::export(self.store.as_ref(), run_id)
    }
}

/// The id of a new run: the caller's, checked, or a new one.
fn chosen_run_id(run_id: Option<&str>) -> Result<String, HostError> {
    match run_id {
        Some(id) => {
            stephost_core::ids::check_run_id(id).map_err(|e| {
                // Shown escaped, and cut: the id is the caller's, of any length.
                let shown: String = id.chars().take(64).collect();
                let more = if shown.len() < id.len() { "…" } else { "" };
                HostError::BadInput(format!(
                    "run id \"{}{more}\" is refused: {e}",
                    shown.escape_debug()
                ))
            })?;
            Ok(id.to_string())
        }
        None => Ok(stephost_core::ids::new_run_id()),
    }
}

/// The new run `run_id` of `loaded` on `input`, with its own `budget`.
fn new_run<'a>(
    loaded: &'a Loaded,
    run_id: &'a str,
    input: &'a str,
    budget: RunBudget,
) -> NewRun<'a> {
    NewRun {
        run_id,
        module_digest: &loaded.digest,
        step: loaded.step.as_deref(),
        world: loaded.world(),
        input,
        now_ms: stephost_core::clock::now_ms(),
        budget,
    }
}

/// Refuses a run id that exists with another module or input. Its budget
/// is not its identity (it may have been raised since): the existing run
/// keeps its own.
fn same_run(new: &NewRun<'_>, found: &RunRecord) -> Result<(), StoreError> {
    if found.module_digest != new.module_digest || found.input != new.input {
        return Err(StoreError::RunExists {
            run_id: new.run_id.to_string(),
        });
    }
    Ok(())
}
