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
     trace, parent_run_id, parent_seq, join_set, root_run_id, detached, cancel_at, cancel_by, \
     cancel_reason, fork";

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
        parent: {
            let run_id: Option<String> = r.get(19)?;
            match run_id {
                Some(run_id) => Some(stephost_core::ParentRef {
                    run_id,
                    seq: r.get::<_, i64>(20)? as u64,
                    join_set: r.get(21)?,
                    detached: r.get(23)?,
                }),
                None => None,
            }
        },
        root_run_id: r.get(22)?,
        cancel: match r.get::<_, Option<i64>>(24)? {
            Some(at_ms) => Some(stephost_core::CancelRequest {
                at_ms,
                by: r.get(25)?,
                reason: r.get(26)?,
            }),
            None => None,
        },
        fork: {
            let text: Option<String> = r.get(27)?;
            stephost_core::ForkRef::from_column(text.as_deref()).map_err(|e| bad_value(27, &e))?
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
             exit_code, seal, budget, trace, parent_run_id, parent_seq, join_set, root_run_id, \
             detached, fork, fork_of) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, \
             ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27) \
             ON CONFLICT (run_id) DO NOTHING",
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
                run.trace.as_ref().map(stephost_core::RunTrace::to_column),
                run.parent.as_ref().map(|p| p.run_id.as_str()),
                run.parent.as_ref().map(|p| p.seq as i64),
                run.parent.as_ref().map(|p| p.join_set.as_str()),
                run.root_run_id,
                run.parent.as_ref().is_some_and(|p| p.detached),
                run.fork.as_ref().map(stephost_core::ForkRef::to_column),
                run.fork.as_ref().map(|f| f.run_id.as_str())
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

/// `body`, a body of run `run_no`'s calls, as stored: its text for the
/// row (and whether it is split), its parts kept in `payloads`, each noted
/// as referred to by the run (`payload_refs`, for retention).
pub fn store_body<'a>(
    conn: &Connection,
    run_no: i64,
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
        conn.prepare_cached(
            "INSERT INTO payload_refs (run_no, digest) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
        )
        .and_then(|mut s| s.execute(params![run_no, part.digest]))
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

/// The ends of run `run_no`'s children, in arrival order.
pub fn inbox(conn: &Connection, run_no: i64) -> Result<Vec<stephost_core::InboxEntry>, StoreError> {
    conn.prepare_cached(
        "SELECT arrival, child_run_id, join_set, status, at FROM inbox WHERE run_no = ?1 \
         ORDER BY arrival",
    )
    .and_then(|mut s| {
        s.query_map([run_no], |r| {
            let status: String = r.get(3)?;
            Ok(stephost_core::InboxEntry {
                arrival: r.get::<_, i64>(0)? as u64,
                child_run_id: r.get(1)?,
                join_set: r.get(2)?,
                status: RunStatus::parse(&status).ok_or_else(|| bad_value(3, &status))?,
                at_ms: r.get(4)?,
            })
        })?
        .collect()
    })
    .map_err(error)
}

/// Promise `id` of run `run_no`'s completion, if it has one.
pub fn promise(
    conn: &Connection,
    run_no: i64,
    id: u64,
) -> Result<Option<stephost_core::promises::Completion>, StoreError> {
    let found: Option<(String, String, String, i64)> = conn
        .prepare_cached("SELECT state, value, by, at FROM promises WHERE run_no = ?1 AND id = ?2")
        .and_then(|mut s| {
            s.query_row(params![run_no, id as i64], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })
            .optional()
        })
        .map_err(error)?;
    found
        .map(|(state, value, by, at_ms)| {
            Ok(stephost_core::promises::Completion {
                state: stephost_core::promises::PromiseState::parse(&state)
                    .ok_or_else(|| error(bad_value(0, &state)))?,
                value,
                by,
                at_ms,
            })
        })
        .transpose()
}

/// A child's end into its parent's inbox, under the parent's next arrival
/// number; the parent made due if it waits
/// ([`lifecycle::woken_by_arrival`]). A second delivery of the same end
/// changes nothing.
pub fn arrive(conn: &Connection, arrival: &stephost_core::ChildArrival) -> Result<(), StoreError> {
    let found: Option<(i64, String)> = conn
        .prepare_cached("SELECT run_no, status FROM runs WHERE run_id = ?1")
        .and_then(|mut s| {
            s.query_row([&arrival.parent_run_id], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
        })
        .map_err(error)?;
    let Some((run_no, status)) = found else {
        return Err(StoreError::UnknownRun(arrival.parent_run_id.clone()));
    };
    let status = RunStatus::parse(&status)
        .ok_or_else(|| StoreError::Corrupt(format!("run status {status:?}")))?;
    let known: i64 = conn
        .prepare_cached("SELECT count(*) FROM inbox WHERE run_no = ?1 AND child_run_id = ?2")
        .and_then(|mut s| s.query_row(params![run_no, arrival.child_run_id], |r| r.get(0)))
        .map_err(error)?;
    if known > 0 {
        return Ok(());
    }
    let woken = lifecycle::woken_by_arrival(status, arrival.at_ms);
    let number: i64 = conn
        .prepare_cached(
            "UPDATE runs SET arrivals = arrivals + 1, version = version + 1, \
             wake_at = coalesce(?2, wake_at), due_at = coalesce(?3, due_at) \
             WHERE run_no = ?1 RETURNING arrivals",
        )
        .and_then(|mut s| {
            s.query_row(
                params![run_no, woken.map(|w| w.0), woken.map(|w| w.1)],
                |r| r.get(0),
            )
        })
        .map_err(error)?;
    conn.prepare_cached(
        "INSERT INTO inbox (run_no, arrival, child_run_id, join_set, status, at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )
    .and_then(|mut s| {
        s.execute(params![
            run_no,
            number,
            arrival.child_run_id,
            arrival.join_set,
            arrival.status.as_str(),
            arrival.at_ms
        ])
    })
    .map_err(error)?;
    if let Some((_, due)) = woken {
        crate::wake::note(Some(due), false);
    }
    Ok(())
}

/// Marks run `run_id` cancelled by `request` if it is unfinished and not
/// marked yet, then every run below it (only the children not detached of
/// the top one, with `attached`), in the caller's transaction; the ids
/// marked, top down. A run nobody holds that is pending or waiting is due
/// at once ([`lifecycle::woken_by_cancel`]).
pub fn mark_cancelled(
    conn: &Connection,
    top: &[String],
    request: &stephost_core::CancelRequest,
    marked: &mut Vec<String>,
) -> Result<(), StoreError> {
    let mut level: Vec<String> = top.to_vec();
    while !level.is_empty() {
        let mut next = Vec::new();
        for id in &level {
            let found: Option<(String, bool)> = conn
                .prepare_cached(
                    "SELECT status, owner IS NOT NULL FROM runs \
                     WHERE run_id = ?1 AND cancel_at IS NULL",
                )
                .and_then(|mut s| s.query_row([id], |r| Ok((r.get(0)?, r.get(1)?))).optional())
                .map_err(error)?;
            if let Some((status, held)) = found
                && let Some(status) = RunStatus::parse(&status)
                && !status.is_finished()
            {
                let woken = lifecycle::woken_by_cancel(status, held, request.at_ms);
                conn.prepare_cached(
                    "UPDATE runs SET cancel_at = ?2, cancel_by = ?3, cancel_reason = ?4, \
                     version = version + 1, updated_at = ?2, \
                     wake_at = CASE WHEN status = 'waiting' THEN coalesce(?5, wake_at) \
                                    ELSE wake_at END, \
                     due_at = coalesce(?6, due_at) WHERE run_id = ?1",
                )
                .and_then(|mut s| {
                    s.execute(params![
                        id,
                        request.at_ms,
                        request.by,
                        request.reason,
                        woken.map(|w| w.0),
                        woken.map(|w| w.1)
                    ])
                })
                .map_err(error)?;
                if let Some((_, due)) = woken {
                    crate::wake::note(Some(due), false);
                }
                marked.push(id.clone());
            }
            let children: Vec<String> = conn
                .prepare_cached(
                    "SELECT run_id FROM runs WHERE parent_run_id = ?1 ORDER BY parent_seq",
                )
                .and_then(|mut s| s.query_map([id], |r| r.get(0))?.collect())
                .map_err(error)?;
            next.extend(children);
        }
        level = next;
    }
    Ok(())
}

/// The children of run `run_id` that are not detached.
pub fn attached_children(conn: &Connection, run_id: &str) -> Result<Vec<String>, StoreError> {
    conn.prepare_cached(
        "SELECT run_id FROM runs WHERE parent_run_id = ?1 AND detached = 0 ORDER BY parent_seq",
    )
    .and_then(|mut s| s.query_map([run_id], |r| r.get(0))?.collect())
    .map_err(error)
}
