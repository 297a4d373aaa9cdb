//! Reads, listings and compare-and-set writes on a connection of their own.

use std::cell::RefCell;

use rusqlite::{OptionalExtension, params, params_from_iter};
use stephost_core::History;
use stephost_core::journal::Counters;
use stephost_core::notices::{Notice, NoticeAttempt};
use stephost_core::store::{OpenCall, Outbox, RunQuery, Settlement, Store, StoreResult, Views};
use stephost_core::{
    AttemptRecord, CallRecord, CallState, InboxEntry, LogRecord, RunRecord, RunStatus, StoreError,
};

use crate::commit::add_counters;
use crate::conn::{Conn, Sync};
use crate::errors::error;
use crate::rows::{self, RUN_COLUMNS};
use crate::segments;

/// A store over one connection (a store is used by one thread at a time;
/// each caller takes its own from the pool).
pub struct SqliteStore {
    conn: RefCell<Conn>,
    /// The ledger file, for the connections a long history is read on.
    path: std::path::PathBuf,
}

/// Histories at least this long are read while they are replayed.
pub const STREAM_CALLS_MIN: usize = 4096;

impl SqliteStore {
    pub(crate) fn new(conn: Conn, path: &std::path::Path) -> Self {
        SqliteStore {
            conn: RefCell::new(conn),
            path: path.to_path_buf(),
        }
    }

    /// Runs `f` in a write transaction, fsync'd at commit.
    pub(crate) fn write<T>(
        &self,
        f: impl FnOnce(&rusqlite::Connection) -> StoreResult<T>,
    ) -> StoreResult<T> {
        self.write_synced(Sync::Full, f)
    }

    /// Runs `f` in a write transaction, committed in `sync` mode.
    pub(crate) fn write_synced<T>(
        &self,
        sync: Sync,
        f: impl FnOnce(&rusqlite::Connection) -> StoreResult<T>,
    ) -> StoreResult<T> {
        let mut conn = self.conn.borrow_mut();
        conn.set_sync(sync)?;
        let db = &conn.conn;
        Conn::run(db, "BEGIN IMMEDIATE")?;
        let done = f(db).and_then(|value| Conn::run(db, "COMMIT").map(|()| value));
        if done.is_err() {
            let _ = Conn::run(db, "ROLLBACK");
        }
        conn.ended(done.is_ok());
        done
    }

    /// Runs `f` in a write transaction that is rolled back whatever it
    /// did (what a change would do, without doing it).
    pub(crate) fn rolled_back<T>(
        &self,
        f: impl FnOnce(&rusqlite::Connection) -> StoreResult<T>,
    ) -> StoreResult<T> {
        let conn = self.conn.borrow_mut();
        let db = &conn.conn;
        Conn::run(db, "BEGIN IMMEDIATE")?;
        let done = f(db);
        Conn::run(db, "ROLLBACK")?;
        done
    }

    pub(crate) fn read<T>(
        &self,
        f: impl FnOnce(&rusqlite::Connection) -> StoreResult<T>,
    ) -> StoreResult<T> {
        f(&self.conn.borrow().conn)
    }
}

impl Views for SqliteStore {
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

    fn module(&self, digest: &str) -> StoreResult<Vec<u8>> {
        self.read(|conn| {
            conn.prepare_cached("SELECT bytes FROM modules WHERE digest = ?1")
                .and_then(|mut s| s.query_row([digest], |r| r.get(0)).optional())
                .map_err(error)?
                .ok_or_else(|| StoreError::UnknownModule(digest.to_string()))
        })
    }

    fn run(&self, run_id: &str) -> StoreResult<RunRecord> {
        self.read(|conn| rows::run(conn, run_id))
    }

    fn runs(&self, query: &RunQuery) -> StoreResult<Vec<RunRecord>> {
        if !query.may_match() {
            return Ok(Vec::new());
        }
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
        if let Some(after) = query.updated_after_ms {
            bind(&mut sql, " AND updated_at > ?", after.into());
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

    fn calls(&self, run_id: &str, from_seq: u64, limit: usize) -> StoreResult<Vec<CallRecord>> {
        self.read(|conn| {
            rows::run(conn, run_id)?;
            rows::calls(conn, run_id, from_seq, limit)
        })
    }

    fn history(&self, run_id: &str) -> StoreResult<History> {
        self.read(|conn| {
            let run_no = rows::run_no(conn, run_id)?;
            let total = segments::last_seq(conn, run_no)?;
            let last = segments::calls(conn, run_no, total.max(1), 1)?.pop();
            let last_attempts = match last {
                Some(last) if last.state == CallState::Started => {
                    attempts_of(conn, run_id, Some(last.seq))?
                        .iter()
                        .map(|a| a.attempt)
                        .max()
                        .unwrap_or(0)
                }
                _ => 0,
            };
            let history = if (total as usize) < STREAM_CALLS_MIN {
                History::checked(run_id, segments::calls(conn, run_no, 1, total as usize)?)?
            } else {
                let chunks = crate::stream::chunks(&self.path, run_no, total as usize)?;
                History::streamed(run_id, total as usize, chunks)
            };
            Ok(history.with_last_attempts(last_attempts))
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
            let run_no = rows::run_no(conn, run_id)?;
            conn.prepare_cached(
                "SELECT after_seq, level, message, at FROM logs WHERE run_no = ?1 ORDER BY id",
            )
            .and_then(|mut s| {
                s.query_map([run_no], |r| {
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
        // A call a person waits on is the last call of an unfinished run: a
        // run stops at an approval it waits for and at an unknown outcome.
        self.read(|conn| {
            let unfinished: Vec<(String, i64)> = conn
                .prepare_cached(
                    "SELECT run_id, run_no FROM runs \
                     WHERE status = 'running' OR status = 'waiting' OR status = 'parked'",
                )
                .and_then(|mut s| s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
                .map_err(error)?;
            let mut open = Vec::new();
            for (run_id, run_no) in unfinished {
                let last = segments::last_seq(conn, run_no)?;
                if last == 0 {
                    continue;
                }
                let Some(call) = segments::calls(conn, run_no, last, 1)?.pop() else {
                    continue;
                };
                if call.state == state && interface.is_none_or(|i| call.interface == i) {
                    open.push(OpenCall {
                        run: rows::run(conn, &run_id)?,
                        call,
                    });
                }
            }
            open.sort_by(|a, b| {
                (a.call.started_at_ms, &a.run.run_id).cmp(&(b.call.started_at_ms, &b.run.run_id))
            });
            Ok(open)
        })
    }

    fn counters(&self) -> StoreResult<Vec<(String, i64)>> {
        self.read(|conn| {
            conn.prepare_cached("SELECT name, value FROM counters ORDER BY name")
                .and_then(|mut s| s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
                .map_err(error)
        })
    }

    fn notices(&self, run_id: Option<&str>, limit: usize) -> StoreResult<Vec<Notice>> {
        self.read(|conn| {
            conn.prepare_cached(&format!(
                "SELECT {} FROM notices WHERE ?1 IS NULL OR run_id = ?1 ORDER BY no LIMIT ?2",
                rows::NOTICE_COLUMNS
            ))
            .and_then(|mut s| {
                s.query_map(
                    params![run_id, limit.min(i64::MAX as usize) as i64],
                    rows::notice_from_row,
                )?
                .collect::<Result<Vec<_>, _>>()
            })
            .map_err(error)
        })
    }

    fn inbox(&self, run_id: &str) -> StoreResult<Vec<InboxEntry>> {
        self.read(|conn| {
            let run_no = rows::run_no(conn, run_id)?;
            rows::inbox(conn, run_no)
        })
    }

    fn tree_size(&self, root_run_id: &str) -> StoreResult<u64> {
        self.read(|conn| {
            conn.prepare_cached("SELECT count(*) FROM runs WHERE root_run_id = ?1")
                .and_then(|mut s| s.query_row([root_run_id], |r| r.get::<_, i64>(0)))
                .map(|n| n.max(0) as u64)
                .map_err(error)
        })
    }

    fn promise(
        &self,
        run_id: &str,
        id: u64,
    ) -> StoreResult<Option<stephost_core::promises::Completion>> {
        self.read(|conn| {
            let run_no = rows::run_no(conn, run_id)?;
            rows::promise(conn, run_no, id)
        })
    }

    fn children(&self, run_id: &str) -> StoreResult<Vec<RunRecord>> {
        self.read(|conn| {
            rows::run_no(conn, run_id)?;
            conn.prepare_cached(&format!(
                "SELECT {RUN_COLUMNS} FROM runs WHERE parent_run_id = ?1 ORDER BY parent_seq"
            ))
            .and_then(|mut s| s.query_map([run_id], rows::run_from_row)?.collect())
            .map_err(error)
        })
    }

    fn forks(&self, run_id: &str) -> StoreResult<Vec<RunRecord>> {
        self.read(|conn| {
            rows::run_no(conn, run_id)?;
            conn.prepare_cached(&format!(
                "SELECT {RUN_COLUMNS} FROM runs WHERE fork_of = ?1 ORDER BY created_at, run_id"
            ))
            .and_then(|mut s| s.query_map([run_id], rows::run_from_row)?.collect())
            .map_err(error)
        })
    }

    fn last_call(&self, run_id: &str) -> StoreResult<Option<CallRecord>> {
        self.read(|conn| {
            let run_no = rows::run_no(conn, run_id)?;
            match segments::last_seq(conn, run_no)? {
                0 => Ok(None),
                last => Ok(segments::calls(conn, run_no, last, 1)?.pop()),
            }
        })
    }
}

impl Store for SqliteStore {
    fn complete_promise(
        &self,
        run_id: &str,
        id: u64,
        completion: &stephost_core::promises::Completion,
    ) -> StoreResult<stephost_core::promises::Kept> {
        self.write(|conn| {
            let run = rows::run(conn, run_id)?;
            let run_no = rows::run_no(conn, run_id)?;
            if let Some(kept) = rows::promise(conn, run_no, id)? {
                return Ok(stephost_core::promises::Kept::Already(kept));
            }
            if run.status.is_finished() {
                return Err(StoreError::Ended {
                    run_id: run_id.to_string(),
                    status: run.status.as_str().to_string(),
                });
            }
            conn.prepare_cached(
                "INSERT INTO promises (run_no, id, state, value, by, at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )
            .and_then(|mut s| {
                s.execute(params![
                    run_no,
                    id as i64,
                    completion.state.as_str(),
                    completion.value,
                    completion.by,
                    completion.at_ms
                ])
            })
            .map_err(error)?;
            rows::arrive(
                conn,
                &stephost_core::promises::arrival(run_id, id, completion),
            )?;
            Ok(stephost_core::promises::Kept::Now)
        })
    }

    fn cancel(
        &self,
        run_id: &str,
        request: &stephost_core::CancelRequest,
    ) -> StoreResult<Vec<String>> {
        self.write(|conn| {
            let run = rows::run(conn, run_id)?;
            if run.status.is_finished() {
                return Err(StoreError::Ended {
                    run_id: run_id.to_string(),
                    status: run.status.as_str().to_string(),
                });
            }
            let mut marked = Vec::new();
            rows::mark_cancelled(conn, &[run_id.to_string()], request, &mut marked)?;
            Ok(marked)
        })
    }

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
            // Kept an hour after, whatever retention does: the run this
            // module is stored for is recorded next.
            conn.prepare_cached(
                "INSERT INTO module_stored (digest, at) VALUES (?1, ?2) \
                 ON CONFLICT (digest) DO UPDATE SET at = excluded.at",
            )
            .and_then(|mut s| s.execute(params![digest, stephost_core::clock::now_ms()]))
            .map_err(error)?;
            Ok(())
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

    fn swap_run(&self, expected_version: i64, run: &RunRecord, durable: bool) -> StoreResult<()> {
        // One statement: atomic on its own, no transaction around it.
        let mut conn = self.conn.borrow_mut();
        conn.set_sync(Sync::when(durable))?;
        match rows::swap_run(&conn.conn, expected_version, run)? {
            1 => Ok(()),
            _ => Err(rows::version_conflict(
                &conn.conn,
                &run.run_id,
                expected_version,
            )),
        }
    }

    fn settle(&self, s: &Settlement) -> StoreResult<()> {
        self.write(|conn| {
            let run_no = rows::run_no(conn, &s.run_id)?;
            let (outcome, split) = rows::store_body(conn, run_no, &s.outcome)?;
            let key = segments::find(conn, run_no, s.seq)?.unwrap_or(0);
            let changed = conn
                .prepare_cached(
                    "UPDATE calls SET state = ?2, outcome = ?3, outcome_split = ?4, \
                     finished_at = ?5, resolved_by = ?6, resolved_at = ?5, chain = ?7 \
                     WHERE id = ?1 AND state = ?8",
                )
                .and_then(|mut stmt| {
                    stmt.execute(params![
                        key,
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
}

impl Outbox for SqliteStore {
    fn owe_notices(&self, notices: &[Notice]) -> StoreResult<usize> {
        if notices.is_empty() {
            return Ok(0);
        }
        self.write(|conn| {
            let mut new = 0;
            let mut insert = conn
                .prepare_cached(&format!(
                    "INSERT INTO notices ({}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, \
                     ?11) ON CONFLICT (delivery_id) DO NOTHING",
                    rows::NOTICE_COLUMNS
                ))
                .map_err(error)?;
            for n in notices {
                new += insert
                    .execute(params![
                        n.delivery_id,
                        n.webhook,
                        n.event.as_str(),
                        n.run_id,
                        n.body,
                        n.created_at_ms,
                        n.state.as_str(),
                        n.next_at_ms,
                        n.attempts,
                        n.delivered_at_ms,
                        n.last_error,
                    ])
                    .map_err(error)?;
            }
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
        if webhooks.is_empty() {
            return Ok(Vec::new());
        }
        let names: Vec<String> = (0..webhooks.len()).map(|i| format!("?{}", i + 4)).collect();
        let mut values: Vec<rusqlite::types::Value> = vec![
            now_ms.into(),
            hold_until_ms.into(),
            (limit.min(i64::MAX as usize) as i64).into(),
        ];
        values.extend(webhooks.iter().map(|w| w.clone().into()));
        // Read in the order they are due (then owed), and held, in one
        // write transaction.
        self.write(|conn| {
            let mut taken: Vec<(i64, Notice)> = conn
                .prepare_cached(&format!(
                    "SELECT no, {} FROM notices \
                     WHERE state = 'owed' AND next_at <= ?1 AND webhook IN ({}) \
                     ORDER BY next_at, no LIMIT ?3",
                    rows::NOTICE_COLUMNS,
                    names.join(", "),
                ))
                .and_then(|mut s| {
                    s.query_map(params_from_iter(values), |r| {
                        Ok((r.get(0)?, rows::notice_from_row_at(r, 1)?))
                    })?
                    .collect::<Result<Vec<_>, _>>()
                })
                .map_err(error)?;
            for (no, notice) in &mut taken {
                conn.prepare_cached("UPDATE notices SET next_at = ?2 WHERE no = ?1")
                    .and_then(|mut s| s.execute(params![*no, hold_until_ms]))
                    .map_err(error)?;
                notice.next_at_ms = hold_until_ms;
            }
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
        self.write(|conn| {
            let changed = conn
                .prepare_cached(
                    "UPDATE notices SET attempts = attempts + 1, state = ?2, \
                     next_at = coalesce(?3, next_at), delivered_at = coalesce(?4, delivered_at), \
                     last_error = coalesce(?5, last_error) \
                     WHERE delivery_id = ?1 AND state = 'owed' AND next_at = ?6",
                )
                .and_then(|mut s| {
                    s.execute(params![
                        delivery_id,
                        state.as_str(),
                        next_at,
                        delivered_at,
                        last_error,
                        held_until_ms
                    ])
                })
                .map_err(error)?;
            Ok(changed == 1)
        })
    }
}

fn attempts_of(
    conn: &rusqlite::Connection,
    run_id: &str,
    seq: Option<u64>,
) -> StoreResult<Vec<AttemptRecord>> {
    let run_no = rows::run_no(conn, run_id)?;
    let (from, limit) = match seq {
        Some(seq) => (seq, 1),
        None => (1, usize::MAX),
    };
    let rows: Vec<(i64, Option<String>)> =
        segments::read(conn, run_no, from, limit, "run_no, seq, attempts", |r| {
            Ok((r.get(1)?, r.get(2)?))
        })?;
    let mut all = Vec::new();
    for (seq, text) in rows {
        if let Some(text) = text {
            all.extend(AttemptRecord::from_stored_json(seq as u64, &text)?);
        }
    }
    Ok(all)
}
