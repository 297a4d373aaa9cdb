//! What a seed draws: the cluster, the workload and the schedule of
//! faults. Drawing touches nothing; the same seed gives the same plan.

use std::fmt;
use std::time::Duration;

use supplier_receiver::{Fault as Misbehaviour, LookupFault};

use super::rng::Rng;

/// The crash points a worker can be armed with (`STEPHOST_CRASH_AT`).
const POINTS: &[&str] = stephost_core::crash::POINTS;

/// One run of the workload, submitted at `at` into the plan.
#[derive(Debug, Clone)]
pub struct Submit {
    pub at: Duration,
    pub run_id: String,
    pub work: Work,
}

/// What a run does.
#[derive(Debug, Clone)]
pub enum Work {
    /// The supplier step: reads the stock, orders the shortage from the
    /// deduplicating receiver (looked up when in doubt).
    Supplier { quantity: u64 },
    /// `count` writes in a row to the receiver that does not deduplicate.
    Writes { count: u64 },
    /// A write, a durable sleep of `ms`, a write.
    Sleeper { ms: u64 },
    /// `n` child runs of the `square` step (each a durable sleep of
    /// `sleep_ms[i]`, then one write), joined.
    Fanout { n: u64, sleep_ms: Vec<u64> },
    /// A promise whose token the run hands to the receiver, completed by
    /// the harness `after` the token arrives; it expires after
    /// `ttl_seconds` (a short one may expire first).
    Promise { after: Duration, ttl_seconds: u64 },
    /// The refund agent (three model turns, a read, a refund written to
    /// the receiver that does not deduplicate) for order `order`.
    Agent { order: String },
    /// A person's approval, decided by the harness `after` it is asked
    /// (approved or rejected); it expires after `ttl_seconds` (a short one
    /// may expire first). Approved, the step reads the stock and writes
    /// an order to the receiver that does not deduplicate.
    Approval {
        after: Duration,
        approve: bool,
        ttl_seconds: u64,
    },
    /// The supplier step with the guest's own HTTP client (`wasi:http`):
    /// a read and an order, to the receiver that does not deduplicate when
    /// `plain`, else to the one that does (an idempotent origin).
    WasiHttp { plain: bool },
    /// The supplier step over MCP (a tool list, a read and an order from
    /// the MCP supplier server); only in plans with `mcp`.
    Mcp,
}

/// A fault the harness injects into worker `worker` at `at`.
#[derive(Debug, Clone)]
pub struct Inject {
    pub at: Duration,
    pub worker: usize,
    pub fault: Fault,
}

#[derive(Debug, Clone)]
pub enum Fault {
    /// `kill -9`.
    Kill,
    /// `kill -9`, then started again armed to abort at this crash point
    /// (`after-send@3`): it dies when some run's call passes it.
    Arm(String),
    /// SIGSTOP for `for` (past the lease, so a successor may act), then
    /// SIGCONT.
    Pause { r#for: Duration },
    /// SIGTERM: the worker drains and exits; it is started again.
    Drain,
    /// Every worker frozen for `for`: timers, promises and leases run out
    /// while nothing runs.
    Outage { r#for: Duration },
    /// `kill -9` of every MCP server the workers have started (idle or
    /// mid-call); a worker starts another when it next needs one.
    McpDeath,
}

/// Something done to the PostgreSQL server the ledger is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerEvent {
    /// `pg_ctl restart -m fast`: every session cut, the server back.
    Restart,
    /// Every client's backend terminated (`pg_terminate_backend`).
    DropConnections,
}

/// A seed's plan.
#[derive(Debug, Clone)]
pub struct Plan {
    pub seed: u64,
    pub workers: usize,
    /// Whether worker 0 is `stephost serve` (the API with its worker),
    /// under the same faults as the others.
    pub serve: bool,
    pub concurrency: u64,
    pub lease_ms: u64,
    /// Whether the receiver that does not deduplicate can be looked up.
    pub lookup_plain: bool,
    /// The API the model speaks (`[models.support] api`).
    pub model_api: &'static str,
    /// The faults each of the model's three turns serves first (to the
    /// first requests of any run that reach it), as the scripted model
    /// server reads them.
    pub model_faults: Vec<Vec<serde_json::Value>>,
    /// Each run's model token budget (`[limits] model_tokens_max`), when
    /// drawn: tight enough that an agent's later turns are refused.
    pub model_tokens_max: Option<u64>,
    /// What happens to the PostgreSQL server, when the ledger is one of
    /// the harness's own (on SQLite, nothing).
    pub postgres: Vec<(Duration, ServerEvent)>,
    /// In how many of 100 commits, compare-and-sets and reads of the
    /// workers' ledger a fault is injected (`STEPHOST_LEDGER_FAULTS`).
    pub ledger_faults_percent: u64,
    /// How long faults are injected and runs submitted.
    pub chaos: Duration,
    pub submits: Vec<Submit>,
    pub injects: Vec<Inject>,
    /// Runs a person cancels (with their trees), and when.
    pub cancels: Vec<(Duration, String)>,
    /// The misbehaviours queued at each receiver's `POST /orders`, in the
    /// order requests take them.
    pub deduplicating: Vec<Misbehaviour>,
    pub plain: Vec<Misbehaviour>,
    /// The misbehaviours queued at each receiver's lookups.
    pub deduplicating_lookups: Vec<LookupFault>,
    pub plain_lookups: Vec<LookupFault>,
    /// Whether `supplier.order` is a tool of the MCP supplier server (the
    /// supplier step's orders go there, and MCP runs are drawn) instead of
    /// the deduplicating HTTP receiver.
    pub mcp: bool,
    /// The model leaves the usage out of its answers to these turns
    /// (indexes from 0; OpenAI Chat streams only).
    pub model_omit_usage: Vec<usize>,
    /// The ledger is on PostgreSQL (else SQLite), unless the run names one
    /// (`STEPHOST_TEST_LEDGER`).
    pub postgres_ledger: bool,
}

impl Plan {
    pub fn draw(seed: u64) -> Plan {
        let mut rng = Rng::new(seed);
        let workers = rng.range(1, 4) as usize;
        let serve = rng.chance(50);
        let concurrency = rng.range(2, 6);
        let lease_ms = rng.range(1500, 2500);
        let lookup_plain = rng.chance(50);
        let ledger_faults_percent = if rng.chance(40) { rng.range(2, 10) } else { 0 };
        let chaos = Duration::from_millis(rng.range(2000, 5000));
        let model_api = MODEL_APIS[rng.index(MODEL_APIS.len())];
        let mut model_faults: Vec<Vec<serde_json::Value>> = (0..3)
            .map(|_| {
                (0..rng.range(0, 2))
                    .map(|_| model_fault(&mut rng))
                    .collect()
            })
            .collect();
        let model_tokens_max = rng.chance(60).then(|| rng.range(600, 2000));
        let runs = rng.range(8, 16);
        let mut writes = 0;
        let submits: Vec<Submit> = (0..runs)
            .map(|i| {
                let (work, kind, n) = match rng.range(0, 11) {
                    0..=1 => (Work::Supplier { quantity: 10 }, "supplier", 1),
                    2..=3 => {
                        let count = rng.range(1, 6);
                        (Work::Writes { count }, "writes", count)
                    }
                    4..=5 => {
                        let ms = rng.range(100, 1500);
                        (Work::Sleeper { ms }, "sleeper", 2)
                    }
                    6..=7 => {
                        let n = rng.range(1, 4);
                        let sleep_ms = (0..n).map(|_| rng.range(0, 1500)).collect();
                        (Work::Fanout { n, sleep_ms }, "fanout", n)
                    }
                    8 => {
                        let after = Duration::from_millis(rng.range(0, 2000));
                        let ttl_seconds = if rng.chance(30) { 1 } else { 600 };
                        (Work::Promise { after, ttl_seconds }, "promise", 1)
                    }
                    _ => {
                        let order = format!("A-{}", 2000 + i);
                        (Work::Agent { order }, "agent", 1)
                    }
                };
                writes += n;
                // Half the runs are there when the workers start.
                let at = if rng.chance(50) {
                    Duration::ZERO
                } else {
                    Duration::from_millis(rng.range(0, chaos.as_millis() as u64))
                };
                Submit {
                    at,
                    run_id: format!("r{i:02}-{kind}"),
                    work,
                }
            })
            .collect();
        let faults = rng.range(1, 6);
        let mut injects: Vec<Inject> = (0..faults)
            .map(|_| {
                let at = Duration::from_millis(rng.range(100, chaos.as_millis() as u64));
                let worker = rng.index(workers);
                let fault = match rng.range(0, 9) {
                    0..=2 => Fault::Kill,
                    3..=6 => {
                        let point = POINTS[rng.index(POINTS.len())];
                        let seq = rng.range(1, 10);
                        // A claim passes its point before any call.
                        Fault::Arm(match point {
                            "after-claim" => point.to_string(),
                            _ => format!("{point}@{seq}"),
                        })
                    }
                    7 => Fault::Pause {
                        r#for: Duration::from_millis(lease_ms + rng.range(300, 1500)),
                    },
                    8 => Fault::Outage {
                        r#for: Duration::from_millis(rng.range(500, 2500)),
                    },
                    _ => Fault::Drain,
                };
                Inject { at, worker, fault }
            })
            .collect();
        injects.sort_by_key(|i| i.at);
        // A person cancels runs soon after they are submitted, mostly
        // while a worker executes them.
        let mut cancels: Vec<(Duration, String)> = (0..rng.range(0, 3))
            .map(|_| {
                let run = &submits[rng.index(submits.len())];
                (
                    run.at + Duration::from_millis(rng.range(50, 800)),
                    run.run_id.clone(),
                )
            })
            .collect();
        cancels.sort();
        let mut postgres: Vec<(Duration, ServerEvent)> = match rng.chance(30) {
            false => Vec::new(),
            true => (0..rng.range(1, 2))
                .map(|_| {
                    let at = Duration::from_millis(rng.range(100, chaos.as_millis() as u64));
                    let event = match rng.chance(50) {
                        true => ServerEvent::Restart,
                        false => ServerEvent::DropConnections,
                    };
                    (at, event)
                })
                .collect(),
        };
        postgres.sort_by_key(|(at, _)| *at);
        let queue = |rng: &mut Rng| {
            (0..writes * 2)
                .map(|_| misbehaviour(rng))
                .collect::<Vec<_>>()
        };
        let mut deduplicating = queue(&mut rng);
        let mut plain = queue(&mut rng);
        // What later versions of the plan draw comes from a stream of its
        // own, so the draws above stay what they were for every seed.
        let mut more = Rng::new(seed ^ 0x5eed_0000_0000_0002);
        let mcp = more.chance(35);
        let mut submits = submits;
        for (i, s) in submits.iter_mut().enumerate() {
            if !more.chance(30) {
                continue;
            }
            let (work, kind) = match more.range(0, 2) {
                0 => {
                    let after = Duration::from_millis(more.range(0, 2000));
                    let ttl_seconds = if more.chance(25) { 1 } else { 600 };
                    let approve = more.chance(75);
                    let work = Work::Approval {
                        after,
                        approve,
                        ttl_seconds,
                    };
                    (work, "approval")
                }
                1 if mcp && more.chance(50) => (Work::Mcp, "mcp"),
                _ => (
                    Work::WasiHttp {
                        plain: more.chance(50),
                    },
                    "wasi-http",
                ),
            };
            s.work = work;
            s.run_id = format!("r{i:02}-{kind}");
        }
        // Receivers' answers that are not JSON, and lookups that are slow,
        // not JSON, or answer with another operation's receipt.
        for queue in [&mut deduplicating, &mut plain] {
            for m in queue.iter_mut() {
                if more.chance(5) {
                    *m = Misbehaviour::CommitNotJson;
                }
            }
        }
        let lookups = |more: &mut Rng| {
            (0..writes)
                .map(|_| match more.range(0, 9) {
                    0 => Some(LookupFault::OtherReceipt),
                    1 => Some(LookupFault::NotJson),
                    2 | 3 => Some(LookupFault::Slow(Duration::from_millis(
                        more.range(100, 700),
                    ))),
                    _ => None,
                })
                .map(|f| f.unwrap_or(LookupFault::Slow(Duration::ZERO)))
                .collect::<Vec<_>>()
        };
        let deduplicating_lookups = lookups(&mut more);
        let plain_lookups = lookups(&mut more);
        if mcp
            && submits
                .iter()
                .any(|s| matches!(s.work, Work::Mcp | Work::Supplier { .. }))
        {
            for _ in 0..more.range(0, 2) {
                injects.push(Inject {
                    at: Duration::from_millis(more.range(100, chaos.as_millis() as u64)),
                    worker: 0,
                    fault: Fault::McpDeath,
                });
            }
            injects.sort_by_key(|i| i.at);
        }
        let model_omit_usage = (0..3).filter(|_| more.chance(20)).collect();
        // A rate limit that pauses the model for every process sharing it
        // (the pause is kept in the ledger).
        if more.chance(25) {
            let turn = more.index(model_faults.len());
            model_faults[turn].insert(
                0,
                serde_json::json!({"kind": "status", "status": 429, "retry_after": 1, "times": 1}),
            );
        }
        let postgres_ledger = more.chance(50);
        Plan {
            seed,
            workers,
            serve,
            concurrency,
            lease_ms,
            lookup_plain,
            model_api,
            model_faults,
            model_tokens_max,
            postgres,
            ledger_faults_percent,
            chaos,
            submits,
            injects,
            cancels,
            deduplicating,
            plain,
            deduplicating_lookups,
            plain_lookups,
            mcp,
            model_omit_usage,
            postgres_ledger,
        }
    }

    /// What the MCP supplier server started by start `start` of worker
    /// `slot` does wrong (`SUPPLIER_MCP_FAULT`), if anything: the same for
    /// the same seed.
    pub fn mcp_fault(&self, slot: usize, start: usize) -> Option<&'static str> {
        let mut rng = Rng::new(self.seed ^ (0x3c9_0000 + slot as u64 * 100 + start as u64));
        match rng.range(0, 10) {
            0 => Some("die-after"),
            1 => Some("die-before"),
            2 => Some("rpc-error"),
            3 => Some("slow-start"),
            4 => Some("is-error"),
            _ => None,
        }
    }
}

const MODEL_APIS: &[&str] = &["openai-chat", "openai-responses", "anthropic-messages"];

/// A model provider's misbehaviour: rate limits with and without
/// `retry-after`, overload, 5xx, streams cut or ended by an error, a
/// dropped connection.
fn model_fault(rng: &mut Rng) -> serde_json::Value {
    use serde_json::json;
    let times = rng.range(1, 3);
    match rng.range(0, 6) {
        0 => json!({"kind": "status", "status": 429, "retry_after": 0, "times": times}),
        1 => json!({"kind": "status", "status": 429, "times": times}),
        2 => json!({"kind": "status", "status": 529, "times": times}),
        3 => json!({"kind": "status", "status": 500, "times": times}),
        4 => json!({"kind": "cut", "times": times}),
        5 => json!({"kind": "stream_error", "times": times}),
        _ => json!({"kind": "drop", "times": times}),
    }
}

/// How many of `lookups` misbehave.
pub fn odd_lookups(lookups: &[LookupFault]) -> usize {
    lookups
        .iter()
        .filter(|l| **l != LookupFault::Slow(Duration::ZERO))
        .count()
}

/// The longest latency a well-behaved receiver answers with here.
pub const USUAL_LATENCY: Duration = Duration::from_millis(150);

/// Most requests are answered after a receiver's usual latency (up to
/// 150 ms, within the attempt's timeout); the rest misbehave as receivers
/// do.
fn misbehaviour(rng: &mut Rng) -> Misbehaviour {
    if rng.chance(65) {
        return Misbehaviour::Delay(Duration::from_millis(rng.range(0, 150)));
    }
    match rng.range(0, 7) {
        0 => Misbehaviour::status(500),
        1 => Misbehaviour::retry_after(503, rng.range(0, 1)),
        2 => Misbehaviour::retry_after(429, 0),
        3 => Misbehaviour::CommitThenDrop,
        4 if rng.chance(50) => Misbehaviour::DropBeforeCommit,
        // A refusal not declared final ("the key is in use").
        4 => Misbehaviour::status(409),
        5 => Misbehaviour::Delay(Duration::from_millis(rng.range(100, 700))),
        _ => Misbehaviour::CommitLate(Duration::from_millis(rng.range(100, 800))),
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "seed {}: {} worker(s){} × {} slots, lease {} ms, {} ms of faults, the plain \
             receiver {} lookup, ledger faults in {} of 100 operations, {} drawn",
            self.seed,
            self.workers,
            if self.serve {
                " (worker 0 is serve)"
            } else {
                ""
            },
            self.concurrency,
            self.lease_ms,
            self.chaos.as_millis(),
            if self.lookup_plain { "with" } else { "without" },
            self.ledger_faults_percent,
            if self.postgres_ledger {
                "PostgreSQL"
            } else {
                "SQLite"
            }
        )?;
        for s in &self.submits {
            writeln!(
                f,
                "  at {:>5} ms submit {} {:?}",
                s.at.as_millis(),
                s.run_id,
                s.work
            )?;
        }
        for i in &self.injects {
            writeln!(
                f,
                "  at {:>5} ms worker {}: {:?}",
                i.at.as_millis(),
                i.worker,
                i.fault
            )?;
        }
        for (at, run_id) in &self.cancels {
            writeln!(f, "  at {:>5} ms cancel {run_id}", at.as_millis())?;
        }
        for (at, event) in &self.postgres {
            writeln!(
                f,
                "  at {:>5} ms PostgreSQL (a server of the seed's own): {event:?}",
                at.as_millis()
            )?;
        }
        if let Some(max) = self.model_tokens_max {
            writeln!(f, "  model_tokens_max = {max}")?;
        }
        let odd = |queue: &[Misbehaviour]| {
            queue
                .iter()
                .filter(|m| !matches!(m, Misbehaviour::Delay(d) if *d <= USUAL_LATENCY))
                .count()
        };
        writeln!(
            f,
            "  model ({}): turn faults {}",
            self.model_api,
            serde_json::Value::from(self.model_faults.clone())
        )?;
        writeln!(
            f,
            "  receivers: {} of {} deduplicating and {} of {} plain answers misbehave; {} of {} \
             and {} of {} lookups",
            odd(&self.deduplicating),
            self.deduplicating.len(),
            odd(&self.plain),
            self.plain.len(),
            odd_lookups(&self.deduplicating_lookups),
            self.deduplicating_lookups.len(),
            odd_lookups(&self.plain_lookups),
            self.plain_lookups.len(),
        )?;
        if self.mcp {
            writeln!(
                f,
                "  supplier.order is the MCP supplier server's place_order"
            )?;
        }
        if !self.model_omit_usage.is_empty() {
            writeln!(
                f,
                "  the model leaves the usage out of turns {:?}",
                self.model_omit_usage
            )?;
        }
        Ok(())
    }
}
