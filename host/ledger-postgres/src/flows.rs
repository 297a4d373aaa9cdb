//! Models' flow state in the ledger, shared by every worker on it
//! ([`stephost_core::flow`]): one row per model (its buckets, its pause,
//! its slots), locked, read and written in
//! one transaction, at the server's clock (so that workers on machines
//! whose clocks differ share one time). A call that changes nothing (a
//! model without limits, not paused) only reads; one that does commits
//! without waiting for the WAL's flush: the state need not survive a crash,
//! and a model call's one fsync stays its answer's.

use stephost_core::StoreResult;
use stephost_core::flow::{FlowCaps, FlowOp, FlowState, Flows, unchanged};

use crate::Shared;
use crate::errors::error;

/// The server's clock, in ms.
const NOW_MS: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

pub struct PgFlows {
    shared: std::sync::Arc<Shared>,
}

impl PgFlows {
    pub fn new(shared: std::sync::Arc<Shared>) -> Self {
        PgFlows { shared }
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }
}

impl Flows for PgFlows {
    fn flow(&self, key: &str, caps: FlowCaps, op: FlowOp) -> StoreResult<Result<(), i64>> {
        let key = key.to_string();
        self.shared.block(move |mut conn| async move {
            // Most calls change nothing (a model without limits, not
            // paused): a read, no lock.
            let found = conn
                .client
                .query_opt(
                    format!(
                        "SELECT requests, tokens, at_ms, paused_until_ms, slots, {NOW_MS} \
                         FROM flows WHERE key = $1"
                    )
                    .as_str(),
                    &[&key],
                )
                .await
                .map_err(error)?;
            let (found, now_ms) = match found {
                Some(row) => (Some(state_of(&row)?), row.try_get(5).map_err(error)?),
                None => (None, stephost_core::clock::now_ms()),
            };
            if let Some(answer) = unchanged(found, &caps, op, now_ms) {
                return Ok(answer);
            }
            let tx = conn.client.transaction().await.map_err(error)?;
            // Flow state need not survive a crash: no WAL flush waited for.
            tx.batch_execute("SET LOCAL synchronous_commit TO off")
                .await
                .map_err(error)?;
            // A model not seen yet starts with full buckets; two workers
            // inserting it at once: one row, the other waits on its lock.
            let full = FlowState::full(&caps, 0);
            tx.execute(
                format!(
                    "INSERT INTO flows (key, requests, tokens, at_ms, paused_until_ms) \
                     VALUES ($1, $2, $3, {NOW_MS}, 0) ON CONFLICT (key) DO NOTHING"
                )
                .as_str(),
                &[&key, &full.requests, &full.tokens],
            )
            .await
            .map_err(error)?;
            let row = tx
                .query_one(
                    format!(
                        "SELECT requests, tokens, at_ms, paused_until_ms, slots, {NOW_MS} \
                         FROM flows WHERE key = $1 FOR UPDATE"
                    )
                    .as_str(),
                    &[&key],
                )
                .await
                .map_err(error)?;
            let now_ms: i64 = row.try_get(5).map_err(error)?;
            let mut state = state_of(&row)?;
            let answer = state.apply(&caps, op, now_ms);
            tx.execute(
                "UPDATE flows SET requests = $2, tokens = $3, at_ms = $4, paused_until_ms = $5, \
                 slots = $6 WHERE key = $1",
                &[
                    &key,
                    &state.requests,
                    &state.tokens,
                    &state.at_ms,
                    &state.paused_until_ms,
                    &state.slots_text(),
                ],
            )
            .await
            .map_err(error)?;
            tx.commit().await.map_err(error)?;
            Ok(answer)
        })
    }
}

fn state_of(row: &tokio_postgres::Row) -> StoreResult<FlowState> {
    Ok(FlowState {
        requests: row.try_get(0).map_err(error)?,
        tokens: row.try_get(1).map_err(error)?,
        at_ms: row.try_get(2).map_err(error)?,
        paused_until_ms: row.try_get(3).map_err(error)?,
        slots: FlowState::parse_slots(row.try_get(4).map_err(error)?),
    })
}
