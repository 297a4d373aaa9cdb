//! Schedules in the ledger file ([`stephost_core::schedules`]): a row per
//! schedule, swapped by compare-and-set on its version. A person's change
//! (add, pause, resume, remove) is fsync'd; a worker's move past the slots
//! it fired is not: lost in a crash, the next look fires the same run ids
//! again, which are found, not made twice.

use rusqlite::{OptionalExtension, Row, params};
use stephost_core::StoreResult;
use stephost_core::schedules::{Overlap, Schedule, Schedules};

use crate::conn::Sync;
use crate::errors::error;
use crate::flows::SqliteFlows;

const COLUMNS: &str = "name, cron, timezone, module_digest, world, step, input, overlap, \
     catch_up, paused, next_at, last_run_id, buffered_at, created_at, updated_at, version";

fn from_row(r: &Row<'_>) -> rusqlite::Result<Schedule> {
    let overlap: String = r.get(7)?;
    Ok(Schedule {
        name: r.get(0)?,
        cron: r.get(1)?,
        timezone: r.get(2)?,
        module_digest: r.get(3)?,
        world: r.get(4)?,
        step: r.get(5)?,
        input: r.get(6)?,
        overlap: Overlap::parse(&overlap).map_err(|e| {
            rusqlite::Error::FromSqlConversionFailure(7, rusqlite::types::Type::Text, e.into())
        })?,
        catch_up_ms: r.get(8)?,
        paused: r.get(9)?,
        next_at_ms: r.get(10)?,
        last_run_id: r.get(11)?,
        buffered_at_ms: r.get(12)?,
        created_at_ms: r.get(13)?,
        updated_at_ms: r.get(14)?,
        version: r.get(15)?,
    })
}

fn query(
    conn: &rusqlite::Connection,
    sql: &str,
    values: impl rusqlite::Params,
) -> StoreResult<Vec<Schedule>> {
    conn.prepare_cached(sql)
        .and_then(|mut s| s.query_map(values, from_row)?.collect())
        .map_err(error)
}

impl Schedules for SqliteFlows {
    fn add(&self, s: &Schedule) -> StoreResult<bool> {
        self.with_store(|store| {
            store.write_synced(Sync::Full, |conn| {
                conn.prepare_cached(&format!(
                    "INSERT INTO schedules ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, \
                     ?9, ?10, ?11, ?12, ?13, ?14, ?15, 1) ON CONFLICT (name) DO NOTHING"
                ))
                .and_then(|mut st| {
                    st.execute(params![
                        s.name,
                        s.cron,
                        s.timezone,
                        s.module_digest,
                        s.world,
                        s.step,
                        s.input,
                        s.overlap.as_str(),
                        s.catch_up_ms,
                        s.paused,
                        s.next_at_ms,
                        s.last_run_id,
                        s.buffered_at_ms,
                        s.created_at_ms,
                        s.updated_at_ms
                    ])
                })
                .map(|n| n == 1)
                .map_err(error)
            })
        })
    }

    fn list(&self) -> StoreResult<Vec<Schedule>> {
        self.with_store(|store| {
            store.read(|conn| {
                query(
                    conn,
                    &format!("SELECT {COLUMNS} FROM schedules ORDER BY name"),
                    [],
                )
            })
        })
    }

    fn get(&self, name: &str) -> StoreResult<Option<Schedule>> {
        self.with_store(|store| {
            store.read(|conn| {
                conn.prepare_cached(&format!("SELECT {COLUMNS} FROM schedules WHERE name = ?1"))
                    .and_then(|mut s| s.query_row([name], from_row).optional())
                    .map_err(error)
            })
        })
    }

    fn due(&self, now_ms: i64, limit: usize) -> StoreResult<Vec<Schedule>> {
        let limit = limit.min(i64::MAX as usize) as i64;
        self.with_store(|store| {
            store.read(|conn| {
                query(
                    conn,
                    &format!(
                        "SELECT {COLUMNS} FROM schedules WHERE paused = 0 AND (next_at <= ?1 \
                         OR buffered_at IS NOT NULL) ORDER BY next_at LIMIT ?2"
                    ),
                    params![now_ms, limit],
                )
            })
        })
    }

    fn next_at(&self) -> StoreResult<Option<i64>> {
        self.with_store(|store| {
            store.read(|conn| {
                conn.prepare_cached("SELECT min(next_at) FROM schedules WHERE paused = 0")
                    .and_then(|mut s| s.query_row([], |r| r.get(0)))
                    .map_err(error)
            })
        })
    }

    fn swap(&self, expected: i64, s: &Schedule, durable: bool) -> StoreResult<bool> {
        self.with_store(|store| {
            store.write_synced(Sync::when(durable), |conn| {
                conn.prepare_cached(
                    "UPDATE schedules SET paused = ?3, next_at = ?4, last_run_id = ?5, \
                     buffered_at = ?6, updated_at = ?7, version = version + 1 \
                     WHERE name = ?1 AND version = ?2",
                )
                .and_then(|mut st| {
                    st.execute(params![
                        s.name,
                        expected,
                        s.paused,
                        s.next_at_ms,
                        s.last_run_id,
                        s.buffered_at_ms,
                        s.updated_at_ms
                    ])
                })
                .map(|n| n == 1)
                .map_err(error)
            })
        })
    }

    fn remove(&self, name: &str) -> StoreResult<bool> {
        self.with_store(|store| {
            store.write_synced(Sync::Full, |conn| {
                conn.prepare_cached("DELETE FROM schedules WHERE name = ?1")
                    .and_then(|mut s| s.execute([name]))
                    .map(|n| n == 1)
                    .map_err(error)
            })
        })
    }
}
