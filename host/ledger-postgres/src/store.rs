//! Reads, listings and compare-and-set writes, each on a connection taken
//! from the pool for it.

use std::sync::Arc;

use stephost_core::History;
use stephost_core::journal::Counters;
use stephost_core::notices::{Notice, NoticeAttempt};
use stephost_core::store::{OpenCall, Outbox, RunQuery, Settlement, Store, StoreResult, Views};
use stephost_core::{
    AttemptRecord, CallRecord, CallState, InboxEntry, LogRecord, RunRecord, RunStatus, StoreError,
};

use crate::commit::{ADD_COUNTERS, counter_values};
use crate::errors::error;
use crate::rows::{self, Bodies, RUN_COLUMNS, Value, boxed, refs};
use crate::{Shared, stream};

/// Histories at least this long are read while they are replayed.
pub const STREAM_CALLS_MIN: usize = 4096;

/// A store over the pool's connections.
pub struct PgStore {
    pub(crate) shared: Arc<Shared>,
}

impl PgStore {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        PgStore { shared }
    }
}

impl Views for PgStore {
    fn due_runs(&self, limit: usize) -> StoreResult<Vec<RunRecord>> {
        let limit = limit.min(i64::MAX as usize) as i64;
        self.shared.block(move |mut conn| async move {
            let statement = conn
                .statement(
                    "SELECT run_id, module_digest, input, status, output, error, created_at, \
                     updated_at, version, owner, lease_until, fence, wake_at, world, step, \
                     exit_code, seal, budget, trace, parent_run_id, parent_seq, join_set, \
                     root_run_id, detached, cancel_at, cancel_by, cancel_reason, fork FROM runs \
                     WHERE due_at IS NOT NULL \
                     ORDER BY due_at, run_id LIMIT $1",
                )
                .await?;
            conn.client
                .query(&statement, &[&limit])
                .await
                .map_err(error)?
                .iter()
                .map(rows::run_from_row)
                .collect()
        })
    }

    fn module(&self, digest: &str) -> StoreResult<Vec<u8>> {
        let digest = digest.to_string();
        self.shared.block(move |mut conn| async move {
            let statement = conn
                .statement("SELECT bytes FROM modules WHERE digest = $1")
                .await?;
            conn.client
                .query_opt(&statement, &[&digest])
                .await
                .map_err(error)?
                .map(|r| r.get(0))
                .ok_or(StoreError::UnknownModule(digest))
        })
    }

    fn run(&self, run_id: &str) -> StoreResult<RunRecord> {
        let run_id = run_id.to_string();
        self.shared
            .block(move |mut conn| async move { rows::run(&mut conn, &run_id).await })
    }

    fn runs(&self, query: &RunQuery) -> StoreResult<Vec<RunRecord>> {
        if !query.may_match() {
            return Ok(Vec::new());
        }
        let mut sql = format!("SELECT {RUN_COLUMNS} FROM runs WHERE true");
        let mut values: Vec<Value> = Vec::new();
        let mut bind = |sql: &mut String, clause: &str, value: Value| {
            values.push(value);
            sql.push_str(&clause.replace('?', &format!("${}", values.len())));
        };
        if let Some(status) = query.status {
            bind(&mut sql, " AND status = ?", boxed(status.as_str()));
        }
        if let Some(digest) = &query.module_digest {
            bind(&mut sql, " AND module_digest = ?", boxed(digest.clone()));
        }
        if let Some(step) = &query.step {
            bind(&mut sql, " AND step = ?", boxed(step.clone()));
        }
        if let Some(after) = query.created_after_ms {
            bind(&mut sql, " AND created_at > ?", boxed(after));
        }
        if let Some(before) = query.created_before_ms {
            bind(&mut sql, " AND created_at < ?", boxed(before));
        }
        if let Some(after) = query.updated_after_ms {
            bind(&mut sql, " AND updated_at > ?", boxed(after));
        }
        if let Some(after) = &query.after_run_id {
            bind(
                &mut sql,
                " AND (created_at, run_id) < (SELECT created_at, run_id FROM runs WHERE run_id = ?)",
                boxed(after.clone()),
            );
        }
        sql.push_str(" ORDER BY created_at DESC, run_id DESC");
        if let Some(limit) = query.limit {
            bind(
                &mut sql,
                " LIMIT ?",
                boxed(limit.min(i64::MAX as usize) as i64),
            );
        }
        self.shared.block(move |conn| async move {
            let found = conn
                .client
                .query(sql.as_str(), &refs(&values))
                .await
                .map_err(error)?;
            found.iter().map(rows::run_from_row).collect()
        })
    }

    fn status_counts(&self) -> StoreResult<Vec<(RunStatus, u64)>> {
        self.shared.block(move |mut conn| async move {
            let statement = conn
                .statement("SELECT status, count(*) FROM runs GROUP BY status ORDER BY status")
                .await?;
            conn.client
                .query(&statement, &[])
                .await
                .map_err(error)?
                .iter()
                .map(|r| {
                    let status: &str = r.get(0);
                    let n: i64 = r.get(1);
                    RunStatus::parse(status)
                        .map(|s| (s, n as u64))
                        .ok_or_else(|| StoreError::Corrupt(format!("a run has status {status:?}")))
                })
                .collect()
        })
    }

    fn calls(&self, run_id: &str, from_seq: u64, limit: usize) -> StoreResult<Vec<CallRecord>> {
        let run_id = run_id.to_string();
        self.shared.block(move |mut conn| async move {
            rows::run(&mut conn, &run_id).await?;
            rows::calls(&mut conn, &run_id, from_seq, limit).await
        })
    }

    fn history(&self, run_id: &str) -> StoreResult<History> {
        let id = run_id.to_string();
        let (total, last_attempts) = self.shared.block(move |mut conn| async move {
            rows::run(&mut conn, &id).await?;
            let total = rows::last_seq(&mut conn, &id).await?;
            let last = rows::calls(&mut conn, &id, total.max(1), 1).await?.pop();
            let last_attempts = match last {
                Some(last) if last.state == CallState::Started => {
                    attempts_of(&mut conn, &id, Some(last.seq))
                        .await?
                        .iter()
                        .map(|a| a.attempt)
                        .max()
                        .unwrap_or(0)
                }
                _ => 0,
            };
            Ok((total as usize, last_attempts))
        })?;
        let history = if total < STREAM_CALLS_MIN {
            History::checked(run_id, self.calls(run_id, 1, total)?)?
        } else {
            let chunks = stream::chunks(self.shared.clone(), run_id, total)?;
            History::streamed(run_id, total, chunks)
        };
        Ok(history.with_last_attempts(last_attempts))
    }

    fn attempts(&self, run_id: &str, seq: Option<u64>) -> StoreResult<Vec<AttemptRecord>> {
        let run_id = run_id.to_string();
        self.shared.block(move |mut conn| async move {
            rows::run(&mut conn, &run_id).await?;
            attempts_of(&mut conn, &run_id, seq).await
        })
    }

    fn logs(&self, run_id: &str) -> StoreResult<Vec<LogRecord>> {
        let run_id = run_id.to_string();
        self.shared.block(move |mut conn| async move {
            rows::run(&mut conn, &run_id).await?;
            let statement = conn
                .statement(
                    "SELECT after_seq, level, message, at FROM logs WHERE run_id = $1 ORDER BY id",
                )
                .await?;
            Ok(conn
                .client
                .query(&statement, &[&run_id])
                .await
                .map_err(error)?
                .iter()
                .map(|r| LogRecord {
                    after_seq: r.get::<_, i64>(0) as u64,
                    level: r.get(1),
                    message: r.get(2),
                    at_ms: r.get(3),
                })
                .collect())
        })
    }

    fn open_calls(&self, state: CallState, interface: Option<&str>) -> StoreResult<Vec<OpenCall>> {
        let interface = interface.map(str::to_string);
        // A call a person waits on is the last call of an unfinished run: a
        // run stops at an approval it waits for and at an unknown outcome.
        self.shared.block(move |mut conn| async move {
            let statement = conn
                .statement(
                    "SELECT r.run_id, r.module_digest, r.input, r.status, r.output, r.error, \
                     r.created_at, r.updated_at, r.version, r.owner, r.lease_until, r.fence, \
                     r.wake_at, r.world, r.step, r.exit_code, r.seal, r.budget, c.seq, c.class, \
                     c.interface, \
                     c.function, c.operation_id, c.request, c.request_split, c.request_hash, \
                     c.state, c.outcome, c.outcome_split, c.started_at, c.finished_at, \
                     c.resolved_by, c.chain, c.fence, r.trace, r.parent_run_id, r.parent_seq, \
                     r.join_set, r.root_run_id, r.detached, r.cancel_at, r.cancel_by, \
                     r.cancel_reason, r.fork \
                     FROM runs r CROSS JOIN LATERAL (SELECT * FROM calls \
                     WHERE calls.run_id = r.run_id ORDER BY seq DESC LIMIT 1) c \
                     WHERE r.status IN ('running', 'waiting', 'parked') AND c.state = $1 \
                     AND ($2::text IS NULL OR c.interface = $2) \
                     ORDER BY c.started_at, r.run_id",
                )
                .await?;
            let found = conn
                .client
                .query(&statement, &[&state.as_str(), &interface])
                .await
                .map_err(error)?;
            let mut runs = Vec::with_capacity(found.len());
            let mut calls = Vec::with_capacity(found.len());
            for row in &found {
                runs.push(rows::run_from_row(row)?);
                calls.push(rows::call_from_row(row, 18)?);
            }
            let calls = rows::load_calls(&mut conn, calls).await?;
            Ok(runs
                .into_iter()
                .zip(calls)
                .map(|(run, call)| OpenCall { run, call })
                .collect())
        })
    }

    fn counters(&self) -> StoreResult<Vec<(String, i64)>> {
        self.shared.block(move |mut conn| async move {
            let statement = conn
                .statement("SELECT name, value FROM counters ORDER BY name")
                .await?;
            Ok(conn
                .client
                .query(&statement, &[])
                .await
                .map_err(error)?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect())
        })
    }

    fn notices(&self, run_id: Option<&str>, limit: usize) -> StoreResult<Vec<Notice>> {
        let run_id = run_id.map(str::to_string);
        let limit = limit.min(i64::MAX as usize) as i64;
        self.shared.block(move |conn| async move {
            let found = conn
                .client
                .query(
                    format!(
                        "SELECT {} FROM notices WHERE $1::text IS NULL OR run_id = $1 \
                         ORDER BY no LIMIT $2",
                        rows::NOTICE_COLUMNS
                    )
                    .as_str(),
                    &[&run_id, &limit],
                )
                .await
                .map_err(error)?;
            found.iter().map(rows::notice_from_row).collect()
        })
    }

    fn inbox(&self, run_id: &str) -> StoreResult<Vec<InboxEntry>> {
        let id = run_id.to_string();
        self.shared.block(move |mut conn| async move {
            rows::run(&mut conn, &id).await?;
            rows::inbox(&mut conn, &id).await
        })
    }

    fn tree_size(&self, root_run_id: &str) -> StoreResult<u64> {
        let root = root_run_id.to_string();
        self.shared.block(move |conn| async move {
            let row = conn
                .client
                .query_one("SELECT count(*) FROM runs WHERE root_run_id = $1", &[&root])
                .await
                .map_err(error)?;
            Ok(row.try_get::<_, i64>(0).map_err(error)?.max(0) as u64)
        })
    }

    fn promise(
        &self,
        run_id: &str,
        id: u64,
    ) -> StoreResult<Option<stephost_core::promises::Completion>> {
        let run_id = run_id.to_string();
        self.shared.block(move |mut conn| async move {
            rows::run(&mut conn, &run_id).await?;
            let found = conn
                .client
                .query_opt(SELECT_PROMISE, &[&run_id, &(id as i64)])
                .await
                .map_err(error)?;
            found.as_ref().map(promise_from_row).transpose()
        })
    }

    fn children(&self, run_id: &str) -> StoreResult<Vec<RunRecord>> {
        let id = run_id.to_string();
        self.shared.block(move |mut conn| async move {
            rows::run(&mut conn, &id).await?;
            let statement = conn.statement(rows::SELECT_CHILDREN).await?;
            let found = conn.client.query(&statement, &[&id]).await.map_err(error)?;
            found.iter().map(rows::run_from_row).collect()
        })
    }

    fn forks(&self, run_id: &str) -> StoreResult<Vec<RunRecord>> {
        let id = run_id.to_string();
        self.shared.block(move |mut conn| async move {
            rows::run(&mut conn, &id).await?;
            let statement = conn.statement(rows::SELECT_FORKS).await?;
            let found = conn.client.query(&statement, &[&id]).await.map_err(error)?;
            found.iter().map(rows::run_from_row).collect()
        })
    }

    fn last_call(&self, run_id: &str) -> StoreResult<Option<CallRecord>> {
        let id = run_id.to_string();
        self.shared.block(move |mut conn| async move {
            rows::run(&mut conn, &id).await?;
            match rows::last_seq(&mut conn, &id).await? {
                0 => Ok(None),
                last => Ok(rows::calls(&mut conn, &id, last, 1).await?.pop()),
            }
        })
    }
}

impl Store for PgStore {
    fn put_module(&self, digest: &str, bytes: &[u8]) -> StoreResult<()> {
        let (digest, bytes) = (digest.to_string(), bytes.to_vec());
        self.shared.block(move |mut conn| async move {
            let statement = conn
                .statement(
                    // Noted as stored now, whatever retention does: the run
                    // it is stored for is recorded next.
                    "WITH m AS (INSERT INTO modules (digest, bytes, size, created_at) \
                     VALUES ($1, $2, $3, $4) ON CONFLICT (digest) DO NOTHING) \
                     INSERT INTO module_stored (digest, at) VALUES ($1, $4) \
                     ON CONFLICT (digest) DO UPDATE SET at = excluded.at",
                )
                .await?;
            conn.client
                .execute(
                    &statement,
                    &[
                        &digest,
                        &bytes,
                        &(bytes.len() as i64),
                        &stephost_core::clock::now_ms(),
                    ],
                )
                .await
                .map_err(error)?;
            Ok(())
        })
    }

    fn insert_run(&self, run: &RunRecord) -> StoreResult<RunRecord> {
        let run = run.clone();
        self.shared.block(move |mut conn| async move {
            let statement = conn.statement(rows::INSERT_RUN_UNLESS_EXISTS).await?;
            let values = rows::insert_values(&run);
            let inserted = conn
                .client
                .execute(&statement, &refs(&values))
                .await
                .map_err(error)?;
            if inserted == 1 {
                Ok(run)
            } else {
                rows::run(&mut conn, &run.run_id).await
            }
        })
    }

    fn swap_run(&self, expected_version: i64, run: &RunRecord, durable: bool) -> StoreResult<()> {
        let run = run.clone();
        self.shared.block(move |mut conn| async move {
            let statement = conn.statement(rows::SWAP_RUN).await?;
            let mut values = rows::run_values(&run);
            values.push(boxed(expected_version));
            let values = refs(&values);
            let changed = if durable {
                conn.client
                    .execute(&statement, &values)
                    .await
                    .map_err(error)?
            } else {
                // A claim needs no flush of its own: nothing leaves the
                // host before the claimant's first durable commit.
                let client = &conn.client;
                let (began, changed, committed) = futures_util::join!(
                    client.batch_execute("BEGIN; SET LOCAL synchronous_commit TO OFF"),
                    client.execute(&statement, &values),
                    client.batch_execute("COMMIT")
                );
                began.map_err(error)?;
                let changed = changed.map_err(error)?;
                committed.map_err(error)?;
                changed
            };
            match changed {
                1 => Ok(()),
                _ => Err(rows::version_conflict(&mut conn, &run.run_id, expected_version).await),
            }
        })
    }

    fn cancel(
        &self,
        run_id: &str,
        request: &stephost_core::CancelRequest,
    ) -> StoreResult<Vec<String>> {
        let (run_id, request) = (run_id.to_string(), request.clone());
        self.shared.block(move |mut conn| async move {
            let lock = conn
                .statement("SELECT status FROM runs WHERE run_id = $1 FOR UPDATE")
                .await?;
            let mark = conn
                .statement("SELECT * FROM stephost_mark_cancelled(ARRAY[$1::text], $2, $3, $4)")
                .await?;
            let transaction = conn.client.transaction().await.map_err(error)?;
            let found = transaction
                .query_opt(&lock, &[&run_id])
                .await
                .map_err(error)?;
            let Some(found) = found else {
                return Err(StoreError::UnknownRun(run_id));
            };
            let status: String = found.try_get(0).map_err(error)?;
            if RunStatus::parse(&status).is_some_and(RunStatus::is_finished) {
                return Err(StoreError::Ended { run_id, status });
            }
            let marked = transaction
                .query(
                    &mark,
                    &[&run_id, &request.at_ms, &request.by, &request.reason],
                )
                .await
                .map_err(error)?;
            let marked = marked
                .iter()
                .map(|r| r.try_get::<_, String>(0).map_err(error))
                .collect::<StoreResult<Vec<_>>>()?;
            transaction.commit().await.map_err(error)?;
            Ok(marked)
        })
    }

    fn complete_promise(
        &self,
        run_id: &str,
        id: u64,
        completion: &stephost_core::promises::Completion,
    ) -> StoreResult<stephost_core::promises::Kept> {
        use stephost_core::promises::Kept;
        let (run_id, completion) = (run_id.to_string(), completion.clone());
        self.shared.block(move |mut conn| async move {
            let transaction = conn.client.transaction().await.map_err(error)?;
            // The run's row is locked first, as a child's end locks its
            // parent's: arrivals are numbered in commit order.
            let found = transaction
                .query_opt(
                    "SELECT status FROM runs WHERE run_id = $1 FOR UPDATE",
                    &[&run_id],
                )
                .await
                .map_err(error)?;
            let Some(found) = found else {
                return Err(StoreError::UnknownRun(run_id));
            };
            let kept = transaction
                .query_opt(SELECT_PROMISE, &[&run_id, &(id as i64)])
                .await
                .map_err(error)?;
            if let Some(kept) = kept {
                return Ok(Kept::Already(promise_from_row(&kept)?));
            }
            let status: String = found.try_get(0).map_err(error)?;
            if RunStatus::parse(&status).is_some_and(RunStatus::is_finished) {
                return Err(StoreError::Ended { run_id, status });
            }
            transaction
                .execute(
                    "INSERT INTO promises (run_id, id, state, value, by, at) \
                     VALUES ($1, $2, $3, $4, $5, $6)",
                    &[
                        &run_id,
                        &(id as i64),
                        &completion.state.as_str(),
                        &completion.value,
                        &completion.by,
                        &completion.at_ms,
                    ],
                )
                .await
                .map_err(error)?;
            let arrival = stephost_core::promises::arrival(&run_id, id, &completion);
            let arrivals: i64 = transaction
                .query_one(
                    "UPDATE runs SET arrivals = arrivals + 1, version = version + 1, \
                     wake_at = CASE WHEN status = 'waiting' THEN $2 ELSE wake_at END, \
                     due_at = CASE WHEN status = 'waiting' THEN $2 ELSE due_at END \
                     WHERE run_id = $1 RETURNING arrivals",
                    &[&run_id, &arrival.at_ms],
                )
                .await
                .map_err(error)?
                .try_get(0)
                .map_err(error)?;
            transaction
                .execute(
                    "INSERT INTO inbox (run_id, arrival, child_run_id, join_set, status, at) \
                     VALUES ($1, $2, $3, $4, $5, $6)",
                    &[
                        &run_id,
                        &arrivals,
                        &arrival.child_run_id,
                        &arrival.join_set,
                        &arrival.status.as_str(),
                        &arrival.at_ms,
                    ],
                )
                .await
                .map_err(error)?;
            transaction.commit().await.map_err(error)?;
            Ok(Kept::Now)
        })
    }

    fn settle(&self, s: &Settlement) -> StoreResult<()> {
        let s = s.clone();
        self.shared.block(move |mut conn| async move {
            let mut bodies = Bodies::default();
            let (outcome, split) = bodies.store(&s.outcome);
            let decide = conn
                .statement(
                    "UPDATE calls SET state = $3, outcome = $4, outcome_split = $5, \
                     finished_at = $6, resolved_by = $7, resolved_at = $6, chain = $8 \
                     WHERE run_id = $1 AND seq = $2 AND state = $9",
                )
                .await?;
            let swap = conn.statement(rows::SWAP_RUN).await?;
            let payloads = conn.statement(rows::INSERT_PAYLOADS).await?;
            let counters = conn.statement(ADD_COUNTERS).await?;
            let transaction = conn.client.transaction().await.map_err(error)?;
            if !bodies.is_empty() {
                transaction
                    .execute(&payloads, &[&bodies.digests, &bodies.parts])
                    .await
                    .map_err(error)?;
            }
            // The run's row first, then its call's: the order every commit
            // locks them in, so a decision and a commit never wait on each
            // other in a cycle.
            let mut values = rows::run_values(&s.run);
            values.push(boxed(s.expected_version));
            let swapped = transaction
                .execute(&swap, &refs(&values))
                .await
                .map_err(error)?;
            if swapped != 1 {
                drop(transaction);
                return Err(rows::version_conflict(&mut conn, &s.run_id, s.expected_version).await);
            }
            let decided = transaction
                .execute(
                    &decide,
                    &[
                        &s.run_id,
                        &(s.seq as i64),
                        &s.state.as_str(),
                        &outcome,
                        &split,
                        &s.at_ms,
                        &s.by,
                        &s.chain,
                        &s.expected_state.as_str(),
                    ],
                )
                .await
                .map_err(error)?;
            if decided != 1 {
                drop(transaction);
                let found = rows::calls(&mut conn, &s.run_id, s.seq, 1)
                    .await?
                    .pop()
                    .filter(|c| c.seq == s.seq)
                    .map(|c| c.state.as_str().to_string())
                    .unwrap_or_else(|| "not recorded".into());
                return Err(StoreError::CallConflict {
                    run_id: s.run_id.clone(),
                    seq: s.seq,
                    expected: s.expected_state,
                    found,
                });
            }
            if !s.counters.is_empty() {
                transaction
                    .execute(&counters, &refs(&counter_values(&s.counters)))
                    .await
                    .map_err(error)?;
            }
            transaction.commit().await.map_err(error)
        })
    }

    fn add_counters(&self, counters: &Counters) -> StoreResult<()> {
        if counters.is_empty() {
            return Ok(());
        }
        let values = counter_values(counters);
        self.shared.block(move |mut conn| async move {
            let statement = conn.statement(ADD_COUNTERS).await?;
            conn.client
                .execute(&statement, &refs(&values))
                .await
                .map_err(error)?;
            Ok(())
        })
    }
}

impl Outbox for PgStore {
    fn owe_notices(&self, notices: &[Notice]) -> StoreResult<usize> {
        if notices.is_empty() {
            return Ok(0);
        }
        let notices = notices.to_vec();
        self.shared.block(move |mut conn| async move {
            let sql = format!(
                "INSERT INTO notices ({}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) \
                 ON CONFLICT (delivery_id) DO NOTHING",
                rows::NOTICE_COLUMNS
            );
            let tx = conn.client.transaction().await.map_err(error)?;
            let statement = tx.prepare(&sql).await.map_err(error)?;
            let mut new = 0;
            for n in &notices {
                new += tx
                    .execute(
                        &statement,
                        &[
                            &n.delivery_id,
                            &n.webhook,
                            &n.event.as_str(),
                            &n.run_id,
                            &n.body,
                            &n.created_at_ms,
                            &n.state.as_str(),
                            &n.next_at_ms,
                            &(n.attempts.min(i32::MAX as u32) as i32),
                            &n.delivered_at_ms,
                            &n.last_error,
                        ],
                    )
                    .await
                    .map_err(error)? as usize;
            }
            tx.commit().await.map_err(error)?;
            Ok(new)
        })
    }

    fn take_notices(
        &self,
        webhooks: &[String],
        now_ms: i64,
        hold_until_ms: i64,
        limit: usize,
    ) -> StoreResult<Vec<Notice>> {
        let limit = limit.min(i64::MAX as usize) as i64;
        let webhooks = webhooks.to_vec();
        self.shared.block(move |conn| async move {
            let found = conn
                .client
                .query(
                    format!(
                        "WITH due AS (SELECT no AS due_no, next_at AS was FROM notices \
                         WHERE state = 'owed' AND next_at <= $1 AND webhook = ANY($4) \
                         ORDER BY next_at, no LIMIT $3 FOR UPDATE SKIP LOCKED) \
                         UPDATE notices SET next_at = $2 FROM due WHERE no = due_no \
                         RETURNING {}, was, no",
                        rows::NOTICE_COLUMNS
                    )
                    .as_str(),
                    &[&now_ms, &hold_until_ms, &limit, &webhooks],
                )
                .await
                .map_err(error)?;
            let mut taken = found
                .iter()
                .map(|row| {
                    let was: i64 = row.try_get(11).map_err(error)?;
                    let no: i64 = row.try_get(12).map_err(error)?;
                    Ok(((was, no), rows::notice_from_row(row)?))
                })
                .collect::<StoreResult<Vec<_>>>()?;
            // RETURNING gives no order: earliest due first, then owed first.
            taken.sort_by_key(|(order, _)| *order);
            Ok(taken.into_iter().map(|(_, n)| n).collect())
        })
    }

    fn notice_tried(
        &self,
        delivery_id: &str,
        held_until_ms: i64,
        attempt: &NoticeAttempt,
    ) -> StoreResult<bool> {
        let (state, next_at, delivered_at, last_error) = attempt.columns();
        let (delivery_id, last_error) = (delivery_id.to_string(), last_error.map(str::to_string));
        self.shared.block(move |conn| async move {
            let changed = conn
                .client
                .execute(
                    "UPDATE notices SET attempts = attempts + 1, state = $2, \
                     next_at = coalesce($3, next_at), delivered_at = coalesce($4, delivered_at), \
                     last_error = coalesce($5, last_error) \
                     WHERE delivery_id = $1 AND state = 'owed' AND next_at = $6",
                    &[
                        &delivery_id,
                        &state.as_str(),
                        &next_at,
                        &delivered_at,
                        &last_error,
                        &held_until_ms,
                    ],
                )
                .await
                .map_err(error)?;
            Ok(changed == 1)
        })
    }
}

async fn attempts_of(
    conn: &mut crate::conns::PgConn,
    run_id: &str,
    seq: Option<u64>,
) -> StoreResult<Vec<AttemptRecord>> {
    let statement = conn
        .statement(
            "SELECT seq, attempts::text FROM calls WHERE run_id = $1 \
             AND ($2::int8 IS NULL OR seq = $2) AND attempts IS NOT NULL ORDER BY seq",
        )
        .await?;
    let found = conn
        .client
        .query(&statement, &[&run_id, &seq.map(|s| s as i64)])
        .await
        .map_err(error)?;
    let mut all = Vec::new();
    for row in found {
        let seq: i64 = row.get(0);
        let text: &str = row.get(1);
        all.extend(AttemptRecord::from_stored_json(seq as u64, text)?);
    }
    Ok(all)
}

const SELECT_PROMISE: &str =
    "SELECT state, value, by, at FROM promises WHERE run_id = $1 AND id = $2";

fn promise_from_row(row: &tokio_postgres::Row) -> StoreResult<stephost_core::promises::Completion> {
    let state: String = row.try_get(0).map_err(error)?;
    Ok(stephost_core::promises::Completion {
        state: stephost_core::promises::PromiseState::parse(&state)
            .ok_or_else(|| StoreError::Corrupt(format!("a promise in state {state:?}")))?,
        value: row.try_get(1).map_err(error)?,
        by: row.try_get(2).map_err(error)?,
        at_ms: row.try_get(3).map_err(error)?,
    })
}
