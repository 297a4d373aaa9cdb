//! The ledger's schema: plain SQL migration files, applied in order, each in
//! its own transaction.
//!
//! A ledger file is marked with `PRAGMA application_id` so that stephost
//! never writes into a database that is not its own, and `PRAGMA
//! user_version` holds the schema version. A ledger newer than this build is
//! used as it is if its `stephost_meta` says builds of this schema version
//! may use it (rolling upgrades: `stephost_core::store::may_use`), and
//! refused otherwise; so is one of the development format no release
//! wrote, which carries another application id.

use rusqlite::{Connection, OptionalExtension};
use stephost_core::StoreError;

use crate::errors::{error, not_a_ledger};

/// `STPL` in ASCII: a stephost ledger of this format.
pub const APPLICATION_ID: i64 = 0x5354_504C;

/// `STEP` in ASCII: the development format before it, schema versions 1–9.
pub const OLD_APPLICATION_ID: i64 = 0x5354_4550;

/// Migration `i` takes the schema from version `i` to `i + 1`.
pub const MIGRATIONS: &[&str] = &[
    include_str!("../migrations/0001_ledger.sql"),
    include_str!("../migrations/0002_seal.sql"),
    include_str!("../migrations/0003_notices.sql"),
    include_str!("../migrations/0004_payload_rows.sql"),
    include_str!("../migrations/0005_flows.sql"),
    include_str!("../migrations/0006_flow_slots.sql"),
    include_str!("../migrations/0007_run_budget.sql"),
    include_str!("../migrations/0008_run_trace.sql"),
    include_str!("../migrations/0009_children.sql"),
    include_str!("../migrations/0010_tree_spend.sql"),
    include_str!("../migrations/0011_promises.sql"),
    include_str!("../migrations/0012_schedules_forks.sql"),
    include_str!("../migrations/0013_retention.sql"),
    include_str!("../migrations/0014_meta.sql"),
];

/// The schema version this build writes.
pub const VERSION: i64 = MIGRATIONS.len() as i64;

/// The oldest schema version whose builds may use a ledger at [`VERSION`]
/// (`stephost_core::store::may_use`): 14, as builds before it do not keep
/// `payload_refs`, which retention relies on. A later migration that only
/// adds keeps it.
pub const COMPATIBLE_FROM: i64 = 14;

/// The ledger's `compatible_from`, if it says.
fn compatible_from(conn: &Connection, location: &str) -> Result<Option<i64>, StoreError> {
    let has_meta: bool = crate::conn::patiently(|| {
        conn.query_row(
            "SELECT count(*) > 0 FROM sqlite_master WHERE name = 'stephost_meta'",
            [],
            |r| r.get(0),
        )
    })
    .map_err(|e| not_a_ledger(location, e))?;
    if !has_meta {
        return Ok(None);
    }
    let value: Option<String> = crate::conn::patiently(|| {
        conn.query_row(
            "SELECT value FROM stephost_meta WHERE key = 'compatible_from'",
            [],
            |r| r.get(0),
        )
        .optional()
    })
    .map_err(|e| not_a_ledger(location, e))?;
    Ok(value.and_then(|v| v.parse().ok()))
}

fn pragma(conn: &Connection, location: &str, name: &str) -> Result<i64, StoreError> {
    crate::conn::patiently(|| conn.pragma_query_value(None, name, |r| r.get(0)))
        .map_err(|e| not_a_ledger(location, e))
}

/// Refuses a file that is not a stephost ledger of this format (or an
/// empty file, which becomes one).
pub fn check(conn: &Connection, location: &str) -> Result<(), StoreError> {
    let id = pragma(conn, location, "application_id")?;
    let version = pragma(conn, location, "user_version")?;
    match id {
        APPLICATION_ID => {
            let from = match version > VERSION {
                true => compatible_from(conn, location)?,
                false => None,
            };
            stephost_core::store::may_use(location, version, from, VERSION).map(|_| ())
        }
        OLD_APPLICATION_ID => Err(StoreError::OldFormat {
            location: location.to_string(),
            found: format!("schema version {version}"),
        }),
        0 => {
            let tables: i64 = crate::conn::patiently(|| {
                conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
            })
            .map_err(|e| not_a_ledger(location, e))?;
            if tables > 0 {
                return Err(StoreError::NotALedger {
                    location: location.to_string(),
                    detail: "an SQLite database of another application".into(),
                });
            }
            Ok(())
        }
        other => Err(StoreError::NotALedger {
            location: location.to_string(),
            detail: format!("an SQLite database with application id {other:#x}"),
        }),
    }
}

/// Brings the schema to [`VERSION`]. Two processes opening a new file at
/// once are serialized by the write lock; the second finds it migrated. A
/// ledger at this version is only read.
pub fn migrate(conn: &Connection, location: &str) -> Result<(), StoreError> {
    if pragma(conn, location, "user_version")? == VERSION {
        return Ok(());
    }
    loop {
        conn.execute_batch("BEGIN IMMEDIATE").map_err(error)?;
        let step = migrate_one(conn, location);
        let end = if matches!(step, Ok(true)) {
            "COMMIT"
        } else {
            "ROLLBACK"
        };
        let ended = conn.execute_batch(end).map_err(error);
        match step {
            Ok(true) => ended?,
            Ok(false) => return Ok(()),
            Err(e) => return Err(e),
        }
    }
}

/// Applies the next migration, if any: `false` once at [`VERSION`].
fn migrate_one(conn: &Connection, location: &str) -> Result<bool, StoreError> {
    check(conn, location)?;
    let version = pragma(conn, location, "user_version")?;
    if version >= VERSION {
        return Ok(false);
    }
    conn.execute_batch(MIGRATIONS[version as usize])
        .map_err(error)?;
    conn.pragma_update(None, "application_id", APPLICATION_ID)
        .map_err(error)?;
    conn.pragma_update(None, "user_version", version + 1)
        .map_err(error)?;
    if version + 1 == VERSION {
        conn.execute(
            "INSERT INTO stephost_meta (key, value) VALUES ('compatible_from', ?1) \
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            [COMPATIBLE_FROM.to_string()],
        )
        .map_err(error)?;
    }
    Ok(true)
}
