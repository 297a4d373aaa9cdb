//! Rows and records: the SQL that reads and writes a run, a call and its
//! attempts, and the bodies kept apart by digest.

use rusqlite::{Connection, OptionalExtension, Row, params};
use stephost_core::lifecycle;
use stephost_core::notices::{Notice, NoticeEvent, NoticeState};
use stephost_core::payload;
use stephost_core::{CallClass, CallRecord, CallState, RunRecord, RunStatus, StoreError};

use crate::errors::error;

pub const RUN_COLUMNS: &str = "run_id, module_digest, input, status, output, error, created_at, \
     updated_at, version, owner, lease_until, fence, wake_at, world, step, exit_code, seal, budget, \
     trace";

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
        seal: r.get(16)?,
        budget: {
            let text: Option<String> = r.get(17)?;
            stephost_core::RunBudget::from_column(text.as_deref()).map_err(|e| bad_value(17, &e))?
        },
        trace: {
            let text: Option<String> = r.get(18)?;
            text.map(|t| {
                stephost_core::RunTrace::from_column(Some(&t), "").map_err(|e| bad_value(18, &e))
            })
            .transpose()?
        },
    })
}

pub const NOTICE_COLUMNS: &str = "delivery_id, webhook, event, run_id, body, created_at, state, \
     next_at, attempts, delivered_at, last_error";

pub fn notice_from_row(r: &Row<'_>) -> rusqlite::Result<Notice> {
    notice_from_row_at(r, 0)
}

/// A notice from [`NOTICE_COLUMNS`] starting at column `at`.
pub fn notice_from_row_at(r: &Row<'_>, at: usize) -> rusqlite::Result<Notice> {
    let event: String = r.get(at + 2)?;
    let state: String = r.get(at + 6)?;
    Ok(Notice {
        delivery_id: r.get(at)?,
        webhook: r.get(at + 1)?,
        event: NoticeEvent::parse(&event).ok_or_else(|| bad_value(at + 2, &event))?,
        run_id: r.get(at + 3)?,
        body: r.get(at + 4)?,
        created_at_ms: r.get(at + 5)?,
        state: NoticeState::parse(&state).ok_or_else(|| bad_value(at + 6, &state))?,
        next_at_ms: r.get(at + 7)?,
        attempts: r.get(at + 8)?,
        delivered_at_ms: r.get(at + 9)?,
        last_error: r.get(at + 10)?,
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
             exit_code, seal, budget, trace) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, \
             ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20) ON CONFLICT (run_id) DO NOTHING",
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
                run.seal,
                run.budget.to_column(),
                run.trace.as_ref().map(stephost_core::RunTrace::to_column)
            ])
        })
        .map_err(error)?;
    crate::wake::note(lifecycle::due_at(run), run.owner.is_some());
    Ok(inserted == 1)
}

/// Replaces `run`'s row if its version is still `expected`: the number of
/// rows changed (0 or 1).
pub fn swap_run(conn: &Connection, expected: i64, run: &RunRecord) -> Result<usize, StoreError> {
    crate::wake::note(lifecycle::due_at(run), run.owner.is_some());
    conn.prepare_cached(
        "UPDATE runs SET module_digest = ?2, input = ?3, status = ?4, output = ?5, error = ?6, \
         created_at = ?7, updated_at = ?8, version = ?9, owner = ?10, lease_until = ?11, \
         fence = ?12, wake_at = ?13, due_at = ?14, world = ?15, step = ?16, exit_code = ?17, \
         seal = ?19, budget = ?20 WHERE run_id = ?1 AND version = ?18",
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
            expected,
            run.seal,
            run.budget.to_column()
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

/// A call's columns, as [`call_from_row`] reads them (the first two are
/// those [`crate::segments::read`] needs).
pub const CALL_COLUMNS: &str = "run_no, seq, class, interface, function, operation_id, request, \
     request_split, request_hash, state, outcome, outcome_split, started_at, finished_at, \
     resolved_by, chain, fence";

/// Which bodies of a call row are split into `payloads` and must be loaded.
#[derive(Clone, Copy)]
pub struct Split {
    request: bool,
    outcome: bool,
}

impl Split {
    /// Whether a body must be loaded.
    pub fn any(self) -> bool {
        self.request || self.outcome
    }

    /// Loads `call`'s bodies that this says are split.
    pub fn load(self, conn: &Connection, call: &mut CallRecord) -> Result<(), StoreError> {
        if self.request {
            call.request = payload::load(&call.request, true, |d| part(conn, d))?;
        }
        if self.outcome
            && let Some(outcome) = &call.outcome
        {
            call.outcome = Some(payload::load(outcome, true, |d| part(conn, d))?);
        }
        Ok(())
    }
}

/// The call in [`CALL_COLUMNS`] order, whose `seq` is column `at`, its
/// split bodies not yet loaded.
pub fn call_from_row(r: &Row<'_>, at: usize) -> rusqlite::Result<(CallRecord, Split)> {
    let class = r.get_ref(at + 1)?.as_str()?;
    let class = CallClass::parse(class).ok_or_else(|| bad_value(at + 1, class))?;
    let state = r.get_ref(at + 8)?.as_str()?;
    let state = CallState::parse(state).ok_or_else(|| bad_value(at + 8, state))?;
    let call = CallRecord {
        seq: r.get::<_, i64>(at)? as u64,
        class,
        interface: r.get(at + 2)?,
        function: r.get(at + 3)?,
        operation_id: r.get(at + 4)?,
        request: r.get(at + 5)?,
        request_hash: r.get(at + 7)?,
        state,
        outcome: r.get(at + 9)?,
        started_at_ms: r.get(at + 11)?,
        finished_at_ms: r.get(at + 12)?,
        resolved_by: r.get(at + 13)?,
        chain: r.get(at + 14)?,
        fence: r.get(at + 15)?,
    };
    let split = Split {
        request: r.get(at + 6)?,
        outcome: r.get(at + 10)?,
    };
    Ok((call, split))
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
    crate::segments::calls(conn, run_no(conn, run_id)?, from_seq, limit)
}

/// SQL that appends the JSON array `?` to a row's `attempts` array.
pub const APPEND_ATTEMPTS: &str = "CASE WHEN attempts IS NULL THEN ?{n} \
     ELSE substr(attempts, 1, length(attempts) - 1) || ',' || substr(?{n}, 2) END";

/// [`APPEND_ATTEMPTS`] with its parameter numbered `n`.
pub fn append_attempts(n: usize) -> String {
    APPEND_ATTEMPTS.replace("{n}", &n.to_string())
}
