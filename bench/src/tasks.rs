//! What group commit reaches with a minimal host that runs its runs as tasks
//! on a few threads: a model (measured before the worker ran its runs so),
//! beside which figure 5's real host is compared.
//!
//! The bench guest's `write` mode runs in `runs` instances at once, each a
//! task on a tokio runtime of `threads` threads (wasmtime's async support: a
//! run that waits for its `started` record's fsync is a suspended fiber, not
//! a sleeping thread, and an fsync's writers are woken by queueing their
//! tasks, not a thread each). Its import `effects.call` does the part of the
//! host's work that a write cannot go without: the operation id, the request
//! hash and the chain link (the ledger's own functions), a `started` record
//! queued for the committer thread, a wait for the fsync that covers it, and
//! the outcome record queued to ride on the run's next write. The committer
//! applies the records in a transaction per batch, in the ledger's layout or
//! appended to one table (as [`crate::ceiling`]), while a syncer thread
//! fsyncs the WAL. Not done: the fence check, the ledger's bookkeeping,
//! metrics, limits, the other imports: so it is a ceiling for such a host,
//! not a figure of it.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use rusqlite::{Connection, params};
use stephost::clock::now_ms;
use stephost::ledger::CallRecord;
use tokio::sync::oneshot;
use wasmtime::component::{ComponentType, Lift, Linker, Lower};
use wasmtime::{Store, StoreContextMut};

use crate::ceiling::{Ceiling, Layout};
use crate::minimal::{Calls, EFFECTS, INTERFACE};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const TABLE: &str = "CREATE TABLE calls (
    key INTEGER PRIMARY KEY, run INTEGER NOT NULL, seq INTEGER NOT NULL, class TEXT NOT NULL,
    interface TEXT NOT NULL, function TEXT NOT NULL, operation_id TEXT NOT NULL,
    request TEXT NOT NULL, request_hash TEXT NOT NULL, state TEXT NOT NULL, outcome TEXT,
    started_at INTEGER NOT NULL, finished_at INTEGER, fence INTEGER NOT NULL, chain TEXT,
    attempts TEXT) STRICT";

const STARTED: &str = "INSERT INTO calls (key, run, seq, class, interface, function, \
    operation_id, request, request_hash, state, started_at, fence) \
    VALUES (?9, ?1, ?2, 'write', ?3, ?4, ?5, ?6, ?7, 'started', ?8, 1)";

/// Appended: `?7` and `?8` (the keyed layout's key and rowid) are `NULL`,
/// so the record takes a new rowid.
const FINISHED: &str = "INSERT INTO calls (key, run, seq, class, interface, function, \
    operation_id, request, request_hash, state, outcome, started_at, finished_at, fence, chain, \
    attempts) VALUES (coalesce(?7, ?8), ?1, ?2, 'write', '', '', '', '', '', 'succeeded', ?3, ?4, \
    ?4, 1, ?5, ?6)";

/// `?7` is the key, `?8` the rowid its row took: found as the ledger
/// finds a call that its connection wrote itself (`ledger::known`), its
/// key checked (`?1` and `?2` are the run and the sequence number, checked
/// too).
const FINISHED_KEYED: &str = "UPDATE calls SET state = 'succeeded', outcome = ?3, \
    finished_at = ?4, chain = ?5, attempts = ?6 WHERE id = ?8 AND key = ?7 AND run = ?1 \
    AND seq = ?2";

/// The WIT `call-error` (`types.wit`), for the import's signature.
#[derive(ComponentType, Lift, Lower)]
#[component(variant)]
pub(crate) enum CallError {
    #[component(name = "rejected")]
    Rejected(String),
    #[component(name = "denied")]
    Denied(String),
    #[component(name = "exhausted")]
    Exhausted(String),
    #[component(name = "invalid")]
    Invalid(String),
}

/// What the committer appends.
enum Record {
    Started {
        run: i64,
        seq: u64,
        function: String,
        operation_id: String,
        request: String,
        request_hash: String,
        at: i64,
    },
    Finished {
        run: i64,
        seq: u64,
        outcome: String,
        at: i64,
        chain: String,
    },
}

/// Records waiting for the committer, and the writers waiting for them.
#[derive(Default)]
struct Queue {
    records: Vec<Record>,
    waiters: Vec<oneshot::Sender<()>>,
    done: bool,
}

/// Batches committed and waiting for the syncer's fsync.
#[derive(Default)]
struct Unsynced {
    waiters: Vec<oneshot::Sender<()>>,
    done: bool,
}

/// What the committer and the syncer share with the runs.
#[derive(Default)]
struct Shared {
    queue: (Mutex<Queue>, Condvar),
    unsynced: (Mutex<Unsynced>, Condvar),
}

/// One run's state in its store.
struct Run {
    no: i64,
    calls: Calls,
    /// The call whose `started` record was queued last.
    call: Option<CallRecord>,
    /// Its outcome's record, once known: it rides on the run's next write.
    finished: Option<Record>,
    shared: Arc<Shared>,
}

impl Run {
    /// Queues the call's `started` record (after the previous call's
    /// outcome); the receiver completes once an fsync covers it.
    fn start(&mut self, name: &str, request: String, key: Option<&str>) -> oneshot::Receiver<()> {
        let call = self.calls.start(name, request, key, now_ms());
        let record = Record::Started {
            run: self.no,
            seq: call.seq,
            function: call.function.clone(),
            operation_id: call.operation_id.clone(),
            request: call.request.clone(),
            request_hash: call.request_hash.clone(),
            at: call.started_at_ms,
        };
        self.call = Some(call);
        let (sender, receiver) = oneshot::channel();
        let (lock, wake) = &self.shared.queue;
        let mut queue = lock.lock().expect("queue");
        queue.records.extend(self.finished.take());
        queue.records.push(record);
        queue.waiters.push(sender);
        drop(queue);
        wake.notify_one();
        receiver
    }

    /// The outcome of the call started last, kept for the run's next write.
    fn finish(&mut self, outcome: &str) {
        let Some(call) = &self.call else { return };
        let link = self.calls.link(call, outcome);
        self.finished = Some(Record::Finished {
            run: self.no,
            seq: call.seq,
            outcome: outcome.to_string(),
            at: now_ms(),
            chain: link,
        });
    }

    /// Queues the last outcome, with no writer waiting for it.
    fn end(&mut self) {
        let (lock, wake) = &self.shared.queue;
        lock.lock()
            .expect("queue")
            .records
            .extend(self.finished.take());
        wake.notify_one();
    }
}

/// A call's key in the keyed layout: the run's number in the high 32 bits,
/// the call's sequence number in the low (as the ledger's calls are keyed).
fn key(run: i64, seq: u64) -> i64 {
    ((run + 1) << 32) + seq as i64
}

/// Runs `runs` instances of the bench guest (`guest`, a component's bytes)
/// making `writes` writes each, as tasks on `threads` threads, into a new
/// database in `dir`, in `layout`.
pub fn measure(
    guest: &[u8],
    dir: &Path,
    layout: Layout,
    runs: usize,
    writes: u64,
    threads: usize,
) -> Res<Ceiling> {
    let (engine, component) = crate::minimal::compile(guest)?;
    let mut linker: Linker<Run> = Linker::new(&engine);
    linker.instance(EFFECTS)?.func_wrap_async(
        "call",
        |mut store: StoreContextMut<'_, Run>,
         (name, request, key): (String, String, Option<String>)| {
            Box::new(async move {
                let durable = store.data_mut().start(&name, request, key.as_deref());
                durable
                    .await
                    .map_err(|_| wasmtime::format_err!("the committer stopped"))?;
                // The no-op handler's response.
                let response = "{}".to_string();
                store.data_mut().finish(&response);
                Ok((Ok::<String, CallError>(response),))
            })
        },
    )?;
    linker.define_unknown_imports_as_traps(&component)?;

    let path = dir.join("tasks.db");
    let mut conn = Connection::open(&path)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    // Commits are made durable by the syncer's fsync of the WAL.
    conn.pragma_update(None, "synchronous", "OFF")?;
    crate::ceiling::create_calls(&conn, layout, TABLE)?;
    let pages = Arc::new(AtomicU64::new(0));
    crate::ceiling::count_pages(&mut conn, pages.clone())?;
    let wal = std::fs::File::open(dir.join("tasks.db-wal"))?;
    let shared = Arc::new(Shared::default());
    let committer = {
        let shared = shared.clone();
        std::thread::spawn(move || commit(conn, layout, &shared).map_err(|e| e.to_string()))
    };
    let syncer = {
        let shared = shared.clone();
        std::thread::spawn(move || sync(&wal, &shared).map_err(|e| e.to_string()))
    };

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .build()?;
    let input = serde_json::json!({ "mode": "write", "count": writes }).to_string();
    let ran = runtime.block_on(async {
        let mut ready = Vec::with_capacity(runs);
        for no in 0..runs {
            let mut store = Store::new(
                &engine,
                Run {
                    no: no as i64,
                    calls: Calls::new(format!("run-tasks-{no:04}")),
                    call: None,
                    finished: None,
                    shared: shared.clone(),
                },
            );
            store.set_fuel(u64::MAX)?;
            let instance = linker.instantiate_async(&mut store, &component).await?;
            let run = instance
                .get_typed_func::<(String,), (Result<String, String>,)>(&mut store, "run")?;
            ready.push((store, run));
        }
        let cpu = crate::cpu_seconds()?;
        let t = Instant::now();
        let tasks: Vec<_> = ready
            .into_iter()
            .map(|(mut store, run)| {
                let input = input.clone();
                tokio::spawn(async move {
                    let (output,) = run.call_async(&mut store, (input,)).await?;
                    store.data_mut().end();
                    output.map_err(|e| wasmtime::format_err!("the step failed: {e}"))
                })
            })
            .collect();
        for task in tasks {
            task.await??;
        }
        Ok::<_, Box<dyn std::error::Error>>((t.elapsed(), crate::cpu_seconds()? - cpu))
    });
    {
        let (lock, wake) = &shared.queue;
        lock.lock().map_err(|_| "poisoned")?.done = true;
        wake.notify_all();
    }
    committer.join().map_err(|_| "the committer panicked")??;
    let fsyncs = syncer.join().map_err(|_| "the syncer panicked")??;
    let (took, cpu) = ran?;
    let writes = (runs as u64 * writes) as f64;
    Ok(Ceiling {
        writes_per_s: writes / took.as_secs_f64(),
        writes_per_fsync: writes / fsyncs.max(1) as f64,
        pages_per_write: pages.load(Ordering::Relaxed) as f64 / writes,
        cpu_us_per_write: cpu * 1e6 / writes,
    })
}

/// The committer: appends what is queued in one transaction, then hands
/// its writers to the syncer, and goes on with the next batch.
fn commit(conn: Connection, layout: Layout, shared: &Shared) -> Res<()> {
    // The rowid of each run's last call, as the ledger remembers it.
    let mut last_ids = std::collections::HashMap::new();
    let [span, run_epoch] = crate::ceiling::span_statements();
    let (lock, wake) = &shared.queue;
    loop {
        let (records, waiters) = {
            let mut queue = lock.lock().map_err(|_| "poisoned")?;
            while queue.records.is_empty() && !queue.done {
                queue = wake.wait(queue).map_err(|_| "poisoned")?;
            }
            if queue.records.is_empty() {
                break;
            }
            (
                std::mem::take(&mut queue.records),
                std::mem::take(&mut queue.waiters),
            )
        };
        let tx = conn.unchecked_transaction()?;
        for record in &records {
            match record {
                Record::Started {
                    run,
                    seq,
                    function,
                    operation_id,
                    request,
                    request_hash,
                    at,
                } => {
                    let keyed = (layout == Layout::Keyed).then(|| key(*run, *seq));
                    tx.prepare_cached(STARTED)?.execute(params![
                        run,
                        *seq as i64,
                        INTERFACE,
                        function,
                        operation_id,
                        request,
                        request_hash,
                        at,
                        keyed
                    ])?;
                    // Each begins a span: other runs' calls came between.
                    if let Some(key) = keyed {
                        let before = last_ids.get(run).copied().unwrap_or(0);
                        tx.prepare_cached(&run_epoch)?
                            .execute(params![key, before])?;
                        tx.prepare_cached(&span)?.execute([key])?;
                        last_ids.insert(*run, tx.last_insert_rowid());
                    }
                }
                Record::Finished {
                    run,
                    seq,
                    outcome,
                    at,
                    chain,
                } => {
                    let (sql, found) = match layout {
                        Layout::Keyed => (
                            FINISHED_KEYED,
                            (Some(key(*run, *seq)), last_ids.get(run).copied()),
                        ),
                        Layout::Appended => (FINISHED, (None, None)),
                    };
                    let changed = tx.prepare_cached(sql)?.execute(params![
                        run,
                        *seq as i64,
                        outcome,
                        at,
                        chain,
                        crate::ceiling::ATTEMPTS,
                        found.0,
                        found.1
                    ])?;
                    if changed != 1 {
                        return Err(format!("run {run}: no row for call {seq}").into());
                    }
                }
            }
        }
        tx.commit()?;
        let (unsynced, wake_syncer) = &shared.unsynced;
        unsynced
            .lock()
            .map_err(|_| "poisoned")?
            .waiters
            .extend(waiters);
        wake_syncer.notify_one();
    }
    let (unsynced, wake_syncer) = &shared.unsynced;
    unsynced.lock().map_err(|_| "poisoned")?.done = true;
    wake_syncer.notify_one();
    Ok(())
}

/// The syncer: one fsync of the WAL for every batch committed before it,
/// then their writers' tasks are woken. Returns how many fsyncs it made.
fn sync(wal: &std::fs::File, shared: &Shared) -> Res<u64> {
    let (lock, wake) = &shared.unsynced;
    let mut fsyncs = 0;
    loop {
        let waiters = {
            let mut unsynced = lock.lock().map_err(|_| "poisoned")?;
            while unsynced.waiters.is_empty() && !unsynced.done {
                unsynced = wake.wait(unsynced).map_err(|_| "poisoned")?;
            }
            if unsynced.waiters.is_empty() {
                return Ok(fsyncs);
            }
            std::mem::take(&mut unsynced.waiters)
        };
        wal.sync_data()?;
        fsyncs += 1;
        for waiter in waiters {
            // A writer that is gone has nothing to learn.
            let _ = waiter.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stephost::ids;
    use stephost::ledger::CallState;
    use stephost::ledger::chain;

    /// The model's calls of run `no`, from its rows, as the ledger would
    /// hold them once finished.
    fn calls_of(conn: &Connection, layout: Layout, no: i64) -> Vec<CallRecord> {
        let started = conn
            .prepare(
                "SELECT seq, function, operation_id, request, request_hash, outcome, chain \
                 FROM calls WHERE run = ?1 AND interface != '' ORDER BY seq",
            )
            .unwrap()
            .query_map([no], |r| {
                let seq = r.get::<_, i64>(0)? as u64;
                crate::minimal::call_from_row(r, seq, CallState::Succeeded)
            })
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        if layout == Layout::Keyed {
            return started;
        }
        // Appended: each call's outcome is a record of its own.
        started
            .into_iter()
            .map(|mut call| {
                let (outcome, chain) = conn
                    .query_row(
                        "SELECT outcome, chain FROM calls WHERE run = ?1 AND seq = ?2 \
                         AND state = 'succeeded'",
                        params![no, call.seq as i64],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .unwrap();
                call.outcome = outcome;
                call.chain = chain;
                call
            })
            .collect()
    }

    #[test]
    fn every_task_records_each_write_once_with_its_outcome_in_a_chain_that_holds() {
        let guest = std::fs::read(env!("BENCH_GUEST")).unwrap();
        let (runs, writes) = (3, 5);
        for (layout, threads) in [(Layout::Keyed, 1), (Layout::Appended, 2)] {
            let dir = tempfile::tempdir().unwrap();
            let found = measure(&guest, dir.path(), layout, runs, writes, threads).unwrap();
            assert!(found.writes_per_s > 0.0 && found.pages_per_write > 0.0);
            assert!(found.writes_per_fsync >= 1.0, "{found:?}");
            let conn = Connection::open(dir.path().join("tasks.db")).unwrap();
            let rows: i64 = conn
                .query_row("SELECT count(*) FROM calls", [], |r| r.get(0))
                .unwrap();
            let per_call = if layout == Layout::Keyed { 1 } else { 2 };
            assert_eq!(rows, (runs as u64 * writes * per_call) as i64, "{layout:?}");
            for no in 0..runs as i64 {
                let calls = calls_of(&conn, layout, no);
                let seqs: Vec<u64> = calls.iter().map(|c| c.seq).collect();
                assert_eq!(seqs, (1..=writes).collect::<Vec<_>>(), "{layout:?}");
                let run_id = format!("run-tasks-{no:04}");
                for call in &calls {
                    assert_eq!(
                        call.operation_id,
                        ids::operation_id(&run_id, "noop.write", call.seq, None)
                    );
                    assert_eq!(call.request, format!("{{\"i\":{}}}", call.seq - 1));
                    assert_eq!(
                        call.request_hash,
                        ids::request_hash(INTERFACE, "noop.write", &call.request)
                    );
                    assert_eq!(call.outcome.as_deref(), Some("{}"));
                }
                // Every call finished, the last one's outcome included, and
                // each link follows the one before.
                assert_eq!(chain::verify(&calls), Ok(writes as usize), "{layout:?}");
            }
        }
    }
}
