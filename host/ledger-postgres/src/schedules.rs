//! Schedules in the ledger ([`stephost_core::schedules`]): a row per
//! schedule, swapped by compare-and-set on its version. Every change waits
//! for the WAL's flush (a worker's move past the slots it fired too: it is
//! one statement per firing, rare beside the runs it makes).

use stephost_core::schedules::{Overlap, Schedule, Schedules};
use stephost_core::{StoreError, StoreResult};
use tokio_postgres::Row;

use crate::errors::error;
use crate::flows::PgFlows;

const COLUMNS: &str = "name, cron, timezone, module_digest, world, step, input, overlap, \
     catch_up, paused, next_at, last_run_id, buffered_at, created_at, updated_at, version";

fn from_row(r: &Row) -> StoreResult<Schedule> {
    let overlap: &str = r.try_get(7).map_err(error)?;
    Ok(Schedule {
        name: r.try_get(0).map_err(error)?,
        cron: r.try_get(1).map_err(error)?,
        timezone: r.try_get(2).map_err(error)?,
        module_digest: r.try_get(3).map_err(error)?,
        world: r.try_get(4).map_err(error)?,
        step: r.try_get(5).map_err(error)?,
        input: r.try_get(6).map_err(error)?,
        overlap: Overlap::parse(overlap).map_err(StoreError::Corrupt)?,
        catch_up_ms: r.try_get(8).map_err(error)?,
        paused: r.try_get(9).map_err(error)?,
        next_at_ms: r.try_get(10).map_err(error)?,
        last_run_id: r.try_get(11).map_err(error)?,
        buffered_at_ms: r.try_get(12).map_err(error)?,
        created_at_ms: r.try_get(13).map_err(error)?,
        updated_at_ms: r.try_get(14).map_err(error)?,
        version: r.try_get(15).map_err(error)?,
    })
}

impl Schedules for PgFlows {
    fn add(&self, s: &Schedule) -> StoreResult<bool> {
        let s = s.clone();
        self.shared().block(move |conn| async move {
            let sql = format!(
                "INSERT INTO schedules ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, \
                 $10, $11, $12, $13, $14, $15, 1) ON CONFLICT (name) DO NOTHING"
            );
            let n = conn
                .client
                .execute(
                    &sql,
                    &[
                        &s.name,
                        &s.cron,
                        &s.timezone,
                        &s.module_digest,
                        &s.world,
                        &s.step,
                        &s.input,
                        &s.overlap.as_str(),
                        &s.catch_up_ms,
                        &s.paused,
                        &s.next_at_ms,
                        &s.last_run_id,
                        &s.buffered_at_ms,
                        &s.created_at_ms,
                        &s.updated_at_ms,
                    ],
                )
                .await
                .map_err(error)?;
            Ok(n == 1)
        })
    }

    fn list(&self) -> StoreResult<Vec<Schedule>> {
        self.shared().block(move |conn| async move {
            let sql = format!("SELECT {COLUMNS} FROM schedules ORDER BY name");
            let rows = conn.client.query(&sql, &[]).await.map_err(error)?;
            rows.iter().map(from_row).collect()
        })
    }

    fn get(&self, name: &str) -> StoreResult<Option<Schedule>> {
        let name = name.to_string();
        self.shared().block(move |conn| async move {
            let sql = format!("SELECT {COLUMNS} FROM schedules WHERE name = $1");
            let row = conn.client.query_opt(&sql, &[&name]).await.map_err(error)?;
            row.as_ref().map(from_row).transpose()
        })
    }

    fn due(&self, now_ms: i64, limit: usize) -> StoreResult<Vec<Schedule>> {
        let limit = limit.min(i64::MAX as usize) as i64;
        self.shared().block(move |conn| async move {
            let sql = format!(
                "SELECT {COLUMNS} FROM schedules WHERE NOT paused AND (next_at <= $1 \
                 OR buffered_at IS NOT NULL) ORDER BY next_at LIMIT $2"
            );
            let rows = conn
                .client
                .query(&sql, &[&now_ms, &limit])
                .await
                .map_err(error)?;
            rows.iter().map(from_row).collect()
        })
    }

    fn next_at(&self) -> StoreResult<Option<i64>> {
        self.shared().block(move |conn| async move {
            let row = conn
                .client
                .query_one("SELECT min(next_at) FROM schedules WHERE NOT paused", &[])
                .await
                .map_err(error)?;
            row.try_get(0).map_err(error)
        })
    }

    fn swap(&self, expected: i64, s: &Schedule, _durable: bool) -> StoreResult<bool> {
        let s = s.clone();
        self.shared().block(move |conn| async move {
            let n = conn
                .client
                .execute(
                    "UPDATE schedules SET paused = $3, next_at = $4, last_run_id = $5, \
                     buffered_at = $6, updated_at = $7, version = version + 1 \
                     WHERE name = $1 AND version = $2",
                    &[
                        &s.name,
                        &expected,
                        &s.paused,
                        &s.next_at_ms,
                        &s.last_run_id,
                        &s.buffered_at_ms,
                        &s.updated_at_ms,
                    ],
                )
                .await
                .map_err(error)?;
            Ok(n == 1)
        })
    }

    fn remove(&self, name: &str) -> StoreResult<bool> {
        let name = name.to_string();
        self.shared().block(move |conn| async move {
            let n = conn
                .client
                .execute("DELETE FROM schedules WHERE name = $1", &[&name])
                .await
                .map_err(error)?;
            Ok(n == 1)
        })
    }
}
