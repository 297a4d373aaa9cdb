//! The invariants checked after every seed, from the ledger (`runs`,
//! `show`, `verify`, `replay` of the real binary) and the receivers' own
//! records. Each returns what it found broken, in words that name the run,
//! the call and the operation.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use model_server::ModelServer;
use serde_json::Value;
use supplier_receiver::Receiver;

use super::plan::{Plan, Work};
use crate::Sandbox;

/// A write call as the ledger records it.
struct Write {
    run_id: String,
    seq: u64,
    /// The receiver it was sent to ([`Receivers::name_of`]).
    receiver: Option<&'static str>,
    state: String,
}

/// The other side of the network: the receivers, the effects each plays,
/// and the model.
pub struct Receivers<'a> {
    /// `supplier.order`: deduplicates by `Idempotency-Key`, looked up.
    pub deduplicating: &'a Receiver,
    /// `orders` and `payments.refund`: does not deduplicate; the host must
    /// never resend to it.
    pub plain: &'a Receiver,
    pub model: &'a ModelServer,
    /// The wall clock (ms) just before the model server started: its
    /// requests' arrival times count from a moment at or after it.
    pub model_started_ms: i64,
    /// The MCP supplier server's orders (a JSON line each), when the plan
    /// has `supplier.order` there.
    pub mcp: Option<PathBuf>,
}

/// An order the MCP supplier server placed (its file's line).
struct McpOrder {
    line: Value,
}

impl Receivers<'_> {
    fn all(&self) -> [(&'static str, &Receiver); 2] {
        [("deduplicating", self.deduplicating), ("plain", self.plain)]
    }

    fn mcp_orders(&self) -> Vec<McpOrder> {
        let Some(path) = &self.mcp else {
            return Vec::new();
        };
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .map(|line| McpOrder { line })
            .collect()
    }

    /// Which receiver the write `call` (as `show --json` has it) went to:
    /// by its effect, or for a guest's own HTTP request by its URL; none
    /// for a write the host keeps (a child's start, a promise).
    pub fn name_of(&self, call: &Value) -> Option<&'static str> {
        match call["function"].as_str().unwrap_or_default() {
            "supplier.order" if self.mcp.is_some() => Some("mcp"),
            "supplier.order" => Some("deduplicating"),
            "orders" | "payments.refund" => Some("plain"),
            "handle" => {
                let request = call["request"].as_str().unwrap_or_default();
                match request.contains(&self.deduplicating.url()) {
                    true => Some("deduplicating"),
                    false => Some("plain"),
                }
            }
            _ => None,
        }
    }

    /// The receipt the receiver of `call` holds for operation `op`, if it
    /// holds one.
    pub fn receipt(&self, call: &Value, op: &str) -> Option<Value> {
        match self.name_of(call)? {
            "mcp" => self
                .mcp_orders()
                .into_iter()
                .find(|o| o.line["operation_id"] == op)
                .map(|o| o.line),
            "deduplicating" => self.deduplicating.order(op).map(|o| o.receipt()),
            _ => self.plain.order(op).map(|o| o.receipt()),
        }
    }

    /// Each receiver's business effects: how many for each operation id.
    fn effects(&self) -> Vec<(&'static str, BTreeMap<String, usize>)> {
        let mut all: Vec<_> = self
            .all()
            .into_iter()
            .map(|(name, receiver)| {
                let mut effects: BTreeMap<String, usize> = BTreeMap::new();
                for order in receiver.orders() {
                    *effects.entry(order.operation_id.clone()).or_default() += 1;
                }
                (name, effects)
            })
            .collect();
        if self.mcp.is_some() {
            let mut effects: BTreeMap<String, usize> = BTreeMap::new();
            for order in self.mcp_orders() {
                let op = order.line["operation_id"].as_str().unwrap_or("(none)");
                *effects.entry(op.to_string()).or_default() += 1;
            }
            all.push(("mcp", effects));
        }
        all
    }

    fn requests(&self) -> usize {
        self.deduplicating.requests().len()
            + self.plain.requests().len()
            + self.model.report()["requests_total"].as_u64().unwrap_or(0) as usize
            + self.mcp_orders().len()
    }
}

/// Every invariant; an empty list when all hold.
/// `breaks`: the rules the host was told to break, which its replays break
/// too.
pub fn all(
    sb: &Sandbox,
    plan: &Plan,
    receivers: &Receivers<'_>,
    breaks: Option<&str>,
) -> Vec<String> {
    let mut broken = Vec::new();
    let runs = list(sb);
    ended_with_a_reason(plan, &runs, &mut broken);
    let shows: BTreeMap<String, Value> = runs
        .iter()
        .map(|r| {
            let id = r["run_id"].as_str().unwrap_or_default().to_string();
            let show = sb.stephost(&["show", &id, "--json"]).json();
            (id, show)
        })
        .collect();
    let writes = writes(&shows, receivers, &mut broken);
    effects_match_the_ledger(&writes, receivers, &mut broken);
    writes_carry_their_fence(receivers, &mut broken);
    children_started_once(plan, &runs, &mut broken);
    cancelled_trees_begin_nothing(&runs, &shows, &mut broken);
    no_answered_turn_asked_again(plan, &shows, receivers, &mut broken);
    budgets_hold(plan, &shows, &mut broken);
    verified_and_replayed(sb, &runs, receivers, breaks, &mut broken);
    broken
}

pub fn list(sb: &Sandbox) -> Vec<Value> {
    let ran = sb.stephost(&["runs", "--json"]);
    match ran.code {
        Some(0) => ran.json().as_array().cloned().unwrap_or_default(),
        _ => Vec::new(),
    }
}

/// Every run ends completed, failed (with its reason) or cancelled: none
/// is left running, waiting, pending, parked or diverged once the faults
/// have stopped and every wait has ended.
fn ended_with_a_reason(plan: &Plan, runs: &[Value], broken: &mut Vec<String>) {
    for submit in &plan.submits {
        if !runs.iter().any(|r| r["run_id"] == submit.run_id.as_str()) {
            broken.push(format!(
                "run {} was submitted and is not in the ledger",
                submit.run_id
            ));
        }
    }
    for run in runs {
        let id = &run["run_id"];
        match run["status"].as_str() {
            Some("completed") | Some("cancelled") => {}
            Some("failed") if run["error"].as_str().is_some_and(|e| !e.is_empty()) => {}
            other => broken.push(format!(
                "run {id} ended {}: {}",
                other.unwrap_or("with no status"),
                run["error"]
            )),
        }
    }
}

/// The write calls of every run, by operation id; an operation id
/// recorded by two calls is broken.
fn writes(
    shows: &BTreeMap<String, Value>,
    receivers: &Receivers<'_>,
    broken: &mut Vec<String>,
) -> HashMap<String, Write> {
    let mut writes: HashMap<String, Write> = HashMap::new();
    for (run_id, show) in shows {
        for call in show["calls"].as_array().into_iter().flatten() {
            if call["class"] != "write" {
                continue;
            }
            let op = call["operation_id"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let write = Write {
                run_id: run_id.clone(),
                seq: call["seq"].as_u64().unwrap_or(0),
                receiver: receivers.name_of(call),
                state: state_of(call),
            };
            if let Some(first) = writes.get(&op) {
                broken.push(format!(
                    "operation {op} is recorded by {} #{} and {} #{}",
                    first.run_id, first.seq, write.run_id, write.seq
                ));
            }
            writes.insert(op, write);
        }
    }
    writes
}

/// The state of a write, as the receiver's side should see it: a guest's
/// own HTTP request that the receiver answered with an error is recorded
/// succeeded (the exchange happened; the step reads the status) and took
/// no effect. (A write settled by a lookup records the receipt.)
fn state_of(call: &Value) -> String {
    let state = call["state"].as_str().unwrap_or_default();
    if call["function"] == "handle" && state == "succeeded" {
        let outcome: Value =
            serde_json::from_str(call["outcome"].as_str().unwrap_or("null")).unwrap_or_default();
        let exchange: Value =
            serde_json::from_str(outcome["ok"].as_str().unwrap_or("null")).unwrap_or_default();
        // A receipt found by a lookup has no status.
        if let Some(status) = exchange["status"].as_u64()
            && !(200..300).contains(&status)
        {
            return format!("answered {status}");
        }
    }
    state.to_string()
}

/// At each receiver: no operation has two business effects; every effect
/// is a write the ledger recorded (durably `started` before it left) and
/// does not call failed; every write the ledger calls succeeded is there.
fn effects_match_the_ledger(
    writes: &HashMap<String, Write>,
    receivers: &Receivers<'_>,
    broken: &mut Vec<String>,
) {
    for (name, effects) in receivers.effects() {
        for (op, count) in &effects {
            let Some(write) = writes.get(op) else {
                broken.push(format!(
                    "the {name} receiver holds {count} order(s) for operation {op}, which no \
                     call in the ledger records"
                ));
                continue;
            };
            if *count > 1 {
                broken.push(format!(
                    "operation {op} ({} #{}) has {count} business effects at the {name} receiver",
                    write.run_id, write.seq
                ));
            }
            if write.state != "succeeded" {
                broken.push(format!(
                    "the {name} receiver holds operation {op} while the ledger records {} #{} as \
                     {}: doubt was not kept as doubt",
                    write.run_id, write.seq, write.state
                ));
            }
        }
        for (op, write) in writes {
            if write.receiver == Some(name)
                && write.state == "succeeded"
                && !effects.contains_key(op)
            {
                broken.push(format!(
                    "{} #{} is recorded succeeded, and the {name} receiver holds no order for \
                     operation {op}",
                    write.run_id, write.seq
                ));
            }
        }
    }
}

/// Every write request carries its run's fence, and no order was made
/// with a fence lower than one an earlier order of its run carried: a
/// paused zombie cannot act.
fn writes_carry_their_fence(receivers: &Receivers<'_>, broken: &mut Vec<String>) {
    let unfenced = receivers
        .mcp_orders()
        .iter()
        .filter(|o| o.line["fence"].is_null())
        .count();
    if unfenced > 0 {
        broken.push(format!(
            "{unfenced} order(s) reached the MCP supplier server without a fence in their _meta"
        ));
    }
    for (name, receiver) in receivers.all() {
        let unfenced = receiver
            .requests()
            .iter()
            .filter(|r| r.method == "POST" && r.path == "/orders")
            .filter(|r| r.header("stephost-fence").is_none())
            .count();
        if unfenced > 0 {
            broken.push(format!(
                "{unfenced} write request(s) reached the {name} receiver without a \
                 Stephost-Fence: a zombie's write could not be refused"
            ));
        }
        let mut highest: HashMap<String, u64> = HashMap::new();
        for order in receiver.orders() {
            let (Some(run), Some(fence)) = (order.run_id.clone(), order.fence) else {
                continue;
            };
            let seen = highest.entry(run.clone()).or_insert(fence);
            if fence < *seen {
                broken.push(format!(
                    "the {name} receiver took order {} of run {run} with fence {fence} after one \
                     with fence {seen}",
                    order.order_id
                ));
            }
            *seen = (*seen).max(fence);
        }
    }
}

/// No child is started twice, and a fan-out that completed joined as many
/// children as it started.
fn children_started_once(plan: &Plan, runs: &[Value], broken: &mut Vec<String>) {
    let mut by_start: BTreeMap<(String, u64), Vec<String>> = BTreeMap::new();
    for run in runs {
        if let Some(parent) = run["parent"]["run_id"].as_str() {
            let seq = run["parent"]["seq"].as_u64().unwrap_or(0);
            by_start
                .entry((parent.to_string(), seq))
                .or_default()
                .push(run["run_id"].as_str().unwrap_or_default().to_string());
        }
    }
    for ((parent, seq), children) in &by_start {
        if children.len() > 1 {
            broken.push(format!(
                "{parent} #{seq} started {} children: {children:?}",
                children.len()
            ));
        }
    }
    for submit in &plan.submits {
        let Work::Fanout { n, .. } = submit.work else {
            continue;
        };
        let Some(run) = runs.iter().find(|r| r["run_id"] == submit.run_id.as_str()) else {
            continue;
        };
        if run["status"] != "completed" {
            continue;
        }
        let output: Value =
            serde_json::from_str(run["output"].as_str().unwrap_or("null")).unwrap_or_default();
        let joined = output["joined"].as_array().map_or(0, Vec::len) as u64;
        let started = by_start.keys().filter(|(p, _)| *p == submit.run_id).count() as u64;
        // `n` started and joined, and one more called.
        if joined != n || started != n + 1 {
            broken.push(format!(
                "fan-out {} of {n} completed having started {started} and joined {joined}",
                submit.run_id
            ));
        }
    }
}

/// A run marked cancelled at T began nothing after T (no write, wait or
/// child start stamped later), and no run below it was created after T.
fn cancelled_trees_begin_nothing(
    runs: &[Value],
    shows: &BTreeMap<String, Value>,
    broken: &mut Vec<String>,
) {
    let parent_of: HashMap<&str, &str> = runs
        .iter()
        .filter_map(|r| Some((r["run_id"].as_str()?, r["parent"]["run_id"].as_str()?)))
        .collect();
    for run in runs {
        let (Some(id), Some(at)) = (run["run_id"].as_str(), run["cancel"]["at_ms"].as_i64()) else {
            continue;
        };
        let calls = shows.get(id).and_then(|s| s["calls"].as_array());
        for call in calls.into_iter().flatten() {
            let begins = call["class"] == "write" || call["class"] == "suspend";
            if begins && call["started_at_ms"].as_i64().is_some_and(|t| t > at) {
                broken.push(format!(
                    "run {id} was cancelled at {at} and began call #{} ({}) at {}",
                    call["seq"], call["function"], call["started_at_ms"]
                ));
            }
        }
        for below in runs {
            let Some(child) = below["run_id"].as_str() else {
                continue;
            };
            let mut up = parent_of.get(child).copied();
            while let Some(parent) = up {
                if parent == id {
                    if below["created_at_ms"].as_i64().is_some_and(|t| t > at) {
                        broken.push(format!(
                            "run {child} was started at {} below run {id}, cancelled at {at}",
                            below["created_at_ms"]
                        ));
                    }
                    break;
                }
                up = parent_of.get(parent).copied();
            }
        }
    }
}

/// No model turn is asked again once its answer is recorded: for each
/// agent run, no request for its k-th turn reached the model after the
/// ledger's k-th model call finished. (A worker killed between an answer's
/// arrival and its commit asks again, and records the later answer.)
fn no_answered_turn_asked_again(
    plan: &Plan,
    shows: &BTreeMap<String, Value>,
    receivers: &Receivers<'_>,
    broken: &mut Vec<String>,
) {
    let report = receivers.model.report();
    let requests = report["requests"].as_array().cloned().unwrap_or_default();
    for submit in &plan.submits {
        let Work::Agent { order } = &submit.work else {
            continue;
        };
        let Some(show) = shows.get(&submit.run_id) else {
            continue;
        };
        let answered: Vec<i64> = show["calls"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| {
                c["interface"]
                    .as_str()
                    .is_some_and(|i| i.contains("models"))
            })
            .filter(|c| c["state"] == "succeeded")
            .filter_map(|c| c["finished_at_ms"].as_i64())
            .collect();
        let mine = requests
            .iter()
            .filter(|r| r["body"].to_string().contains(&format!("order {order},")));
        for request in mine {
            let (Some(turn), Some(arrived)) =
                (request["turn"].as_u64(), request["arrived_ms"].as_i64())
            else {
                continue;
            };
            let Some(finished) = answered.get(turn as usize - 1) else {
                continue;
            };
            // The arrival, on the wall clock, is no earlier than this.
            let at_least = receivers.model_started_ms + arrived;
            if at_least > *finished {
                broken.push(format!(
                    "run {}'s model turn {turn} was asked again at {at_least}, after its answer \
                     was recorded at {finished}",
                    submit.run_id
                ));
            }
        }
    }
}

/// No run spent more model tokens than its budget: a call that would pass
/// it is refused before it is sent.
fn budgets_hold(plan: &Plan, shows: &BTreeMap<String, Value>, broken: &mut Vec<String>) {
    let Some(max) = plan.model_tokens_max else {
        return;
    };
    for (run_id, show) in shows {
        let spent = show["tokens_total"].as_u64().unwrap_or(0);
        if spent > max {
            broken.push(format!(
                "run {run_id} spent {spent} model tokens, past model_tokens_max = {max}"
            ));
        }
    }
}

/// Every run's chain and seal verify; every completed run replays with no
/// divergence and no request to any receiver.
fn verified_and_replayed(
    sb: &Sandbox,
    runs: &[Value],
    receivers: &Receivers<'_>,
    breaks: Option<&str>,
    broken: &mut Vec<String>,
) {
    let before = receivers.requests();
    for run in runs {
        let id = run["run_id"].as_str().unwrap_or_default();
        let verified = sb.stephost(&["verify", id]);
        if verified.code != Some(0) {
            broken.push(format!(
                "verify {id} exited {:?}: {}{}",
                verified.code, verified.stdout, verified.stderr
            ));
        }
        if run["status"] == "completed" {
            let replayed = match breaks {
                Some(breaks) => sb.stephost_with_env("STEPHOST_BREAK", breaks, &["replay", id]),
                None => sb.stephost(&["replay", id]),
            };
            if replayed.code != Some(0) || !replayed.stdout.contains("no divergence") {
                broken.push(format!(
                    "replay {id} exited {:?}: {}{}",
                    replayed.code, replayed.stdout, replayed.stderr
                ));
            }
        }
    }
    let after = receivers.requests();
    if after != before {
        broken.push(format!(
            "replays made {} request(s) to the receivers",
            after - before
        ));
    }
}
