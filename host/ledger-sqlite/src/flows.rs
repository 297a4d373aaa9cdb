//! Models' flow state in the ledger file, shared by every process that
//! opens it (and, on the same connection, trees' model spend:
//! [`crate::tree_spend`]) ([`stephost_core::flow`]): one row per model (its buckets, its
//! pause, its slots), read and written in one write transaction. Nothing here needs to survive a crash, so the
//! transaction is not fsync'd.

use rusqlite::{OptionalExtension, params};
use stephost_core::StoreResult;
use stephost_core::flow::{FlowCaps, FlowOp, FlowState, Flows, unchanged};

use crate::conn::{Conn, Sync};
use crate::errors::error;
use crate::store::SqliteStore;

/// A connection of the ledger's for flow updates, made on first use.
pub struct SqliteFlows {
    path: std::path::PathBuf,
    store: std::sync::Mutex<Option<SqliteStore>>,
}

impl SqliteFlows {
    pub fn new(path: &std::path::Path) -> Self {
        SqliteFlows {
            path: path.to_path_buf(),
            store: std::sync::Mutex::new(None),
        }
    }
}

impl SqliteFlows {
    /// `f` on the connection, made on first use.
    pub(crate) fn with_store<T>(
        &self,
        f: impl FnOnce(&SqliteStore) -> StoreResult<T>,
    ) -> StoreResult<T> {
        let mut store = self.store.lock().unwrap_or_else(|p| p.into_inner());
        if store.is_none() {
            *store = Some(SqliteStore::new(Conn::connect(&self.path)?, &self.path));
        }
        f(store.as_ref().expect("just made"))
    }
}

impl Flows for SqliteFlows {
    fn flow(&self, key: &str, caps: FlowCaps, op: FlowOp) -> StoreResult<Result<(), i64>> {
        self.with_store(|store| flow(store, key, caps, op))
    }
}

fn flow(
    store: &SqliteStore,
    key: &str,
    caps: FlowCaps,
    op: FlowOp,
) -> StoreResult<Result<(), i64>> {
    // Most calls change nothing (a model without limits, not paused):
    // a read, no write lock.
    let found = store.read(|conn| read(conn, key))?;
    if let Some(answer) = unchanged(found, &caps, op, stephost_core::clock::now_ms()) {
        return Ok(answer);
    }
    store.write_synced(Sync::Normal, |conn| {
        let now_ms = stephost_core::clock::now_ms();
        let found = read(conn, key)?;
        let mut state = found.unwrap_or_else(|| FlowState::full(&caps, now_ms));
        let answer = state.apply(&caps, op, now_ms);
        conn.prepare_cached(
            "INSERT INTO flows (key, requests, tokens, at_ms, paused_until_ms, slots) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (key) DO UPDATE SET \
                 requests = excluded.requests, tokens = excluded.tokens, \
                 at_ms = excluded.at_ms, paused_until_ms = excluded.paused_until_ms, \
                 slots = excluded.slots",
        )
        .and_then(|mut s| {
            s.execute(params![
                key,
                state.requests,
                state.tokens,
                state.at_ms,
                state.paused_until_ms,
                state.slots_text()
            ])
        })
        .map_err(error)?;
        Ok(answer)
    })
}

/// Model `key`'s state, if it has a row.
fn read(conn: &rusqlite::Connection, key: &str) -> StoreResult<Option<FlowState>> {
    conn.prepare_cached(
        "SELECT requests, tokens, at_ms, paused_until_ms, slots FROM flows WHERE key = ?1",
    )
    .and_then(|mut s| {
        s.query_row([key], |r| {
            Ok(FlowState {
                requests: r.get(0)?,
                tokens: r.get(1)?,
                at_ms: r.get(2)?,
                paused_until_ms: r.get(3)?,
                slots: FlowState::parse_slots(&r.get::<_, String>(4)?),
            })
        })
        .optional()
    })
    .map_err(error)
}
