//! stephost-ledger-sqlite: the embedded ledger, one SQLite file in WAL mode.
//!
//! A [`SqlitePool`] opens the file (`sqlite:PATH`), creating it and its
//! schema ([`schema`], plain SQL migration files) if absent. Its stores
//! and writers each have a connection of their own. A commit that must be
//! durable is fsync'd (`synchronous = FULL`) before it is answered; others
//! are not (`NORMAL`), and become durable with the next one that is. A pool
//! opened for group commit sends its writers' commits through one committer
//! thread ([`group`]).

mod commit;
mod conn;
pub mod group;
mod rows;
pub mod schema;
mod store;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use stephost_core::store::{Commit, CommitCounts, Pool, PoolOptions, Store, WriteOp, Writer};
use stephost_core::{Claim, StoreResult};

pub use conn::BUSY_TIMEOUT_MS;
pub use store::SqliteStore;

use crate::conn::{Conn, Sync, error};

/// A ledger in one SQLite file.
pub struct SqlitePool {
    path: PathBuf,
    group: Option<Arc<group::GroupCommitter>>,
}

impl SqlitePool {
    /// Opens (or creates) the ledger at `path`.
    pub fn open(path: &Path, options: PoolOptions) -> StoreResult<Self> {
        // Opening checks the file and brings its schema up to date.
        drop(Conn::open(path)?);
        let group = match options.group_commit {
            true => Some(Arc::new(group::GroupCommitter::start(path)?)),
            false => None,
        };
        Ok(SqlitePool {
            path: path.to_path_buf(),
            group,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A store of this pool's, typed.
    pub fn sqlite_store(&self) -> StoreResult<SqliteStore> {
        Ok(SqliteStore::new(Conn::open(&self.path)?))
    }
}

impl Pool for SqlitePool {
    fn location(&self) -> String {
        format!("sqlite:{}", self.path.display())
    }

    fn store(&self) -> StoreResult<Box<dyn Store>> {
        Ok(Box::new(self.sqlite_store()?))
    }

    fn writer(&self) -> StoreResult<Box<dyn Writer>> {
        match &self.group {
            Some(group) => Ok(Box::new(group.writer()?)),
            None => Ok(Box::new(DirectWriter {
                conn: Conn::open(&self.path)?,
            })),
        }
    }

    fn commit_counts(&self) -> CommitCounts {
        self.group.as_ref().map(|g| g.counts()).unwrap_or_default()
    }
}

/// A writer that commits on its own connection, on the caller's thread.
pub struct DirectWriter {
    conn: Conn,
}

impl DirectWriter {
    fn apply(&mut self, claim: &Claim, ops: &[WriteOp]) -> StoreResult<()> {
        if ops.is_empty() {
            return Ok(());
        }
        self.conn.set_sync(Sync::when(commit::durable(ops)))?;
        let conn = &self.conn.conn;
        conn.execute_batch("BEGIN IMMEDIATE").map_err(error)?;
        match commit::apply(conn, claim, ops) {
            Ok(()) => conn.execute_batch("COMMIT").map_err(error),
            Err(e) => {
                let _ = conn.execute_batch("ROLLBACK");
                Err(e)
            }
        }
    }
}

impl Writer for DirectWriter {
    fn commit(&mut self, claim: &Claim, ops: Vec<WriteOp>) -> Commit {
        Commit::Done(self.apply(claim, &ops))
    }

    fn landed(&mut self) -> StoreResult<()> {
        Ok(())
    }
}
