//! Deleting finished runs from the ledger ([`stephost_core::retention`]).
//!
//! A batch is one transaction: the roots found (`FOR UPDATE SKIP LOCKED`,
//! so workers pruning at once take different trees), their trees checked,
//! their rows deleted, then the payload parts no run refers to any more.
//! That last step holds `payloads` in `SHARE ROW EXCLUSIVE` mode until the
//! transaction ends: a commit storing a part (and, by the trigger on
//! `calls`, its reference) waits for it, or is waited for, so a part a
//! commit refers to is never deleted under it. Committed without waiting
//! for the WAL's flush: undone by a crash, the next batch deletes the same
//! runs. The space is reused once autovacuum has passed (PostgreSQL's own;
//! nothing to do here).

use stephost_core::StoreResult;
use stephost_core::retention::{
    BYTES_PRUNED_COUNTER, Pruned, RUNS_PRUNED_COUNTER, Retention, Rule, finished_sql_list,
};

use crate::commit::{ADD_COUNTERS, counter_values};
use crate::errors::error;
use crate::flows::PgFlows;
use crate::rows::refs;

impl Retention for PgFlows {
    fn prune(&self, rule: &Rule, dry_run: bool) -> StoreResult<Pruned> {
        let rule = rule.clone();
        self.shared().block(move |mut conn| async move {
            let tx = conn.client.transaction().await.map_err(error)?;
            tx.batch_execute("SET LOCAL synchronous_commit TO off")
                .await
                .map_err(error)?;
            let statuses: Vec<String> = rule.status_names().iter().map(|s| s.to_string()).collect();
            let finished = finished_sql_list();
            // Roots the rule takes whose trees are all finished and owe no
            // notice, oldest first.
            let roots = tx
                .query(
                    &format!(
                        "SELECT r.run_id FROM runs r WHERE r.updated_at < $1 \
                         AND r.parent_run_id IS NULL AND r.status = ANY($2) \
                         AND NOT EXISTS (SELECT 1 FROM runs c WHERE c.root_run_id = r.run_id \
                             AND c.status NOT IN ({finished})) \
                         AND NOT EXISTS (SELECT 1 FROM notices n WHERE n.state = 'owed' \
                             AND (n.run_id = r.run_id OR n.run_id IN \
                             (SELECT c.run_id FROM runs c WHERE c.root_run_id = r.run_id))) \
                         ORDER BY r.updated_at, r.run_id LIMIT $3 FOR UPDATE SKIP LOCKED"
                    ),
                    &[
                        &rule.finished_before_ms,
                        &statuses,
                        &(rule.batch_runs.min(i64::MAX as usize) as i64),
                    ],
                )
                .await
                .map_err(error)?;
            let roots: Vec<String> = roots.iter().map(|r| r.get(0)).collect();
            if roots.is_empty() {
                return Ok(Pruned::default());
            }
            // Every run of those trees, locked. A tree one of whose runs
            // changed since the look above (a child started or resumed) is
            // left for a later batch.
            let runs = tx
                .query(
                    &format!(
                        "SELECT run_id, coalesce(root_run_id, run_id), module_digest, \
                         status IN ({finished}) FROM runs \
                         WHERE run_id = ANY($1) OR root_run_id = ANY($1) FOR UPDATE"
                    ),
                    &[&roots],
                )
                .await
                .map_err(error)?;
            let live: Vec<String> = runs
                .iter()
                .filter(|r| !r.get::<_, bool>(3))
                .map(|r| r.get(1))
                .collect();
            let roots: Vec<String> = roots.into_iter().filter(|r| !live.contains(r)).collect();
            let runs: Vec<&tokio_postgres::Row> = runs
                .iter()
                .filter(|r| !live.contains(&r.get::<_, String>(1)))
                .collect();
            if roots.is_empty() {
                return Ok(Pruned::default());
            }
            let run_ids: Vec<String> = runs.iter().map(|r| r.get(0)).collect();
            let mut modules: Vec<String> = runs.iter().map(|r| r.get(2)).collect();
            modules.sort();
            modules.dedup();
            let mut bytes: i64 = 0;
            for sql in [
                "WITH d AS (DELETE FROM calls WHERE run_id = ANY($1) RETURNING \
                 octet_length(request) + coalesce(octet_length(outcome), 0) \
                 + coalesce(octet_length(attempts::text), 0) AS n) \
                 SELECT coalesce(sum(n), 0)::bigint FROM d",
                "WITH d AS (DELETE FROM logs WHERE run_id = ANY($1) RETURNING \
                 octet_length(message) AS n) SELECT coalesce(sum(n), 0)::bigint FROM d",
                "WITH d AS (DELETE FROM inbox WHERE run_id = ANY($1) RETURNING \
                 octet_length(child_run_id) AS n) SELECT coalesce(sum(n), 0)::bigint FROM d",
                "WITH d AS (DELETE FROM promises WHERE run_id = ANY($1) RETURNING \
                 octet_length(value) AS n) SELECT coalesce(sum(n), 0)::bigint FROM d",
                "WITH d AS (DELETE FROM notices WHERE run_id = ANY($1) RETURNING \
                 octet_length(body) AS n) SELECT coalesce(sum(n), 0)::bigint FROM d",
                "WITH d AS (DELETE FROM tree_spend WHERE root_run_id = ANY($1) RETURNING 0 AS n) \
                 SELECT coalesce(sum(n), 0)::bigint FROM d",
                "WITH d AS (DELETE FROM runs WHERE run_id = ANY($1) RETURNING \
                 octet_length(input) + coalesce(octet_length(output), 0) \
                 + coalesce(octet_length(error), 0) AS n) SELECT coalesce(sum(n), 0)::bigint FROM d",
            ] {
                let ids = match sql.contains("tree_spend") {
                    true => &roots,
                    false => &run_ids,
                };
                bytes += tx
                    .query_one(sql, &[ids])
                    .await
                    .map_err(error)?
                    .get::<_, i64>(0);
            }
            let parts: Vec<String> = tx
                .query(
                    "DELETE FROM payload_refs WHERE run_id = ANY($1) RETURNING digest",
                    &[&run_ids],
                )
                .await
                .map_err(error)?
                .iter()
                .map(|r| r.get(0))
                .collect();
            if !parts.is_empty() {
                tx.batch_execute("LOCK TABLE payloads IN SHARE ROW EXCLUSIVE MODE")
                    .await
                    .map_err(error)?;
                bytes += tx
                    .query_one(
                        "WITH d AS (DELETE FROM payloads p WHERE p.digest = ANY($1) \
                         AND NOT EXISTS (SELECT 1 FROM payload_refs r WHERE r.digest = p.digest) \
                         RETURNING octet_length(p.body) AS n) \
                         SELECT coalesce(sum(n), 0)::bigint FROM d",
                        &[&parts],
                    )
                    .await
                    .map_err(error)?
                    .get::<_, i64>(0);
            }
            let kept_since = stephost_core::clock::now_ms() - rule.module_kept_ms;
            bytes += tx
                .query_one(
                    "WITH d AS (DELETE FROM modules m WHERE m.digest = ANY($1) \
                     AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.module_digest = m.digest) \
                     AND NOT EXISTS (SELECT 1 FROM schedules s WHERE s.module_digest = m.digest) \
                     AND NOT EXISTS (SELECT 1 FROM module_stored k WHERE k.digest = m.digest \
                         AND k.at > $2) RETURNING m.digest, m.size), \
                     k AS (DELETE FROM module_stored WHERE digest IN (SELECT digest FROM d)) \
                     SELECT coalesce(sum(size), 0)::bigint FROM d",
                    &[&modules, &kept_since],
                )
                .await
                .map_err(error)?
                .get::<_, i64>(0);
            let pruned = Pruned {
                run_ids,
                bytes: bytes.max(0) as u64,
            };
            if dry_run {
                tx.rollback().await.map_err(error)?;
                return Ok(pruned);
            }
            let counters = stephost_core::journal::Counters::from([
                (RUNS_PRUNED_COUNTER, pruned.run_ids.len() as i64),
                (BYTES_PRUNED_COUNTER, pruned.bytes as i64),
            ]);
            let values = counter_values(&counters);
            tx.execute(ADD_COUNTERS, &refs(&values))
                .await
                .map_err(error)?;
            tx.commit().await.map_err(error)?;
            Ok(pruned)
        })
    }
}
