//! [`Tamper`] on PostgreSQL: rows rewritten as they are, for tests (the
//! `testing` feature).

use stephost_core::records::{CallRecord, RunRecord};
use stephost_core::tamper::Tamper;
use stephost_core::{StoreError, StoreResult};

use crate::errors::error;
use crate::rows::{self, Bodies, boxed, refs};
use crate::store::PgStore;

impl Tamper for PgStore {
    fn edit_run(&self, run_id: &str, edit: &mut dyn FnMut(&mut RunRecord)) -> StoreResult<()> {
        let mut run = stephost_core::Views::run(self, run_id)?;
        let version = run.version;
        edit(&mut run);
        run.run_id = run_id.to_string();
        self.shared.block(move |mut conn| async move {
            let swap = conn.statement(rows::SWAP_RUN).await?;
            let mut values = rows::run_values(&run);
            values.push(boxed(version));
            match conn
                .client
                .execute(&swap, &refs(&values))
                .await
                .map_err(error)?
            {
                1 => Ok(()),
                _ => Err(StoreError::UnknownRun(run.run_id.clone())),
            }
        })
    }

    fn edit_call(
        &self,
        run_id: &str,
        seq: u64,
        edit: &mut dyn FnMut(&mut CallRecord),
    ) -> StoreResult<()> {
        let id = run_id.to_string();
        let mut call = self
            .shared
            .block(move |mut conn| async move { rows::calls(&mut conn, &id, seq, 1).await })?
            .pop()
            .filter(|c| c.seq == seq)
            .ok_or_else(|| missing(run_id, seq))?;
        edit(&mut call);
        let run_id = run_id.to_string();
        self.shared.block(move |conn| async move {
            let mut bodies = Bodies::default();
            let (request, request_split) = bodies.store(&call.request);
            let (outcome, outcome_split) = match &call.outcome {
                Some(text) => {
                    let (body, split) = bodies.store(text);
                    (Some(body), split)
                }
                None => (None, false),
            };
            if !bodies.is_empty() {
                conn.client
                    .execute(rows::INSERT_PAYLOADS, &[&bodies.digests, &bodies.parts])
                    .await
                    .map_err(error)?;
            }
            conn.client
                .execute(
                    "UPDATE calls SET class = $3, interface = $4, function = $5, \
                     operation_id = $6, request = $7, request_split = $8, request_hash = $9, \
                     state = $10, outcome = $11, outcome_split = $12, started_at = $13, \
                     finished_at = $14, resolved_by = $15, chain = $16, fence = $17 \
                     WHERE run_id = $1 AND seq = $2",
                    &[
                        &run_id,
                        &(seq as i64),
                        &call.class.as_str(),
                        &call.interface,
                        &call.function,
                        &call.operation_id,
                        &request,
                        &request_split,
                        &call.request_hash,
                        &call.state.as_str(),
                        &outcome,
                        &outcome_split,
                        &call.started_at_ms,
                        &call.finished_at_ms,
                        &call.resolved_by,
                        &call.chain,
                        &call.fence,
                    ],
                )
                .await
                .map_err(error)?;
            Ok(())
        })
    }

    fn delete_call(&self, run_id: &str, seq: u64) -> StoreResult<()> {
        let id = run_id.to_string();
        let deleted = self.shared.block(move |conn| async move {
            conn.client
                .execute(
                    "DELETE FROM calls WHERE run_id = $1 AND seq = $2",
                    &[&id, &(seq as i64)],
                )
                .await
                .map_err(error)
        })?;
        match deleted {
            1 => Ok(()),
            _ => Err(missing(run_id, seq)),
        }
    }

    fn replace_module(&self, digest: &str, bytes: &[u8]) -> StoreResult<()> {
        let (digest, bytes) = (digest.to_string(), bytes.to_vec());
        self.shared.block(move |conn| async move {
            match conn
                .client
                .execute(
                    "UPDATE modules SET bytes = $2 WHERE digest = $1",
                    &[&digest, &bytes],
                )
                .await
                .map_err(error)?
            {
                1 => Ok(()),
                _ => Err(StoreError::UnknownModule(digest.clone())),
            }
        })
    }

    fn insert_runs(&self, runs: &[RunRecord]) -> StoreResult<()> {
        let runs = runs.to_vec();
        self.shared.block(move |mut conn| async move {
            let insert = conn.statement(rows::INSERT_RUN).await?;
            let transaction = conn.client.transaction().await.map_err(error)?;
            for run in &runs {
                let values = rows::insert_values(run);
                transaction
                    .execute(&insert, &refs(&values))
                    .await
                    .map_err(error)?;
            }
            transaction.commit().await.map_err(error)
        })
    }
}

fn missing(run_id: &str, seq: u64) -> StoreError {
    StoreError::Corrupt(format!("run {run_id} has no call #{seq} to change"))
}
