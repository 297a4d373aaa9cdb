//! Rows and records: the SQL that reads and writes a run, a call and its
//! attempts, and the bodies kept apart by digest.

use rusqlite::{Connection, OptionalExtension, Row, params};
use serde::{Deserialize, Serialize};
use stephost_core::lifecycle;
use stephost_core::payload;
use stephost_core::{
    AttemptRecord, CallClass, CallRecord, CallState, RunRecord, RunStatus, StoreError,
};

use crate::errors::error;

pub const RUN_COLUMNS: &str = "run_id, module_digest, input, status, output, error, created_at, \
     updated_at, version, owner, lease_until, fence, wake_at, world, step, exit_code";

pub fn run_from_row(r: &Row<'_>) -> rusqlite::Result<RunRecord> {
    let status: String = r.get(3)?;
    Ok(RunRecord {
        run_id: r.get(0)?,
        module_digest: r.get(1)?,
        input: r.get(2)?,
        status: RunStatus::parse(&status).ok_or_else(|| bad_value(3, &status))?,
        output: r.get(4)?,
        error: r.get(5)?,
        created_at_ms: r.get(6)?,
        updated_at_ms: r.get(7)?,
        version: r.get(8)?,
        owner: r.get(9)?,
        lease_until_ms: r.get(10)?,
        fence: r.get(11)?,
        wake_at_ms: r.get(12)?,
        world: r.get(13)?,
        step: r.get(14)?,
        exit_code: r.get(15)?,
    })
}

fn bad_value(column: usize, value: &str) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(
        column,
        rusqlite::types::Type::Text,
        format!("unexpected value {value:?}").into(),
    )
}

/// The run `run_id`, if it exists.
pub fn find_run(conn: &Connection, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
    conn.prepare_cached(&format!("SELECT {RUN_COLUMNS} FROM runs WHERE run_id = ?1"))
        .and_then(|mut s| s.query_row([run_id], run_from_row).optional())
        .map_err(error)
}

pub fn run(conn: &Connection, run_id: &str) -> Result<RunRecord, StoreError> {
    find_run(conn, run_id)?.ok_or_else(|| StoreError::UnknownRun(run_id.to_string()))
}

/// Inserts `run`'s row; `false` if a run with its id exists.
pub fn insert_run(conn: &Connection, run: &RunRecord) -> Result<bool, StoreError> {
    let inserted = conn
        .prepare_cached(
            "INSERT INTO runs (run_id, module_digest, input, status, output, error, created_at, \
             updated_at, version, owner, lease_until, fence, wake_at, due_at, world, step, \
             exit_code) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, \
             ?15, ?16, ?17) ON CONFLICT (run_id) DO NOTHING",
        )
        .and_then(|mut s| {
            s.execute(params![
                run.run_id,
                run.module_digest,
                run.input,
                run.status.as_str(),
                run.output,
                run.error,
                run.created_at_ms,
                run.updated_at_ms,
                run.version,
                run.owner,
                run.lease_until_ms,
                run.fence,
                run.wake_at_ms,
                lifecycle::due_at(run),
                run.world,
                run.step,
                run.exit_code
            ])
        })
        .map_err(error)?;
    Ok(inserted == 1)
}

/// Replaces `run`'s row if its version is still `expected`: the number of
/// rows changed (0 or 1).
pub fn swap_run(conn: &Connection, expected: i64, run: &RunRecord) -> Result<usize, StoreError> {
    conn.prepare_cached(
        "UPDATE runs SET module_digest = ?2, input = ?3, status = ?4, output = ?5, error = ?6, \
         created_at = ?7, updated_at = ?8, version = ?9, owner = ?10, lease_until = ?11, \
         fence = ?12, wake_at = ?13, due_at = ?14, world = ?15, step = ?16, exit_code = ?17 \
         WHERE run_id = ?1 AND version = ?18",
    )
    .and_then(|mut s| {
        s.execute(params![
            run.run_id,
            run.module_digest,
            run.input,
            run.status.as_str(),
            run.output,
            run.error,
            run.created_at_ms,
            run.updated_at_ms,
            run.version,
            run.owner,
            run.lease_until_ms,
            run.fence,
            run.wake_at_ms,
            lifecycle::due_at(run),
            run.world,
            run.step,
            run.exit_code,
            expected
        ])
    })
    .map_err(error)
}

/// The error for a compare-and-set on `run_id`'s version that changed no row.
pub fn version_conflict(conn: &Connection, run_id: &str, expected: i64) -> StoreError {
    match run(conn, run_id) {
        Ok(found) => StoreError::VersionConflict {
            run_id: run_id.to_string(),
            expected,
            found: found.version,
        },
        Err(e) => e,
    }
}

pub const CALL_COLUMNS: &str = "key, class, interface, function, operation_id, request, \
     request_split, request_hash, state, outcome, outcome_split, started_at, finished_at, \
     resolved_by, chain";

/// A call row as read, its bodies not yet loaded from `payloads`.
pub struct CallRow {
    pub call: CallRecord,
    request_split: bool,
    outcome_split: bool,
}

pub fn call_from_row(r: &Row<'_>) -> rusqlite::Result<CallRow> {
    let class = r.get_ref(1)?.as_str()?;
    let class = CallClass::parse(class).ok_or_else(|| bad_value(1, class))?;
    let state = r.get_ref(8)?.as_str()?;
    let state = CallState::parse(state).ok_or_else(|| bad_value(8, state))?;
    Ok(CallRow {
        call: CallRecord {
            seq: (r.get::<_, i64>(0)? & 0xffff_ffff) as u64,
            class,
            interface: r.get(2)?,
            function: r.get(3)?,
            operation_id: r.get(4)?,
            request: r.get(5)?,
            request_hash: r.get(7)?,
            state,
            outcome: r.get(9)?,
            started_at_ms: r.get(11)?,
            finished_at_ms: r.get(12)?,
            resolved_by: r.get(13)?,
            chain: r.get(14)?,
        },
        request_split: r.get(6)?,
        outcome_split: r.get(10)?,
    })
}

impl CallRow {
    /// The call with its bodies whole.
    pub fn load(self, conn: &Connection) -> Result<CallRecord, StoreError> {
        if !self.request_split && !self.outcome_split {
            return Ok(self.call);
        }
        let CallRow {
            mut call,
            request_split,
            outcome_split,
        } = self;
        if request_split {
            call.request = payload::load(&call.request, true, |d| part(conn, d))?;
        }
        if outcome_split && let Some(outcome) = &call.outcome {
            call.outcome = Some(payload::load(outcome, true, |d| part(conn, d))?);
        }
        Ok(call)
    }
}

fn part(conn: &Connection, digest: &str) -> Result<Option<String>, StoreError> {
    conn.prepare_cached("SELECT body FROM payloads WHERE digest = ?1")
        .and_then(|mut s| s.query_row([digest], |r| r.get(0)).optional())
        .map_err(error)
}

/// `body` as stored: its text for the row (and whether it is split), its
/// parts kept in `payloads`.
pub fn store_body<'a>(
    conn: &Connection,
    body: &'a str,
) -> Result<(std::borrow::Cow<'a, str>, bool), StoreError> {
    if payload::stays_whole(body) {
        return Ok((std::borrow::Cow::Borrowed(body), false));
    }
    let stored = payload::store(body);
    for part in &stored.parts {
        conn.prepare_cached(
            "INSERT INTO payloads (digest, body) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
        )
        .and_then(|mut s| s.execute(params![part.digest, part.body]))
        .map_err(error)?;
    }
    let split = stored.is_split();
    Ok((std::borrow::Cow::Owned(stored.text), split))
}

/// The key of call `seq` of run number `run_no` (see the `calls` table).
pub fn call_key(run_no: i64, seq: u64) -> Result<i64, StoreError> {
    if seq > stephost_core::records::CALLS_PER_RUN_MAX || !(0..1 << 31).contains(&run_no) {
        return Err(StoreError::Corrupt(format!(
            "call #{seq} of run number {run_no} has no key: a run records at most {} calls, \
             a ledger at most 2,147,483,647 runs",
            stephost_core::records::CALLS_PER_RUN_MAX
        )));
    }
    Ok((run_no << 32) | seq as i64)
}

/// The keys of run number `run_no`'s calls, from call `from_seq` on.
pub fn call_keys(run_no: i64, from_seq: u64) -> Result<(i64, i64), StoreError> {
    Ok((
        call_key(run_no, from_seq)?,
        call_key(run_no, stephost_core::records::CALLS_PER_RUN_MAX)?,
    ))
}

/// The number that keys `run_id`'s calls and log lines.
pub fn run_no(conn: &Connection, run_id: &str) -> Result<i64, StoreError> {
    conn.prepare_cached("SELECT run_no FROM runs WHERE run_id = ?1")
        .and_then(|mut s| s.query_row([run_id], |r| r.get(0)).optional())
        .map_err(error)?
        .ok_or_else(|| StoreError::UnknownRun(run_id.to_string()))
}

/// Calls of `run_id` from `from_seq` on, in order, at most `limit`.
pub fn calls(
    conn: &Connection,
    run_id: &str,
    from_seq: u64,
    limit: usize,
) -> Result<Vec<CallRecord>, StoreError> {
    calls_of(conn, run_no(conn, run_id)?, from_seq, limit)
}

/// Calls of run number `run_no` from `from_seq` on, in order, at most
/// `limit`.
pub fn calls_of(
    conn: &Connection,
    run_no: i64,
    from_seq: u64,
    limit: usize,
) -> Result<Vec<CallRecord>, StoreError> {
    let (from, to) = call_keys(run_no, from_seq)?;
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT {CALL_COLUMNS} FROM calls WHERE key BETWEEN ?1 AND ?2 ORDER BY key LIMIT ?3"
        ))
        .map_err(error)?;
    let mut rows = stmt
        .query(params![from, to, i64::try_from(limit).unwrap_or(i64::MAX)])
        .map_err(error)?;
    let mut calls = Vec::with_capacity(limit.min(CALLS_ALLOCATED_MAX));
    while let Some(row) = rows.next().map_err(error)? {
        calls.push(call_from_row(row).map_err(error)?.load(conn)?);
    }
    Ok(calls)
}

/// Most calls a read allocates room for before it has them.
const CALLS_ALLOCATED_MAX: usize = 4096;

/// How many calls run number `run_no` has recorded (the last one's seq).
pub fn last_seq(conn: &Connection, run_no: i64) -> Result<u64, StoreError> {
    let (from, to) = call_keys(run_no, 0)?;
    conn.prepare_cached("SELECT max(key) FROM calls WHERE key BETWEEN ?1 AND ?2")
        .and_then(|mut s| s.query_row([from, to], |r| r.get::<_, Option<i64>>(0)))
        .map(|key| key.map_or(0, |key| (key & 0xffff_ffff) as u64))
        .map_err(error)
}

/// One attempt as a call row's `attempts` array holds it.
#[derive(Serialize, Deserialize)]
struct StoredAttempt<'a> {
    attempt: u32,
    #[serde(borrow)]
    kind: std::borrow::Cow<'a, str>,
    started_at: i64,
    finished_at: i64,
    #[serde(borrow)]
    result: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    detail: Option<std::borrow::Cow<'a, str>>,
}

/// The JSON array of `attempts`.
pub fn attempts_json(attempts: &[&AttemptRecord]) -> String {
    let stored: Vec<StoredAttempt<'_>> = attempts
        .iter()
        .map(|a| StoredAttempt {
            attempt: a.attempt,
            kind: a.kind.as_str().into(),
            started_at: a.started_at_ms,
            finished_at: a.finished_at_ms,
            result: a.result.as_str().into(),
            detail: a.detail.as_deref().map(Into::into),
        })
        .collect();
    serde_json::to_string(&stored).unwrap_or_else(|_| "[]".into())
}

/// The attempts of call `seq` from its row's `attempts` array.
pub fn attempts_from_json(seq: u64, text: &str) -> Result<Vec<AttemptRecord>, StoreError> {
    let stored: Vec<StoredAttempt<'_>> = serde_json::from_str(text).map_err(|e| {
        StoreError::Corrupt(format!("the attempts of call #{seq} are unreadable: {e}"))
    })?;
    Ok(stored
        .into_iter()
        .map(|a| AttemptRecord {
            seq,
            attempt: a.attempt,
            kind: a.kind.into_owned(),
            started_at_ms: a.started_at,
            finished_at_ms: a.finished_at,
            result: a.result.into_owned(),
            detail: a.detail.map(std::borrow::Cow::into_owned),
        })
        .collect())
}

/// SQL that appends the JSON array `?` to a row's `attempts` array.
pub const APPEND_ATTEMPTS: &str = "CASE WHEN attempts IS NULL THEN ?{n} \
     ELSE substr(attempts, 1, length(attempts) - 1) || ',' || substr(?{n}, 2) END";

/// [`APPEND_ATTEMPTS`] with its parameter numbered `n`.
pub fn append_attempts(n: usize) -> String {
    APPEND_ATTEMPTS.replace("{n}", &n.to_string())
}
