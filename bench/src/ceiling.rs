//! What SQLite alone allows group commit on this disk: the ceiling that
//! figure 5 is compared with.
//!
//! The writes of `runs` runs, as rows like the ledger's, are applied by one
//! thread in transactions of half the runs each, while a second thread
//! fsyncs the WAL. A run's next write goes into a transaction only once its
//! previous one is fsync'd, as a run waits for its `started` row, so one
//! half's fsync overlaps the other half's SQL (of the transaction sizes
//! tried, 1 to 64 runs' writes, half the runs was the fastest). There is no
//! guest, no host, no fence check and no savepoint: only the SQL, the WAL
//! and the fsyncs. So the host's group commit, which does all that as well,
//! cannot be expected to write faster in the same layout on this disk.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use rusqlite::{Connection, params};

/// Where the model's calls go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// As the ledger keeps its calls (schema v8): rows stored in the order
    /// they were recorded, each call beginning a span of its run
    /// (`call_spans`), the outcome an `UPDATE` of its call's row at the
    /// rowid the row took, as the ledger's committer remembers it: each
    /// transaction changes the table's last pages and a page of span rows
    /// per run.
    Keyed,
    /// Every record (a call started, its outcome) appended to one table by
    /// rowid: a transaction changes the table's last pages only.
    Appended,
}

/// What one measurement found.
#[derive(Debug, Clone, Copy)]
pub struct Ceiling {
    pub writes_per_s: f64,
    pub writes_per_fsync: f64,
    /// WAL pages written per write.
    pub pages_per_write: f64,
    /// CPU time of the whole process per write, in µs.
    pub cpu_us_per_write: f64,
}

pub(crate) const TABLE: &str = "CREATE TABLE calls (
    key INTEGER PRIMARY KEY, class TEXT NOT NULL, interface TEXT NOT NULL,
    function TEXT NOT NULL, operation_id TEXT NOT NULL, request TEXT NOT NULL,
    request_hash TEXT NOT NULL, state TEXT NOT NULL, outcome TEXT,
    started_at INTEGER NOT NULL, finished_at INTEGER, fence INTEGER NOT NULL,
    chain TEXT, attempts TEXT) STRICT";

/// Creates the model's `calls` table from `table` (whose first column is
/// `key INTEGER PRIMARY KEY`) in `layout`: appended, the key is the rowid
/// (a record inserted with no key gets the next one); keyed as the ledger's
/// calls (schema v8), rows are stored by rowid, the key is a column of its
/// own, and each call begins a span of its run (`call_spans`, see
/// [`stephost::ledger::spans`]), as each does in a group commit, where
/// another run's call comes between two of a run's.
pub(crate) fn create_calls(conn: &Connection, layout: Layout, table: &str) -> rusqlite::Result<()> {
    match layout {
        Layout::Appended => conn.execute_batch(table),
        Layout::Keyed => conn.execute_batch(&format!(
            "{}; CREATE TABLE call_spans (epoch INTEGER NOT NULL, run_no INTEGER NOT NULL, \
             first_seq INTEGER NOT NULL, first_id INTEGER NOT NULL, \
             PRIMARY KEY (epoch, run_no, first_seq)) STRICT, WITHOUT ROWID; \
             CREATE TABLE run_epochs (run_no INTEGER NOT NULL, first_seq INTEGER NOT NULL, \
             epoch INTEGER NOT NULL, PRIMARY KEY (run_no, first_seq)) STRICT, WITHOUT ROWID;",
            table.replacen(
                "key INTEGER PRIMARY KEY,",
                "id INTEGER PRIMARY KEY, key INTEGER NOT NULL,",
                1
            )
        )),
    }
}

/// Records the span that the call just inserted with key `?1` begins, in
/// its epoch (see [`stephost::ledger::spans::EPOCH_BITS`]); with `?2`, the
/// rowid of the run's call before (0 for none), also the run's first span
/// in that epoch, if it is.
pub(crate) fn span_statements() -> [String; 2] {
    let bits = stephost::ledger::spans::EPOCH_BITS;
    [
        format!(
            "INSERT INTO call_spans (epoch, run_no, first_seq, first_id) \
             VALUES (last_insert_rowid() >> {bits}, ?1 >> 32, ?1 & 4294967295, last_insert_rowid())"
        ),
        format!(
            "INSERT INTO run_epochs (run_no, first_seq, epoch) \
             SELECT ?1 >> 32, ?1 & 4294967295, last_insert_rowid() >> {bits} \
             WHERE ?2 = 0 OR ?2 >> {bits} <> last_insert_rowid() >> {bits}"
        ),
    ]
}

/// The outcome of the call whose key is `?5`, at the rowid `?6` its row
/// took: as the ledger finds a call that its connection wrote itself
/// (`ledger::known`), its key checked.
pub(crate) const FINISHED_KEYED: &str = "UPDATE calls SET state = 'succeeded', outcome = ?1, \
    finished_at = ?2, chain = ?3, attempts = ?4 WHERE id = ?6 AND key = ?5";

const STARTED: &str = "INSERT INTO calls (key, class, interface, function, operation_id, \
    request, request_hash, state, started_at, fence, chain) \
    VALUES (?1, 'write', 'stephost:step/effects', 'noop.write', ?2, ?3, ?4, 'started', ?5, 1, ?6)";

const FINISHED_APPENDED: &str = "INSERT INTO calls (key, class, interface, function, \
    operation_id, request, request_hash, state, outcome, started_at, finished_at, fence, chain, \
    attempts) VALUES (NULL, 'write', '', '', '', '', '', 'succeeded', ?1, ?2, ?2, 1, ?3, ?4)";

/// A recorded attempt, as the ledger keeps it in a call's row.
pub(crate) const ATTEMPTS: &str = r#"[{"attempt":1,"kind":"send","started_at":1764500000000,"finished_at":1764500000000,"result":"ok","detail":null,"fence":1}]"#;

/// Transactions committed and fsync'd so far.
#[derive(Default)]
struct Progress {
    committed: u64,
    synced: u64,
    fsyncs: u64,
    failed: Option<String>,
    done: bool,
}

/// Applies `writes_per_run` writes of each of `runs` runs (an even number)
/// in `layout`, in a new ledger-like database in `dir`.
pub fn measure(
    dir: &Path,
    layout: Layout,
    runs: usize,
    writes_per_run: u64,
) -> Result<Ceiling, Box<dyn std::error::Error>> {
    let path = dir.join(format!("ceiling-{layout:?}.db"));
    let mut conn = Connection::open(&path)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    // Commits are made durable by the syncer's fsync of the WAL.
    conn.pragma_update(None, "synchronous", "OFF")?;
    create_calls(&conn, layout, TABLE)?;
    let pages = Arc::new(AtomicU64::new(0));
    count_pages(&mut conn, pages.clone())?;
    let wal = std::fs::File::open(dir.join(format!("ceiling-{layout:?}.db-wal")))?;
    let shared = Arc::new((Mutex::new(Progress::default()), Condvar::new()));
    let syncer = {
        let shared = shared.clone();
        std::thread::spawn(move || sync_when_committed(&wal, &shared))
    };
    let per_transaction = runs / 2;
    let hex = "5e".repeat(32);
    // The rowid of each run's last call, as the ledger remembers it.
    let mut last_ids = vec![0i64; runs];
    let [span, run_epoch] = span_statements();
    let cpu = crate::cpu_seconds()?;
    let t = Instant::now();
    let applied = (|| -> Result<(), Box<dyn std::error::Error>> {
        for transaction in 0..2 * writes_per_run {
            // Its runs' previous writes were in the transaction before the
            // last: it must be fsync'd.
            wait(&shared, |p| p.synced + 1 >= transaction)?;
            let first_run = (transaction % 2) as usize * per_transaction;
            let seq = transaction / 2;
            let tx = conn.unchecked_transaction()?;
            let these = last_ids.iter_mut().enumerate().skip(first_run);
            for (run, last_id) in these.take(per_transaction) {
                let key = ((run as i64 + 1) << 32) + seq as i64;
                let request = format!("{{\"i\":{seq}}}");
                if seq > 0 {
                    let previous = format!("{{\"i\":{}}}", seq - 1);
                    match layout {
                        Layout::Keyed => {
                            let changed = tx.prepare_cached(FINISHED_KEYED)?.execute(params![
                                previous,
                                1_764_500_000_000i64,
                                hex,
                                ATTEMPTS,
                                key - 1,
                                *last_id
                            ])?;
                            if changed != 1 {
                                return Err(
                                    format!("run {run}: no row for call {}", seq - 1).into()
                                );
                            }
                            changed
                        }
                        Layout::Appended => tx
                            .prepare_cached(FINISHED_APPENDED)?
                            .execute(params![previous, 1_764_500_000_000i64, hex, ATTEMPTS])?,
                    };
                }
                let keyed = (layout == Layout::Keyed).then_some(key);
                tx.prepare_cached(STARTED)?.execute(params![
                    keyed,
                    hex,
                    request,
                    hex,
                    1_764_500_000_000i64,
                    hex
                ])?;
                if layout == Layout::Keyed {
                    tx.prepare_cached(&run_epoch)?
                        .execute(params![key, *last_id])?;
                    tx.prepare_cached(&span)?.execute([key])?;
                    *last_id = tx.last_insert_rowid();
                }
            }
            tx.commit()?;
            let (lock, wake) = &*shared;
            lock.lock().map_err(|_| "poisoned")?.committed += 1;
            wake.notify_all();
        }
        wait(&shared, |p| p.synced == p.committed)
    })();
    let took = t.elapsed().as_secs_f64();
    let cpu = crate::cpu_seconds()? - cpu;
    {
        let (lock, wake) = &*shared;
        lock.lock().map_err(|_| "poisoned")?.done = true;
        wake.notify_all();
    }
    syncer.join().map_err(|_| "the syncer panicked")?;
    applied?;
    let fsyncs = shared.0.lock().map_err(|_| "poisoned")?.fsyncs;
    let writes = (runs as u64 * writes_per_run) as f64;
    Ok(Ceiling {
        writes_per_s: writes / took,
        writes_per_fsync: writes / fsyncs.max(1) as f64,
        pages_per_write: pages.load(Ordering::Relaxed) as f64 / writes,
        cpu_us_per_write: cpu * 1e6 / writes,
    })
}

/// Waits until `ready` holds of the progress, or the syncer failed.
fn wait(
    shared: &(Mutex<Progress>, Condvar),
    ready: impl Fn(&Progress) -> bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let (lock, wake) = shared;
    let mut progress = lock.lock().map_err(|_| "poisoned")?;
    loop {
        if let Some(e) = &progress.failed {
            return Err(e.clone().into());
        }
        if ready(&progress) {
            return Ok(());
        }
        progress = wake.wait(progress).map_err(|_| "poisoned")?;
    }
}

/// The syncer: one fsync of the WAL for everything committed before it.
fn sync_when_committed(wal: &std::fs::File, shared: &(Mutex<Progress>, Condvar)) {
    let (lock, wake) = shared;
    let Ok(mut progress) = lock.lock() else {
        return;
    };
    loop {
        while progress.committed == progress.synced && !progress.done {
            match wake.wait(progress) {
                Ok(p) => progress = p,
                Err(_) => return,
            }
        }
        if progress.committed == progress.synced {
            return;
        }
        let committed = progress.committed;
        drop(progress);
        let synced = wal.sync_data();
        let Ok(again) = lock.lock() else {
            return;
        };
        progress = again;
        match synced {
            Ok(()) => {
                progress.synced = committed;
                progress.fsyncs += 1;
            }
            Err(e) => progress.failed = Some(format!("fsync of the WAL failed: {e}")),
        }
        wake.notify_all();
    }
}

/// Counts the pages `conn`'s commits write to the WAL into `pages`, and
/// checkpoints as SQLite does by default (the hook replaces its own), inside
/// the commit that takes the log past 1,000 pages.
pub(crate) fn count_pages(conn: &mut Connection, pages: Arc<AtomicU64>) -> rusqlite::Result<()> {
    let mut before = 0;
    conn.wal_hook(Some(move |wal: &mut rusqlite::hooks::Wal, now: i32| {
        // A log that started over holds this commit's pages only.
        let written = if now >= before { now - before } else { now };
        pages.fetch_add(written as u64, Ordering::Relaxed);
        before = now;
        if now >= 1000 {
            // A checkpoint that cannot finish is retried at the next commit.
            let _ = wal.checkpoint_v2(rusqlite::wal::CheckpointMode::PASSIVE);
        }
        Ok(())
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(dir: &Path, layout: Layout, sql: &str) -> i64 {
        let conn = Connection::open(dir.join(format!("ceiling-{layout:?}.db"))).unwrap();
        conn.query_row(sql, [], |r| r.get(0)).unwrap()
    }

    #[test]
    fn every_write_of_every_run_is_recorded_once_with_its_outcome() {
        let (runs, writes) = (4, 5);
        for layout in [Layout::Keyed, Layout::Appended] {
            let dir = tempfile::tempdir().unwrap();
            let found = measure(dir.path(), layout, runs, writes).unwrap();
            assert!(found.writes_per_s > 0.0 && found.pages_per_write > 0.0);
            // Each run's last write is left started: its outcome would
            // ride on its run's next write.
            let started = rows(
                dir.path(),
                layout,
                "SELECT count(*) FROM calls WHERE state = 'started'",
            );
            let finished = rows(
                dir.path(),
                layout,
                "SELECT count(*) FROM calls WHERE state = 'succeeded'",
            );
            let outcomes = (runs as u64 * (writes - 1)) as i64;
            assert_eq!(finished, outcomes, "{layout:?}");
            match layout {
                Layout::Keyed => assert_eq!(started, runs as i64, "outcomes update their rows"),
                Layout::Appended => assert_eq!(started, (runs as u64 * writes) as i64),
            }
            if layout == Layout::Keyed {
                let open = rows(
                    dir.path(),
                    layout,
                    "SELECT count(*) FROM calls WHERE outcome IS NULL",
                );
                assert_eq!(
                    open, runs as i64,
                    "only each run's last write has no outcome"
                );
                let keys = rows(
                    dir.path(),
                    layout,
                    "SELECT count(DISTINCT key >> 32) FROM calls",
                );
                assert_eq!(keys, runs as i64);
                // Each call begins a span; each run has one epoch at least,
                // and a span in each of its epochs.
                let spans = rows(dir.path(), layout, "SELECT count(*) FROM call_spans");
                assert_eq!(spans, (runs as u64 * writes) as i64);
                let epochs_without_spans = rows(
                    dir.path(),
                    layout,
                    "SELECT count(*) FROM run_epochs e WHERE NOT EXISTS (SELECT 1 \
                     FROM call_spans s WHERE s.epoch = e.epoch AND s.run_no = e.run_no \
                     AND s.first_seq = e.first_seq)",
                );
                assert_eq!(epochs_without_spans, 0);
                let runs_with_epochs = rows(
                    dir.path(),
                    layout,
                    "SELECT count(DISTINCT run_no) FROM run_epochs",
                );
                assert_eq!(runs_with_epochs, runs as i64);
            }
        }
    }
}
