//! Deleting finished runs from the ledger file ([`stephost_core::retention`]).
//!
//! A batch is found by a read (no write lock: commits go on meanwhile),
//! then deleted in one write transaction that checks each tree again, so
//! that commits wait for at most one batch's deletes. The transaction is
//! not fsync'd: undone by a crash, the next batch deletes the same runs.
//! Free pages are reused by the next writes; a ledger made with
//! `auto_vacuum = INCREMENTAL` (every ledger this build creates) also
//! gives them back to the file system ([`SqliteRetention::reclaim`]).

use rusqlite::{Connection, OptionalExtension, params};
use stephost_core::retention::{
    BYTES_PRUNED_COUNTER, Pruned, RUNS_PRUNED_COUNTER, Retention, Rule,
};
use stephost_core::{RunStatus, StoreResult};

use crate::conn::{Conn, Sync};
use crate::errors::error;
use crate::segments;
use crate::store::SqliteStore;

/// Retention over a connection of its own, made for each batch.
pub struct SqliteRetention {
    path: std::path::PathBuf,
}

impl SqliteRetention {
    pub fn new(path: &std::path::Path) -> Self {
        SqliteRetention {
            path: path.to_path_buf(),
        }
    }

    fn store(&self) -> StoreResult<SqliteStore> {
        Ok(SqliteStore::new(Conn::connect(&self.path)?, &self.path))
    }
}

/// A tree's root, as found.
struct Root {
    run_no: i64,
    run_id: String,
}

impl Retention for SqliteRetention {
    fn prune(&self, rule: &Rule, dry_run: bool) -> StoreResult<Pruned> {
        let store = self.store()?;
        let roots = store.read(|conn| roots(conn, rule))?;
        if roots.is_empty() {
            return Ok(Pruned::default());
        }
        let delete = |conn: &Connection| -> StoreResult<Pruned> {
            let mut pruned = Pruned::default();
            let mut parts = Vec::new();
            let mut modules = Vec::new();
            for root in &roots {
                // Looked at again under the write lock: a tree changed since
                // the read (a run resumed, a child started) is left.
                if !prunable(conn, rule, root)? {
                    continue;
                }
                for (run_no, run_id, module) in tree(conn, root)? {
                    pruned.bytes += delete_run(conn, run_no, &run_id, &mut parts)?;
                    pruned.run_ids.push(run_id);
                    if !modules.contains(&module) {
                        modules.push(module);
                    }
                }
                conn.prepare_cached("DELETE FROM tree_spend WHERE root_run_id = ?1")
                    .and_then(|mut s| s.execute([&root.run_id]))
                    .map_err(error)?;
            }
            parts.sort();
            parts.dedup();
            for digest in &parts {
                pruned.bytes += deleted_len(
                    conn,
                    "DELETE FROM payloads WHERE digest = ?1 AND NOT EXISTS \
                     (SELECT 1 FROM payload_refs WHERE digest = ?1) RETURNING length(body)",
                    params![digest],
                )?;
            }
            let kept_since = stephost_core::clock::now_ms() - rule.module_kept_ms;
            for digest in &modules {
                let freed = deleted_len(
                    conn,
                    "DELETE FROM modules WHERE digest = ?1 \
                     AND NOT EXISTS (SELECT 1 FROM runs WHERE module_digest = ?1) \
                     AND NOT EXISTS (SELECT 1 FROM schedules WHERE module_digest = ?1) \
                     AND NOT EXISTS (SELECT 1 FROM module_stored WHERE digest = ?1 AND at > ?2) \
                     RETURNING size",
                    params![digest, kept_since],
                )?;
                if freed > 0 {
                    conn.prepare_cached("DELETE FROM module_stored WHERE digest = ?1")
                        .and_then(|mut s| s.execute([digest]))
                        .map_err(error)?;
                    pruned.bytes += freed;
                }
            }
            let counters = stephost_core::journal::Counters::from([
                (RUNS_PRUNED_COUNTER, pruned.run_ids.len() as i64),
                (BYTES_PRUNED_COUNTER, pruned.bytes as i64),
            ]);
            crate::commit::add_counters(conn, &counters)?;
            Ok(pruned)
        };
        if dry_run {
            // The same deletes, rolled back: what they would take.
            return store.rolled_back(delete);
        }
        store.write_synced(Sync::Normal, delete)
    }

    fn reclaim(&self) -> StoreResult<u64> {
        let store = self.store()?;
        store.read(|conn| {
            let free = |conn: &Connection| -> StoreResult<i64> {
                let pages: i64 = conn
                    .pragma_query_value(None, "freelist_count", |r| r.get(0))
                    .map_err(error)?;
                let size: i64 = conn
                    .pragma_query_value(None, "page_size", |r| r.get(0))
                    .map_err(error)?;
                Ok(pages * size)
            };
            let before = free(conn)?;
            // Does nothing in a ledger made before auto_vacuum was set (its
            // free pages are reused by later writes all the same).
            // Each step gives one page back: stepped to its end.
            let mut vacuum = conn.prepare("PRAGMA incremental_vacuum").map_err(error)?;
            let mut steps = vacuum.query([]).map_err(error)?;
            while steps.next().map_err(error)?.is_some() {}
            Ok(before.saturating_sub(free(conn)?).max(0) as u64)
        })
    }
}

/// Up to one batch of roots `rule` takes, oldest first, whose trees are
/// all finished and owe no notice.
fn roots(conn: &Connection, rule: &Rule) -> StoreResult<Vec<Root>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT run_no, run_id, status, updated_at FROM runs INDEXED BY runs_updated \
             WHERE updated_at < ?1 AND parent_run_id IS NULL ORDER BY updated_at, run_no",
        )
        .map_err(error)?;
    let mut rows = stmt.query([rule.finished_before_ms]).map_err(error)?;
    let mut found = Vec::new();
    while found.len() < rule.batch_runs
        && let Some(row) = rows.next().map_err(error)?
    {
        let status: String = row.get(2).map_err(error)?;
        let updated_at: i64 = row.get(3).map_err(error)?;
        let taken = RunStatus::parse(&status).is_some_and(|s| rule.takes(s, updated_at));
        if !taken {
            continue;
        }
        let root = Root {
            run_no: row.get(0).map_err(error)?,
            run_id: row.get(1).map_err(error)?,
        };
        if tree_done(conn, &root.run_id)? {
            found.push(root);
        }
    }
    Ok(found)
}

/// Whether `root` is (still) one `rule` takes.
fn prunable(conn: &Connection, rule: &Rule, root: &Root) -> StoreResult<bool> {
    let found: Option<(String, i64)> = conn
        // By number and id: a number freed by another pruner may be a new
        // run's by now.
        .prepare_cached(
            "SELECT status, updated_at FROM runs WHERE run_no = ?1 AND run_id = ?2 \
             AND parent_run_id IS NULL",
        )
        .and_then(|mut s| {
            s.query_row(params![root.run_no, root.run_id], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()
        })
        .map_err(error)?;
    let Some((status, updated_at)) = found else {
        return Ok(false);
    };
    let taken = RunStatus::parse(&status).is_some_and(|s| rule.takes(s, updated_at));
    Ok(taken && tree_done(conn, &root.run_id)?)
}

/// Whether every run below `root_run_id` is finished and no run of the
/// tree owes a notice.
fn tree_done(conn: &Connection, root_run_id: &str) -> StoreResult<bool> {
    let live: Option<i64> = conn
        .prepare_cached(&format!(
            "SELECT 1 FROM runs WHERE root_run_id = ?1 AND status NOT IN ({}) \
             UNION ALL SELECT 1 FROM notices WHERE state = 'owed' AND (run_id = ?1 OR run_id IN \
             (SELECT run_id FROM runs WHERE root_run_id = ?1)) LIMIT 1",
            stephost_core::retention::finished_sql_list()
        ))
        .and_then(|mut s| s.query_row([root_run_id], |r| r.get(0)).optional())
        .map_err(error)?;
    Ok(live.is_none())
}

/// The runs of `root`'s tree (number, id, module), the root last.
fn tree(conn: &Connection, root: &Root) -> StoreResult<Vec<(i64, String, String)>> {
    let mut runs: Vec<(i64, String, String)> = conn
        .prepare_cached("SELECT run_no, run_id, module_digest FROM runs WHERE root_run_id = ?1")
        .and_then(|mut s| {
            s.query_map([&root.run_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect()
        })
        .map_err(error)?;
    let module: String = conn
        .prepare_cached("SELECT module_digest FROM runs WHERE run_no = ?1")
        .and_then(|mut s| s.query_row([root.run_no], |r| r.get(0)))
        .map_err(error)?;
    runs.push((root.run_no, root.run_id.clone(), module));
    Ok(runs)
}

/// Deletes run `run_no` and what it owns but its payload parts, which are
/// added to `parts` (to be deleted once no run refers to them); the bytes
/// deleted.
fn delete_run(
    conn: &Connection,
    run_no: i64,
    run_id: &str,
    parts: &mut Vec<String>,
) -> StoreResult<u64> {
    let mut bytes = 0u64;
    let calls = segments::read(
        conn,
        run_no,
        1,
        usize::MAX,
        "run_no, seq, id, length(request) + coalesce(length(outcome), 0) \
         + coalesce(length(attempts), 0)",
        |r| Ok((r.get::<_, i64>(2)?, r.get::<_, i64>(3)?)),
    )?;
    let mut delete_call = conn
        .prepare_cached("DELETE FROM calls WHERE id = ?1")
        .map_err(error)?;
    for (id, len) in calls {
        delete_call.execute([id]).map_err(error)?;
        bytes += len as u64;
    }
    let mut digests = conn
        .prepare_cached("SELECT digest FROM payload_refs WHERE run_no = ?1")
        .map_err(error)?;
    for digest in digests
        .query_map([run_no], |r| r.get::<_, String>(0))
        .map_err(error)?
    {
        parts.push(digest.map_err(error)?);
    }
    for sql in [
        "DELETE FROM payload_refs WHERE run_no = ?1",
        "DELETE FROM segments WHERE run_no = ?1 AND epoch IN \
         (SELECT epoch FROM run_epochs WHERE run_no = ?1)",
        "DELETE FROM run_epochs WHERE run_no = ?1",
    ] {
        conn.prepare_cached(sql)
            .and_then(|mut s| s.execute([run_no]))
            .map_err(error)?;
    }
    for sql in [
        "DELETE FROM logs WHERE run_no = ?1 RETURNING length(message)",
        "DELETE FROM inbox WHERE run_no = ?1 RETURNING length(child_run_id)",
        "DELETE FROM promises WHERE run_no = ?1 RETURNING length(value)",
        "DELETE FROM runs WHERE run_no = ?1 RETURNING length(input) \
         + coalesce(length(output), 0) + coalesce(length(error), 0)",
    ] {
        bytes += deleted_len(conn, sql, [run_no])?;
    }
    bytes += deleted_len(
        conn,
        "DELETE FROM notices WHERE run_id = ?1 RETURNING length(body)",
        [run_id],
    )?;
    Ok(bytes)
}

/// Runs a `DELETE … RETURNING` of lengths; their sum.
fn deleted_len(conn: &Connection, sql: &str, values: impl rusqlite::Params) -> StoreResult<u64> {
    let mut stmt = conn.prepare_cached(sql).map_err(error)?;
    let mut rows = stmt.query(values).map_err(error)?;
    let mut sum = 0u64;
    while let Some(row) = rows.next().map_err(error)? {
        sum += row.get::<_, Option<i64>>(0).map_err(error)?.unwrap_or(0) as u64;
    }
    Ok(sum)
}
