//! Rows and records: the SQL that reads and writes runs and calls, and the
//! bodies kept apart by digest.

use std::collections::HashMap;
use stephost_core::notices::{Notice, NoticeEvent, NoticeState};

use stephost_core::lifecycle;
use stephost_core::payload;
use stephost_core::{CallClass, CallRecord, CallState, RunRecord, RunStatus, StoreError};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use crate::conns::PgConn;
use crate::errors::error;

pub const RUN_COLUMNS: &str = "run_id, module_digest, input, status, output, error, created_at, \
     updated_at, version, owner, lease_until, fence, wake_at, world, step, exit_code, seal, budget, \
     trace, parent_run_id, parent_seq, join_set, root_run_id, detached, cancel_at, cancel_by, \
     cancel_reason, fork";

pub const SELECT_RUN: &str = "SELECT run_id, module_digest, input, status, output, error, \
     created_at, updated_at, version, owner, lease_until, fence, wake_at, world, step, exit_code, \
     seal, budget, trace, parent_run_id, parent_seq, join_set, root_run_id, detached, cancel_at, \
     cancel_by, cancel_reason, fork FROM runs WHERE run_id = $1";

pub const SELECT_FORKS: &str = "SELECT run_id, module_digest, input, status, output, error, \
     created_at, updated_at, version, owner, lease_until, fence, wake_at, world, step, exit_code, \
     seal, budget, trace, parent_run_id, parent_seq, join_set, root_run_id, detached, cancel_at, \
     cancel_by, cancel_reason, fork FROM runs WHERE fork_of = $1 ORDER BY created_at, run_id";

pub const SELECT_CHILDREN: &str = "SELECT run_id, module_digest, input, status, output, error, \
     created_at, updated_at, version, owner, lease_until, fence, wake_at, world, step, exit_code, \
     seal, budget, trace, parent_run_id, parent_seq, join_set, root_run_id, detached, cancel_at, \
     cancel_by, cancel_reason, fork FROM runs WHERE parent_run_id = $1 ORDER BY parent_seq";

pub const INSERT_RUN: &str = "INSERT INTO runs (run_id, module_digest, input, status, output, \
     error, created_at, updated_at, version, owner, lease_until, fence, wake_at, due_at, world, \
     step, exit_code, seal, budget, trace, parent_run_id, parent_seq, join_set, root_run_id, \
     detached, fork, fork_of) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, \
     $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27)";

pub const INSERT_RUN_UNLESS_EXISTS: &str = "INSERT INTO runs (run_id, module_digest, input, \
     status, output, error, created_at, updated_at, version, owner, lease_until, fence, wake_at, \
     due_at, world, step, exit_code, seal, budget, trace, parent_run_id, parent_seq, join_set, \
     root_run_id, detached, fork, fork_of) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, \
     $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27) \
     ON CONFLICT (run_id) DO NOTHING";

pub const SWAP_RUN: &str = "UPDATE runs SET module_digest = $2, input = $3, status = $4, \
     output = $5, error = $6, created_at = $7, updated_at = $8, version = $9, owner = $10, \
     lease_until = $11, fence = $12, wake_at = $13, due_at = $14, world = $15, step = $16, \
     exit_code = $17, seal = $18, budget = $19, trace = $20 WHERE run_id = $1 AND version = $21";

pub fn run_from_row(r: &Row) -> Result<RunRecord, StoreError> {
    let status: &str = r.try_get(3).map_err(error)?;
    Ok(RunRecord {
        run_id: r.try_get(0).map_err(error)?,
        module_digest: r.try_get(1).map_err(error)?,
        input: r.try_get(2).map_err(error)?,
        status: RunStatus::parse(status)
            .ok_or_else(|| StoreError::Corrupt(format!("a run has status {status:?}")))?,
        output: r.try_get(4).map_err(error)?,
        error: r.try_get(5).map_err(error)?,
        created_at_ms: r.try_get(6).map_err(error)?,
        updated_at_ms: r.try_get(7).map_err(error)?,
        version: r.try_get(8).map_err(error)?,
        owner: r.try_get(9).map_err(error)?,
        lease_until_ms: r.try_get(10).map_err(error)?,
        fence: r.try_get(11).map_err(error)?,
        wake_at_ms: r.try_get(12).map_err(error)?,
        world: r.try_get(13).map_err(error)?,
        step: r.try_get(14).map_err(error)?,
        exit_code: r.try_get(15).map_err(error)?,
        seal: r.try_get(16).map_err(error)?,
        budget: stephost_core::RunBudget::from_column(r.try_get(17).map_err(error)?)
            .map_err(StoreError::Corrupt)?,
        // By name: a query may read a call's columns after the run's.
        trace: r
            .try_get::<_, Option<&str>>("trace")
            .map_err(error)?
            .map(|t| stephost_core::RunTrace::from_column(Some(t), ""))
            .transpose()
            .map_err(StoreError::Corrupt)?,
        parent: match r
            .try_get::<_, Option<String>>("parent_run_id")
            .map_err(error)?
        {
            Some(run_id) => Some(stephost_core::ParentRef {
                run_id,
                seq: r.try_get::<_, i64>("parent_seq").map_err(error)? as u64,
                join_set: r.try_get("join_set").map_err(error)?,
                detached: r.try_get("detached").map_err(error)?,
            }),
            None => None,
        },
        root_run_id: r.try_get("root_run_id").map_err(error)?,
        cancel: match r.try_get::<_, Option<i64>>("cancel_at").map_err(error)? {
            Some(at_ms) => Some(stephost_core::CancelRequest {
                at_ms,
                by: r.try_get("cancel_by").map_err(error)?,
                reason: r.try_get("cancel_reason").map_err(error)?,
            }),
            None => None,
        },
        fork: stephost_core::ForkRef::from_column(r.try_get("fork").map_err(error)?)
            .map_err(StoreError::Corrupt)?,
    })
}

pub const NOTICE_COLUMNS: &str = "delivery_id, webhook, event, run_id, body, created_at, state, \
     next_at, attempts, delivered_at, last_error";

pub fn notice_from_row(r: &Row) -> Result<Notice, StoreError> {
    let event: &str = r.try_get(2).map_err(error)?;
    let state: &str = r.try_get(6).map_err(error)?;
    let attempts: i32 = r.try_get(8).map_err(error)?;
    Ok(Notice {
        delivery_id: r.try_get(0).map_err(error)?,
        webhook: r.try_get(1).map_err(error)?,
        event: NoticeEvent::parse(event)
            .ok_or_else(|| StoreError::Corrupt(format!("a notice has event {event:?}")))?,
        run_id: r.try_get(3).map_err(error)?,
        body: r.try_get(4).map_err(error)?,
        created_at_ms: r.try_get(5).map_err(error)?,
        state: NoticeState::parse(state)
            .ok_or_else(|| StoreError::Corrupt(format!("a notice has state {state:?}")))?,
        next_at_ms: r.try_get(7).map_err(error)?,
        attempts: attempts.max(0) as u32,
        delivered_at_ms: r.try_get(9).map_err(error)?,
        last_error: r.try_get(10).map_err(error)?,
    })
}

/// A value to bind, owned (a statement's values outlive the code that
/// planned it when statements are sent together).
pub type Value = Box<dyn ToSql + Sync + Send>;

pub fn boxed<T: ToSql + Sync + Send + 'static>(value: T) -> Value {
    Box::new(value)
}

/// `values` as a statement takes them.
pub fn refs(values: &[Value]) -> Vec<&(dyn ToSql + Sync)> {
    values
        .iter()
        .map(|v| v.as_ref() as &(dyn ToSql + Sync))
        .collect()
}

/// A run's row as the values of [`INSERT_RUN`] (and the first 20 of
/// [`SWAP_RUN`]), `due_at` computed by the lifecycle rules.
pub fn run_values(r: &RunRecord) -> Vec<Value> {
    vec![
        boxed(r.run_id.clone()),
        boxed(r.module_digest.clone()),
        boxed(r.input.clone()),
        boxed(r.status.as_str()),
        boxed(r.output.clone()),
        boxed(r.error.clone()),
        boxed(r.created_at_ms),
        boxed(r.updated_at_ms),
        boxed(r.version),
        boxed(r.owner.clone()),
        boxed(r.lease_until_ms),
        boxed(r.fence),
        boxed(r.wake_at_ms),
        boxed(lifecycle::due_at(r)),
        boxed(r.world.clone()),
        boxed(r.step.clone()),
        boxed(r.exit_code),
        boxed(r.seal.clone()),
        boxed(r.budget.to_column()),
        boxed(r.trace.as_ref().map(stephost_core::RunTrace::to_column)),
    ]
}

/// A new run's row as the values of [`INSERT_RUN`] and
/// [`INSERT_RUN_UNLESS_EXISTS`]: [`run_values`], then where a child was
/// started (set once, never swapped).
pub fn insert_values(r: &RunRecord) -> Vec<Value> {
    let mut values = run_values(r);
    values.extend([
        boxed(r.parent.as_ref().map(|p| p.run_id.clone())),
        boxed(r.parent.as_ref().map(|p| p.seq as i64)),
        boxed(r.parent.as_ref().map(|p| p.join_set.clone())),
        boxed(r.root_run_id.clone()),
        boxed(r.parent.as_ref().is_some_and(|p| p.detached)),
        boxed(r.fork.as_ref().map(stephost_core::ForkRef::to_column)),
        boxed(r.fork.as_ref().map(|f| f.run_id.clone())),
    ]);
    values
}

/// The ends of run `run_id`'s children, in arrival order.
pub async fn inbox(
    conn: &mut PgConn,
    run_id: &str,
) -> Result<Vec<stephost_core::InboxEntry>, StoreError> {
    let statement = conn
        .statement(
            "SELECT arrival, child_run_id, join_set, status, at FROM inbox WHERE run_id = $1 \
             ORDER BY arrival",
        )
        .await?;
    let found = conn
        .client
        .query(&statement, &[&run_id])
        .await
        .map_err(error)?;
    found
        .iter()
        .map(|r| {
            let status: &str = r.try_get(3).map_err(error)?;
            Ok(stephost_core::InboxEntry {
                arrival: r.try_get::<_, i64>(0).map_err(error)? as u64,
                child_run_id: r.try_get(1).map_err(error)?,
                join_set: r.try_get(2).map_err(error)?,
                status: RunStatus::parse(status)
                    .ok_or_else(|| StoreError::Corrupt(format!("an inbox status {status:?}")))?,
                at_ms: r.try_get(4).map_err(error)?,
            })
        })
        .collect()
}

/// A call row as read, and which of its bodies are split.
pub struct CallRow {
    pub call: CallRecord,
    request_split: bool,
    outcome_split: bool,
}

/// The call whose columns are, from column `at` on: seq, class, interface,
/// function, operation_id, request, request_split, request_hash, state,
/// outcome, outcome_split, started_at, finished_at, resolved_by, chain, fence.
pub fn call_from_row(r: &Row, at: usize) -> Result<CallRow, StoreError> {
    let get_err = |e| error(e);
    let class: &str = r.try_get(at + 1).map_err(get_err)?;
    let state: &str = r.try_get(at + 8).map_err(get_err)?;
    let seq: i64 = r.try_get(at).map_err(get_err)?;
    Ok(CallRow {
        call: CallRecord {
            seq: seq as u64,
            class: CallClass::parse(class)
                .ok_or_else(|| StoreError::Corrupt(format!("a call has class {class:?}")))?,
            interface: r.try_get(at + 2).map_err(get_err)?,
            function: r.try_get(at + 3).map_err(get_err)?,
            operation_id: r.try_get(at + 4).map_err(get_err)?,
            request: r.try_get(at + 5).map_err(get_err)?,
            request_hash: r.try_get(at + 7).map_err(get_err)?,
            state: CallState::parse(state)
                .ok_or_else(|| StoreError::Corrupt(format!("a call has state {state:?}")))?,
            outcome: r.try_get(at + 9).map_err(get_err)?,
            started_at_ms: r.try_get(at + 11).map_err(get_err)?,
            finished_at_ms: r.try_get(at + 12).map_err(get_err)?,
            resolved_by: r.try_get(at + 13).map_err(get_err)?,
            chain: r.try_get(at + 14).map_err(get_err)?,
            fence: r.try_get(at + 15).map_err(get_err)?,
        },
        request_split: r.try_get(at + 6).map_err(get_err)?,
        outcome_split: r.try_get(at + 10).map_err(get_err)?,
    })
}

/// The calls of `rows`, their split bodies loaded from `payloads`.
pub async fn load_calls(
    conn: &mut PgConn,
    rows: Vec<CallRow>,
) -> Result<Vec<CallRecord>, StoreError> {
    let mut wanted: Vec<String> = Vec::new();
    for row in &rows {
        if row.request_split {
            wanted.extend(
                payload::references(&row.call.request)
                    .into_iter()
                    .map(str::to_string),
            );
        }
        if row.outcome_split
            && let Some(outcome) = &row.call.outcome
        {
            wanted.extend(payload::references(outcome).into_iter().map(str::to_string));
        }
    }
    if wanted.is_empty() {
        return Ok(rows.into_iter().map(|r| r.call).collect());
    }
    wanted.sort();
    wanted.dedup();
    let statement = conn
        .statement("SELECT digest, body FROM payloads WHERE digest = ANY($1)")
        .await?;
    let parts: HashMap<String, String> = conn
        .client
        .query(&statement, &[&wanted])
        .await
        .map_err(error)?
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let part = |digest: &str| Ok(parts.get(digest).cloned());
    rows.into_iter()
        .map(|row| {
            let CallRow {
                mut call,
                request_split,
                outcome_split,
            } = row;
            if request_split {
                call.request = payload::load(&call.request, true, part)?;
            }
            if outcome_split && let Some(outcome) = &call.outcome {
                call.outcome = Some(payload::load(outcome, true, part)?);
            }
            Ok(call)
        })
        .collect()
}

/// Bodies as stored: each body's text for its row (and whether it is
/// split), and every part, once, to keep in `payloads`.
#[derive(Default)]
pub struct Bodies {
    pub digests: Vec<String>,
    pub parts: Vec<String>,
}

impl Bodies {
    /// `body` as its row holds it.
    pub fn store(&mut self, body: &str) -> (String, bool) {
        if payload::stays_whole(body) {
            return (body.to_string(), false);
        }
        let stored = payload::store(body);
        let split = stored.is_split();
        for part in stored.parts {
            if !self.digests.contains(&part.digest) {
                self.digests.push(part.digest);
                self.parts.push(part.body);
            }
        }
        (stored.text, split)
    }

    pub fn is_empty(&self) -> bool {
        self.digests.is_empty()
    }
}

/// Keeps `bodies`' parts (each once).
pub const INSERT_PAYLOADS: &str = "INSERT INTO payloads (digest, body) \
     SELECT * FROM unnest($1::text[], $2::text[]) ORDER BY 1 ON CONFLICT (digest) DO NOTHING";

/// The run `run_id`, if it exists.
pub async fn find_run(conn: &mut PgConn, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
    let statement = conn.statement(SELECT_RUN).await?;
    conn.client
        .query_opt(&statement, &[&run_id])
        .await
        .map_err(error)?
        .map(|r| run_from_row(&r))
        .transpose()
}

pub async fn run(conn: &mut PgConn, run_id: &str) -> Result<RunRecord, StoreError> {
    find_run(conn, run_id)
        .await?
        .ok_or_else(|| StoreError::UnknownRun(run_id.to_string()))
}

/// The error for a compare-and-set on `run_id`'s version that changed no row.
pub async fn version_conflict(conn: &mut PgConn, run_id: &str, expected: i64) -> StoreError {
    match run(conn, run_id).await {
        Ok(found) => StoreError::VersionConflict {
            run_id: run_id.to_string(),
            expected,
            found: found.version,
        },
        Err(e) => e,
    }
}

/// Calls of `run_id` from `from_seq` on, in order, at most `limit`.
pub async fn calls(
    conn: &mut PgConn,
    run_id: &str,
    from_seq: u64,
    limit: usize,
) -> Result<Vec<CallRecord>, StoreError> {
    let statement = conn
        .statement(
            "SELECT seq, class, interface, function, operation_id, request, request_split, \
             request_hash, state, outcome, outcome_split, started_at, finished_at, resolved_by, \
             chain, fence FROM calls WHERE run_id = $1 AND seq >= $2 ORDER BY seq LIMIT $3",
        )
        .await?;
    let limit = limit.min(i64::MAX as usize) as i64;
    let rows = conn
        .client
        .query(&statement, &[&run_id, &(from_seq as i64), &limit])
        .await
        .map_err(error)?;
    let rows = rows
        .iter()
        .map(|r| call_from_row(r, 0))
        .collect::<Result<Vec<_>, _>>()?;
    load_calls(conn, rows).await
}

/// The last recorded sequence number of `run_id` (0 if none).
pub async fn last_seq(conn: &mut PgConn, run_id: &str) -> Result<u64, StoreError> {
    let statement = conn
        .statement("SELECT coalesce(max(seq), 0) FROM calls WHERE run_id = $1")
        .await?;
    let last: i64 = conn
        .client
        .query_one(&statement, &[&run_id])
        .await
        .map_err(error)?
        .get(0);
    Ok(last as u64)
}
