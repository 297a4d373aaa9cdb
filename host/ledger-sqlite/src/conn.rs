//! A connection to the ledger file: opened in WAL mode, its schema checked
//! (and created, for a new file), in the sync mode its next commit needs.

use std::path::Path;

use rusqlite::{Connection, OpenFlags};
use stephost_core::StoreError;

use crate::errors::{error, not_a_ledger};
use crate::known::Known;
use crate::schema;

/// How long a connection waits for another's write lock before it gives up
/// with [`StoreError::Unavailable`], in milliseconds.
pub const BUSY_TIMEOUT_MS: u64 = 10_000;

/// Statements a connection keeps prepared (rusqlite keeps 16 by default,
/// fewer than a writer and a store use).
pub const STATEMENTS_CACHED: usize = 128;

/// Runs `step` again while the file is busy, for up to
/// [`BUSY_TIMEOUT_MS`]: another process creating the ledger, or turning
/// its journal to WAL, holds a lock SQLite's busy handler does not wait
/// for when a connection opens.
pub fn patiently<T>(mut step: impl FnMut() -> rusqlite::Result<T>) -> rusqlite::Result<T> {
    let until = std::time::Instant::now() + std::time::Duration::from_millis(BUSY_TIMEOUT_MS);
    loop {
        match step() {
            Err(e)
                if matches!(
                    e.sqlite_error_code(),
                    Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
                ) && std::time::Instant::now() < until =>
            {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            done => return done,
        }
    }
}

/// Whether a commit is fsync'd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sync {
    /// `synchronous = FULL`: the WAL is fsync'd at commit.
    Full,
    /// `synchronous = NORMAL`: ordered before the next fsync'd commit.
    Normal,
}

impl Sync {
    pub fn when(durable: bool) -> Self {
        if durable { Sync::Full } else { Sync::Normal }
    }
}

/// A connection, the sync mode it is in, and what it remembers of the
/// calls it appended.
pub struct Conn {
    pub conn: Connection,
    sync: Sync,
    pub known: Known,
    /// The ledger's wake file ([`crate::wake`]).
    wake: std::path::PathBuf,
}

/// Creates the ledger file, if absent, readable and writable by its owner
/// only; SQLite gives its `-wal` and `-shm` files the same mode.
fn create_private(path: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(StoreError::Unavailable(format!(
            "cannot create the ledger {}: {e}",
            path.display()
        ))),
    }
}

impl Conn {
    /// Opens the ledger at `path`, creating it if absent and migrating it
    /// to this build's schema.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        create_private(path)?;
        let conn = Self::connect(path)?;
        schema::migrate(&conn.conn, &path.display().to_string())?;
        Ok(conn)
    }

    /// Opens another connection to a ledger [`Conn::open`] has checked.
    pub fn connect(path: &Path) -> Result<Self, StoreError> {
        let location = path.display().to_string();
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| not_a_ledger(&location, e))?;
        conn.busy_timeout(std::time::Duration::from_millis(BUSY_TIMEOUT_MS))
            .map_err(error)?;
        // Every statement the ledger runs stays prepared: parsing one again
        // costs more than running it.
        conn.set_prepared_statement_cache_capacity(STATEMENTS_CACHED);
        // The bundled SQLite plans with STAT4, and would prepare a statement
        // again whenever a value bound to a range (`first_seq <= ?`) changes:
        // a plan that stays as prepared keeps finding a segment a lookup,
        // not a parse.
        conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
            true,
        )
        .map_err(error)?;
        // Checked before anything is written: another application's file
        // (or one of an earlier format) is left as it is. In one read
        // transaction, so that a file another process is creating is seen
        // before or after its first migration, never between its reads.
        conn.execute_batch("BEGIN").map_err(error)?;
        let checked = schema::check(&conn, &location);
        let _ = conn.execute_batch("COMMIT");
        checked?;
        // A new file keeps the pages retention frees apart, to be given
        // back by `PRAGMA incremental_vacuum`; an existing file made without
        // it keeps its mode (it reuses free pages all the same).
        patiently(|| conn.pragma_update(None, "auto_vacuum", "INCREMENTAL"))
            .map_err(|e| not_a_ledger(&location, e))?;
        patiently(|| conn.pragma_update(None, "journal_mode", "WAL"))
            .map_err(|e| not_a_ledger(&location, e))?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(error)?;
        Ok(Conn {
            conn,
            sync: Sync::Full,
            known: Known::default(),
            wake: crate::wake::path_of(path),
        })
    }

    /// After a transaction of this connection's ended (on this thread):
    /// tells the workers watching the ledger if it `committed` a run row
    /// that wakes them.
    pub fn ended(&self, committed: bool) {
        if crate::wake::take_noted() && committed {
            crate::wake::signal(&self.wake);
        }
    }

    /// Runs one of the transaction statements (`BEGIN IMMEDIATE`, `COMMIT`,
    /// `SAVEPOINT`…), kept prepared like every other.
    pub fn run(conn: &Connection, statement: &str) -> Result<(), StoreError> {
        conn.prepare_cached(statement)
            .and_then(|mut s| s.execute([]))
            .map(|_| ())
            .map_err(error)
    }

    /// Writes `plan` in one write transaction, committed in the sync mode
    /// its durability asks for.
    pub fn commit(&mut self, plan: &stephost_core::commit::CommitPlan) -> Result<(), StoreError> {
        if plan.is_empty() {
            return Ok(());
        }
        self.set_sync(Sync::when(plan.durable))?;
        Conn::run(&self.conn, "BEGIN IMMEDIATE")?;
        let applied = self
            .known
            .begin(&self.conn)
            .and_then(|()| crate::commit::apply(&self.conn, &mut self.known, plan))
            .and_then(|refusal| Conn::run(&self.conn, "COMMIT").map(|()| refusal));
        if applied.is_err() {
            let _ = Conn::run(&self.conn, "ROLLBACK");
            self.known.forget();
        }
        self.ended(applied.is_ok());
        match applied? {
            Some(refusal) => Err(refusal),
            None => Ok(()),
        }
    }

    /// Puts the connection in `sync` mode for its next commit.
    pub fn set_sync(&mut self, sync: Sync) -> Result<(), StoreError> {
        if self.sync != sync {
            let value = match sync {
                Sync::Full => "FULL",
                Sync::Normal => "NORMAL",
            };
            self.conn
                .pragma_update(None, "synchronous", value)
                .map_err(error)?;
            self.sync = sync;
        }
        Ok(())
    }
}
