//! Where a call's row is: spans of a run's calls stored one after another.
//!
//! The calls table keeps its rows in the order they were recorded (by
//! rowid, `id`), so that a group commit's rows, many runs' calls at once,
//! share the table's last page (schema v7). A call is named by its key, its
//! run's number in the high 32 bits and its sequence number in the low.
//! Rather than an index entry for every key, which would cost a run that
//! writes alone a second page in every commit, `call_spans` (schema v8)
//! records where each *span* of a run's calls begins: calls of one run with
//! consecutive sequence numbers stored at consecutive rowids. A run that
//! writes alone has one span; a run whose calls alternate with other runs'
//! (a worker's group commit) has a span per call, which is what an index
//! would have cost it.
//!
//! Spans are kept by epoch first (schema v9, [`EPOCH_BITS`]): a
//! transaction's spans, one for each of the many runs whose calls it
//! holds, share a page or two of `call_spans` instead of landing on a page
//! per run, and `run_epochs` records the first sequence number each run
//! has in each epoch, through which a run's spans are found.
//!
//! The invariant: for every call row, the span of its run with the greatest
//! first sequence number not above the call's gives the call's rowid as
//! `first_id + (seq - first_seq)`; that span is in the run's epoch with the
//! greatest first sequence number not above the call's. It holds because
//! calls are only ever appended to their run (each sequence number past
//! the run's last) at the table's end: a call stored right after its run's
//! previous call extends that call's span; any other starts a span of its
//! own, in the epoch of its rowid, never before the epoch of the run's
//! span before. [`Placed::place`] is the only writer of call rows: schema
//! v8 renamed a call row's `fence` to `writer_fence`, and schema v9 gave a
//! span an epoch, so that an older build still running cannot write one.
//! Every lookup checks that the row it computes has the key it looks for,
//! so a row that is not there (a damaged ledger's gap) is found missing,
//! never mistaken for another; and rowids are dense (rows are only
//! appended, at the end), so where a run's last span ends is checked too
//! ([`last_seq`]).

use rusqlite::{Connection, OptionalExtension, params};

use super::LedgerError;

/// Spans are kept by epoch first: the range of `1 << EPOCH_BITS` rowids
/// where a span's first call is (schema v9). A transaction's new spans,
/// of many runs at once, then share a page or two of `call_spans`, not a
/// page per run. `run_epochs` holds the first sequence number of each
/// epoch a run has spans in: the span of a run holding a call is in the
/// epoch whose first sequence number is the greatest not above the call's,
/// since a run's spans take rowids, and so epochs, in the order of their
/// numbers. Four rowids in the tests, so that they cross epochs often.
/// Never to be made larger than the v9 migration's 10: a new span's epoch
/// could then equal an older one's of the same run and its lookups find
/// both.
pub const EPOCH_BITS: i64 = if cfg!(test) { 2 } else { 10 };

/// SQL for the rowid and key of call `?2` of run `?1` (a condition on the
/// calls table): false for an unknown run, a call not recorded, and a
/// sequence number no call can have.
pub const CALL_AT: &str = "id = (SELECT s.first_id + ?2 - s.first_seq FROM call_spans s \
     WHERE s.epoch = (SELECT e.epoch FROM run_epochs e \
         WHERE e.run_no = (SELECT run_no FROM runs WHERE run_id = ?1) AND e.first_seq <= ?2 \
         ORDER BY e.first_seq DESC LIMIT 1) \
     AND s.run_no = (SELECT run_no FROM runs WHERE run_id = ?1) AND s.first_seq <= ?2 \
     ORDER BY s.first_seq DESC LIMIT 1) \
     AND key = (SELECT (run_no << 32) + ?2 FROM runs \
     WHERE run_id = ?1 AND ?2 BETWEEN 1 AND 4294967295)";

/// [`CALL_AT`] for the call whose key is parameter `?{param}`.
pub fn call_at_key(param: usize) -> String {
    format!(
        "id = (SELECT s.first_id + (?{param} & 4294967295) - s.first_seq FROM call_spans s \
         WHERE s.epoch = (SELECT e.epoch FROM run_epochs e WHERE e.run_no = ?{param} >> 32 \
             AND e.first_seq <= (?{param} & 4294967295) ORDER BY e.first_seq DESC LIMIT 1) \
         AND s.run_no = ?{param} >> 32 AND s.first_seq <= (?{param} & 4294967295) \
         ORDER BY s.first_seq DESC LIMIT 1) AND key = ?{param}"
    )
}

/// SQL for the calls of run `?1` numbered `?2 + 1 ..= ?3`, as `c`, in order:
/// from the epoch and the span that hold call `?2 + 1` on, each span's rows
/// are a rowid range, ending where the run's next span begins (in its
/// epoch, or the next), or at `?3`. The loops over the run's epochs and
/// each one's spans in their keys' order, each span a rowid range in
/// order, give the calls in order without a sort. `columns` names the
/// calls table's columns to select, `filter` is a further condition on `c`
/// (`TRUE` for none).
pub fn calls_between_sql(columns: &str, filter: &str) -> String {
    format!(
        "SELECT {columns} FROM run_epochs e \
         JOIN call_spans s ON s.epoch = e.epoch AND s.run_no = e.run_no \
         JOIN calls c \
         ON c.id >= s.first_id + max(?2 + 1 - s.first_seq, 0) \
         AND c.id < s.first_id - s.first_seq + min(?3 + 1, coalesce((SELECT n.first_seq \
             FROM call_spans n WHERE n.epoch = s.epoch AND n.run_no = s.run_no \
             AND n.first_seq > s.first_seq ORDER BY n.first_seq LIMIT 1), (SELECT f.first_seq \
             FROM run_epochs f WHERE f.run_no = e.run_no AND f.first_seq > e.first_seq \
             ORDER BY f.first_seq LIMIT 1), ?3 + 1)) \
         WHERE e.run_no = (SELECT run_no FROM runs WHERE run_id = ?1) \
         AND e.first_seq >= coalesce((SELECT m.first_seq FROM run_epochs m \
             WHERE m.run_no = (SELECT run_no FROM runs WHERE run_id = ?1) \
             AND m.first_seq <= ?2 + 1 ORDER BY m.first_seq DESC LIMIT 1), 1) \
         AND e.first_seq <= ?3 \
         AND s.first_seq >= coalesce((SELECT h.first_seq FROM call_spans h \
             WHERE h.epoch = e.epoch AND h.run_no = e.run_no AND h.first_seq <= ?2 + 1 \
             ORDER BY h.first_seq DESC LIMIT 1), 1) \
         AND s.first_seq <= ?3 \
         AND c.key = (s.run_no << 32) + s.first_seq + (c.id - s.first_id) \
         AND ({filter}) \
         ORDER BY e.first_seq, s.first_seq, c.id"
    )
}

/// The last span of a run: its epoch, and where it begins.
struct LastSpan {
    epoch: i64,
    first_seq: i64,
    first_id: i64,
}

/// The last span of the run numbered `run_no`, if it has any; a run with
/// an epoch that holds none of its spans is a damaged ledger.
fn last_span(conn: &Connection, run_no: i64) -> Result<Option<LastSpan>, LedgerError> {
    let Some(epoch) = last_epoch(conn, run_no)? else {
        return Ok(None);
    };
    conn.prepare_cached(
        "SELECT first_seq, first_id FROM call_spans WHERE epoch = ?1 AND run_no = ?2 \
         ORDER BY first_seq DESC LIMIT 1",
    )?
    .query_row([epoch, run_no], |r| {
        Ok(LastSpan {
            epoch,
            first_seq: r.get(0)?,
            first_id: r.get(1)?,
        })
    })
    .optional()?
    .map(Some)
    .ok_or_else(|| {
        LedgerError::Corrupt(format!(
            "the calls of run number {run_no}: it has spans in epoch {epoch}, which holds none"
        ))
    })
}

/// The epoch of the last span of the run numbered `run_no`, if it has any.
fn last_epoch(conn: &Connection, run_no: i64) -> Result<Option<i64>, LedgerError> {
    Ok(conn
        .prepare_cached(
            "SELECT epoch FROM run_epochs WHERE run_no = ?1 ORDER BY first_seq DESC LIMIT 1",
        )?
        .query_row([run_no], |r| r.get(0))
        .optional()?)
}

/// The highest sequence number among the calls of the run numbered
/// `run_no` (their count, in a sound ledger); 0 for none. Its last span's
/// rows are consecutive rowids, so the end is found by probing rowids:
/// doubling steps, then halving (about 2 log n lookups). The row after the
/// end must be another run's, or past the table's end: a row missing
/// there, or one of this run's, is a damaged ledger (`Corrupt`), not the
/// end of the run's calls.
pub fn last_seq(conn: &Connection, run_no: i64) -> Result<u64, LedgerError> {
    let Some(LastSpan {
        first_seq,
        first_id,
        ..
    }) = last_span(conn, run_no)?
    else {
        return Ok(0);
    };
    let mut key_at = conn.prepare_cached("SELECT key FROM calls WHERE id = ?1")?;
    let mut holds = |k: i64| -> Result<bool, LedgerError> {
        let key: Option<i64> = key_at.query_row([first_id + k], |r| r.get(0)).optional()?;
        Ok(key == Some((run_no << 32) + first_seq + k))
    };
    if !holds(0)? {
        return Err(LedgerError::Corrupt(format!(
            "the calls of run number {run_no}: a span begins with call #{first_seq} at row \
             {first_id}, which does not hold it"
        )));
    }
    // `holds(known)` and, once found, `!holds(past)`.
    let (mut known, mut past) = (0i64, 1i64);
    while holds(past)? {
        known = past;
        past = past.saturating_mul(2);
    }
    while past - known > 1 {
        let mid = known + (past - known) / 2;
        if holds(mid)? {
            known = mid;
        } else {
            past = mid;
        }
    }
    let after: Option<i64> = key_at
        .query_row([first_id + known + 1], |r| r.get(0))
        .optional()?;
    let sound = match after {
        Some(key) => key >> 32 != run_no,
        None => {
            let end: Option<i64> = conn
                .prepare_cached("SELECT max(id) FROM calls")?
                .query_row([], |r| r.get(0))?;
            end.is_none_or(|end| first_id + known + 1 > end)
        }
    };
    if !sound {
        return Err(LedgerError::Corrupt(format!(
            "the calls of run number {run_no}: call #{} is not where its span puts it \
             (row {}), which is {}",
            first_seq + known + 1,
            first_id + known + 1,
            if after.is_some() {
                "another of the run's calls"
            } else {
                "missing"
            }
        )));
    }
    Ok((first_seq + known) as u64)
}

/// What one connection knows of where the calls it wrote are, so that
/// placing a run's next call, and finding the rowid of a call it wrote to
/// record its outcome, look nothing up: the table's last row, and for each
/// run it wrote to, its calls from some sequence number to its last at
/// consecutive rowids (a part of the run's last span). In a worker's group
/// commit, where every call of a run begins a span of its own, this saves
/// two of a write's statements. It is exact only while no other connection
/// writes, which the connection's `ledger::known::Known` checks; what it
/// does not know is looked up.
#[derive(Default)]
pub struct Placed(std::cell::RefCell<Tails>);

#[derive(Default)]
struct Tails {
    /// The table's last row: rowid and key.
    last_row: Option<(i64, i64)>,
    /// By run number: the run's calls `from_seq ..= last_seq` are at rowids
    /// `from_id ..`, and `last_seq` is the run's last call.
    runs: std::collections::HashMap<i64, Tail>,
}

#[derive(Clone, Copy)]
struct Tail {
    from_seq: i64,
    from_id: i64,
    last_seq: i64,
    /// The epoch of the run's last span, if known.
    epoch: Option<i64>,
}

/// Runs remembered at most; past it, all are forgotten (and looked up
/// again when they next write). Two in the tests, whose runs then
/// forget and look up as a busy worker's would.
const RUNS_KNOWN_MAX: usize = if cfg!(test) { 2 } else { 4096 };

impl Placed {
    /// Forgets everything.
    pub fn clear(&self) {
        *self.0.borrow_mut() = Tails::default();
    }

    /// The rowid of call `seq` of the run numbered `run_no`, if this
    /// connection wrote it and knows where; `None` means look it up.
    pub fn id_of(&self, run_no: i64, seq: u64) -> Option<i64> {
        let known = self.0.borrow();
        let tail = known.runs.get(&run_no)?;
        let seq = seq as i64;
        (tail.from_seq..=tail.last_seq)
            .contains(&seq)
            .then(|| tail.from_id + seq - tail.from_seq)
    }

    /// Where `count` new calls of the run numbered `run_no` go, the first
    /// of which has the key `key`: at the table's end, from the
    /// placement's rowid on. Records the span they begin, if they begin
    /// one; once their rows are inserted, [`Placed::inserted`] remembers
    /// them. Refuses a call already recorded, or older than the run's last
    /// span: calls are only appended to their run. Right after the run's
    /// previous call (the table's last row) nothing is looked up: a run's
    /// calls are stored in the order of their numbers (the order this
    /// module's callers write them in), so that call was its last. Nor is
    /// anything looked up for a run whose last call this connection knows.
    pub fn place(
        &self,
        conn: &Connection,
        run_id: &str,
        run_no: i64,
        key: i64,
        count: usize,
    ) -> Result<Placement, LedgerError> {
        let seq = key & 0xffff_ffff;
        let known = self.0.borrow();
        let last = match known.last_row {
            Some(row) => Some(row),
            None => conn
                .prepare_cached("SELECT id, key FROM calls ORDER BY id DESC LIMIT 1")?
                .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?,
        };
        let id = last.map_or(1, |(id, _)| id + 1);
        let known_tail = known.runs.get(&run_no).copied();
        let tail = if seq > 1 && last.is_some_and(|(_, last_key)| last_key == key - 1) {
            // Right after the run's previous call: in its span.
            match known_tail {
                Some(tail) if tail.last_seq == seq - 1 => tail,
                _ => Tail {
                    from_seq: seq - 1,
                    from_id: id - 1,
                    last_seq: seq - 1,
                    epoch: None,
                },
            }
        } else {
            let (appended, last_epoch) = match known_tail {
                Some(tail) => (
                    seq > tail.last_seq,
                    match tail.epoch {
                        Some(epoch) => Some(epoch),
                        None => last_epoch(conn, run_no)?,
                    },
                ),
                None => {
                    let (recorded, epoch) = recorded_or_older(conn, run_no, seq)?;
                    (!recorded, epoch)
                }
            };
            if !appended {
                return Err(LedgerError::NotAppended {
                    run_id: run_id.to_string(),
                    seq: seq as u64,
                });
            }
            let epoch = id >> EPOCH_BITS;
            if last_epoch != Some(epoch) {
                conn.prepare_cached(
                    "INSERT INTO run_epochs (run_no, first_seq, epoch) VALUES (?1, ?2, ?3)",
                )?
                .execute(params![run_no, seq, epoch])?;
            }
            conn.prepare_cached(
                "INSERT INTO call_spans (epoch, run_no, first_seq, first_id) \
                 VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![epoch, run_no, seq, id])?;
            Tail {
                from_seq: seq,
                from_id: id,
                last_seq: seq,
                epoch: Some(epoch),
            }
        };
        let count = count.max(1) as i64;
        Ok(Placement {
            id,
            run_no,
            tail: Tail {
                last_seq: seq + count - 1,
                ..tail
            },
            last_row: (id + count - 1, key + count - 1),
        })
    }

    /// The calls `placement` placed were inserted: remembered only now, so
    /// that a failed insert leaves nothing remembered that is not there.
    pub fn inserted(&self, placement: Placement) {
        let mut known = self.0.borrow_mut();
        if known.runs.len() >= RUNS_KNOWN_MAX && !known.runs.contains_key(&placement.run_no) {
            known.runs.clear();
        }
        known.runs.insert(placement.run_no, placement.tail);
        known.last_row = Some(placement.last_row);
    }
}

/// Where new calls go ([`Placed::place`]).
pub struct Placement {
    /// The first call's rowid; the others follow it.
    pub id: i64,
    run_no: i64,
    tail: Tail,
    last_row: (i64, i64),
}

/// Whether call `seq` of the run numbered `run_no` is recorded already, or
/// older than the run's last span; and the epoch of that span.
fn recorded_or_older(
    conn: &Connection,
    run_no: i64,
    seq: i64,
) -> Result<(bool, Option<i64>), LedgerError> {
    let Some(last) = last_span(conn, run_no)? else {
        return Ok((false, None));
    };
    if seq < last.first_seq {
        return Ok((true, Some(last.epoch)));
    }
    let in_it: Option<i64> = conn
        .prepare_cached("SELECT key FROM calls WHERE id = ?1")?
        .query_row([last.first_id + seq - last.first_seq], |r| r.get(0))
        .optional()?;
    Ok((in_it == Some((run_no << 32) + seq), Some(last.epoch)))
}
