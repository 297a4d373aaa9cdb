//! Where a run's calls are.
//!
//! Calls are stored in the order they are recorded (`calls.id`), so that
//! the rows a group commit writes for many runs at once share the table's
//! last pages instead of taking a page of each run's (measured: 2.3 WAL
//! pages a write with the calls clustered by run, 0.4 in recording order).
//! A **segment** is a run's calls with consecutive sequence numbers stored
//! at consecutive ids; `segments` records where each begins. A run writing
//! alone has one segment; a run whose calls alternate with other runs' has
//! one per commit. Segments are keyed by their **epoch** (their first id's
//! range of [`EPOCH_CALLS`] ids) first, so that the segments one commit
//! begins for many runs share a page too; `run_epochs` lists the epochs
//! each run has a segment in, by the first sequence number it has there.
//!
//! A call is found at its segment's first id plus its distance from the
//! segment's first call, and the row found must be that call; a run's calls
//! are read segment by segment, each a range of ids.

use rusqlite::{Connection, OptionalExtension, params};
use stephost_core::{CallRecord, StoreError};

use crate::errors::error;
use crate::rows::{self, CALL_COLUMNS};

/// Bits of an id below its epoch: an epoch is 1,024 consecutive ids.
pub const EPOCH_BITS: u32 = 10;

/// Ids per epoch.
pub const EPOCH_CALLS: i64 = 1 << EPOCH_BITS;

fn epoch(id: i64) -> i64 {
    id >> EPOCH_BITS
}

/// Where calls about to be inserted at the table's end will go: the id of
/// the first, and whether it continues its run's last segment (the table's
/// last row is the run's call before it).
pub fn next_place(
    conn: &Connection,
    run_no: i64,
    first_seq: u64,
) -> Result<(i64, bool), StoreError> {
    let last: Option<(i64, i64, i64)> = conn
        .prepare_cached("SELECT id, run_no, seq FROM calls ORDER BY id DESC LIMIT 1")
        .and_then(|mut s| {
            s.query_row([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .optional()
        })
        .map_err(error)?;
    Ok(match last {
        Some((id, last_run, last_seq)) => (
            id + 1,
            last_run == run_no && last_seq as u64 + 1 == first_seq,
        ),
        None => (1, false),
    })
}

/// Records calls of run `run_no` inserted from sequence number `first_seq`
/// at consecutive ids from `first_id`, which begin a segment (see
/// [`next_place`]).
pub fn begin(
    conn: &Connection,
    run_no: i64,
    first_seq: u64,
    first_id: i64,
) -> Result<(), StoreError> {
    let epoch = epoch(first_id);
    let seen: Option<i64> = conn
        .prepare_cached("SELECT 1 FROM segments WHERE epoch = ?1 AND run_no = ?2 LIMIT 1")
        .and_then(|mut s| s.query_row(params![epoch, run_no], |r| r.get(0)).optional())
        .map_err(error)?;
    if seen.is_none() {
        conn.prepare_cached(
            "INSERT INTO run_epochs (run_no, first_seq, epoch) VALUES (?1, ?2, ?3)",
        )
        .and_then(|mut s| s.execute(params![run_no, first_seq as i64, epoch]))
        .map_err(error)?;
    }
    conn.prepare_cached(
        "INSERT INTO segments (epoch, run_no, first_seq, first_id) VALUES (?1, ?2, ?3, ?4)",
    )
    .and_then(|mut s| s.execute(params![epoch, run_no, first_seq as i64, first_id]))
    .map_err(error)?;
    Ok(())
}

/// The segment of run `run_no` that holds (or would hold) call `seq`: its
/// first sequence number and first id.
fn segment_of(conn: &Connection, run_no: i64, seq: u64) -> Result<Option<(u64, i64)>, StoreError> {
    let epoch: Option<i64> = conn
        .prepare_cached(
            "SELECT epoch FROM run_epochs WHERE run_no = ?1 AND first_seq <= ?2 \
             ORDER BY first_seq DESC LIMIT 1",
        )
        .and_then(|mut s| {
            s.query_row(params![run_no, seq as i64], |r| r.get(0))
                .optional()
        })
        .map_err(error)?;
    let Some(epoch) = epoch else {
        return Ok(None);
    };
    conn.prepare_cached(
        "SELECT first_seq, first_id FROM segments WHERE epoch = ?1 AND run_no = ?2 \
         AND first_seq <= ?3 ORDER BY first_seq DESC LIMIT 1",
    )
    .and_then(|mut s| {
        s.query_row(params![epoch, run_no, seq as i64], |r| {
            Ok((r.get::<_, i64>(0)? as u64, r.get(1)?))
        })
        .optional()
    })
    .map_err(error)
}

/// Whether the row at `id` is call `seq` of run `run_no`.
fn holds(conn: &Connection, id: i64, run_no: i64, seq: u64) -> Result<bool, StoreError> {
    conn.prepare_cached("SELECT 1 FROM calls WHERE id = ?1 AND run_no = ?2 AND seq = ?3")
        .and_then(|mut s| {
            s.query_row(params![id, run_no, seq as i64], |_| Ok(()))
                .optional()
        })
        .map(|found| found.is_some())
        .map_err(error)
}

/// The id of call `seq` of run `run_no`, if it is recorded.
pub fn find(conn: &Connection, run_no: i64, seq: u64) -> Result<Option<i64>, StoreError> {
    let Some((first_seq, first_id)) = segment_of(conn, run_no, seq)? else {
        return Ok(None);
    };
    let id = first_id.saturating_add((seq - first_seq) as i64);
    Ok(holds(conn, id, run_no, seq)?.then_some(id))
}

/// How many calls run `run_no` has recorded: the sequence number of its
/// last call (the end of its last segment, found by halving).
pub fn last_seq(conn: &Connection, run_no: i64) -> Result<u64, StoreError> {
    let Some((first_seq, first_id)) = segment_of(conn, run_no, u32::MAX as u64)? else {
        return Ok(0);
    };
    // The segment holds calls first_seq ..= first_seq + n for some n:
    // find the largest n whose row is the run's call.
    let (mut known, mut step) = (0u64, 1u64);
    while holds(
        conn,
        first_id + (known + step) as i64,
        run_no,
        first_seq + known + step,
    )? {
        known += step;
        step *= 2;
    }
    while step > 1 {
        step /= 2;
        if holds(
            conn,
            first_id + (known + step) as i64,
            run_no,
            first_seq + known + step,
        )? {
            known += step;
        }
    }
    Ok(first_seq + known)
}

/// Calls of run `run_no` from `from_seq` on, in order, at most `limit`.
pub fn calls(
    conn: &Connection,
    run_no: i64,
    from_seq: u64,
    limit: usize,
) -> Result<Vec<CallRecord>, StoreError> {
    // Rarely a body is split: those calls are noted and loaded after.
    let mut splits = Vec::new();
    let mut calls = read(conn, run_no, from_seq, limit, CALL_COLUMNS, |row| {
        let (call, split) = rows::call_from_row(row, 1)?;
        if split.any() {
            splits.push((call.seq, split));
        }
        Ok(call)
    })?;
    for (seq, split) in splits {
        split.load(conn, &mut calls[(seq - from_seq.max(1)) as usize])?;
    }
    Ok(calls)
}

/// Columns `columns` (which must begin with `run_no, seq`) of the calls of
/// run `run_no` from `from_seq` on, in order, at most `limit`, each made
/// by `map`, segment by segment.
pub fn read<T>(
    conn: &Connection,
    run_no: i64,
    from_seq: u64,
    limit: usize,
    columns: &str,
    mut map: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> Result<Vec<T>, StoreError> {
    let mut out = Vec::with_capacity(limit.min(CALLS_ALLOCATED_MAX));
    let mut seq = from_seq.max(1);
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT {columns} FROM calls WHERE id >= ?1 ORDER BY id LIMIT ?2"
        ))
        .map_err(error)?;
    while out.len() < limit {
        let Some((first_seq, first_id)) = segment_of(conn, run_no, seq)? else {
            break;
        };
        // Saturating: a `seq` far past the run's calls finds nothing.
        let start = first_id.saturating_add((seq - first_seq) as i64);
        let wanted = (limit - out.len()).min(i64::MAX as usize) as i64;
        let mut rows = stmt.query(params![start, wanted]).map_err(error)?;
        let before = out.len();
        while let Some(row) = rows.next().map_err(error)? {
            let owner: i64 = row.get(0).map_err(error)?;
            let found = row.get::<_, i64>(1).map_err(error)? as u64;
            // The segment ends where the next row is another run's; within
            // it, the run's calls follow each other without a gap.
            if owner != run_no {
                break;
            }
            if found != seq {
                return Err(StoreError::Corrupt(format!(
                    "run number {run_no}: call #{found} found where #{seq} was expected"
                )));
            }
            out.push(map(row).map_err(error)?);
            seq += 1;
        }
        if out.len() == before {
            break;
        }
    }
    Ok(out)
}

/// Most calls a read allocates room for before it has them.
const CALLS_ALLOCATED_MAX: usize = 4096;

/// An error for a call that should be recorded and is not found.
pub fn missing(run_id: &str, seq: u64, what: &str) -> StoreError {
    StoreError::Corrupt(format!(
        "{what} call #{seq} of run {run_id}, which is not recorded"
    ))
}
