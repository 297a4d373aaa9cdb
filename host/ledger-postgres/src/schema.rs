//! The ledger's schema: plain SQL migration files, applied once, in
//! order, under an advisory lock so that workers starting together do not
//! race. Tables go to the connection's first `search_path` schema.

use stephost_core::{StoreError, StoreResult};

use crate::conns::PgConn;
use crate::errors::describe;

/// The oldest schema version whose builds may use a ledger at this
/// build's (`stephost_core::store::may_use`): 13, as builds before it do
/// not keep `module_stored`, which retention relies on. A later migration
/// that only adds keeps it.
pub const COMPATIBLE_FROM: i64 = 13;

/// The migrations, in order; the schema version is how many are applied.
pub const MIGRATIONS: &[&str] = &[
    include_str!("../migrations/0001_ledger.sql"),
    include_str!("../migrations/0002_seal.sql"),
    include_str!("../migrations/0003_notices.sql"),
    include_str!("../migrations/0004_commit_plan.sql"),
    include_str!("../migrations/0005_flows.sql"),
    include_str!("../migrations/0006_flow_slots.sql"),
    include_str!("../migrations/0007_run_budget.sql"),
    include_str!("../migrations/0008_run_trace.sql"),
    include_str!("../migrations/0009_children.sql"),
    include_str!("../migrations/0010_tree_spend.sql"),
    include_str!("../migrations/0011_promises.sql"),
    include_str!("../migrations/0012_schedules_forks.sql"),
    include_str!("../migrations/0013_retention.sql"),
];

/// The advisory lock key migrations hold ("stephost" in ASCII).
const MIGRATION_LOCK: i64 = 0x7374_6570_686f_7374;

/// Brings the ledger's schema up to date, or refuses a database that holds
/// something else or a newer ledger.
pub async fn prepare(conn: &mut PgConn, location: &str) -> StoreResult<()> {
    let failed = |e: tokio_postgres::Error| {
        StoreError::Unavailable(format!("preparing ledger {location}: {}", describe(&e)))
    };
    let transaction = conn.client.transaction().await.map_err(failed)?;
    transaction
        .execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(failed)?;
    let has_meta: bool = transaction
        .query_one("SELECT to_regclass('stephost_meta') IS NOT NULL", &[])
        .await
        .map_err(failed)?
        .get(0);
    let applied = if has_meta {
        let rows = transaction
            .query(
                "SELECT key, value FROM stephost_meta \
                 WHERE key IN ('format', 'version', 'compatible_from')",
                &[],
            )
            .await
            .map_err(failed)?;
        let value = |key: &str| {
            rows.iter()
                .find(|r| r.get::<_, &str>(0) == key)
                .map(|r| r.get::<_, String>(1))
        };
        if value("format").as_deref() != Some("stephost-ledger") {
            return Err(StoreError::NotALedger {
                location: location.to_string(),
                detail: "its stephost_meta table names another format".into(),
            });
        }
        let version = value("version")
            .and_then(|v| v.parse::<i64>().ok())
            .ok_or_else(|| {
                StoreError::Corrupt("the ledger's schema version is unreadable".into())
            })?;
        (
            version,
            value("compatible_from").and_then(|v| v.parse::<i64>().ok()),
        )
    } else {
        let taken: bool = transaction
            .query_one("SELECT to_regclass('runs') IS NOT NULL", &[])
            .await
            .map_err(failed)?
            .get(0);
        if taken {
            return Err(StoreError::NotALedger {
                location: location.to_string(),
                detail: "it has a table named runs that stephost did not make; use another \
                         database or schema"
                    .into(),
            });
        }
        (0, None)
    };
    let (applied, compatible_from) = applied;
    let supported = MIGRATIONS.len() as i64;
    if !stephost_core::store::may_use(location, applied, compatible_from, supported)? {
        // A newer build's ledger this build may use as it is.
        return transaction.commit().await.map_err(failed);
    }
    let migrating = applied < supported;
    for (version, sql) in MIGRATIONS.iter().enumerate().skip(applied as usize) {
        transaction.batch_execute(sql).await.map_err(failed)?;
        transaction
            .execute(
                "UPDATE stephost_meta SET value = $1 WHERE key = 'version'",
                &[&(version as i64 + 1).to_string()],
            )
            .await
            .map_err(failed)?;
    }
    if migrating {
        transaction
            .execute(
                "INSERT INTO stephost_meta (key, value) VALUES ('compatible_from', $1) \
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                &[&COMPATIBLE_FROM.to_string()],
            )
            .await
            .map_err(failed)?;
    }
    transaction.commit().await.map_err(failed)
}
