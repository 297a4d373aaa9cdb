//! Trees' model spend in the ledger file ([`stephost_core::tree_spend`]):
//! a row per run of a tree, checked and written in one write transaction
//! (SQLite's one writer is the lock on the tree). Not fsync'd: it survives
//! its process's death, and the call's answer, committed with an fsync
//! after it, makes it durable with it.

use rusqlite::params;
use stephost_core::tree_spend::{TreeSpends, column, fits};
use stephost_core::{Spent, StoreResult};

use crate::conn::Sync;
use crate::errors::error;
use crate::flows::SqliteFlows;

impl TreeSpends for SqliteFlows {
    fn set_spent(
        &self,
        root_run_id: &str,
        run_id: &str,
        spent: Spent,
        cap: Option<Spent>,
    ) -> StoreResult<Result<(), Spent>> {
        self.with_store(|store| {
            store.write_synced(Sync::Normal, |conn| {
                if let Some(cap) = cap {
                    let others = total(conn, root_run_id, Some(run_id))?;
                    if !fits(others, spent, cap) {
                        return Ok(Err(others));
                    }
                }
                conn.prepare_cached(
                    "INSERT INTO tree_spend (root_run_id, run_id, tokens, micro_usd) \
                     VALUES (?1, ?2, ?3, ?4) ON CONFLICT (root_run_id, run_id) DO UPDATE SET \
                     tokens = excluded.tokens, micro_usd = excluded.micro_usd",
                )
                .and_then(|mut s| {
                    s.execute(params![
                        root_run_id,
                        run_id,
                        column(spent.tokens),
                        column(spent.micro_usd)
                    ])
                })
                .map_err(error)?;
                Ok(Ok(()))
            })
        })
    }

    fn tree_spent(&self, root_run_id: &str) -> StoreResult<Spent> {
        self.with_store(|store| store.read(|conn| total(conn, root_run_id, None)))
    }
}

/// What the runs of a tree have spent, but `except`.
fn total(
    conn: &rusqlite::Connection,
    root_run_id: &str,
    except: Option<&str>,
) -> StoreResult<Spent> {
    conn.prepare_cached(
        "SELECT coalesce(sum(tokens), 0), coalesce(sum(micro_usd), 0) FROM tree_spend \
         WHERE root_run_id = ?1 AND run_id IS NOT ?2",
    )
    .and_then(|mut s| {
        s.query_row(params![root_run_id, except], |r| {
            Ok(Spent {
                tokens: r.get::<_, i64>(0)?.max(0) as u64,
                micro_usd: r.get::<_, i64>(1)?.max(0) as u64,
            })
        })
    })
    .map_err(error)
}
