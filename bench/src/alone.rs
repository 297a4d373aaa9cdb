//! What figure 1 allows: one run writing alone, modelled in two steps,
//! beside which the real host's write effect is compared.
//!
//! Each model makes its writes one after another, each a transaction of
//! the ledger's statements for a run writing alone: the previous call's
//! outcome as an `UPDATE` of its row (found at the rowid it took, as the
//! ledger's connection remembers it) and the new call's `started` row, in
//! the ledger's layout (rows by rowid; the run's first call begins its
//! span, and the others extend it). Each commit is fsync'd by SQLite itself
//! (`synchronous = FULL`) on the thread that writes, and the WAL is
//! checkpointed inside the commit that takes it past 1,000 pages, as the
//! ledger's connection does for a run writing alone.
//!
//! - [`Sql`]: the statements alone, with precomputed values: no guest, no
//!   host, no hashes. What the ledger's rows cost beside the floor's.
//! - [`Guest`]: the bench guest's `write` mode in wasmtime, whose import
//!   `effects.call` does the part of the host's work that a write cannot go
//!   without: the operation id, the request hash and the chain link (the
//!   ledger's own functions), then that transaction, before it answers.
//!   Not done: the fence check, the ledger's bookkeeping, metrics, limits,
//!   the instance pool. So it is a ceiling for a host that runs a guest,
//!   not a figure of it.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rusqlite::{Connection, params};
use stephost::clock::now_ms;
use stephost::ledger::CallRecord;
use wasmtime::component::{Linker, TypedFunc};
use wasmtime::{Store, StoreContextMut};

use crate::ceiling::{self, Layout};
use crate::minimal::{Calls, EFFECTS, INTERFACE};
use crate::tasks::CallError;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// The run's only number: its calls' keys are `(1 << 32) + seq`.
const RUN: i64 = 1;

const STARTED: &str = "INSERT INTO calls (key, class, interface, function, operation_id, \
    request, request_hash, state, started_at, fence) \
    VALUES (?1, 'write', ?2, ?3, ?4, ?5, ?6, 'started', ?7, 1)";

const SQL_DB: &str = "alone-sql.db";
const GUEST_DB: &str = "alone-guest.db";

/// Writes made before the measured ones (the ledger's, before figure 1,
/// and each model's), in rounds of this many, until the WAL stops growing:
/// it has passed its first checkpoint and started over, as a long-lived
/// ledger's has (see [`warm`]).
pub(crate) const WARMUP_WRITES: u64 = 400;
/// Most warm-up rounds.
pub(crate) const WARMUP_ROUNDS_MAX: u64 = 10;

/// The previous call's outcome, which rides on the next write.
struct Finished {
    seq: u64,
    outcome: String,
    at: i64,
    chain: String,
}

impl Finished {
    /// Its `UPDATE` of its call's row, at rowid `id`.
    fn record(&self, conn: &Connection, id: i64) -> Res<()> {
        let changed = conn
            .prepare_cached(ceiling::FINISHED_KEYED)?
            .execute(params![
                self.outcome,
                self.at,
                self.chain,
                ceiling::ATTEMPTS,
                key(self.seq),
                id
            ])?;
        if changed != 1 {
            return Err(format!(
                "the model's call #{} is not at rowid {id} ({changed} rows updated): the \
                 model lost track of its rows",
                self.seq
            )
            .into());
        }
        Ok(())
    }
}

/// One run's ledger: a connection and where its last call's row is.
struct Writer {
    conn: Connection,
    pages: Arc<AtomicU64>,
    /// The rowid of the last call's row, as the ledger remembers it.
    last_id: i64,
}

impl Writer {
    fn open(dir: &Path, name: &str) -> Res<Self> {
        let mut conn = Connection::open(dir.join(name))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        ceiling::create_calls(&conn, Layout::Keyed, ceiling::TABLE)?;
        let pages = Arc::new(AtomicU64::new(0));
        ceiling::count_pages(&mut conn, pages.clone())?;
        Ok(Writer {
            conn,
            pages,
            last_id: 0,
        })
    }

    /// One fsync'd commit: `finished`'s outcome, then call `seq`'s
    /// `started` row (the run's first call also begins its span).
    fn write(
        &mut self,
        finished: Option<&Finished>,
        seq: u64,
        function: &str,
        operation_id: &str,
        request: &str,
        request_hash: &str,
    ) -> Res<()> {
        // `BEGIN` and `COMMIT` prepared once and kept, as the ledger's are.
        let conn = &self.conn;
        conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        let written = (|| -> Res<i64> {
            if let Some(f) = finished {
                f.record(conn, self.last_id)?;
            }
            conn.prepare_cached(STARTED)?.execute(params![
                key(seq),
                INTERFACE,
                function,
                operation_id,
                request,
                request_hash,
                now_ms()
            ])?;
            let id = conn.last_insert_rowid();
            if self.last_id == 0 {
                let [span, run_epoch] = ceiling::span_statements();
                conn.prepare_cached(&run_epoch)?
                    .execute(params![key(seq), 0])?;
                conn.prepare_cached(&span)?.execute([key(seq)])?;
            }
            Ok(id)
        })();
        match written {
            Ok(id) => {
                conn.prepare_cached("COMMIT")?.execute([])?;
                self.last_id = id;
                Ok(())
            }
            Err(e) => {
                conn.prepare_cached("ROLLBACK")?.execute([])?;
                Err(e)
            }
        }
    }

    /// The last outcome, in a commit of its own (a run's end).
    fn end(&mut self, finished: Option<&Finished>) -> Res<()> {
        match finished {
            Some(f) => f.record(&self.conn, self.last_id),
            None => Ok(()),
        }
    }
}

fn key(seq: u64) -> i64 {
    (RUN << 32) + seq as i64
}

/// Rounds of writes by `round` (which makes `WARMUP_WRITES` more, or
/// commits) until one leaves the WAL at `wal` no larger than it found it:
/// the log has passed its first checkpoint and started over. The rounds
/// made, or `None` if it still grew after `WARMUP_ROUNDS_MAX` of them.
pub(crate) fn warm(wal: &Path, round: &mut dyn FnMut() -> Res<()>) -> Res<Option<u64>> {
    let size = || std::fs::metadata(wal).map_or(0, |m| m.len());
    let mut before = size();
    for rounds in 1..=WARMUP_ROUNDS_MAX {
        round()?;
        let after = size();
        if after <= before {
            return Ok(Some(rounds));
        }
        before = after;
    }
    Ok(None)
}

/// [`warm`] for a model or a floor, whose WAL must have stopped growing.
pub(crate) fn warm_fully(wal: &Path, round: &mut dyn FnMut() -> Res<()>) -> Res<()> {
    match warm(wal, round)? {
        Some(_) => Ok(()),
        None => Err(format!(
            "{}: the WAL still grew after {WARMUP_ROUNDS_MAX} warm-up rounds; is a \
             checkpoint kept from finishing (another process reading this file)?",
            wal.display()
        )
        .into()),
    }
}

/// A model, which writes on demand.
pub trait Model {
    /// Makes `n` more writes.
    fn writes(&mut self, n: u64) -> Res<()>;

    /// WAL pages its commits have written.
    fn pages(&self) -> u64;
}

/// The ledger's rows for one run, with no guest and no host.
pub struct Sql {
    writer: Writer,
    hex: String,
    seq: u64,
    finished: Option<Finished>,
}

impl Sql {
    /// A new database in `dir`, warmed.
    pub fn open(dir: &Path) -> Res<Self> {
        let mut sql = Sql {
            writer: Writer::open(dir, SQL_DB)?,
            hex: "5e".repeat(32),
            seq: 0,
            finished: None,
        };
        warm_fully(&dir.join(format!("{SQL_DB}-wal")), &mut || {
            sql.writes(WARMUP_WRITES)
        })?;
        Ok(sql)
    }
}

impl Model for Sql {
    fn writes(&mut self, n: u64) -> Res<()> {
        for _ in 0..n {
            self.seq += 1;
            let request = format!("{{\"i\":{}}}", self.seq - 1);
            let finished = self.finished.take();
            let hex = &self.hex;
            self.writer.write(
                finished.as_ref(),
                self.seq,
                "noop.write",
                hex,
                &request,
                hex,
            )?;
            self.finished = Some(Finished {
                seq: self.seq,
                outcome: "{}".to_string(),
                at: now_ms(),
                chain: hex.clone(),
            });
        }
        Ok(())
    }

    fn pages(&self) -> u64 {
        self.writer.pages.load(Ordering::Relaxed)
    }
}

/// One run's state in its store: its ledger and the call it made last.
struct Run {
    writer: Writer,
    calls: Calls,
    /// The call started last, once its `started` row is in.
    call: Option<CallRecord>,
    /// Its outcome, once known: it rides on the run's next write.
    finished: Option<Finished>,
}

impl Run {
    /// Records the run's next call's `started` row (after the previous
    /// call's outcome) in one fsync'd commit.
    fn start(&mut self, name: &str, request: String, key: Option<&str>) -> Res<()> {
        let call = self.calls.start(name, request, key, now_ms());
        let finished = self.finished.take();
        self.writer.write(
            finished.as_ref(),
            call.seq,
            &call.function,
            &call.operation_id,
            &call.request,
            &call.request_hash,
        )?;
        self.call = Some(call);
        Ok(())
    }

    /// The outcome of the call started last, kept for the run's next write.
    fn finish(&mut self, outcome: &str) {
        let Some(call) = &self.call else { return };
        let link = self.calls.link(call, outcome);
        self.finished = Some(Finished {
            seq: call.seq,
            outcome: outcome.to_string(),
            at: now_ms(),
            chain: link,
        });
    }
}

/// The bench guest through a minimal host: an instance, which runs its
/// `write` mode on demand.
pub struct Guest {
    store: Store<Run>,
    run: TypedFunc<(String,), (Result<String, String>,)>,
}

impl Guest {
    /// The bench guest (`guest`, a component's bytes) instantiated, with a
    /// new database in `dir`, warmed.
    pub fn open(guest: &[u8], dir: &Path) -> Res<Self> {
        let (engine, component) = crate::minimal::compile(guest)?;
        let mut linker: Linker<Run> = Linker::new(&engine);
        linker.instance(EFFECTS)?.func_wrap(
            "call",
            |mut store: StoreContextMut<'_, Run>,
             (name, request, key): (String, String, Option<String>)| {
                let run = store.data_mut();
                run.start(&name, request, key.as_deref())
                    .map_err(|e| wasmtime::format_err!("the model's database failed: {e}"))?;
                // The no-op handler's response.
                let response = "{}".to_string();
                run.finish(&response);
                Ok((Ok::<String, CallError>(response),))
            },
        )?;
        linker.define_unknown_imports_as_traps(&component)?;
        let mut store = Store::new(
            &engine,
            Run {
                writer: Writer::open(dir, GUEST_DB)?,
                calls: Calls::new("run-alone".to_string()),
                call: None,
                finished: None,
            },
        );
        store.set_fuel(u64::MAX)?;
        let instance = linker.instantiate(&mut store, &component)?;
        let run = instance.get_typed_func(&mut store, "run")?;
        let mut guest = Guest { store, run };
        warm_fully(&dir.join(format!("{GUEST_DB}-wal")), &mut || {
            guest.writes(WARMUP_WRITES)
        })?;
        Ok(guest)
    }

    /// Records the last call's outcome, as a run's end would.
    pub fn end(mut self) -> Res<()> {
        let run = self.store.data_mut();
        let finished = run.finished.take();
        run.writer.end(finished.as_ref())
    }
}

impl Model for Guest {
    fn writes(&mut self, n: u64) -> Res<()> {
        let input = serde_json::json!({ "mode": "write", "count": n }).to_string();
        let (output,) = self.run.call(&mut self.store, (input,))?;
        output.map_err(|e| format!("the step failed: {e}"))?;
        Ok(())
    }

    fn pages(&self) -> u64 {
        self.store.data().writer.pages.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stephost::ids;
    use stephost::ledger::CallState;
    use stephost::ledger::chain;

    fn count(conn: &Connection, sql: &str) -> i64 {
        conn.query_row(sql, [], |r| r.get(0)).unwrap()
    }

    /// The calls recorded in `conn`, in their order, as the ledger would
    /// hold them.
    fn calls(conn: &Connection) -> Vec<CallRecord> {
        conn.prepare(
            "SELECT key, function, operation_id, request, request_hash, state, outcome, chain \
             FROM calls ORDER BY id",
        )
        .unwrap()
        .query_map([], |r| {
            let state = match r.get::<_, String>(5)?.as_str() {
                "succeeded" => CallState::Succeeded,
                _ => CallState::Started,
            };
            let seq = (r.get::<_, i64>(0)? - (RUN << 32)) as u64;
            crate::minimal::call_from_row(r, seq, state)
        })
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap()
    }

    /// Each model's run has one span, its calls numbered from 1 in the
    /// order of their rows.
    fn one_span_in_order(conn: &Connection, calls: &[CallRecord]) {
        let seqs: Vec<u64> = calls.iter().map(|c| c.seq).collect();
        assert_eq!(seqs, (1..=calls.len() as u64).collect::<Vec<_>>());
        assert_eq!(count(conn, "SELECT count(*) FROM call_spans"), 1);
        assert_eq!(count(conn, "SELECT count(*) FROM run_epochs"), 1);
    }

    #[test]
    fn the_rows_alone_are_each_write_once_with_the_outcome_of_the_one_before() {
        let dir = tempfile::tempdir().unwrap();
        let mut sql = Sql::open(dir.path()).unwrap();
        let pages = sql.pages();
        sql.writes(5).unwrap();
        assert!(sql.pages() > pages);
        let conn = Connection::open(dir.path().join(SQL_DB)).unwrap();
        let calls = calls(&conn);
        assert!(calls.len() as u64 > WARMUP_WRITES, "the warm-up wrote too");
        one_span_in_order(&conn, &calls);
        let (last, before) = calls.split_last().unwrap();
        assert!(before.iter().all(|c| c.outcome.as_deref() == Some("{}")));
        // Its outcome would ride on the run's next write.
        assert_eq!(
            (last.state, last.outcome.as_deref()),
            (CallState::Started, None)
        );
    }

    #[test]
    fn the_guest_through_the_minimal_host_records_each_write_once_in_a_chain_that_holds() {
        let guest = std::fs::read(env!("BENCH_GUEST")).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut model = Guest::open(&guest, dir.path()).unwrap();
        let pages = model.pages();
        model.writes(5).unwrap();
        assert!(model.pages() > pages);
        model.end().unwrap();
        let conn = Connection::open(dir.path().join(GUEST_DB)).unwrap();
        let calls = calls(&conn);
        assert!(calls.len() as u64 > WARMUP_WRITES, "the warm-up wrote too");
        one_span_in_order(&conn, &calls);
        // The last round's five writes, as the guest made them.
        let last: Vec<&str> = calls[calls.len() - 5..]
            .iter()
            .map(|c| c.request.as_str())
            .collect();
        assert_eq!(
            last,
            [
                "{\"i\":0}",
                "{\"i\":1}",
                "{\"i\":2}",
                "{\"i\":3}",
                "{\"i\":4}"
            ]
        );
        for call in &calls {
            assert_eq!(
                call.operation_id,
                ids::operation_id("run-alone", "noop.write", call.seq, None)
            );
            assert_eq!(
                call.request_hash,
                ids::request_hash(INTERFACE, "noop.write", &call.request)
            );
            assert_eq!(call.outcome.as_deref(), Some("{}"));
        }
        // Every call finished, the last one's outcome included, and each
        // link follows the one before.
        assert_eq!(chain::verify(&calls), Ok(calls.len()));
    }
}
