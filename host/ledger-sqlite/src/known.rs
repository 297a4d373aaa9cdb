//! What a writing connection remembers of the calls it appended: each run's
//! last call, its sequence number and id. A commit that appends a run's next
//! call, or records the outcome of its last, then needs no look through the
//! run's segments (three lookups a call, a third of a group commit's work).
//!
//! What it remembers holds only while no other connection has committed:
//! SQLite's `data_version` tells, read at the start of each transaction
//! (while this connection holds the write lock, nobody else commits); when
//! it moved, or a transaction failed, everything is forgotten and the
//! segments are looked through again.

use std::collections::HashMap;

use rusqlite::Connection;
use stephost_core::StoreError;

use crate::errors::error;

#[derive(Default)]
pub struct Known {
    data_version: Option<i64>,
    /// By run number: the run's last call's sequence number and id.
    last: HashMap<i64, (u64, i64)>,
}

impl Known {
    /// At the start of a write transaction: forgets everything if another
    /// connection has committed since this one last looked.
    pub fn begin(&mut self, conn: &Connection) -> Result<(), StoreError> {
        let version = data_version(conn)?;
        if self.data_version != Some(version) {
            self.last.clear();
            self.data_version = Some(version);
        }
        Ok(())
    }

    /// After a failed transaction: what it appended is gone.
    pub fn forget(&mut self) {
        self.last.clear();
        self.data_version = None;
    }

    /// The run's last call, as this connection appended it.
    pub fn last(&self, run_no: i64) -> Option<(u64, i64)> {
        self.last.get(&run_no).copied()
    }

    /// The id of call `seq` of run `run_no`, if it is the last this
    /// connection appended.
    pub fn id_of(&self, run_no: i64, seq: u64) -> Option<i64> {
        self.last(run_no)
            .and_then(|(last, id)| (last == seq).then_some(id))
    }

    pub fn appended(&mut self, run_no: i64, seq: u64, id: i64) {
        self.last.insert(run_no, (seq, id));
    }
}

fn data_version(conn: &Connection) -> Result<i64, StoreError> {
    conn.prepare_cached("PRAGMA data_version")
        .and_then(|mut s| s.query_row([], |r| r.get(0)))
        .map_err(error)
}
