//! An execution's commit, applied inside a transaction (or a savepoint of a
//! group commit's transaction): the run's row first if the commit creates
//! it, then the fence check, then every op in order.

use std::collections::HashMap;

use rusqlite::{Connection, OptionalExtension, params};
use stephost_core::store::WriteOp;
use stephost_core::{AttemptRecord, CallRecord, Claim, StoreError};

use crate::errors::error;
use crate::known::Known;
use crate::rows;
use crate::segments;

/// Applies `ops` under `claim`; the caller holds the write transaction and
/// has brought `known` up to date for it ([`Known::begin`]).
pub fn apply(
    conn: &Connection,
    known: &mut Known,
    claim: &Claim,
    ops: &[WriteOp],
) -> Result<(), StoreError> {
    let mut ops = ops;
    if let Some(WriteOp::Create(run)) = ops.first() {
        if let Some(found) = rows::find_run(conn, &run.run_id)? {
            // Another process started the same run id first.
            return Err(StoreError::ClaimedElsewhere {
                run_id: found.run_id,
                owner: found.owner.unwrap_or_else(|| "another process".into()),
                lease_until_ms: found.lease_until_ms.unwrap_or(found.updated_at_ms),
            });
        }
        rows::insert_run(conn, run)?;
        ops = &ops[1..];
    }
    let run_no = check_fence(conn, claim)?;
    // A call's attempts are kept in its row: those of a call this commit
    // writes go with it, the others are appended to rows already written.
    let mut attempts: HashMap<u64, Vec<&AttemptRecord>> = HashMap::new();
    for op in ops {
        if let WriteOp::Attempt(a) = op {
            attempts.entry(a.seq).or_default().push(a);
        }
    }
    let mut calls: Vec<&CallRecord> = Vec::new();
    for (at, op) in ops.iter().enumerate() {
        match op {
            WriteOp::Create(_) => {
                return Err(StoreError::Corrupt(
                    "a commit creates its run only as its first op".into(),
                ));
            }
            WriteOp::Call(call) | WriteOp::Started(call) => {
                // Consecutive calls go in together, a chunk per statement.
                calls.push(call);
                let next_is_call = matches!(
                    ops.get(at + 1),
                    Some(WriteOp::Call(_) | WriteOp::Started(_))
                );
                if !next_is_call {
                    insert_calls(conn, known, run_no, claim, &calls, &mut attempts)?;
                    calls.clear();
                }
            }
            WriteOp::Outcome {
                seq,
                state,
                outcome,
                now_ms,
                chain,
            } => {
                let (outcome, split) = match outcome {
                    Some(body) => {
                        let (text, split) = rows::store_body(conn, body)?;
                        (Some(text), split)
                    }
                    None => (None, false),
                };
                let tried = attempts
                    .remove(seq)
                    .map(|a| AttemptRecord::to_stored_json(&a));
                let key = find(conn, known, run_no, *seq)?
                    .ok_or_else(|| segments::missing(&claim.run_id, *seq, "an outcome for"))?;
                let changed = conn
                    .prepare_cached(&format!(
                        "UPDATE calls SET state = ?2, outcome = ?3, outcome_split = ?4, \
                         finished_at = ?5, chain = ?6, attempts = {} \
                         WHERE id = ?1",
                        if tried.is_some() {
                            rows::append_attempts(7)
                        } else {
                            "attempts".into()
                        }
                    ))
                    .and_then(|mut s| match &tried {
                        Some(t) => s.execute(params![
                            key,
                            state.as_str(),
                            outcome,
                            split,
                            now_ms,
                            chain,
                            t
                        ]),
                        None => {
                            s.execute(params![key, state.as_str(), outcome, split, now_ms, chain])
                        }
                    })
                    .map_err(error)?;
                if changed != 1 {
                    return Err(StoreError::Corrupt(format!(
                        "an outcome for call #{seq} of run {}, which is not recorded",
                        claim.run_id
                    )));
                }
            }
            // Kept for their call (above or below).
            WriteOp::Attempt(_) => {}
            WriteOp::Log(log) => {
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
            WriteOp::Lease {
                until_ms,
                due_at_ms,
            } => {
                conn.prepare_cached(
                    "UPDATE runs SET lease_until = ?2, due_at = ?3, version = version + 1 \
                     WHERE run_id = ?1",
                )
                .and_then(|mut s| s.execute(params![claim.run_id, until_ms, due_at_ms]))
                .map_err(error)?;
            }
            WriteOp::End(end) => {
                conn.prepare_cached(
                    "UPDATE runs SET status = ?2, output = ?3, error = ?4, exit_code = ?5, \
                     wake_at = ?6, due_at = ?7, updated_at = ?8, owner = NULL, \
                     lease_until = NULL, version = version + 1, seal = coalesce(?9, seal) \
                     WHERE run_id = ?1",
                )
                .and_then(|mut s| {
                    s.execute(params![
                        claim.run_id,
                        end.status.as_str(),
                        end.output,
                        end.error,
                        end.exit_code,
                        end.wake_at_ms,
                        end.due_at_ms,
                        end.updated_at_ms,
                        end.seal
                    ])
                })
                .map_err(error)?;
            }
            WriteOp::Counters(counters) => add_counters(conn, counters)?,
        }
    }
    // Attempts of calls written by earlier commits (a write's retries).
    let mut rest: Vec<(u64, Vec<&AttemptRecord>)> = attempts.into_iter().collect();
    rest.sort_by_key(|(seq, _)| *seq);
    for (seq, tried) in rest {
        let key = find(conn, known, run_no, seq)?
            .ok_or_else(|| segments::missing(&claim.run_id, seq, "attempts of"))?;
        let changed = conn
            .prepare_cached(&format!(
                "UPDATE calls SET attempts = {} WHERE id = ?1",
                rows::append_attempts(2)
            ))
            .and_then(|mut s| s.execute(params![key, AttemptRecord::to_stored_json(&tried)]))
            .map_err(error)?;
        if changed != 1 {
            return Err(StoreError::Corrupt(format!(
                "attempts of call #{seq} of run {}, which is not recorded",
                claim.run_id
            )));
        }
    }
    Ok(())
}

/// Refuses the commit unless `claim` holds the run's newest fencing token;
/// the run's number.
fn check_fence(conn: &Connection, claim: &Claim) -> Result<i64, StoreError> {
    let found: Option<(i64, i64)> = conn
        .prepare_cached("SELECT run_no, fence FROM runs WHERE run_id = ?1")
        .and_then(|mut s| {
            s.query_row([&claim.run_id], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
        })
        .map_err(error)?;
    match found {
        None => Err(StoreError::UnknownRun(claim.run_id.clone())),
        Some((_, newest)) if newest != claim.fence => Err(StoreError::Fenced {
            run_id: claim.run_id.clone(),
            held: claim.fence,
            newest,
        }),
        Some((run_no, _)) => Ok(run_no),
    }
}

/// Calls per multi-row `INSERT`: one statement for eight rows costs less
/// than eight statements.
const CALLS_PER_INSERT: usize = 8;

/// Appends `calls` (consecutive calls of run `run_no`, in order) at the
/// table's end, each with its attempts from `attempts`; refuses them unless
/// the first follows the run's last recorded call.
fn insert_calls(
    conn: &Connection,
    known: &mut Known,
    run_no: i64,
    claim: &Claim,
    calls: &[&CallRecord],
    attempts: &mut HashMap<u64, Vec<&AttemptRecord>>,
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
    let Some(first) = calls.first() else {
        return Ok(());
    };
    let not_appended = |seq| StoreError::NotAppended {
        run_id: claim.run_id.clone(),
        seq,
    };
    let (first_id, continues) = segments::next_place(conn, run_no, first.seq)?;
    if !continues {
        let last = match known.last(run_no) {
            Some((seq, _)) => seq,
            None => segments::last_seq(conn, run_no)?,
        };
        if first.seq != last + 1 {
            return Err(not_appended(first.seq));
        }
        segments::begin(conn, run_no, first.seq, first_id)?;
    }
    for (offset, call) in calls.iter().enumerate() {
        if call.seq != first.seq + offset as u64 {
            return Err(not_appended(call.seq));
        }
    }
    let mut id = first_id;
    for chunk in calls.chunks(CALLS_PER_INSERT) {
        let chunks: Vec<&[&CallRecord]> = if chunk.len() == CALLS_PER_INSERT {
            vec![chunk]
        } else {
            chunk.chunks(1).collect()
        };
        for rows in chunks {
            let mut stmt = conn
                .prepare_cached(&sql[usize::from(rows.len() > 1)])
                .map_err(error)?;
            let mut n = 0;
            for call in rows {
                let (request, request_split) = rows::store_body(conn, &call.request)?;
                let (outcome, outcome_split) = match &call.outcome {
                    Some(body) => {
                        let (text, split) = rows::store_body(conn, body)?;
                        (Some(text), split)
                    }
                    None => (None, false),
                };
                let tried = attempts
                    .remove(&call.seq)
                    .map(|a| AttemptRecord::to_stored_json(&a));
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
                    &claim.fence,
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

/// Whether any op of the commit must be on disk before it is answered.
pub fn durable(ops: &[WriteOp]) -> bool {
    ops.iter().any(WriteOp::durable)
}
