//! Trees' model spend in the ledger ([`stephost_core::tree_spend`]): a row
//! per run of a tree, checked and written in one transaction under a lock
//! on the tree (a transaction-scoped advisory lock on its root's id), so
//! two runs of a tree holding at once are counted one after the other.
//! Committed without waiting for the WAL's flush: it survives the worker's
//! death, and the call's answer, committed with a flush after it, makes it
//! durable with it.

use stephost_core::tree_spend::{TreeSpends, column, fits};
use stephost_core::{Spent, StoreResult};

use crate::errors::error;
use crate::flows::PgFlows;

impl TreeSpends for PgFlows {
    fn set_spent(
        &self,
        root_run_id: &str,
        run_id: &str,
        spent: Spent,
        cap: Option<Spent>,
    ) -> StoreResult<Result<(), Spent>> {
        let (root, run) = (root_run_id.to_string(), run_id.to_string());
        self.shared().block(move |mut conn| async move {
            let tx = conn.client.transaction().await.map_err(error)?;
            tx.batch_execute("SET LOCAL synchronous_commit TO off")
                .await
                .map_err(error)?;
            if let Some(cap) = cap {
                tx.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended($1, 7))",
                    &[&root],
                )
                .await
                .map_err(error)?;
                let row = tx
                    .query_one(TOTAL_BUT, &[&root, &run])
                    .await
                    .map_err(error)?;
                let others = spent_of(&row)?;
                if !fits(others, spent, cap) {
                    return Ok(Err(others));
                }
            }
            tx.execute(
                "INSERT INTO tree_spend (root_run_id, run_id, tokens, micro_usd) \
                 VALUES ($1, $2, $3, $4) ON CONFLICT (root_run_id, run_id) DO UPDATE SET \
                 tokens = excluded.tokens, micro_usd = excluded.micro_usd",
                &[&root, &run, &column(spent.tokens), &column(spent.micro_usd)],
            )
            .await
            .map_err(error)?;
            tx.commit().await.map_err(error)?;
            Ok(Ok(()))
        })
    }

    fn tree_spent(&self, root_run_id: &str) -> StoreResult<Spent> {
        let root = root_run_id.to_string();
        self.shared().block(move |conn| async move {
            let row = conn
                .client
                .query_one(TOTAL_BUT, &[&root, &""])
                .await
                .map_err(error)?;
            spent_of(&row)
        })
    }
}

/// What the runs of tree `$1` have spent, but run `$2`.
const TOTAL_BUT: &str = "SELECT coalesce(sum(tokens), 0)::bigint, coalesce(sum(micro_usd), 0)::bigint \
     FROM tree_spend WHERE root_run_id = $1 AND run_id <> $2";

fn spent_of(row: &tokio_postgres::Row) -> StoreResult<Spent> {
    let n = |i: usize| -> StoreResult<u64> {
        Ok(row.try_get::<_, i64>(i).map_err(error)?.max(0) as u64)
    };
    Ok(Spent {
        tokens: n(0)?,
        micro_usd: n(1)?,
    })
}
