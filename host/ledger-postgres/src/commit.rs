//! Executions' commits. A commit is one call of `stephost_commit`
//! (migrations/0001_ledger.sql): it locks its run's row, checks the fencing
//! token and applies every op, in one statement. Alone, it is its own
//! transaction: one round trip, its WAL flushed before it returns when it
//! holds a durable op. Several (group commit), or one that creates its run,
//! go in one transaction whose statements are sent together (pipelined): a
//! statement that fails aborts the transaction, the ones after it fail as
//! aborted, and `COMMIT` rolls back; which commit failed, and why, is read
//! from the first real error.

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

const COMMIT: &str = "SELECT stephost_commit($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, \
     $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30, \
     $31, $32, $33, $34, $35, $36, $37, $38, $39, $40, $41, $42, $43)";
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
    Commit { first_seq: Option<u64> },
}

/// Whether any of `jobs` must be on disk before it is answered.
pub fn durable(jobs: &[Job<'_>]) -> bool {
    jobs.iter().any(|j| j.ops.iter().any(WriteOp::durable))
}

/// Applies `jobs` in one transaction: all of them, or none.
pub async fn apply(conn: &mut PgConn, jobs: &[Job<'_>]) -> Result<(), Failed> {
    let durable = durable(jobs);
    let mut planned = Vec::new();
    // One commit that does not create its run is a transaction on its own.
    let alone = jobs.len() == 1 && !matches!(jobs[0].ops.first(), Some(WriteOp::Create(_)));
    for (at, job) in jobs.iter().enumerate() {
        plan(at, job, alone && !durable, &mut planned).map_err(|e| Failed::Job(at, e))?;
    }
    let mut statements = Vec::with_capacity(planned.len());
    for p in &planned {
        statements.push(conn.statement(p.sql).await.map_err(Failed::All)?);
    }
    let values: Vec<Vec<&(dyn ToSql + Sync)>> =
        planned.iter().map(|p| rows::refs(&p.values)).collect();
    let client = &conn.client;
    let results = if alone {
        vec![client.execute(&statements[0], &values[0]).await]
    } else {
        let begin = if durable {
            "BEGIN"
        } else {
            // Ordered before the next durable commit, which flushes the
            // WAL up to itself; not waited for on its own.
            "BEGIN; SET LOCAL synchronous_commit TO OFF"
        };
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
        if results.iter().all(Result::is_ok) {
            return committed.map_err(|e| Failed::All(error(e)));
        }
        results
    };
    for (p, result) in planned.iter().zip(&results) {
        let Err(e) = result else { continue };
        if errors::is_aborted(e) {
            continue;
        }
        // Nothing was committed ("COMMIT" in a failed transaction is a
        // rollback); say why.
        let job = &jobs[p.job];
        if errors::is_retryable(e) || e.as_db_error().is_none() {
            return Err(Failed::All(error_of(e)));
        }
        let failed = match p.what {
            What::CreateRun if errors::is_duplicate(e) => {
                claimed_elsewhere(conn, &job.claim.run_id).await
            }
            What::Commit { first_seq } => commit_error(e, job.claim, first_seq),
            _ => error_of(e),
        };
        return Err(Failed::Job(p.job, failed));
    }
    // Only "aborted" errors: the transaction failed somewhere its results
    // do not say; nothing was committed.
    if let Some(Err(e)) = results.iter().find(|r| r.is_err()) {
        return Err(Failed::All(error_of(e)));
    }
    Ok(())
}

fn error_of(e: &tokio_postgres::Error) -> StoreError {
    StoreError::Unavailable(describe(e))
}

/// What `stephost_commit` refusing `claim`'s commit means.
fn commit_error(e: &tokio_postgres::Error, claim: &Claim, first_seq: Option<u64>) -> StoreError {
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
        Some(errors::CALL_NOT_RECORDED) => StoreError::Corrupt(format!(
            "an outcome for call #{} of run {}, which is not recorded",
            detail.unwrap_or_default(),
            claim.run_id
        )),
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

/// The statements of job `at`: its run's row if it creates it, then one
/// `stephost_commit` call with every op. `async_commit`: the call itself
/// tells the server not to wait for the WAL flush.
fn plan(at: usize, job: &Job<'_>, async_commit: bool, out: &mut Vec<Planned>) -> StoreResult<()> {
    let run_id = job.claim.run_id.clone();
    let mut ops = job.ops;
    if let Some(WriteOp::Create(run)) = ops.first() {
        out.push(Planned {
            sql: rows::INSERT_RUN,
            values: rows::run_values(run),
            job: at,
            what: What::CreateRun,
        });
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
    let mut bodies = Bodies::default();
    let mut calls = CallColumns::default();
    let mut outcomes = OutcomeColumns::default();
    let mut logs = LogColumns::default();
    let mut lease: (Option<i64>, Option<i64>) = (None, None);
    let mut end: Option<&stephost_core::records::EndRow> = None;
    let mut counters = stephost_core::journal::Counters::new();
    for op in ops {
        match op {
            WriteOp::Create(_) => {
                return Err(StoreError::Corrupt(
                    "a commit creates its run only as its first op".into(),
                ));
            }
            WriteOp::Call(call) | WriteOp::Started(call) => {
                let expected = calls
                    .seq
                    .first()
                    .map(|s| *s as u64 + calls.seq.len() as u64);
                if expected.is_some_and(|seq| seq != call.seq) {
                    return Err(StoreError::NotAppended {
                        run_id,
                        seq: call.seq,
                    });
                }
                let (request, request_split) = bodies.store(&call.request);
                let (outcome, outcome_split) = match &call.outcome {
                    Some(body) => {
                        let (text, split) = bodies.store(body);
                        (Some(text), split)
                    }
                    None => (None, false),
                };
                calls.seq.push(call.seq as i64);
                calls.class.push(call.class.as_str().to_string());
                calls.interface.push(call.interface.clone());
                calls.function.push(call.function.clone());
                calls.operation_id.push(call.operation_id.clone());
                calls.request.push(request);
                calls.request_split.push(request_split);
                calls.request_hash.push(call.request_hash.clone());
                calls.state.push(call.state.as_str().to_string());
                calls.outcome.push(outcome);
                calls.outcome_split.push(outcome_split);
                calls.started_at.push(call.started_at_ms);
                calls.finished_at.push(call.finished_at_ms);
                calls.chain.push(call.chain.clone());
                calls.attempts.push(
                    attempts
                        .remove(&call.seq)
                        .map(|a| AttemptRecord::to_stored_json(&a)),
                );
            }
            WriteOp::Attempt(_) => {}
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
                outcomes.seq.push(*seq as i64);
                outcomes.state.push(Some(state.as_str().to_string()));
                outcomes.outcome.push(outcome);
                outcomes.outcome_split.push(split);
                outcomes.finished_at.push(Some(*now_ms));
                outcomes.chain.push(chain.clone());
                outcomes.attempts.push(
                    attempts
                        .remove(seq)
                        .map(|a| AttemptRecord::to_stored_json(&a)),
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
            } => lease = (Some(*until_ms), *due_at_ms),
            WriteOp::End(row) => end = Some(row),
            WriteOp::Counters(add) => {
                for (name, by) in add {
                    *counters.entry(name).or_default() += by;
                }
            }
        }
    }
    // Attempts of calls written by earlier commits (a write's retries).
    for (seq, tried) in attempts {
        outcomes.seq.push(seq as i64);
        outcomes.state.push(None);
        outcomes.outcome.push(None);
        outcomes.outcome_split.push(false);
        outcomes.finished_at.push(None);
        outcomes.chain.push(None);
        outcomes
            .attempts
            .push(Some(AttemptRecord::to_stored_json(&tried)));
    }
    let first_seq = calls.seq.first().map(|s| *s as u64);
    let mut values: Vec<Value> = vec![boxed(run_id), boxed(job.claim.fence), boxed(async_commit)];
    values.extend(array_pair(bodies.digests, bodies.parts));
    values.extend(calls.into_values());
    values.extend(outcomes.into_values());
    values.extend(logs.into_values());
    values.push(boxed(lease.0));
    values.push(boxed(lease.1));
    values.push(boxed(end.map(|e| e.status.as_str())));
    values.push(boxed(end.and_then(|e| e.output.clone())));
    values.push(boxed(end.and_then(|e| e.error.clone())));
    values.push(boxed(end.and_then(|e| e.exit_code)));
    values.push(boxed(end.and_then(|e| e.wake_at_ms)));
    values.push(boxed(end.and_then(|e| e.due_at_ms)));
    values.push(boxed(end.map(|e| e.updated_at_ms)));
    values.push(boxed(end.and_then(|e| e.seal.clone())));
    let names: Vec<String> = counters.keys().map(|k| k.to_string()).collect();
    let added: Vec<i64> = counters.values().copied().collect();
    values.extend(array_pair(names, added));
    out.push(Planned {
        sql: COMMIT,
        values,
        job: at,
        what: What::Commit { first_seq },
    });
    Ok(())
}

/// Two arrays as values, each NULL when empty (the function skips a part
/// whose arrays are NULL).
fn array_pair<A, B>(a: Vec<A>, b: Vec<B>) -> [Value; 2]
where
    Vec<A>: ToSql + Sync + Send + 'static,
    Vec<B>: ToSql + Sync + Send + 'static,
{
    if a.is_empty() {
        [boxed(None::<Vec<A>>), boxed(None::<Vec<B>>)]
    } else {
        [boxed(Some(a)), boxed(Some(b))]
    }
}

/// A column's values, or NULL when the part is empty.
fn column<T>(values: Vec<T>, present: bool) -> Value
where
    Vec<T>: ToSql + Sync + Send + 'static,
{
    boxed(present.then_some(values))
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
    fn into_values(self) -> Vec<Value> {
        let present = !self.seq.is_empty();
        vec![
            column(self.seq, present),
            column(self.class, present),
            column(self.interface, present),
            column(self.function, present),
            column(self.operation_id, present),
            column(self.request, present),
            column(self.request_split, present),
            column(self.request_hash, present),
            column(self.state, present),
            column(self.outcome, present),
            column(self.outcome_split, present),
            column(self.started_at, present),
            column(self.finished_at, present),
            column(self.chain, present),
            column(self.attempts, present),
        ]
    }
}

#[derive(Default)]
struct OutcomeColumns {
    seq: Vec<i64>,
    state: Vec<Option<String>>,
    outcome: Vec<Option<String>>,
    outcome_split: Vec<bool>,
    finished_at: Vec<Option<i64>>,
    chain: Vec<Option<String>>,
    attempts: Vec<Option<String>>,
}

impl OutcomeColumns {
    fn into_values(self) -> Vec<Value> {
        let present = !self.seq.is_empty();
        vec![
            column(self.seq, present),
            column(self.state, present),
            column(self.outcome, present),
            column(self.outcome_split, present),
            column(self.finished_at, present),
            column(self.chain, present),
            column(self.attempts, present),
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

impl LogColumns {
    fn into_values(self) -> Vec<Value> {
        let present = !self.at.is_empty();
        vec![
            column(self.after_seq, present),
            column(self.level, present),
            column(self.message, present),
            column(self.at, present),
        ]
    }
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
