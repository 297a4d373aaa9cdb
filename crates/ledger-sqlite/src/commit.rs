//! An execution's commit, applied inside a transaction (or a savepoint of a
//! group commit's transaction): the run's row first if the commit creates
//! it, then the fence check, then every op in order.

use std::collections::HashMap;

use rusqlite::{Connection, OptionalExtension, params};
use stephost_core::store::WriteOp;
use stephost_core::{AttemptRecord, CallRecord, Claim, StoreError};

use crate::conn::error;
use crate::rows;

/// Applies `ops` under `claim`; the caller holds the write transaction.
pub fn apply(conn: &Connection, claim: &Claim, ops: &[WriteOp]) -> Result<(), StoreError> {
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
    check_fence(conn, claim)?;
    // A call's attempts are kept in its row: those of a call this commit
    // writes go with it, the others are appended to rows already written.
    let mut attempts: HashMap<u64, Vec<&AttemptRecord>> = HashMap::new();
    for op in ops {
        if let WriteOp::Attempt(a) = op {
            attempts.entry(a.seq).or_default().push(a);
        }
    }
    let mut next_seq: Option<u64> = None;
    for op in ops {
        match op {
            WriteOp::Create(_) => {
                return Err(StoreError::Corrupt(
                    "a commit creates its run only as its first op".into(),
                ));
            }
            WriteOp::Call(call) | WriteOp::Started(call) => {
                let expected = match next_seq {
                    Some(seq) => seq,
                    None => last_seq(conn, &claim.run_id)? + 1,
                };
                if call.seq != expected {
                    return Err(StoreError::NotAppended {
                        run_id: claim.run_id.clone(),
                        seq: call.seq,
                    });
                }
                next_seq = Some(expected + 1);
                insert_call(conn, claim, call, attempts.remove(&call.seq))?;
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
                let tried = attempts.remove(seq).map(|a| rows::attempts_json(&a));
                let changed = conn
                    .prepare_cached(&format!(
                        "UPDATE calls SET state = ?3, outcome = ?4, outcome_split = ?5, \
                         finished_at = ?6, chain = ?7, attempts = {} \
                         WHERE run_id = ?1 AND seq = ?2",
                        if tried.is_some() {
                            rows::append_attempts(8)
                        } else {
                            "attempts".into()
                        }
                    ))
                    .and_then(|mut s| match &tried {
                        Some(t) => s.execute(params![
                            claim.run_id,
                            *seq as i64,
                            state.as_str(),
                            outcome,
                            split,
                            now_ms,
                            chain,
                            t
                        ]),
                        None => s.execute(params![
                            claim.run_id,
                            *seq as i64,
                            state.as_str(),
                            outcome,
                            split,
                            now_ms,
                            chain
                        ]),
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
                    "INSERT INTO logs (run_id, after_seq, level, message, at) \
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                )
                .and_then(|mut s| {
                    s.execute(params![
                        claim.run_id,
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
                     lease_until = NULL, version = version + 1 WHERE run_id = ?1",
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
                        end.updated_at_ms
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
        let changed = conn
            .prepare_cached(&format!(
                "UPDATE calls SET attempts = {} WHERE run_id = ?1 AND seq = ?2",
                rows::append_attempts(3)
            ))
            .and_then(|mut s| {
                s.execute(params![
                    claim.run_id,
                    seq as i64,
                    rows::attempts_json(&tried)
                ])
            })
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

/// Refuses the commit unless `claim` holds the run's newest fencing token.
fn check_fence(conn: &Connection, claim: &Claim) -> Result<(), StoreError> {
    let fence: Option<i64> = conn
        .prepare_cached("SELECT fence FROM runs WHERE run_id = ?1")
        .and_then(|mut s| s.query_row([&claim.run_id], |r| r.get(0)).optional())
        .map_err(error)?;
    match fence {
        None => Err(StoreError::UnknownRun(claim.run_id.clone())),
        Some(newest) if newest != claim.fence => Err(StoreError::Fenced {
            run_id: claim.run_id.clone(),
            held: claim.fence,
            newest,
        }),
        Some(_) => Ok(()),
    }
}

fn last_seq(conn: &Connection, run_id: &str) -> Result<u64, StoreError> {
    conn.prepare_cached("SELECT max(seq) FROM calls WHERE run_id = ?1")
        .and_then(|mut s| s.query_row([run_id], |r| r.get::<_, Option<i64>>(0)))
        .map(|seq| seq.unwrap_or(0) as u64)
        .map_err(error)
}

fn insert_call(
    conn: &Connection,
    claim: &Claim,
    call: &CallRecord,
    attempts: Option<Vec<&AttemptRecord>>,
) -> Result<(), StoreError> {
    let (request, request_split) = rows::store_body(conn, &call.request)?;
    let (outcome, outcome_split) = match &call.outcome {
        Some(body) => {
            let (text, split) = rows::store_body(conn, body)?;
            (Some(text), split)
        }
        None => (None, false),
    };
    let attempts = attempts.map(|a| rows::attempts_json(&a));
    conn.prepare_cached(
        "INSERT INTO calls (run_id, seq, class, interface, function, operation_id, request, \
         request_split, request_hash, state, outcome, outcome_split, started_at, finished_at, \
         fence, chain, attempts) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)",
    )
    .and_then(|mut s| {
        s.execute(params![
            claim.run_id,
            call.seq as i64,
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
            claim.fence,
            call.chain,
            attempts
        ])
    })
    .map_err(error)?;
    Ok(())
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
