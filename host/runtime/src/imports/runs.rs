//! `stephost:step/runs` (0.3.0): child runs, started and joined.
//!
//! - `start` is one commit: the call, finished with the child's run id and
//!   the module its step name resolved to, and the child's pending row
//!   ([`stephost_core::journal::Journal::spawn`]). The child's id is derived
//!   from the call's operation id; a resumed or replayed parent finds the
//!   start recorded and never starts a second child.
//! - `join-next` looks in the run's inbox (children's ends in arrival
//!   order) for the first child of its set not joined: found, the child's
//!   end is the call's outcome, recorded as an observe call (a process that
//!   dies before it is committed joins the same child again), and the
//!   replay of the run gives the same child whatever the timing; not found,
//!   it is a suspend call, recorded `started`, and the run leaves memory
//!   until a child's end makes it due.
//! - `join-try-next` records what it found (an observe call).
//! - `call` is a start in a join set of its own (`call#SEQ`), joined.
//!
//! Which children a set has and which were joined is learnt from the
//! run's own calls (their outcomes, recorded or live), so it is the same
//! in every execution of the run.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use stephost_core::chain::{Head, Signer};
use stephost_core::journal::{
    Attempts, CallErrorKind, CallSpec, Compute, LiveCall, OpContext, Outcome, Performed, Stop, Wait,
};
use stephost_core::tree_spend::TreeSpends;
use stephost_core::{
    CallClass, InboxEntry, Limits, NewRun, ParentRef, RunRecord, RunStatus, Spent, Store,
};

use crate::bindings::v0_3::CallError;
use crate::bindings::v0_3::stephost::step::runs::{
    ChildEnd, ChildSpec, ChildStatus, Host, TryNext,
};
use crate::imports::{StepState, lock, trap};

pub const INTERFACE: &str = "stephost:step/runs";

/// What reads a step's module for a start: its digest, the world it was
/// built for and its declared `name@version` (the engine, which compiles
/// and keeps it).
pub trait StepModules: Send + Sync {
    fn read(&self, bytes: &[u8], what: &str) -> Result<StepModule, String>;
}

/// A step's module as [`StepModules::read`] found it.
pub struct StepModule {
    pub digest: String,
    pub world: &'static str,
    pub step: Option<String>,
}

/// The steps a run may start as children (`[steps.NAME]`), and what starts
/// and joins them use: what reads a step's module, the ledger.
pub struct ChildSteps {
    steps: BTreeMap<String, PathBuf>,
    engine: Arc<dyn StepModules>,
    store: Mutex<Box<dyn Store>>,
    signer: Signer,
    /// Trees' model spend, and this host's `[limits]` (a root's budget
    /// over them is its tree's).
    spends: Arc<dyn TreeSpends>,
    limits: Limits,
    /// Modules read, by step name: a step is read and stored once per
    /// process.
    resolved: Mutex<HashMap<String, Resolved>>,
}

/// What a step name resolved to.
#[derive(Clone)]
struct Resolved {
    digest: String,
    world: &'static str,
    step: Option<String>,
}

impl ChildSteps {
    pub fn new(
        steps: BTreeMap<String, PathBuf>,
        engine: Arc<dyn StepModules>,
        store: Box<dyn Store>,
        signer: Signer,
        spends: Arc<dyn TreeSpends>,
        limits: Limits,
    ) -> Self {
        ChildSteps {
            steps,
            engine,
            store: Mutex::new(store),
            signer,
            spends,
            limits,
            resolved: Mutex::default(),
        }
    }

    pub(crate) fn store(&self) -> std::sync::MutexGuard<'_, Box<dyn Store>> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The module step `name` names, read, checked and kept in the ledger;
    /// a refusal the step sees if it cannot be.
    fn resolve(&self, name: &str) -> Result<Resolved, Outcome> {
        if let Some(found) = self
            .resolved
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
        {
            return Ok(found.clone());
        }
        let invalid = |message: String| Outcome::error(CallErrorKind::Invalid, message);
        let Some(path) = self.steps.get(name) else {
            let known: Vec<&str> = self.steps.keys().map(String::as_str).collect();
            return Err(invalid(format!(
                "no step named {name:?} in the host configuration ([steps.NAME] module = \
                 \"…\" in stephost.toml; it names {})",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            )));
        };
        let bytes = std::fs::read(path).map_err(|e| {
            invalid(format!(
                "step {name:?}: its module {} cannot be read: {e}",
                path.display()
            ))
        })?;
        let what = format!("step {name:?} ({})", path.display());
        let module = self.engine.read(&bytes, &what).map_err(invalid)?;
        self.store()
            .put_module(&module.digest, &bytes)
            .map_err(|e| Outcome::error(CallErrorKind::Exhausted, e.to_string()))?;
        let resolved = Resolved {
            digest: module.digest,
            world: module.world,
            step: module.step,
        };
        self.resolved
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string(), resolved.clone());
        Ok(resolved)
    }

    /// How deep run `run_id` is in its tree (a root is at 0), looking up
    /// at most `max + 1` levels.
    fn depth(&self, run: &RunRecord, max: u64) -> Result<u64, Stop> {
        let store = self.store();
        let mut depth = 0;
        let mut parent = run.parent.clone();
        while let Some(p) = parent {
            depth += 1;
            if depth > max {
                break;
            }
            parent = store.run(&p.run_id).map_err(Stop::reading_history)?.parent;
        }
        Ok(depth)
    }
}

/// The children a run started and joined, per join set, as its calls
/// (recorded or live) say.
#[derive(Default)]
pub struct RunsState {
    /// Children started, per join set, in order.
    started: HashMap<String, Vec<String>>,
    /// Children joined.
    joined: HashSet<String>,
    started_total: u64,
    /// The model budget of the run's tree, once read.
    tree_cap: Option<Spent>,
    /// The runs below the run's root the ledger held at this execution's
    /// first live start, and the live starts since: what
    /// `runs_per_tree_max` is checked against (a start rides on the next
    /// durable commit, so the ledger's count lags this execution's own).
    tree_base: Option<u64>,
    live_starts: u64,
}

impl RunsState {
    /// The children of `join_set` not yet joined, in the order started.
    fn open(&self, join_set: &str) -> Vec<String> {
        self.started
            .get(join_set)
            .map(|children| {
                children
                    .iter()
                    .filter(|c| !self.joined.contains(*c))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn request_of(join_set: &str, spec: &ChildSpec) -> Result<String, String> {
    let input: Value = serde_json::from_str(&spec.input)
        .map_err(|e| format!("the child's input is not JSON: {e}"))?;
    Ok(json!({
        "join_set": join_set,
        "step": spec.step,
        "input": input,
        "key": spec.key,
        "model_tokens_max": spec.model_tokens_max,
        "model_cost_micro_usd_max": spec.model_cost_micro_usd_max,
        "detach": spec.detach,
    })
    .to_string())
}

/// Starts a child in `join_set`: the recorded outcome (the child's run id,
/// or a refusal).
fn start(state: &mut StepState, join_set: &str, spec: &ChildSpec) -> Result<Outcome, Stop> {
    let steps = state.children.clone();
    let mut journal = lock(&state.journal);
    let limits = journal.limits().clone();
    let started_total = state.runs.started_total;
    let pending = started_total.saturating_sub(state.runs.joined.len() as u64);
    let (request, refusal) = match request_of(join_set, spec) {
        Ok(request) => (request, None),
        Err(refused) => (
            json!({"join_set": join_set, "step": spec.step}).to_string(),
            Some(Outcome::error(CallErrorKind::Invalid, refused)),
        ),
    };
    let key = spec.key.clone();
    let call = CallSpec {
        class: CallClass::Write,
        interface: INTERFACE,
        function: "start",
        request: &request,
        key: key.as_deref(),
        paid: false,
        redact: None,
    };
    let parent_root = journal.tree_root().to_string();
    let own_parent = journal.parent().cloned();
    // A root's first child: what the root has spent joins the tree's
    // total before the child can spend.
    let live = journal.calls_made() >= journal.history_len();
    if live
        && own_parent.is_none()
        && started_total == 0
        && !state.models_spent.is_zero()
        && let Some(steps) = &steps
    {
        // Without a cap the figure is written, whatever the tree's total.
        let _written = steps
            .spends
            .set_spent(&parent_root, &parent_root, state.models_spent, None)
            .map_err(Stop::from)?;
    }
    let budget = stephost_core::RunBudget {
        model_tokens_max: spec.model_tokens_max,
        model_cost_micro_usd_max: spec.model_cost_micro_usd_max,
    };
    let tree_base = &mut state.runs.tree_base;
    let live_starts = state.runs.live_starts;
    let mut made_live = false;
    let mut make = |op: &OpContext<'_>| -> Result<RunRecord, Outcome> {
        if let Some(refused) = &refusal {
            return Err(refused.clone());
        }
        let Some(steps) = &steps else {
            return Err(Outcome::error(
                CallErrorKind::Denied,
                "this host starts no child runs",
            ));
        };
        if started_total >= limits.children_per_run_max {
            return Err(Outcome::error(
                CallErrorKind::Budget,
                format!(
                    "the run has started {started_total} children; children_per_run_max = {}",
                    limits.children_per_run_max
                ),
            ));
        }
        if pending >= limits.children_pending_max {
            return Err(Outcome::error(
                CallErrorKind::Budget,
                format!(
                    "the run has {pending} children started and not joined; \
                     children_pending_max = {} (join one first)",
                    limits.children_pending_max
                ),
            ));
        }
        let base = match *tree_base {
            Some(base) => base,
            None => {
                let base = steps
                    .store()
                    .tree_size(&parent_root)
                    .map_err(|e| Outcome::error(CallErrorKind::Exhausted, e.to_string()))?;
                *tree_base = Some(base);
                base
            }
        };
        let in_tree = base + live_starts;
        if in_tree.saturating_add(1) >= limits.runs_per_tree_max {
            return Err(Outcome::error(
                CallErrorKind::Budget,
                format!(
                    "the tree of run {parent_root} holds {} runs; runs_per_tree_max = {}",
                    in_tree + 1,
                    limits.runs_per_tree_max
                ),
            ));
        }
        let this = RunRecord {
            parent: own_parent.clone(),
            ..placeholder(op.run_id)
        };
        let depth = steps
            .depth(&this, limits.child_depth_max)
            .map_err(|e| Outcome::error(CallErrorKind::Exhausted, e.to_string()))?;
        if depth + 1 > limits.child_depth_max {
            return Err(Outcome::error(
                CallErrorKind::Budget,
                format!(
                    "a child would be at depth {} of its tree; child_depth_max = {}",
                    depth + 1,
                    limits.child_depth_max
                ),
            ));
        }
        let module = steps.resolve(&spec.step)?;
        let run_id = stephost_core::ids::child_run_id_in(op.run_id, op.operations, op.operation_id);
        let mut child = NewRun {
            run_id: &run_id,
            module_digest: &module.digest,
            step: module.step.as_deref(),
            world: module.world,
            input: &spec.input,
            now_ms: stephost_core::clock::now_ms(),
            budget,
        }
        .record(None);
        child.parent = Some(ParentRef {
            run_id: op.run_id.to_string(),
            seq: op.seq,
            join_set: join_set.to_string(),
            detached: spec.detach,
        });
        child.root_run_id = Some(parent_root.clone());
        child.trace = Some(child_trace(op));
        child.seal = Some(steps.signer.seal(&child, &Head::default()));
        made_live = true;
        Ok(child)
    };
    // Durable: as a task, the thread's other runs go on while its commit
    // is made.
    let outcome = stephost_effects::blocking(|| journal.spawn(&call, &mut make))?;
    drop(journal);
    if let Outcome::Ok(value) = &outcome {
        let child = value
            .get("run_id")
            .and_then(Value::as_str)
            .ok_or_else(|| Stop::Corrupt(format!("a recorded start has no run id: {value}")))?;
        state
            .runs
            .started
            .entry(join_set.to_string())
            .or_default()
            .push(child.to_string());
        state.runs.started_total += 1;
        state.runs.live_starts += u64::from(made_live);
        if !made_live
            && stephost_core::crash::broken("start-child-again")
            && let Some(steps) = &state.children
        {
            start_again(steps, child);
        }
    }
    Ok(outcome)
}

/// The `start-child-again` break (test builds only): another child like
/// the recorded one `child`, under the same parent's call.
fn start_again(steps: &ChildSteps, child: &str) {
    let Ok(recorded) = steps.store().run(child) else {
        return;
    };
    let run_id = format!("{child}-again-{}", stephost_core::clock::now_ms());
    let mut again = NewRun {
        run_id: &run_id,
        module_digest: &recorded.module_digest,
        step: recorded.step.as_deref(),
        world: &recorded.world,
        input: &recorded.input,
        now_ms: stephost_core::clock::now_ms(),
        budget: recorded.budget,
    }
    .record(None);
    again.parent = recorded.parent.clone();
    again.root_run_id = recorded.root_run_id.clone();
    again.seal = Some(steps.signer.seal(&again, &Head::default()));
    let _ = steps.store().insert_run(&again);
}

/// Whether a run's model calls count against its tree's budget: a child's
/// do, and a root's once it has started a child.
pub fn in_tree(state: &StepState) -> bool {
    state.runs.started_total > 0 || lock(&state.journal).parent().is_some()
}

/// Holds what a live model call of a run in a tree may spend (`call`, its
/// worst case) on top of what the run has spent, if the tree's total stays
/// within its root's budget; why not, if it would not
/// ([`stephost_core::tree_spend`]).
pub fn hold_model_spend(state: &mut StepState, call: Spent) -> Result<Option<String>, Stop> {
    let Some(steps) = state.children.clone() else {
        return Ok(None);
    };
    let (run_id, root) = {
        let journal = lock(&state.journal);
        (
            journal.run_id().to_string(),
            journal.tree_root().to_string(),
        )
    };
    let cap = match state.runs.tree_cap {
        Some(cap) => cap,
        None => {
            let limits = if root == run_id {
                lock(&state.journal).limits().clone()
            } else {
                let root_run = steps.store().run(&root).map_err(Stop::reading_history)?;
                root_run.budget.applied_to(&steps.limits)
            };
            let cap = Spent {
                tokens: limits.model_tokens_max,
                micro_usd: limits.model_cost_micro_usd_max,
            };
            state.runs.tree_cap = Some(cap);
            cap
        }
    };
    let mine = state.models_spent.plus(call);
    match steps.spends.set_spent(&root, &run_id, mine, Some(cap))? {
        Ok(()) => Ok(None),
        Err(others) => Ok(Some(
            if others.tokens.saturating_add(mine.tokens) > cap.tokens {
                format!(
                    "the runs of its tree (root {root}) have spent or hold {} model tokens and \
                     this run {}; this call may spend {} more, past the root's \
                     model_tokens_max = {}",
                    others.tokens, state.models_spent.tokens, call.tokens, cap.tokens
                )
            } else {
                format!(
                    "the model calls of its tree (root {root}) have cost or hold {} micro-USD and \
                     this run's {}; this call may cost {} more, past the root's \
                     model_cost_micro_usd_max = {}",
                    others.micro_usd, state.models_spent.micro_usd, call.micro_usd, cap.micro_usd
                )
            },
        )),
    }
}

/// Writes what a run in a tree has spent after a live model call (in place
/// of what it held). A failure leaves the hold, which counts more than was
/// spent: the tree may be refused a call it could afford, never pass its
/// budget; the run's next call writes it again.
pub fn settle_model_spend(state: &StepState) {
    let Some(steps) = &state.children else {
        return;
    };
    let (run_id, root) = {
        let journal = lock(&state.journal);
        (
            journal.run_id().to_string(),
            journal.tree_root().to_string(),
        )
    };
    let _ = steps
        .spends
        .set_spent(&root, &run_id, state.models_spent, None);
}

/// A run record with nothing but its id (to walk up a tree from it).
fn placeholder(run_id: &str) -> RunRecord {
    NewRun {
        run_id,
        module_digest: "",
        step: None,
        world: "",
        input: "",
        now_ms: 0,
        budget: Default::default(),
    }
    .record(None)
}

/// A child's trace: its parent's, under the span of the call that started
/// it.
fn child_trace(op: &OpContext<'_>) -> stephost_core::RunTrace {
    match (op.trace, op.trace_context()) {
        (Some(trace), Some((traceparent, _))) => stephost_core::RunTrace {
            trace_id: trace.trace_id.clone(),
            parent_span_id: traceparent.split('-').nth(2).map(str::to_string),
            sampled: trace.sampled,
            tracestate: trace.tracestate.clone(),
        },
        _ => stephost_core::RunTrace::new(true),
    }
}

/// What a join looks at: the run's inbox and its children's rows.
struct Join<'a> {
    steps: Option<&'a ChildSteps>,
    join_set: &'a str,
    /// The set's children not joined yet.
    open: Vec<String>,
    /// The arrivals the inbox had when the join last looked.
    seen: Option<u64>,
}

impl Join<'_> {
    /// The end of the first open child of the set to have ended, if any.
    fn find(&mut self, run_id: &str) -> Result<Option<Outcome>, String> {
        let Some(steps) = self.steps else {
            return Err("this host starts no child runs".into());
        };
        let store = steps.store();
        let inbox = store.inbox(run_id).map_err(|e| e.to_string())?;
        self.seen = Some(inbox.len() as u64);
        let Some(entry) = inbox
            .iter()
            .find(|e| e.join_set == self.join_set && self.open.contains(&e.child_run_id))
        else {
            return Ok(None);
        };
        let child = store.run(&entry.child_run_id).map_err(|e| e.to_string())?;
        Ok(Some(Outcome::Ok(end_json(entry, &child))))
    }
}

/// A child's end as a join's outcome records it.
fn end_json(entry: &InboxEntry, child: &RunRecord) -> Value {
    let (status, output) = match child.status {
        RunStatus::Completed => ("completed", child.output.clone().unwrap_or_default()),
        RunStatus::Cancelled => ("cancelled", child.error.clone().unwrap_or_default()),
        _ => ("failed", child.error.clone().unwrap_or_default()),
    };
    json!({
        "run_id": entry.child_run_id,
        "status": status,
        "output": output,
        "arrival": entry.arrival,
    })
}

impl LiveCall for Join<'_> {
    fn perform(&mut self, op: &OpContext<'_>, _attempts: &mut Attempts<'_>) -> Performed {
        match self.find(op.run_id) {
            Ok(Some(outcome)) => outcome.into(),
            Ok(None) => Outcome::Ok(json!("pending")).into(),
            Err(e) => Outcome::error(CallErrorKind::Exhausted, e).into(),
        }
    }

    fn wait(&mut self, op: &OpContext<'_>, _started_at_ms: i64) -> Wait {
        match self.find(op.run_id) {
            Ok(Some(outcome)) => Wait::Ready(outcome),
            Ok(None) => Wait::Until {
                wake_at_ms: None,
                reason: format!(
                    "waiting for a child of join set {:?} to end ({} running)",
                    self.join_set,
                    self.open.len()
                ),
            },
            Err(e) => Wait::Ready(Outcome::error(CallErrorKind::Exhausted, e)),
        }
    }
}

/// Joins the next child of `join_set` to end (`wait`) or looks once
/// (`join-try-next`): the recorded outcome.
fn join(state: &mut StepState, join_set: &str, wait: bool) -> Result<Outcome, Stop> {
    let steps = state.children.clone();
    let open = state.runs.open(join_set);
    let request = json!({ "join_set": join_set }).to_string();
    let function = if wait { "join-next" } else { "join-try-next" };
    let mut journal = lock(&state.journal);
    let outcome = if open.is_empty() {
        // Recorded as any refusal or answer is: replay shows it again.
        let answer = if wait {
            Outcome::error(
                CallErrorKind::Invalid,
                format!("join set {join_set:?} has no child left to join"),
            )
        } else {
            Outcome::Ok(json!("empty"))
        };
        let spec = CallSpec {
            class: CallClass::Observe,
            interface: INTERFACE,
            function,
            request: &request,
            key: None,
            paid: false,
            redact: None,
        };
        journal.call(&spec, &mut Compute(|| answer.clone()))?
    } else {
        let mut live = Join {
            steps: steps.as_deref(),
            join_set,
            open,
            seen: None,
        };
        // A join whose child has ended already is recorded as a plain
        // observe call, with no fsync of its own: a process that dies before
        // it is committed joins the same child again (the lowest arrival
        // not joined). Only a join that must wait is recorded `started`.
        let ready = if wait && journal.next_goes_live() {
            let run_id = journal.run_id().to_string();
            live.find(&run_id).ok().flatten()
        } else {
            None
        };
        let spec = CallSpec {
            class: if wait && ready.is_none() {
                CallClass::Suspend
            } else {
                CallClass::Observe
            },
            interface: INTERFACE,
            function,
            request: &request,
            key: None,
            paid: false,
            redact: None,
        };
        let joined = match ready {
            Some(found) => journal.call(&spec, &mut Compute(|| found.clone())),
            None => stephost_effects::blocking(|| journal.call(&spec, &mut live)),
        };
        if let (Err(Stop::Suspended { .. }), Some(seen)) = (&joined, live.seen) {
            journal.await_inbox(seen);
        }
        joined?
    };
    drop(journal);
    if let Outcome::Ok(value) = &outcome
        && let Some(child) = value.get("run_id").and_then(Value::as_str)
    {
        state.runs.joined.insert(child.to_string());
    }
    Ok(outcome)
}

/// Cancels child `child` with the runs below it (its own transaction,
/// durable, after this run's pending commits), recorded as an observe call: a process that dies before the
/// record is committed cancels it again, which changes nothing.
fn cancel(state: &mut StepState, child: &str) -> Result<Outcome, Stop> {
    let steps = state.children.clone();
    let ours = state
        .runs
        .started
        .values()
        .any(|set| set.iter().any(|c| c == child));
    let request = json!({ "run_id": child }).to_string();
    let spec = CallSpec {
        class: CallClass::Observe,
        interface: INTERFACE,
        function: "cancel",
        request: &request,
        key: None,
        paid: false,
        redact: None,
    };
    let mut journal = lock(&state.journal);
    // The child's row rides on the next commit: it is applied first, so
    // that there is a row to cancel.
    if journal.next_goes_live() {
        stephost_effects::blocking(|| journal.flush_now())?;
    }
    let run_id = journal.run_id().to_string();
    let seq = journal.calls_made() + 1;
    journal.call(
        &spec,
        &mut Compute(|| {
            if !ours {
                return Outcome::error(
                    CallErrorKind::Invalid,
                    format!("run {child} is not a child this run started"),
                );
            }
            let Some(steps) = &steps else {
                return Outcome::error(CallErrorKind::Denied, "this host starts no child runs");
            };
            let request = stephost_core::CancelRequest {
                at_ms: stephost_core::clock::now_ms(),
                by: format!("run {run_id}"),
                reason: Some(format!("its parent cancelled it (call #{seq})")),
            };
            match steps.store().cancel(child, &request) {
                Ok(_) | Err(stephost_core::StoreError::Ended { .. }) => Outcome::Ok(Value::Null),
                Err(e) => Outcome::error(CallErrorKind::Exhausted, e.to_string()),
            }
        }),
    )
}

/// A recorded join's outcome as the guest sees it.
fn child_end(value: &Value) -> Result<ChildEnd, Stop> {
    let corrupt = || Stop::Corrupt(format!("a recorded join is not a child's end: {value}"));
    let run_id = value
        .get("run_id")
        .and_then(Value::as_str)
        .ok_or_else(corrupt)?;
    let status = match value.get("status").and_then(Value::as_str) {
        Some("completed") => ChildStatus::Completed,
        Some("failed") => ChildStatus::Failed,
        Some("cancelled") => ChildStatus::Cancelled,
        _ => return Err(corrupt()),
    };
    Ok(ChildEnd {
        run_id: run_id.to_string(),
        status,
        output: value
            .get("output")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
    })
}

pub(crate) fn guest<T>(
    state: &StepState,
    outcome: Outcome,
    read: impl FnOnce(&Value) -> Result<T, Stop>,
) -> wasmtime::Result<Result<T, CallError>> {
    match outcome {
        Outcome::Ok(value) => match read(&value) {
            Ok(v) => Ok(Ok(v)),
            Err(stop) => Err(state.fail(stop)),
        },
        err => match crate::imports::v0_3::to_guest(err) {
            Ok(_) => Err(state.fail(Stop::Corrupt("an error outcome read as a value".into()))),
            Err(e) => Ok(Err(e)),
        },
    }
}

impl Host for StepState {
    fn start(
        &mut self,
        join_set: String,
        spec: ChildSpec,
    ) -> wasmtime::Result<Result<String, CallError>> {
        let outcome = start(self, &join_set, &spec).map_err(trap)?;
        guest(self, outcome, |v| {
            v.get("run_id")
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| Stop::Corrupt(format!("a recorded start has no run id: {v}")))
        })
    }

    fn join_next(&mut self, join_set: String) -> wasmtime::Result<Result<ChildEnd, CallError>> {
        let outcome = join(self, &join_set, true).map_err(trap)?;
        guest(self, outcome, child_end)
    }

    fn join_try_next(&mut self, join_set: String) -> wasmtime::Result<Result<TryNext, CallError>> {
        let outcome = join(self, &join_set, false).map_err(trap)?;
        guest(self, outcome, |v| match v.as_str() {
            Some("pending") => Ok(TryNext::Pending),
            Some("empty") => Ok(TryNext::Empty),
            _ => child_end(v).map(TryNext::Found),
        })
    }

    fn cancel(&mut self, run_id: String) -> wasmtime::Result<Result<(), CallError>> {
        let outcome = cancel(self, &run_id).map_err(trap)?;
        guest(self, outcome, |_| Ok(()))
    }

    fn call(&mut self, spec: ChildSpec) -> wasmtime::Result<Result<ChildEnd, CallError>> {
        let join_set = format!("call#{}", lock(&self.journal).calls_made() + 1);
        let outcome = start(self, &join_set, &spec).map_err(trap)?;
        if let Outcome::Err(_) = outcome {
            return guest(self, outcome, child_end);
        }
        self.join_next(join_set)
    }
}
