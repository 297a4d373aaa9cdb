//! Executions' commits. A commit is one call of `stephost_commit`
//! (migrations/0004_commit_plan.sql) with the commit's plan (checked and
//! laid out in core, [`CommitPlan`]) as one JSON parameter: it locks its
//! run's row, checks the fencing token and writes, in one statement. Alone, it is its own
//! transaction: one round trip, its WAL flushed before it returns when it
//! holds a durable op. Several (group commit), or one that creates its run,
//! go in one transaction whose statements are sent together (pipelined): a
//! statement that fails aborts the transaction, the ones after it fail as
//! aborted, and `COMMIT` rolls back; which commit failed, and why, is read
//! from the first real error.

use serde_json::{Map, Value as Json, json};
use stephost_core::commit::{CommitPlan, stored_attempts};
use stephost_core::{AttemptRecord, StoreError, StoreResult};
use tokio_postgres::types::ToSql;

use crate::conns::PgConn;
use crate::errors::{self, describe, error};
use crate::rows::{self, Bodies, Value, boxed};

/// One execution's commit.
pub struct Job<'a> {
    pub plan: &'a CommitPlan,
}

/// Why a transaction of jobs did not commit.
pub enum Failed {
    /// Job `.0` failed on its own: the others may be applied without it.
    Job(usize, StoreError),
    /// The transaction failed for all of them (the connection, the server).
    All(StoreError),
}

const COMMIT: &str = "SELECT stephost_commit($1, $2, $3, $4, $5, $6::text::jsonb)";
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
    Commit {
        first_seq: Option<u64>,
    },
    /// The row of the plan's child number `.0`.
    Spawn(usize),
}

/// Whether any of `jobs` must be on disk before it is answered.
pub fn durable(jobs: &[Job<'_>]) -> bool {
    jobs.iter().any(|j| j.plan.durable)
}

/// Applies `jobs` in one transaction: all of them, or none.
pub async fn apply(conn: &mut PgConn, jobs: &[Job<'_>]) -> Result<(), Failed> {
    let durable = durable(jobs);
    let mut planned = Vec::new();
    // One commit that does not create its run is a transaction on its own.
    let alone = jobs.len() == 1 && jobs[0].plan.create.is_none() && jobs[0].plan.spawns.is_empty();
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
                claimed_elsewhere(conn, &job.plan.run_id).await
            }
            What::Commit { first_seq } => commit_error(e, job.plan, first_seq),
            What::Spawn(child) if errors::is_duplicate(e) => StoreError::RunExists {
                run_id: job.plan.spawns[child].run_id.clone(),
            },
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

/// What `stephost_commit` refusing `plan` means.
fn commit_error(
    e: &tokio_postgres::Error,
    plan: &CommitPlan,
    first_seq: Option<u64>,
) -> StoreError {
    let detail = errors::detail(e).and_then(|d| d.parse::<i64>().ok());
    match errors::code(e) {
        Some(errors::NO_SUCH_RUN) => StoreError::UnknownRun(plan.run_id.clone()),
        Some(errors::FENCED) => StoreError::Fenced {
            run_id: plan.run_id.clone(),
            held: plan.fence,
            newest: detail.unwrap_or(plan.fence),
        },
        Some(errors::NOT_APPENDED) => StoreError::NotAppended {
            run_id: plan.run_id.clone(),
            seq: first_seq.unwrap_or_default(),
        },
        Some(errors::CANCELLED) => {
            let detail: Json = errors::detail(e)
                .and_then(|d| serde_json::from_str(d).ok())
                .unwrap_or(Json::Null);
            StoreError::Cancelled {
                run_id: plan.run_id.clone(),
                reason: stephost_core::CancelRequest {
                    at_ms: 0,
                    by: detail["by"].as_str().unwrap_or("someone").to_string(),
                    reason: detail["reason"].as_str().map(str::to_string),
                }
                .error(),
            }
        }
        Some(errors::CALL_NOT_RECORDED) => StoreError::Corrupt(format!(
            "an outcome for call #{} of run {}, which is not recorded",
            detail.unwrap_or_default(),
            plan.run_id
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
/// `stephost_commit` call with the rest of its plan. `async_commit`: the
/// call itself tells the server not to wait for the WAL flush.
fn plan(at: usize, job: &Job<'_>, async_commit: bool, out: &mut Vec<Planned>) -> StoreResult<()> {
    let plan = job.plan;
    if let Some(run) = &plan.create {
        out.push(Planned {
            sql: rows::INSERT_RUN,
            values: rows::insert_values(run),
            job: at,
            what: What::CreateRun,
        });
    }
    let mut bodies = Bodies::default();
    let mut body = |text: Option<&str>| match text {
        Some(text) => {
            let (stored, split) = bodies.store(text);
            (Json::String(stored), split)
        }
        None => (Json::Null, false),
    };
    let mut p = Map::new();
    if plan.begins {
        p.insert("begins".into(), Json::Bool(true));
    }
    if !plan.calls.is_empty() {
        let calls = plan
            .calls
            .iter()
            .map(|new| {
                let call = &new.call;
                let (request, request_split) = body(Some(&call.request));
                let (outcome, outcome_split) = body(call.outcome.as_deref());
                json!({
                    "seq": call.seq,
                    "class": call.class.as_str(),
                    "interface": call.interface,
                    "function": call.function,
                    "operation_id": call.operation_id,
                    "request": request,
                    "request_split": request_split,
                    "request_hash": call.request_hash,
                    "state": call.state.as_str(),
                    "outcome": outcome,
                    "outcome_split": outcome_split,
                    "started_at": call.started_at_ms,
                    "finished_at": call.finished_at_ms,
                    "chain": call.chain,
                    "attempts": attempts_json(&new.attempts),
                })
            })
            .collect();
        p.insert("calls".into(), Json::Array(calls));
    }
    if !plan.updates.is_empty() {
        let updates = plan
            .updates
            .iter()
            .map(|update| match &update.outcome {
                Some(settled) => {
                    let (outcome, outcome_split) = body(settled.outcome.as_deref());
                    json!({
                        "seq": update.seq,
                        "state": settled.state.as_str(),
                        "outcome": outcome,
                        "outcome_split": outcome_split,
                        "finished_at": settled.finished_at_ms,
                        "chain": settled.chain,
                        "attempts": attempts_json(&update.attempts),
                    })
                }
                None => json!({
                    "seq": update.seq,
                    "attempts": attempts_json(&update.attempts),
                }),
            })
            .collect();
        p.insert("updates".into(), Json::Array(updates));
    }
    if !plan.logs.is_empty() {
        let logs = plan
            .logs
            .iter()
            .map(|log| {
                json!({
                    "after_seq": log.after_seq,
                    "level": log.level,
                    "message": log.message,
                    "at": log.at_ms,
                })
            })
            .collect();
        p.insert("logs".into(), Json::Array(logs));
    }
    if let Some(lease) = &plan.lease {
        p.insert(
            "lease".into(),
            json!({"lease_until": lease.lease_until_ms, "due_at": lease.due_at_ms}),
        );
    }
    if let Some(end) = &plan.end {
        p.insert(
            "end".into(),
            json!({
                "status": end.status.as_str(),
                "output": end.output,
                "error": end.error,
                "exit_code": end.exit_code,
                "wake_at": end.wake_at_ms,
                "due_at": end.due_at_ms,
                "updated_at": end.updated_at_ms,
                "seal": end.seal,
                "inbox_seen": end.inbox_seen,
            }),
        );
        if let Some(request) = &end.cancel_children
            && let Some(Json::Object(end)) = p.get_mut("end")
        {
            end.insert(
                "cancel_children".into(),
                json!({"at": request.at_ms, "by": request.by, "reason": request.reason}),
            );
        }
        if let Some(arrival) = &end.arrival
            && let Some(Json::Object(end)) = p.get_mut("end")
        {
            end.insert(
                "arrival".into(),
                json!({
                    "parent_run_id": arrival.parent_run_id,
                    "child_run_id": arrival.child_run_id,
                    "join_set": arrival.join_set,
                    "status": arrival.status.as_str(),
                    "at": arrival.at_ms,
                }),
            );
        }
    }
    if !plan.counters.is_empty() {
        let counters = plan
            .counters
            .iter()
            .map(|(name, by)| (name.to_string(), json!(by)))
            .collect();
        p.insert("counters".into(), Json::Object(counters));
    }
    let mut values: Vec<Value> = vec![
        boxed(plan.run_id.clone()),
        boxed(plan.fence),
        boxed(async_commit),
    ];
    values.extend(array_pair(bodies.digests, bodies.parts));
    values.push(boxed(Json::Object(p).to_string()));
    out.push(Planned {
        sql: COMMIT,
        values,
        job: at,
        what: What::Commit {
            first_seq: plan.first_seq(),
        },
    });
    // Children after the call that starts them: the commit has locked the
    // parent's row and checked its fence.
    for (n, child) in plan.spawns.iter().enumerate() {
        out.push(Planned {
            sql: rows::INSERT_RUN,
            values: rows::insert_values(child),
            job: at,
            what: What::Spawn(n),
        });
    }
    Ok(())
}

/// A call's attempts as the JSON array its row keeps (null if none).
fn attempts_json(attempts: &[AttemptRecord]) -> Json {
    stored_attempts(attempts)
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or(Json::Null)
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

/// The values of a counters upsert.
pub fn counter_values(counters: &stephost_core::journal::Counters) -> Vec<Value> {
    let names: Vec<String> = counters.keys().map(|k| k.to_string()).collect();
    let values: Vec<i64> = counters.values().copied().collect();
    vec![boxed(names), boxed(values)]
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
