//! Executions' commits, applied in one transaction whose statements are
//! sent together (pipelined): one round trip to the server however many
//! statements and commits it holds. Each commit locks its run's row and
//! checks its fencing token first (`stephost_fenced`), then applies its
//! ops in order. A statement that fails aborts the transaction, the
//! statements after it fail as aborted, and `COMMIT` rolls back: which
//! commit failed, and why, is read from the first real error.

use std::collections::BTreeMap;

use stephost_core::store::WriteOp;
use stephost_core::{AttemptRecord, Claim, StoreError, StoreResult};
use tokio_postgres::types::ToSql;

use crate::conns::PgConn;
use crate::errors::{self, describe, error};
use crate::rows::{self, Bodies, Value, boxed};

/// One execution's commit.
pub struct Job<'a> {
    pub claim: &'a Claim,
    pub ops: &'a [WriteOp],
}

/// Why a transaction of jobs did not commit.
pub enum Failed {
    /// Job `.0` failed on its own: the others may be applied without it.
    Job(usize, StoreError),
    /// The transaction failed for all of them (the connection, the server).
    All(StoreError),
}

const FENCED: &str = "SELECT stephost_fenced($1, $2, $3)";
const INSERT_CALLS: &str = "INSERT INTO calls (run_id, seq, class, interface, function, \
     operation_id, request, request_split, request_hash, state, outcome, outcome_split, \
     started_at, finished_at, fence, chain, attempts) \
     SELECT $1, t.seq, t.class, t.interface, t.function, t.operation_id, t.request, \
     t.request_split, t.request_hash, t.state, t.outcome, t.outcome_split, t.started_at, \
     t.finished_at, $2, t.chain, t.attempts::jsonb \
     FROM unnest($3::int8[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], \
     $9::bool[], $10::text[], $11::text[], $12::text[], $13::bool[], $14::int8[], $15::int8[], \
     $16::text[], $17::text[]) AS t(seq, class, interface, function, operation_id, request, \
     request_split, request_hash, state, outcome, outcome_split, started_at, finished_at, chain, \
     attempts)";
const OUTCOME: &str = "SELECT stephost_outcome($1, $2, $3, $4, $5, $6, $7, $8::text::jsonb)";
const INSERT_LOGS: &str = "INSERT INTO logs (run_id, after_seq, level, message, at) \
     SELECT $1, * FROM unnest($2::int8[], $3::text[], $4::text[], $5::int8[])";
const LEASE: &str =
    "UPDATE runs SET lease_until = $2, due_at = $3, version = version + 1 WHERE run_id = $1";
const END: &str = "UPDATE runs SET status = $2, output = $3, error = $4, exit_code = $5, \
     wake_at = $6, due_at = $7, updated_at = $8, owner = NULL, lease_until = NULL, \
     version = version + 1 WHERE run_id = $1";
pub const ADD_COUNTERS: &str = "INSERT INTO counters (name, value) \
     SELECT * FROM unnest($1::text[], $2::int8[]) ON CONFLICT (name) \
     DO UPDATE SET value = counters.value + excluded.value";

/// A statement to send, with its values.
struct Planned {
    sql: &'static str,
    values: Vec<Value>,
    /// The job it belongs to.
    job: usize,
    /// What a failure of this statement means for its job.
    what: What,
}

#[derive(Clone, Copy)]
enum What {
    CreateRun,
    Fence { first_seq: Option<u64> },
    Outcome { seq: u64 },
    Other,
}

/// Whether any of `jobs` must be on disk before it is answered.
pub fn durable(jobs: &[Job<'_>]) -> bool {
    jobs.iter().any(|j| j.ops.iter().any(WriteOp::durable))
}

/// Applies `jobs` in one transaction: all of them, or none.
pub async fn apply(conn: &mut PgConn, jobs: &[Job<'_>]) -> Result<(), Failed> {
    let mut planned = Vec::new();
    for (at, job) in jobs.iter().enumerate() {
        plan(at, job, &mut planned).map_err(|e| Failed::Job(at, e))?;
    }
    let mut statements = Vec::with_capacity(planned.len());
    for p in &planned {
        statements.push(conn.statement(p.sql).await.map_err(Failed::All)?);
    }
    let begin = if durable(jobs) {
        "BEGIN"
    } else {
        // Ordered before the next durable commit, which flushes the WAL
        // up to itself; not waited for on its own.
        "BEGIN; SET LOCAL synchronous_commit TO OFF"
    };
    let client = &conn.client;
    let values: Vec<Vec<&(dyn ToSql + Sync)>> =
        planned.iter().map(|p| rows::refs(&p.values)).collect();
    let sent = statements
        .iter()
        .zip(&values)
        .map(|(statement, values)| client.execute(statement, values));
    let (began, results, committed) = futures_util::join!(
        client.batch_execute(begin),
        in_order(sent),
        client.batch_execute("COMMIT")
    );
    began.map_err(|e| Failed::All(error(e)))?;
    for (p, result) in planned.iter().zip(&results) {
        let Err(e) = result else { continue };
        if errors::is_aborted(e) {
            continue;
        }
        // The transaction is rolled back ("COMMIT" in a failed transaction
        // is a rollback); say why.
        let job = &jobs[p.job];
        if errors::is_retryable(e) || e.as_db_error().is_none() {
            return Err(Failed::All(error_of(e)));
        }
        let failed = match p.what {
            What::CreateRun if errors::is_duplicate(e) => {
                claimed_elsewhere(conn, &job.claim.run_id).await
            }
            What::Fence { first_seq } => fence_error(e, job.claim, first_seq),
            What::Outcome { seq } if errors::code(e) == Some(errors::CALL_NOT_RECORDED) => {
                StoreError::Corrupt(format!(
                    "an outcome for call #{seq} of run {}, which is not recorded",
                    job.claim.run_id
                ))
            }
            _ => error_of(e),
        };
        return Err(Failed::Job(p.job, failed));
    }
    committed.map_err(|e| Failed::All(error(e)))
}

fn error_of(e: &tokio_postgres::Error) -> StoreError {
    StoreError::Unavailable(describe(e))
}

/// What `stephost_fenced` refusing `claim` means.
fn fence_error(e: &tokio_postgres::Error, claim: &Claim, first_seq: Option<u64>) -> StoreError {
    let detail = errors::detail(e).and_then(|d| d.parse::<i64>().ok());
    match errors::code(e) {
        Some(errors::NO_SUCH_RUN) => StoreError::UnknownRun(claim.run_id.clone()),
        Some(errors::FENCED) => StoreError::Fenced {
            run_id: claim.run_id.clone(),
            held: claim.fence,
            newest: detail.unwrap_or(claim.fence),
        },
        Some(errors::NOT_APPENDED) => StoreError::NotAppended {
            run_id: claim.run_id.clone(),
            seq: first_seq.unwrap_or_default(),
        },
        _ => error_of(e),
    }
}

/// The error for a run created by an execution when another process had
/// created it first.
async fn claimed_elsewhere(conn: &mut PgConn, run_id: &str) -> StoreError {
    match rows::find_run(conn, run_id).await {
        Ok(Some(found)) => StoreError::ClaimedElsewhere {
            run_id: found.run_id,
            owner: found.owner.unwrap_or_else(|| "another process".into()),
            lease_until_ms: found.lease_until_ms.unwrap_or(found.updated_at_ms),
        },
        Ok(None) => StoreError::Unavailable(format!(
            "run {run_id} was created elsewhere and is gone again; try again"
        )),
        Err(e) => e,
    }
}

/// The statements of job `at`, in order.
fn plan(at: usize, job: &Job<'_>, out: &mut Vec<Planned>) -> StoreResult<()> {
    let run_id = job.claim.run_id.clone();
    let mut push = |sql, values, what| {
        out.push(Planned {
            sql,
            values,
            job: at,
            what,
        })
    };
    let mut ops = job.ops;
    if let Some(WriteOp::Create(run)) = ops.first() {
        push(rows::INSERT_RUN, rows::run_values(run), What::CreateRun);
        ops = &ops[1..];
    }
    // A call's attempts are kept in its row: those of a call this commit
    // writes go with it, the others are appended to rows written before.
    let mut attempts: BTreeMap<u64, Vec<&AttemptRecord>> = BTreeMap::new();
    for op in ops {
        if let WriteOp::Attempt(a) = op {
            attempts.entry(a.seq).or_default().push(a);
        }
    }
    let calls: Vec<&stephost_core::CallRecord> = ops
        .iter()
        .filter_map(|op| match op {
            WriteOp::Call(call) | WriteOp::Started(call) => Some(call),
            _ => None,
        })
        .collect();
    let first_seq = calls.first().map(|c| c.seq);
    for (offset, call) in calls.iter().enumerate() {
        if Some(call.seq) != first_seq.map(|s| s + offset as u64) {
            return Err(StoreError::NotAppended {
                run_id,
                seq: call.seq,
            });
        }
    }
    push(
        FENCED,
        vec![
            boxed(run_id.clone()),
            boxed(job.claim.fence),
            boxed(first_seq.map(|s| s as i64)),
        ],
        What::Fence { first_seq },
    );
    let mut bodies = Bodies::default();
    if !calls.is_empty() {
        let mut columns = CallColumns::default();
        for call in &calls {
            let (request, request_split) = bodies.store(&call.request);
            let (outcome, outcome_split) = match &call.outcome {
                Some(body) => {
                    let (text, split) = bodies.store(body);
                    (Some(text), split)
                }
                None => (None, false),
            };
            columns.seq.push(call.seq as i64);
            columns.class.push(call.class.as_str().to_string());
            columns.interface.push(call.interface.clone());
            columns.function.push(call.function.clone());
            columns.operation_id.push(call.operation_id.clone());
            columns.request.push(request);
            columns.request_split.push(request_split);
            columns.request_hash.push(call.request_hash.clone());
            columns.state.push(call.state.as_str().to_string());
            columns.outcome.push(outcome);
            columns.outcome_split.push(outcome_split);
            columns.started_at.push(call.started_at_ms);
            columns.finished_at.push(call.finished_at_ms);
            columns.chain.push(call.chain.clone());
            columns.attempts.push(
                attempts
                    .remove(&call.seq)
                    .map(|a| AttemptRecord::to_stored_json(&a)),
            );
        }
        push(
            INSERT_CALLS,
            columns.into_values(run_id.clone(), job.claim.fence),
            What::Other,
        );
    }
    let mut logs = LogColumns::default();
    for op in ops {
        match op {
            WriteOp::Create(_) => {
                return Err(StoreError::Corrupt(
                    "a commit creates its run only as its first op".into(),
                ));
            }
            WriteOp::Call(_) | WriteOp::Started(_) | WriteOp::Attempt(_) => {}
            WriteOp::Outcome {
                seq,
                state,
                outcome,
                now_ms,
                chain,
            } => {
                let (outcome, split) = match outcome {
                    Some(body) => {
                        let (text, split) = bodies.store(body);
                        (Some(text), split)
                    }
                    None => (None, false),
                };
                let tried = attempts
                    .remove(seq)
                    .map(|a| AttemptRecord::to_stored_json(&a));
                push(
                    OUTCOME,
                    vec![
                        boxed(run_id.clone()),
                        boxed(*seq as i64),
                        boxed(Some(state.as_str().to_string())),
                        boxed(outcome),
                        boxed(split),
                        boxed(Some(*now_ms)),
                        boxed(chain.clone()),
                        boxed(tried),
                    ],
                    What::Outcome { seq: *seq },
                );
            }
            WriteOp::Log(log) => {
                logs.after_seq.push(log.after_seq as i64);
                logs.level.push(log.level.clone());
                logs.message.push(log.message.clone());
                logs.at.push(log.at_ms);
            }
            WriteOp::Lease {
                until_ms,
                due_at_ms,
            } => push(
                LEASE,
                vec![boxed(run_id.clone()), boxed(*until_ms), boxed(*due_at_ms)],
                What::Other,
            ),
            WriteOp::End(end) => push(
                END,
                vec![
                    boxed(run_id.clone()),
                    boxed(end.status.as_str()),
                    boxed(end.output.clone()),
                    boxed(end.error.clone()),
                    boxed(end.exit_code),
                    boxed(end.wake_at_ms),
                    boxed(end.due_at_ms),
                    boxed(end.updated_at_ms),
                ],
                What::Other,
            ),
            WriteOp::Counters(counters) => {
                if !counters.is_empty() {
                    push(ADD_COUNTERS, counter_values(counters), What::Other);
                }
            }
        }
    }
    if !logs.at.is_empty() {
        push(
            INSERT_LOGS,
            vec![
                boxed(run_id.clone()),
                boxed(logs.after_seq),
                boxed(logs.level),
                boxed(logs.message),
                boxed(logs.at),
            ],
            What::Other,
        );
    }
    // Attempts of calls written by earlier commits (a write's retries).
    for (seq, tried) in attempts {
        push(
            OUTCOME,
            vec![
                boxed(run_id.clone()),
                boxed(seq as i64),
                boxed(None::<String>),
                boxed(None::<String>),
                boxed(false),
                boxed(None::<i64>),
                boxed(None::<String>),
                boxed(Some(AttemptRecord::to_stored_json(&tried))),
            ],
            What::Outcome { seq },
        );
    }
    if !bodies.is_empty() {
        // In the same transaction as the rows that refer to them.
        push(
            rows::INSERT_PAYLOADS,
            vec![boxed(bodies.digests), boxed(bodies.parts)],
            What::Other,
        );
    }
    Ok(())
}

/// The values of a counters upsert.
pub fn counter_values(counters: &stephost_core::journal::Counters) -> Vec<Value> {
    let names: Vec<String> = counters.keys().map(|k| k.to_string()).collect();
    let values: Vec<i64> = counters.values().copied().collect();
    vec![boxed(names), boxed(values)]
}

#[derive(Default)]
struct CallColumns {
    seq: Vec<i64>,
    class: Vec<String>,
    interface: Vec<String>,
    function: Vec<String>,
    operation_id: Vec<String>,
    request: Vec<String>,
    request_split: Vec<bool>,
    request_hash: Vec<String>,
    state: Vec<String>,
    outcome: Vec<Option<String>>,
    outcome_split: Vec<bool>,
    started_at: Vec<i64>,
    finished_at: Vec<Option<i64>>,
    chain: Vec<Option<String>>,
    attempts: Vec<Option<String>>,
}

impl CallColumns {
    fn into_values(self, run_id: String, fence: i64) -> Vec<Value> {
        vec![
            boxed(run_id),
            boxed(fence),
            boxed(self.seq),
            boxed(self.class),
            boxed(self.interface),
            boxed(self.function),
            boxed(self.operation_id),
            boxed(self.request),
            boxed(self.request_split),
            boxed(self.request_hash),
            boxed(self.state),
            boxed(self.outcome),
            boxed(self.outcome_split),
            boxed(self.started_at),
            boxed(self.finished_at),
            boxed(self.chain),
            boxed(self.attempts),
        ]
    }
}

#[derive(Default)]
struct LogColumns {
    after_seq: Vec<i64>,
    level: Vec<String>,
    message: Vec<String>,
    at: Vec<i64>,
}

/// Awaits `futures` together, first polling each in the order given (a
/// statement is sent when its future is first polled, so they are sent in
/// that order), and gives their outputs in that order.
async fn in_order<F: std::future::Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut pending: Vec<std::pin::Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut done: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    futures_util::future::poll_fn(|cx| {
        let mut all = true;
        for (future, output) in pending.iter_mut().zip(done.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    std::task::Poll::Ready(value) => *output = Some(value),
                    std::task::Poll::Pending => all = false,
                }
            }
        }
        if all {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    done.into_iter().flatten().collect()
}
