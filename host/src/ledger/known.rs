//! What a writing connection knows of the ledger from its own writes.
//!
//! A worker's group committer commits about 40,000 writes a second on one
//! connection, each a run's call, and before each it would look up what it
//! wrote itself a moment ago: the run's fencing token and number, where the
//! run's last call is, where the calls table ends. [`Known`] remembers them
//! instead, which saves three of a write's six statements.
//!
//! Remembered values are exact only while nothing else changed the ledger
//! since this connection committed them. So at the start of every
//! transaction that writes calls ([`Known::begin`]), which holds the
//! ledger's write lock until it ends and so keeps every other writer out,
//! everything is forgotten if
//! - the database changed since this connection's last such transaction
//!   committed: another connection, of this process or another, committed,
//!   or this one did outside such transactions (the data version that
//!   `SQLITE_FCNTL_DATA_VERSION` reads changed: it moves with every
//!   commit of any connection, read once the transaction has seen them);
//! - this connection changed rows outside such transactions (a claim, a
//!   renewal, a person's decision: `total_changes` moved, a second guard);
//! - its last such transaction was not committed (undone, or it failed:
//!   a second guard, since what it remembered of its own rows came with
//!   changes that moved `total_changes` too).
//!
//! A savepoint undone within a transaction forgets everything as well
//! ([`Known::forget`]), and a call's place is remembered only once its row
//! is inserted ([`Placed::inserted`]). What is not known is looked up, as
//! before, so a connection that forgets often is only as fast as one that
//! never knew (but for reading the data version, twice a transaction:
//! a file control, not a statement).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use rusqlite::Connection;

use super::LedgerError;
use super::spans::Placed;

/// Runs whose fencing token is remembered at most; past it, all are
/// forgotten (and looked up again when they next write). Two in the tests,
/// whose runs then forget and look up as a busy worker's would.
const FENCES_KNOWN_MAX: usize = if cfg!(test) { 2 } else { 4096 };

#[derive(Default)]
pub struct Known {
    since: RefCell<Since>,
    /// Where the calls this connection wrote are.
    pub placed: Placed,
    /// By run id: the run's fencing token and number, as this connection
    /// read them.
    fences: RefCell<HashMap<String, (i64, i64)>>,
    /// How many times it forgot everything.
    forgotten: Cell<u64>,
}

/// What the connection's last transaction that writes calls left.
#[derive(Default)]
struct Since {
    /// The database's data version once it committed.
    version: Option<u32>,
    /// The connection's `total_changes` once it committed.
    changes: u64,
    /// It began and has not been committed (yet).
    open: bool,
}

impl Known {
    /// At the start of a transaction of `conn` that writes calls (holding
    /// the write lock): forgets everything unless the ledger is as this
    /// connection's last such transaction left it. The transaction must
    /// have begun (`BEGIN IMMEDIATE`): the data version it reads counts
    /// other connections' commits only once a transaction has seen them.
    pub fn begin(&self, conn: &Connection) -> Result<(), LedgerError> {
        debug_assert_eq!(
            conn.transaction_state(Some(rusqlite::MAIN_DB))?,
            rusqlite::TransactionState::Write,
            "Known::begin outside a write transaction"
        );
        let version = data_version(conn)?;
        let mut since = self.since.borrow_mut();
        if since.open || since.version != Some(version) || since.changes != conn.total_changes() {
            self.forget();
        }
        since.open = true;
        Ok(())
    }

    /// The transaction begun last was committed.
    pub fn committed(&self, conn: &Connection) {
        let mut since = self.since.borrow_mut();
        since.open = false;
        since.changes = conn.total_changes();
        // Unreadable, nothing is known at the next transaction's start.
        since.version = data_version(conn).ok();
    }

    /// Forgets everything (a savepoint was undone).
    pub fn forget(&self) {
        self.placed.clear();
        self.fences.borrow_mut().clear();
        self.forgotten.set(self.forgotten.get() + 1);
    }

    /// How many times it forgot everything.
    #[cfg(test)]
    pub fn forgotten(&self) -> u64 {
        self.forgotten.get()
    }

    /// The fencing token and number of `run_id`, if known.
    pub fn fence(&self, run_id: &str) -> Option<(i64, i64)> {
        self.fences.borrow().get(run_id).copied()
    }

    /// Remembers the fencing token and number of `run_id`, read in this
    /// transaction.
    pub fn read_fence(&self, run_id: &str, fence: i64, run_no: i64) {
        let mut fences = self.fences.borrow_mut();
        if fences.len() >= FENCES_KNOWN_MAX && !fences.contains_key(run_id) {
            fences.clear();
        }
        fences.insert(run_id.to_string(), (fence, run_no));
    }
}

/// The main database's data version (`SQLITE_FCNTL_DATA_VERSION`): it
/// changes with every commit, this connection's own included, and with
/// every other connection's once this one's transaction has seen it. Read
/// by a file control, it costs no statement (`PRAGMA data_version` would,
/// and would not count this connection's own commits).
fn data_version(conn: &Connection) -> Result<u32, LedgerError> {
    let mut version = 0;
    conn.file_control(
        Some(rusqlite::MAIN_DB),
        rusqlite::FileControl::DataVersion(&mut version),
    )?;
    Ok(version)
}
