//! [`Tamper`] on SQLite: rows rewritten as they are, for tests (the
//! `testing` feature).

use rusqlite::params;
use stephost_core::records::{CallRecord, RunRecord};
use stephost_core::tamper::Tamper;
use stephost_core::{StoreError, StoreResult};

use crate::errors::error;
use crate::rows;
use crate::store::SqliteStore;

impl Tamper for SqliteStore {
    fn edit_run(&self, run_id: &str, edit: &mut dyn FnMut(&mut RunRecord)) -> StoreResult<()> {
        self.write(|conn| {
            let mut run = rows::run(conn, run_id)?;
            let version = run.version;
            edit(&mut run);
            run.run_id = run_id.to_string();
            match rows::swap_run(conn, version, &run)? {
                1 => Ok(()),
                _ => Err(StoreError::UnknownRun(run_id.to_string())),
            }
        })
    }

    fn edit_call(
        &self,
        run_id: &str,
        seq: u64,
        edit: &mut dyn FnMut(&mut CallRecord),
    ) -> StoreResult<()> {
        self.write(|conn| {
            let key = call_key(conn, run_id, seq)?;
            let mut call = rows::calls(conn, run_id, seq, 1)?
                .pop()
                .filter(|c| c.seq == seq)
                .ok_or_else(|| missing(run_id, seq))?;
            edit(&mut call);
            let run_no = rows::run_no(conn, run_id)?;
            let (request, request_split) = rows::store_body(conn, run_no, &call.request)?;
            let (outcome, outcome_split) = match &call.outcome {
                Some(text) => {
                    let (body, split) = rows::store_body(conn, run_no, text)?;
                    (Some(body.into_owned()), split)
                }
                None => (None, false),
            };
            conn.execute(
                "UPDATE calls SET class = ?2, interface = ?3, function = ?4, operation_id = ?5, \
                 request = ?6, request_split = ?7, request_hash = ?8, state = ?9, outcome = ?10, \
                 outcome_split = ?11, started_at = ?12, finished_at = ?13, resolved_by = ?14, \
                 chain = ?15, fence = ?16 WHERE id = ?1",
                params![
                    key,
                    call.class.as_str(),
                    call.interface,
                    call.function,
                    call.operation_id,
                    request,
                    request_split,
                    call.request_hash,
                    call.state.as_str(),
                    outcome,
                    outcome_split,
                    call.started_at_ms,
                    call.finished_at_ms,
                    call.resolved_by,
                    call.chain,
                    call.fence
                ],
            )
            .map_err(error)?;
            Ok(())
        })
    }

    fn delete_call(&self, run_id: &str, seq: u64) -> StoreResult<()> {
        self.write(|conn| {
            let key = call_key(conn, run_id, seq)?;
            conn.execute("DELETE FROM calls WHERE id = ?1", [key])
                .map_err(error)?;
            Ok(())
        })
    }

    fn replace_module(&self, digest: &str, bytes: &[u8]) -> StoreResult<()> {
        self.write(|conn| {
            match conn
                .execute(
                    "UPDATE modules SET bytes = ?2 WHERE digest = ?1",
                    params![digest, bytes],
                )
                .map_err(error)?
            {
                1 => Ok(()),
                _ => Err(StoreError::UnknownModule(digest.to_string())),
            }
        })
    }

    fn insert_runs(&self, runs: &[RunRecord]) -> StoreResult<()> {
        self.write(|conn| {
            for run in runs {
                rows::insert_run(conn, run)?;
            }
            Ok(())
        })
    }
}

/// The row id of call `seq` of `run_id`.
fn call_key(conn: &rusqlite::Connection, run_id: &str, seq: u64) -> StoreResult<i64> {
    let run_no = rows::run_no(conn, run_id)?;
    crate::segments::find(conn, run_no, seq)?.ok_or_else(|| missing(run_id, seq))
}

fn missing(run_id: &str, seq: u64) -> StoreError {
    StoreError::Corrupt(format!("run {run_id} has no call #{seq} to change"))
}
