//! Changing a ledger as someone with direct access to its database might:
//! no rule checked, no fence, no seal or link made. For tests of what
//! stephost does with a ledger changed behind its back (tamper evidence,
//! damaged histories, divergence); stephost itself never uses it. Each
//! backend implements it behind its `testing` feature.

use crate::records::{CallRecord, RunRecord};
use crate::store::StoreResult;

pub trait Tamper {
    /// Rewrites the run's row as `edit` leaves it.
    fn edit_run(&self, run_id: &str, edit: &mut dyn FnMut(&mut RunRecord)) -> StoreResult<()>;
    /// Rewrites call `seq` of the run as `edit` leaves it (its seq kept).
    fn edit_call(
        &self,
        run_id: &str,
        seq: u64,
        edit: &mut dyn FnMut(&mut CallRecord),
    ) -> StoreResult<()>;
    /// Removes call `seq` of the run.
    fn delete_call(&self, run_id: &str, seq: u64) -> StoreResult<()>;
    /// Replaces the bytes kept under module `digest`.
    fn replace_module(&self, digest: &str, bytes: &[u8]) -> StoreResult<()>;
    /// Inserts rows as they are, in one transaction (a large ledger, fast).
    fn insert_runs(&self, runs: &[RunRecord]) -> StoreResult<()>;
}
