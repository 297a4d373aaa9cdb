//! Reads, listings and compare-and-set writes on a connection of their own.

use std::cell::RefCell;

use rusqlite::{OptionalExtension, params, params_from_iter};
use stephost_core::History;
use stephost_core::journal::Counters;
use stephost_core::store::{OpenCall, RunQuery, Settlement, Store, StoreResult};
use stephost_core::{
    AttemptRecord, CallRecord, CallState, LogRecord, RunRecord, RunStatus, StoreError,
};

use crate::commit::add_counters;
use crate::conn::{Conn, Sync, error};
use crate::rows::{self, RUN_COLUMNS};

/// A store over one connection (a store is used by one thread at a time;
/// each caller takes its own from the pool).
pub struct SqliteStore {
    conn: RefCell<Conn>,
}

impl SqliteStore {
    pub(crate) fn new(conn: Conn) -> Self {
        SqliteStore {
            conn: RefCell::new(conn),
        }
    }

    /// Runs `f` in a write transaction, fsync'd at commit.
    fn write<T>(&self, f: impl FnOnce(&rusqlite::Connection) -> StoreResult<T>) -> StoreResult<T> {
        self.write_synced(Sync::Full, f)
    }

    /// Runs `f` in a write transaction, committed in `sync` mode.
    fn write_synced<T>(
        &self,
        sync: Sync,
        f: impl FnOnce(&rusqlite::Connection) -> StoreResult<T>,
    ) -> StoreResult<T> {
        let mut conn = self.conn.borrow_mut();
        conn.set_sync(sync)?;
        let conn = &conn.conn;
        conn.execute_batch("BEGIN IMMEDIATE").map_err(error)?;
        match f(conn) {
            Ok(value) => {
                conn.execute_batch("COMMIT").map_err(error)?;
                Ok(value)
            }
            Err(e) => {
                let _ = conn.execute_batch("ROLLBACK");
                Err(e)
            }
        }
    }

    fn read<T>(&self, f: impl FnOnce(&rusqlite::Connection) -> StoreResult<T>) -> StoreResult<T> {
        f(&self.conn.borrow().conn)
    }
}

impl Store for SqliteStore {
    fn put_module(&self, digest: &str, bytes: &[u8]) -> StoreResult<()> {
        self.write(|conn| {
            conn.prepare_cached(
                "INSERT INTO modules (digest, bytes, size, created_at) VALUES (?1, ?2, ?3, ?4) \
                 ON CONFLICT (digest) DO NOTHING",
            )
            .and_then(|mut s| {
                s.execute(params![
                    digest,
                    bytes,
                    bytes.len() as i64,
                    stephost_core::clock::now_ms()
                ])
            })
            .map_err(error)?;
            Ok(())
        })
    }

    fn module(&self, digest: &str) -> StoreResult<Vec<u8>> {
        self.read(|conn| {
            conn.prepare_cached("SELECT bytes FROM modules WHERE digest = ?1")
                .and_then(|mut s| s.query_row([digest], |r| r.get(0)).optional())
                .map_err(error)?
                .ok_or_else(|| StoreError::UnknownModule(digest.to_string()))
        })
    }

    fn insert_run(&self, run: &RunRecord) -> StoreResult<RunRecord> {
        self.write(|conn| {
            if rows::insert_run(conn, run)? {
                Ok(run.clone())
            } else {
                rows::run(conn, &run.run_id)
            }
        })
    }

    fn run(&self, run_id: &str) -> StoreResult<RunRecord> {
        self.read(|conn| rows::run(conn, run_id))
    }

    fn runs(&self, query: &RunQuery) -> StoreResult<Vec<RunRecord>> {
        let mut sql = format!("SELECT {RUN_COLUMNS} FROM runs WHERE 1");
        let mut values: Vec<rusqlite::types::Value> = Vec::new();
        let mut bind = |sql: &mut String, clause: &str, value: rusqlite::types::Value| {
            values.push(value);
            sql.push_str(&clause.replace('?', &format!("?{}", values.len())));
        };
        if let Some(status) = query.status {
            bind(
                &mut sql,
                " AND status = ?",
                status.as_str().to_string().into(),
            );
        }
        if let Some(digest) = &query.module_digest {
            bind(&mut sql, " AND module_digest = ?", digest.clone().into());
        }
        if let Some(step) = &query.step {
            bind(&mut sql, " AND step = ?", step.clone().into());
        }
        if let Some(after) = query.created_after_ms {
            bind(&mut sql, " AND created_at > ?", after.into());
        }
        if let Some(before) = query.created_before_ms {
            bind(&mut sql, " AND created_at < ?", before.into());
        }
        if let Some(after) = &query.after_run_id {
            bind(
                &mut sql,
                " AND (created_at, run_id) < (SELECT created_at, run_id FROM runs WHERE run_id = ?)",
                after.clone().into(),
            );
        }
        sql.push_str(" ORDER BY created_at DESC, run_id DESC");
        if let Some(limit) = query.limit {
            bind(
                &mut sql,
                " LIMIT ?",
                (limit.min(i64::MAX as usize) as i64).into(),
            );
        }
        self.read(|conn| {
            conn.prepare_cached(&sql)
                .and_then(|mut s| {
                    s.query_map(params_from_iter(values), rows::run_from_row)?
                        .collect()
                })
                .map_err(error)
        })
    }

    fn status_counts(&self) -> StoreResult<Vec<(RunStatus, u64)>> {
        self.read(|conn| {
            let counts: Vec<(String, i64)> = conn
                .prepare_cached("SELECT status, count(*) FROM runs GROUP BY status ORDER BY status")
                .and_then(|mut s| s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
                .map_err(error)?;
            counts
                .into_iter()
                .map(|(status, n)| {
                    RunStatus::parse(&status)
                        .map(|s| (s, n as u64))
                        .ok_or_else(|| StoreError::Corrupt(format!("a run has status {status:?}")))
                })
                .collect()
        })
    }

    fn due_runs(&self, limit: usize) -> StoreResult<Vec<RunRecord>> {
        self.read(|conn| {
            conn.prepare_cached(&format!(
                "SELECT {RUN_COLUMNS} FROM runs WHERE due_at IS NOT NULL \
                 ORDER BY due_at, run_id LIMIT ?1"
            ))
            .and_then(|mut s| {
                s.query_map([limit.min(i64::MAX as usize) as i64], rows::run_from_row)?
                    .collect()
            })
            .map_err(error)
        })
    }

    fn swap_run(&self, expected_version: i64, run: &RunRecord, durable: bool) -> StoreResult<()> {
        self.write_synced(Sync::when(durable), |conn| {
            match rows::swap_run(conn, expected_version, run)? {
                1 => Ok(()),
                _ => Err(rows::version_conflict(conn, &run.run_id, expected_version)),
            }
        })
    }

    fn calls(&self, run_id: &str, from_seq: u64, limit: usize) -> StoreResult<Vec<CallRecord>> {
        self.read(|conn| {
            rows::run(conn, run_id)?;
            rows::calls(conn, run_id, from_seq, limit)
        })
    }

    fn history(&self, run_id: &str) -> StoreResult<History> {
        self.read(|conn| {
            rows::run(conn, run_id)?;
            let calls = rows::calls(conn, run_id, 1, usize::MAX)?;
            let last_attempts = match calls.last() {
                Some(last) if last.state == CallState::Started => {
                    attempts_of(conn, run_id, Some(last.seq))?
                        .iter()
                        .map(|a| a.attempt)
                        .max()
                        .unwrap_or(0)
                }
                _ => 0,
            };
            Ok(History::checked(run_id, calls)?.with_last_attempts(last_attempts))
        })
    }

    fn attempts(&self, run_id: &str, seq: Option<u64>) -> StoreResult<Vec<AttemptRecord>> {
        self.read(|conn| {
            rows::run(conn, run_id)?;
            attempts_of(conn, run_id, seq)
        })
    }

    fn logs(&self, run_id: &str) -> StoreResult<Vec<LogRecord>> {
        self.read(|conn| {
            rows::run(conn, run_id)?;
            conn.prepare_cached(
                "SELECT after_seq, level, message, at FROM logs WHERE run_id = ?1 ORDER BY id",
            )
            .and_then(|mut s| {
                s.query_map([run_id], |r| {
                    Ok(LogRecord {
                        after_seq: r.get::<_, i64>(0)? as u64,
                        level: r.get(1)?,
                        message: r.get(2)?,
                        at_ms: r.get(3)?,
                    })
                })?
                .collect()
            })
            .map_err(error)
        })
    }

    fn open_calls(&self, state: CallState, interface: Option<&str>) -> StoreResult<Vec<OpenCall>> {
        self.read(|conn| {
            let keys: Vec<(String, i64)> = conn
                .prepare_cached(
                    "SELECT c.run_id, c.seq FROM calls c JOIN runs r ON r.run_id = c.run_id \
                     WHERE c.state = ?1 AND c.state IN ('started', 'unknown') \
                     AND (?2 IS NULL OR c.interface = ?2) \
                     AND r.status NOT IN ('completed', 'failed', 'diverged') \
                     ORDER BY c.started_at, c.run_id",
                )
                .and_then(|mut s| {
                    s.query_map(params![state.as_str(), interface], |r| {
                        Ok((r.get(0)?, r.get(1)?))
                    })?
                    .collect()
                })
                .map_err(error)?;
            keys.into_iter()
                .map(|(run_id, seq)| {
                    let run = rows::run(conn, &run_id)?;
                    let call = rows::calls(conn, &run_id, seq as u64, 1)?
                        .pop()
                        .ok_or_else(|| {
                            StoreError::Corrupt(format!("call #{seq} of {run_id} vanished"))
                        })?;
                    Ok(OpenCall { run, call })
                })
                .collect()
        })
    }

    fn settle(&self, s: &Settlement) -> StoreResult<()> {
        self.write(|conn| {
            let (outcome, split) = rows::store_body(conn, &s.outcome)?;
            let changed = conn
                .prepare_cached(
                    "UPDATE calls SET state = ?3, outcome = ?4, outcome_split = ?5, \
                     finished_at = ?6, resolved_by = ?7, resolved_at = ?6, chain = ?8 \
                     WHERE run_id = ?1 AND seq = ?2 AND state = ?9",
                )
                .and_then(|mut stmt| {
                    stmt.execute(params![
                        s.run_id,
                        s.seq as i64,
                        s.state.as_str(),
                        outcome,
                        split,
                        s.at_ms,
                        s.by,
                        s.chain,
                        s.expected_state.as_str()
                    ])
                })
                .map_err(error)?;
            if changed != 1 {
                let found = rows::calls(conn, &s.run_id, s.seq, 1)?
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
            if rows::swap_run(conn, s.expected_version, &s.run)? != 1 {
                return Err(rows::version_conflict(conn, &s.run_id, s.expected_version));
            }
            add_counters(conn, &s.counters)
        })
    }

    fn add_counters(&self, counters: &Counters) -> StoreResult<()> {
        if counters.is_empty() {
            return Ok(());
        }
        self.write(|conn| add_counters(conn, counters))
    }

    fn counters(&self) -> StoreResult<Vec<(String, i64)>> {
        self.read(|conn| {
            conn.prepare_cached("SELECT name, value FROM counters ORDER BY name")
                .and_then(|mut s| s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
                .map_err(error)
        })
    }
}

fn attempts_of(
    conn: &rusqlite::Connection,
    run_id: &str,
    seq: Option<u64>,
) -> StoreResult<Vec<AttemptRecord>> {
    let rows: Vec<(i64, String)> = conn
        .prepare_cached(
            "SELECT seq, attempts FROM calls WHERE run_id = ?1 AND attempts IS NOT NULL \
             AND (?2 IS NULL OR seq = ?2) ORDER BY seq",
        )
        .and_then(|mut s| {
            s.query_map(params![run_id, seq.map(|s| s as i64)], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })?
            .collect()
        })
        .map_err(error)?;
    let mut all = Vec::new();
    for (seq, text) in rows {
        all.extend(rows::attempts_from_json(seq as u64, &text)?);
    }
    Ok(all)
}
