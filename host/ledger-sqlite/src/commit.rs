//! An execution's commit, written inside a transaction (or a savepoint of a
//! group commit's transaction). What the commit holds was checked and laid
//! out once, in core ([`CommitPlan`]); here it is only written: the run's
//! row first if the plan creates it, then the fence check, then each part
//! in the plan's order.

use rusqlite::{Connection, OptionalExtension, params};
use stephost_core::StoreError;
use stephost_core::commit::{CommitPlan, NewCall, stored_attempts};

use crate::errors::error;
use crate::known::Known;
use crate::rows;
use crate::segments;

/// Writes `plan`; the caller holds the write transaction and has brought
/// `known` up to date for it ([`Known::begin`]). `Ok(Some(refusal))`: the
/// plan began something for a run cancelled meanwhile; what it records of
/// calls already made ([`CommitPlan::what_happened`]) was written in its
/// place, the transaction stands, and the commit's answer is the refusal.
pub fn apply(
    conn: &Connection,
    known: &mut Known,
    plan: &CommitPlan,
) -> Result<Option<StoreError>, StoreError> {
    match write(conn, known, plan) {
        Err(refusal @ StoreError::Cancelled { .. }) => {
            write(conn, known, &plan.what_happened())?;
            Ok(Some(refusal))
        }
        written => written.map(|()| None),
    }
}

/// Writes `plan`, or nothing if it is refused (the fence check comes before
/// every write but the run's creation, which a cancelled run cannot need).
fn write(conn: &Connection, known: &mut Known, plan: &CommitPlan) -> Result<(), StoreError> {
    if let Some(run) = &plan.create {
        if let Some(found) = rows::find_run(conn, &run.run_id)? {
            // Another process started the same run id first.
            return Err(StoreError::ClaimedElsewhere {
                run_id: found.run_id,
                owner: found.owner.unwrap_or_else(|| "another process".into()),
                lease_until_ms: found.lease_until_ms.unwrap_or(found.updated_at_ms),
            });
        }
        rows::insert_run(conn, run)?;
    }
    let run_no = check_fence(conn, &plan.run_id, plan.fence, plan.begins)?;
    insert_calls(conn, known, run_no, plan)?;
    for update in &plan.updates {
        let key = find(conn, known, run_no, update.seq)?
            .ok_or_else(|| segments::missing(&plan.run_id, update.seq, "an outcome for"))?;
        let tried = stored_attempts(&update.attempts);
        let changed = match &update.outcome {
            Some(settled) => {
                let (outcome, split) = match &settled.outcome {
                    Some(body) => {
                        let (text, split) = rows::store_body(conn, run_no, body)?;
                        (Some(text), split)
                    }
                    None => (None, false),
                };
                conn.prepare_cached(&format!(
                    "UPDATE calls SET state = ?2, outcome = ?3, outcome_split = ?4, \
                     finished_at = ?5, chain = ?6, attempts = {} WHERE id = ?1",
                    rows::append_attempts(7)
                ))
                .and_then(|mut s| {
                    s.execute(params![
                        key,
                        settled.state.as_str(),
                        outcome,
                        split,
                        settled.finished_at_ms,
                        settled.chain,
                        tried
                    ])
                })
            }
            None => conn
                .prepare_cached(&format!(
                    "UPDATE calls SET attempts = {} WHERE id = ?1",
                    rows::append_attempts(2)
                ))
                .and_then(|mut s| s.execute(params![key, tried])),
        }
        .map_err(error)?;
        if changed != 1 {
            return Err(StoreError::Corrupt(format!(
                "an outcome for call #{} of run {}, which is not recorded",
                update.seq, plan.run_id
            )));
        }
    }
    for log in &plan.logs {
        conn.prepare_cached(
            "INSERT INTO logs (run_no, after_seq, level, message, at) \
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .and_then(|mut s| {
            s.execute(params![
                run_no,
                log.after_seq as i64,
                log.level,
                log.message,
                log.at_ms
            ])
        })
        .map_err(error)?;
    }
    if let Some(lease) = &plan.lease {
        conn.prepare_cached(
            "UPDATE runs SET lease_until = ?2, due_at = ?3, version = version + 1 \
             WHERE run_id = ?1",
        )
        .and_then(|mut s| s.execute(params![plan.run_id, lease.lease_until_ms, lease.due_at_ms]))
        .map_err(error)?;
    }
    if let Some(end) = &plan.end {
        // An end lets the claim go: its row is held by nobody.
        crate::wake::note(end.due_at_ms, false);
        conn.prepare_cached(
            "UPDATE runs SET status = ?2, output = ?3, error = ?4, exit_code = ?5, \
             wake_at = CASE WHEN arrivals > ?10 THEN ?8 ELSE ?6 END, \
             due_at = CASE WHEN arrivals > ?10 THEN ?8 ELSE ?7 END, updated_at = ?8, \
             owner = NULL, lease_until = NULL, version = version + 1, \
             seal = coalesce(?9, seal) WHERE run_id = ?1",
        )
        .and_then(|mut s| {
            s.execute(params![
                plan.run_id,
                end.status.as_str(),
                end.output,
                end.error,
                end.exit_code,
                end.wake_at_ms,
                end.due_at_ms,
                end.updated_at_ms,
                end.seal,
                end.inbox_seen.map(|n| n as i64)
            ])
        })
        .map_err(error)?;
        if let Some(arrival) = &end.arrival {
            rows::arrive(conn, arrival)?;
        }
        if let Some(request) = &end.cancel_children {
            let children = rows::attached_children(conn, &plan.run_id)?;
            rows::mark_cancelled(conn, &children, request, &mut Vec::new())?;
        }
    }
    for child in &plan.spawns {
        if !rows::insert_run(conn, child)? {
            return Err(StoreError::RunExists {
                run_id: child.run_id.clone(),
            });
        }
    }
    add_counters(conn, &plan.counters)
}

/// Refuses the commit unless `fence` is run `run_id`'s newest fencing
/// token, and, if it `begins` something, unless the run is not cancelled;
/// the run's number.
fn check_fence(
    conn: &Connection,
    run_id: &str,
    fence: i64,
    begins: bool,
) -> Result<i64, StoreError> {
    type Found = (i64, i64, Option<String>, Option<String>);
    let found: Option<Found> = conn
        .prepare_cached(
            "SELECT run_no, fence, cancel_by, cancel_reason FROM runs WHERE run_id = ?1",
        )
        .and_then(|mut s| {
            s.query_row([run_id], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })
            .optional()
        })
        .map_err(error)?;
    match found {
        None => Err(StoreError::UnknownRun(run_id.to_string())),
        Some((_, newest, ..)) if newest != fence => Err(StoreError::Fenced {
            run_id: run_id.to_string(),
            held: fence,
            newest,
        }),
        Some((_, _, Some(by), reason)) if begins => Err(StoreError::Cancelled {
            run_id: run_id.to_string(),
            reason: stephost_core::CancelRequest {
                at_ms: 0,
                by,
                reason,
            }
            .error(),
        }),
        Some((run_no, ..)) => Ok(run_no),
    }
}

/// Calls per multi-row `INSERT`: one statement for eight rows costs less
/// than eight statements.
const CALLS_PER_INSERT: usize = 8;

/// Appends the plan's calls (consecutive, checked by the plan) at the
/// table's end, each with its attempts; refuses them unless the first
/// follows the run's last recorded call.
fn insert_calls(
    conn: &Connection,
    known: &mut Known,
    run_no: i64,
    plan: &CommitPlan,
) -> Result<(), StoreError> {
    static SQL: std::sync::OnceLock<[String; 2]> = std::sync::OnceLock::new();
    let sql = SQL.get_or_init(|| {
        let insert = |rows: usize| {
            format!(
                "INSERT INTO calls (id, run_no, seq, class, interface, function, operation_id, \
                 request, request_split, request_hash, state, outcome, outcome_split, \
                 started_at, finished_at, fence, chain, attempts) VALUES {}",
                vec!["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"; rows].join(", ")
            )
        };
        [insert(1), insert(CALLS_PER_INSERT)]
    });
    let calls = &plan.calls;
    let Some(first) = calls.first().map(|c| &c.call) else {
        return Ok(());
    };
    let (first_id, continues) = segments::next_place(conn, run_no, first.seq)?;
    if !continues {
        let last = match known.last(run_no) {
            Some((seq, _)) => seq,
            None => segments::last_seq(conn, run_no)?,
        };
        if first.seq != last + 1 {
            return Err(StoreError::NotAppended {
                run_id: plan.run_id.clone(),
                seq: first.seq,
            });
        }
        segments::begin(conn, run_no, first.seq, first_id)?;
    }
    let mut id = first_id;
    for chunk in calls.chunks(CALLS_PER_INSERT) {
        let chunks: Vec<&[NewCall]> = if chunk.len() == CALLS_PER_INSERT {
            vec![chunk]
        } else {
            chunk.chunks(1).collect()
        };
        for rows in chunks {
            let mut stmt = conn
                .prepare_cached(&sql[usize::from(rows.len() > 1)])
                .map_err(error)?;
            let mut n = 0;
            for NewCall { call, attempts } in rows {
                let (request, request_split) = rows::store_body(conn, run_no, &call.request)?;
                let (outcome, outcome_split) = match &call.outcome {
                    Some(body) => {
                        let (text, split) = rows::store_body(conn, run_no, body)?;
                        (Some(text), split)
                    }
                    None => (None, false),
                };
                let tried = stored_attempts(attempts);
                let values: [&dyn rusqlite::ToSql; 18] = [
                    &id,
                    &run_no,
                    &(call.seq as i64),
                    &call.class.as_str(),
                    &call.interface,
                    &call.function,
                    &call.operation_id,
                    &request.as_ref(),
                    &request_split,
                    &call.request_hash,
                    &call.state.as_str(),
                    &outcome.as_deref(),
                    &outcome_split,
                    &call.started_at_ms,
                    &call.finished_at_ms,
                    &call.fence,
                    &call.chain,
                    &tried,
                ];
                for value in values {
                    n += 1;
                    stmt.raw_bind_parameter(n, value).map_err(error)?;
                }
                id += 1;
            }
            stmt.raw_execute().map_err(error)?;
        }
    }
    known.appended(run_no, first.seq + calls.len() as u64 - 1, id - 1);
    Ok(())
}

/// The id of call `seq` of run `run_no`: known, or looked up.
fn find(
    conn: &Connection,
    known: &Known,
    run_no: i64,
    seq: u64,
) -> Result<Option<i64>, StoreError> {
    match known.id_of(run_no, seq) {
        Some(id) => Ok(Some(id)),
        None => segments::find(conn, run_no, seq),
    }
}

pub fn add_counters(
    conn: &Connection,
    counters: &stephost_core::journal::Counters,
) -> Result<(), StoreError> {
    for (name, by) in counters {
        conn.prepare_cached(
            "INSERT INTO counters (name, value) VALUES (?1, ?2) \
             ON CONFLICT (name) DO UPDATE SET value = value + excluded.value",
        )
        .and_then(|mut s| s.execute(params![name, by]))
        .map_err(error)?;
    }
    Ok(())
}
