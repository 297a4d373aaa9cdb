//! What people ask of a ledger, computed once for the command line and the
//! server alike: a run with its timeline, the approvals inbox, the calls
//! whose outcome is unknown, decisions, chain checks and upgrades. Each view
//! is one serde type: the CLI's `--json` output and the API's bodies.

use serde::Serialize;
use stephost_core::approvals::{self, Decision};
use stephost_core::chain::Signer;
use stephost_core::settle::{self, Resolution};
use stephost_core::store::RunQuery;
use stephost_core::{
    AttemptRecord, CallRecord, CallState, LogRecord, RunRecord, RunStatus, Store, Views,
};

use crate::error::HostError;
use crate::instance::check_json;
use crate::runner::{Host, UpgradeOutcome};

/// A run with everything recorded of it (`stephost show`).
#[derive(Debug, Clone, Serialize)]
pub struct RunDetail {
    pub run: RunRecord,
    /// Model tokens its recorded completions and chats spent.
    pub tokens_total: u64,
    /// What its model chats cost, in micro-USD (by each model's prices).
    #[serde(skip_serializing_if = "is_zero")]
    pub cost_micro_usd_total: u64,
    pub calls: Vec<CallRecord>,
    pub attempts: Vec<AttemptRecord>,
    pub logs: Vec<LogRecord>,
    /// The runs forked from it (the run itself names its source).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub forks: Vec<ForkView>,
}

/// A run forked from another, as its source lists it.
#[derive(Debug, Clone, Serialize)]
pub struct ForkView {
    pub run_id: String,
    /// The first call it made live.
    pub at: u64,
    pub status: RunStatus,
    pub module_digest: String,
}

/// The runs forked from run `run_id`, oldest first.
pub fn forks(store: &dyn Views, run_id: &str) -> Result<Vec<ForkView>, HostError> {
    Ok(store
        .forks(run_id)?
        .into_iter()
        .map(|f| ForkView {
            at: f.fork.as_ref().map_or(0, |r| r.seq),
            run_id: f.run_id,
            status: f.status,
            module_digest: f.module_digest,
        })
        .collect())
}

pub fn run_detail(store: &dyn Views, run_id: &str) -> Result<RunDetail, HostError> {
    let run = store.run(run_id)?;
    let calls = store.calls(run_id, 1, usize::MAX)?;
    let attempts = store.attempts(run_id, None)?;
    let logs = store.logs(run_id)?;
    Ok(RunDetail {
        run,
        tokens_total: tokens_total(&calls),
        cost_micro_usd_total: cost_total(&calls),
        calls,
        attempts,
        logs,
        forks: forks(store, run_id)?,
    })
}

/// A run and the runs it started, down its tree (`stephost tree`).
#[derive(Debug, Clone, Serialize)]
pub struct TreeNode {
    pub run_id: String,
    pub status: RunStatus,
    /// The step's declared `name@version`, when its module declares one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    /// The parent's join set it was started in (none for the root).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub join_set: Option<String>,
    /// For a child that ended: its place in its parent's inbox (1, 2, 3 …
    /// in the order the children's ends committed; joins follow it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arrival: Option<u64>,
    /// What an unfinished run waits for: its last call left open (a child
    /// to join, an approval, a timer, an unknown outcome).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waits_for: Option<String>,
    /// For a failed, parked or diverged run: what happened.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What waits for a person in this run or any run below it (an approval
    /// to decide, an unknown outcome to resolve), so that the root shows
    /// it: `RUN_ID #SEQ what`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub needs_a_person: Vec<String>,
    /// Model tokens and cost its own recorded calls spent.
    pub tokens_total: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub cost_micro_usd_total: u64,
    pub children: Vec<TreeNode>,
}

/// How many runs a tree shows at most.
pub const TREE_RUNS_MAX: usize = 10_000;

/// Run `run_id` and its descendants, each with its status, what it waits
/// for and what it spent (at most [`TREE_RUNS_MAX`] runs).
pub fn tree(store: &dyn Views, run_id: &str) -> Result<TreeNode, HostError> {
    let mut shown = 0;
    tree_of(store, store.run(run_id)?, None, &mut shown)
}

fn tree_of(
    store: &dyn Views,
    run: RunRecord,
    arrival: Option<u64>,
    shown: &mut usize,
) -> Result<TreeNode, HostError> {
    *shown += 1;
    let calls = store.calls(&run.run_id, 1, usize::MAX)?;
    let waits_for = (!run.status.is_finished())
        .then(|| calls.last())
        .flatten()
        .filter(|c| matches!(c.state, CallState::Started | CallState::Unknown))
        .map(|c| {
            let what = match c.state {
                CallState::Unknown => "unknown outcome of",
                _ => "",
            };
            format!("{what} #{} {} {}", c.seq, call_name(c), c.request)
                .trim()
                .to_string()
        });
    let mut needs_a_person: Vec<String> = (!run.status.is_finished())
        .then(|| calls.last())
        .flatten()
        .filter(|c| {
            c.state == CallState::Unknown
                || (c.state == CallState::Started && c.interface == approvals::INTERFACE)
        })
        .map(|c| {
            let what = match c.state {
                CallState::Unknown => "an unknown outcome to resolve",
                _ => "an approval to decide",
            };
            format!("{} #{} {what}", run.run_id, c.seq)
        })
        .into_iter()
        .collect();
    let mut children = Vec::new();
    let found = store.children(&run.run_id)?;
    let inbox = if found.is_empty() {
        Vec::new()
    } else {
        store.inbox(&run.run_id)?
    };
    for child in found {
        if *shown >= TREE_RUNS_MAX {
            break;
        }
        let arrival = inbox
            .iter()
            .find(|e| e.child_run_id == child.run_id)
            .map(|e| e.arrival);
        let node = tree_of(store, child, arrival, shown)?;
        needs_a_person.extend(node.needs_a_person.iter().cloned());
        children.push(node);
    }
    Ok(TreeNode {
        tokens_total: tokens_total(&calls),
        cost_micro_usd_total: cost_total(&calls),
        join_set: run.parent.as_ref().map(|p| p.join_set.clone()),
        arrival,
        run_id: run.run_id,
        status: run.status,
        step: run.step,
        waits_for,
        error: run.error,
        needs_a_person,
        children,
    })
}

/// One call as a timeline shows it: its record (bodies cut at a size),
/// name, duration and attempts.
#[derive(Debug, Clone, Serialize)]
pub struct CallView {
    #[serde(flatten)]
    pub call: CallRecord,
    pub name: String,
    pub duration_ms: Option<i64>,
    pub attempts: Vec<AttemptRecord>,
    /// The request's and outcome's full sizes, and whether either was cut.
    pub request_bytes: usize,
    pub outcome_bytes: usize,
    pub truncated: bool,
    /// A model call's tokens and cost, from its recorded answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_micro_usd: Option<u64>,
}

/// A page of a run's timeline.
#[derive(Debug, Clone, Serialize)]
pub struct CallsPage {
    pub run_id: String,
    pub calls: Vec<CallView>,
    /// The `from_seq` of the next page, if there are more calls.
    pub next_seq: Option<u64>,
}

/// Calls `from_seq` on of a run, at most `limit`, their request and
/// outcome cut to `body_bytes_max` bytes each (at a character boundary).
pub fn calls_page(
    store: &dyn Views,
    run_id: &str,
    from_seq: u64,
    limit: usize,
    body_bytes_max: usize,
) -> Result<CallsPage, HostError> {
    if from_seq > i64::MAX as u64 {
        return Err(HostError::BadInput(format!(
            "from_seq {from_seq} is past any call; calls are numbered from 1"
        )));
    }
    store.run(run_id)?;
    let limit = limit.max(1);
    let mut calls = store.calls(run_id, from_seq.max(1), limit.saturating_add(1))?;
    let next_seq = match calls.len() > limit {
        true => calls
            .pop()
            .map(|_| calls.last().map_or(from_seq, |c| c.seq) + 1),
        false => None,
    };
    let calls = calls
        .into_iter()
        .map(|mut call| {
            let attempts = match [
                crate::imports::effects::INTERFACE,
                crate::imports::models::INTERFACE,
                crate::imports::llm::INTERFACE,
            ]
            .contains(&call.interface.as_str())
            {
                true => store.attempts(run_id, Some(call.seq))?,
                false => Vec::new(),
            };
            let one = std::slice::from_ref(&call);
            let (tokens, cost) = (tokens_total(one), cost_total(one));
            let model_call = call.interface == crate::imports::models::INTERFACE
                || call.interface == crate::imports::llm::INTERFACE;
            let request_bytes = call.request.len();
            let outcome_bytes = call.outcome.as_ref().map_or(0, String::len);
            let mut truncated = cut(&mut call.request, body_bytes_max);
            if let Some(outcome) = call.outcome.as_mut() {
                truncated |= cut(outcome, body_bytes_max);
            }
            Ok(CallView {
                name: call_name(&call),
                duration_ms: call.finished_at_ms.map(|f| f - call.started_at_ms),
                attempts,
                request_bytes,
                outcome_bytes,
                truncated,
                tokens: (model_call && tokens > 0).then_some(tokens),
                cost_micro_usd: (model_call && cost > 0).then_some(cost),
                call,
            })
        })
        .collect::<Result<_, HostError>>()?;
    Ok(CallsPage {
        run_id: run_id.to_string(),
        calls,
        next_seq,
    })
}

/// Cuts `text` to at most `max` bytes at a character boundary; whether it
/// was cut.
fn cut(text: &mut String, max: usize) -> bool {
    if text.len() <= max {
        return false;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    true
}

/// How many runs are in each status, and how long the oldest runnable and
/// the longest-waiting have waited.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub counts: std::collections::BTreeMap<String, u64>,
    pub oldest_runnable_age_ms: i64,
    pub oldest_waiting_age_ms: i64,
    pub approvals_waiting: usize,
    pub unknown_calls: usize,
}

pub fn summary(store: &dyn Views) -> Result<Summary, HostError> {
    let mut counts: std::collections::BTreeMap<String, u64> = RunStatus::ALL
        .iter()
        .map(|s| (s.as_str().to_string(), 0))
        .collect();
    for (status, n) in store.status_counts()? {
        counts.insert(status.as_str().to_string(), n);
    }
    let ages = crate::metrics::ages(store, stephost_core::clock::now_ms())?;
    Ok(Summary {
        counts,
        oldest_runnable_age_ms: ages.oldest_runnable_ms,
        oldest_waiting_age_ms: ages.oldest_waiting_ms,
        approvals_waiting: store
            .open_calls(CallState::Started, Some(approvals::INTERFACE))?
            .len(),
        unknown_calls: store.open_calls(CallState::Unknown, None)?.len(),
    })
}

/// Runs by their filters, newest first (`stephost runs`).
pub fn runs(store: &dyn Views, query: &RunQuery) -> Result<Vec<RunRecord>, HostError> {
    Ok(store.runs(query)?)
}

/// An approval waiting for a decision, as a person sees it.
#[derive(Debug, Clone, Serialize)]
pub struct ApprovalView {
    pub run_id: String,
    pub seq: u64,
    pub subject: serde_json::Value,
    pub details: serde_json::Value,
    /// The sha256 of the details the guest asked about.
    pub details_sha256: serde_json::Value,
    pub module_digest: String,
    pub asked_at_ms: i64,
    pub expires_at_ms: i64,
}

/// The approvals inbox, oldest first (`stephost approvals`).
pub fn approvals(store: &dyn Views) -> Result<Vec<ApprovalView>, HostError> {
    let open = store.open_calls(CallState::Started, Some(approvals::INTERFACE))?;
    Ok(open
        .into_iter()
        .map(|o| {
            let request: serde_json::Value =
                serde_json::from_str(&o.call.request).unwrap_or_default();
            ApprovalView {
                run_id: o.run.run_id.clone(),
                seq: o.call.seq,
                subject: request["subject"].clone(),
                details: request["details"].clone(),
                details_sha256: request["details_sha256"].clone(),
                module_digest: o.run.module_digest.clone(),
                asked_at_ms: o.call.started_at_ms,
                expires_at_ms: approvals::expires_at_ms(&o.call),
            }
        })
        .collect())
}

/// A run waiting for a promise, as a person sees it (never its token).
#[derive(Debug, Clone, Serialize)]
pub struct PromiseView {
    pub run_id: String,
    /// The wait's call.
    pub seq: u64,
    /// The promise's id in the run (its `create` call) and name.
    pub promise: u64,
    pub name: String,
    pub waiting_since_ms: i64,
    /// None if its `create` call cannot be read.
    pub expires_at_ms: Option<i64>,
}

/// Runs waiting for a promise, oldest first.
pub fn promises(store: &dyn Views) -> Result<Vec<PromiseView>, HostError> {
    let open = store.open_calls(CallState::Started, Some(stephost_core::promises::INTERFACE))?;
    let mut views = Vec::with_capacity(open.len());
    for o in open {
        let request: serde_json::Value = serde_json::from_str(&o.call.request).unwrap_or_default();
        let promise = request["id"].as_u64().unwrap_or(0);
        let made = stephost_core::promises::made(store, &o.run.run_id, promise)?;
        views.push(PromiseView {
            run_id: o.run.run_id.clone(),
            seq: o.call.seq,
            promise,
            name: made.as_ref().map(|m| m.name.clone()).unwrap_or_default(),
            waiting_since_ms: o.call.started_at_ms,
            expires_at_ms: made.map(|m| m.expires_at_ms),
        });
    }
    Ok(views)
}

/// A call whose outcome is unknown, with what its receiver was sent.
#[derive(Debug, Clone, Serialize)]
pub struct UnknownCallView {
    pub run_id: String,
    pub seq: u64,
    pub name: String,
    pub operation_id: String,
    pub request: String,
    pub started_at_ms: i64,
    pub attempts: Vec<AttemptRecord>,
}

/// Calls parked as unknown, oldest first.
pub fn unknown_calls(store: &dyn Views) -> Result<Vec<UnknownCallView>, HostError> {
    store
        .open_calls(CallState::Unknown, None)?
        .into_iter()
        .map(|o| {
            Ok(UnknownCallView {
                attempts: store.attempts(&o.run.run_id, Some(o.call.seq))?,
                name: call_name(&o.call),
                run_id: o.run.run_id,
                seq: o.call.seq,
                operation_id: o.call.operation_id,
                request: o.call.request,
                started_at_ms: o.call.started_at_ms,
            })
        })
        .collect()
}

/// Records a person's decision on an approval call.
pub fn decide(
    store: &dyn Store,
    signer: &Signer,
    run_id: &str,
    seq: u64,
    decision: &Decision<'_>,
) -> Result<(), HostError> {
    if decision.by.trim().is_empty() {
        return Err(HostError::BadInput("--by must name who decided".into()));
    }
    settle::decide_approval(
        store,
        signer,
        run_id,
        seq,
        decision,
        stephost_core::clock::now_ms(),
    )?;
    Ok(())
}

/// Records a person's decision on a call parked as unknown; the run can then
/// be resumed and the guest sees the decided outcome.
pub fn resolve(
    store: &dyn Store,
    signer: &Signer,
    limits: &stephost_core::Limits,
    run_id: &str,
    seq: u64,
    resolution: &Resolution,
    by: &str,
) -> Result<(), HostError> {
    if by.trim().is_empty() {
        return Err(HostError::BadInput("--by must name who decided".into()));
    }
    if let Resolution::Succeeded(response) = resolution {
        check_json(response, "the resolved response", limits)?;
    }
    settle::resolve(
        store,
        signer,
        run_id,
        seq,
        resolution,
        by,
        stephost_core::clock::now_ms(),
    )?;
    Ok(())
}

/// What checking a run's record found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Verification {
    /// The row matches its seal and every call its link.
    Intact {
        calls: usize,
        links: usize,
        /// Every link and the seal are HMACs under the configured key.
        signed: bool,
    },
    Broken {
        /// The call where the chain breaks; none when the run's row does
        /// not match its seal.
        seq: Option<u64>,
        reason: String,
    },
    /// The record is signed and no chain key was given to check it with.
    NeedsKey { reason: String },
}

/// Run `run_id` of the ledger checked ([`verify`]), and, for a child run,
/// its link to its parent: the parent's call that the child's row names
/// started it (a `runs.start` whose recorded outcome is the child's id,
/// which is derived from that call's operation id).
pub fn verify_in(
    store: &dyn Views,
    signer: &Signer,
    run_id: &str,
) -> Result<Verification, HostError> {
    let run = store.run(run_id)?;
    let calls = store.calls(run_id, 1, usize::MAX)?;
    let verified = verify(signer, &calls, &run);
    if !matches!(verified, Verification::Intact { .. }) {
        return Ok(verified);
    }
    if let Some(fork) = &run.fork
        && let Some(reason) = fork_differs(store, signer, fork, &calls)?
    {
        return Ok(Verification::Broken { seq: None, reason });
    }
    let Some(parent) = &run.parent else {
        return Ok(verified);
    };
    let start = store.calls(&parent.run_id, parent.seq, 1)?.pop();
    let parent_operations = store
        .run(&parent.run_id)
        .ok()
        .map(|p| p.operations().to_string());
    let started = start.as_ref().and_then(|call| {
        let outcome: serde_json::Value = serde_json::from_str(call.outcome.as_deref()?).ok()?;
        let named = outcome["ok"]["run_id"].as_str()? == run.run_id;
        let derived = stephost_core::ids::child_run_id_in(
            &parent.run_id,
            parent_operations.as_deref().unwrap_or(&parent.run_id),
            &call.operation_id,
        ) == run.run_id;
        (call.interface == crate::imports::runs::INTERFACE
            && call.function == "start"
            && named
            && derived)
            .then_some(())
    });
    Ok(match started {
        Some(()) => verified,
        None => Verification::Broken {
            seq: None,
            reason: format!(
                "its row names call #{} of run {} as the start of this child, and that call \
                 did not start it",
                parent.seq, parent.run_id
            ),
        },
    })
}

/// For a fork: why its kept calls are not its source's, if they are not.
/// The source's chain is checked up to the fork's call, and its link
/// there must be the one the fork's sealed row names; each kept call must
/// be the source's (links aside: each run links its own). A source no
/// longer in the ledger leaves the fork's own chain as the evidence.
fn fork_differs(
    store: &dyn Views,
    signer: &Signer,
    fork: &stephost_core::ForkRef,
    calls: &[CallRecord],
) -> Result<Option<String>, HostError> {
    let source = match store.calls(&fork.run_id, 1, (fork.seq - 1) as usize) {
        Ok(found) => found,
        Err(stephost_core::StoreError::UnknownRun(_)) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let kept = (fork.seq - 1) as usize;
    if source.len() != kept || calls.len() < kept {
        return Ok(Some(format!(
            "it is a fork of run {} at #{}, which now has {} call(s) before #{}",
            fork.run_id,
            fork.seq,
            source.len(),
            fork.seq
        )));
    }
    if let Err(broken) = signer.verify_chain(&fork.run_id, &source) {
        return Ok(Some(format!(
            "its source, run {}, does not verify before #{}: {broken}",
            fork.run_id, fork.seq
        )));
    }
    if source.last().and_then(|c| c.chain.as_deref()) != fork.link.as_deref() {
        return Ok(Some(format!(
            "run {}'s link of call #{} is not the one the fork was made from",
            fork.run_id,
            fork.seq - 1
        )));
    }
    Ok(calls
        .iter()
        .zip(&source)
        .find(|(mine, theirs)| !stephost_core::fork::same_call(mine, theirs))
        .map(|(mine, _)| {
            format!(
                "call #{} is not run {}'s call #{}, which the fork kept",
                mine.seq, fork.run_id, mine.seq
            )
        }))
}

/// Checks a run's row against its seal and its chain of calls.
/// Run `run_id` with every call it recorded, as `stephost export` writes it.
/// How often a caller of [`wait_for_end`] reads the run again, in ms.
pub const WAIT_RECHECK_MS: u64 = 10;

/// Run `run_id`'s row once it answers a wait
/// ([`RunStatus::answers_a_wait`]), or as it is after `bound`.
pub fn wait_for_end(
    store: &dyn Views,
    run_id: &str,
    bound: std::time::Duration,
) -> Result<RunRecord, HostError> {
    let until = std::time::Instant::now() + bound;
    loop {
        let run = store.run(run_id)?;
        let left = until.saturating_duration_since(std::time::Instant::now());
        if run.status.answers_a_wait() || left.is_zero() {
            return Ok(run);
        }
        std::thread::sleep(left.min(std::time::Duration::from_millis(WAIT_RECHECK_MS)));
    }
}

pub use crate::replay::export;

pub fn verify(signer: &Signer, calls: &[CallRecord], run: &RunRecord) -> Verification {
    match signer.verify(calls, run) {
        Ok(v) => Verification::Intact {
            calls: calls.len(),
            links: v.links,
            signed: v.signed,
        },
        Err(broken) if broken.needs_key => Verification::NeedsKey {
            reason: broken.reason,
        },
        Err(broken) => Verification::Broken {
            seq: broken.seq,
            reason: broken.reason,
        },
    }
}

/// Moves every unfinished run pinned to module `from` to `module`, where its
/// history replays without divergence.
pub fn upgrade_from(
    host: &mut Host,
    from: &str,
    module: &[u8],
    what: &str,
) -> Result<Vec<UpgradeOutcome>, HostError> {
    let pinned = host.store().runs(&RunQuery {
        module_digest: Some(from.to_string()),
        ..RunQuery::default()
    })?;
    pinned
        .iter()
        .filter(|r| !r.status.is_finished())
        .map(|r| host.upgrade(&r.run_id, module, what))
        .collect()
}

/// Model tokens spent by a run's recorded completions (0.1.0's `llm`) and
/// chats (0.2.0's `models`).
pub fn tokens_total(calls: &[CallRecord]) -> u64 {
    let completions: u64 = answers(calls, crate::imports::llm::INTERFACE)
        .filter_map(|text| stephost_effects::llm::total_tokens(&text))
        .sum();
    let chats: u64 = chats(calls).map(|r| r.usage.total()).sum();
    completions + chats
}

/// What a run's recorded model chats cost, in micro-USD.
pub fn cost_total(calls: &[CallRecord]) -> u64 {
    chats(calls)
        .filter_map(|r| r.cost.map(|c| c.micro_usd))
        .sum()
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The answers (the `ok` text) of a run's successful calls of `interface`.
fn answers<'a>(calls: &'a [CallRecord], interface: &'a str) -> impl Iterator<Item = String> + 'a {
    calls
        .iter()
        .filter(move |c| c.interface == interface)
        .filter_map(|c| c.outcome.as_deref())
        .filter_map(|o| serde_json::from_str::<serde_json::Value>(o).ok())
        .filter_map(|o| o.get("ok").and_then(|v| v.as_str()).map(str::to_string))
}

/// A run's recorded model chats' answers.
fn chats(calls: &[CallRecord]) -> impl Iterator<Item = stephost_models::ChatResponse> + '_ {
    answers(calls, crate::imports::models::INTERFACE)
        .filter_map(|text| serde_json::from_str(&text).ok())
}

/// A call's display name: the effect name, or `interface.function`.
pub fn call_name(call: &CallRecord) -> String {
    if call.interface == crate::imports::effects::INTERFACE {
        call.function.clone()
    } else {
        let short = call.interface.trim_start_matches("stephost:step/");
        format!("{short}.{}", call.function)
    }
}

/// Parses a status for a listing filter.
pub fn parse_status(s: &str) -> Result<RunStatus, HostError> {
    RunStatus::parse(s).ok_or_else(|| {
        let all: Vec<&str> = RunStatus::ALL.iter().map(|s| s.as_str()).collect();
        HostError::BadInput(format!(
            "unknown status {s:?}; use one of {}",
            all.join(", ")
        ))
    })
}
