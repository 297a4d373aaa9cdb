//! WAL checkpoints off the critical path.
//!
//! SQLite copies its write-ahead log back into the database file (a
//! checkpoint) by default inside whichever commit takes the log past 1,000
//! pages. That commit then also writes every page the log holds and fsyncs
//! the database file: milliseconds spent on the thread that committed, a
//! guest's own thread or the group committer, about 1 µs per buffered
//! observe call on the project's machine class.
//!
//! Instead, a writing connection whose commits are not fsync'd (buffered
//! calls, group commit) nudges one background thread per ledger file and
//! process once its log passes
//! [`CHECKPOINT_PAGES`]. The thread copies the log into the database on a
//! connection of its own while the writers go on: a `PASSIVE` checkpoint,
//! which never waits for a writer or a reader, nor makes one wait. Durability
//! does not change: a commit is durable once it is in the fsync'd log, before
//! any checkpoint, as before.
//!
//! The log starts over only when a writer begins a transaction after a
//! checkpoint has copied all of it, which a writer that never pauses would
//! not let the thread do. So once the log passes [`FINISH_PAGES`], the
//! connection that commits checkpoints too, as SQLite would have, copying
//! only what the thread has not; the next transaction then starts the log
//! over. That fails while the thread's own checkpoint is still running (a
//! busy disk's fsyncs), and the next commit tries again; past
//! [`WAIT_PAGES`] the committing connection waits for the thread first. The
//! log stays bounded however slow the thread, and the bulk of the copying
//! is off the committing thread.
//!
//! A connection whose commits are fsync'd one by one (a single run's
//! writes) checkpoints inline, as SQLite would: there the thread's fsyncs
//! would compete with the writer's own on the disk, and that measured
//! slower than the copying it saves.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::wal::CheckpointMode;
use rusqlite::{Connection, OpenFlags};

/// A log of this many pages (4 KiB each) asks for a checkpoint: SQLite's
/// own default threshold.
pub const CHECKPOINT_PAGES: i32 = 1000;

/// A log of this many pages is checkpointed by the connection that
/// commits, which copies what the thread has not yet.
pub const FINISH_PAGES: i32 = CHECKPOINT_PAGES + CHECKPOINT_PAGES / 4;

/// A log of this many pages makes the connection that commits wait for the
/// thread's checkpoint to end before it tries its own, so that the log
/// stays bounded however slow the thread (a busy disk's fsyncs). Below it,
/// a committing connection never waits for the thread.
pub const WAIT_PAGES: i32 = 4 * CHECKPOINT_PAGES;

/// Longest a committing connection waits for the thread's checkpoint to
/// end before it tries its own (which then fails, and the next commit
/// tries again).
const FINISH_WAIT: Duration = Duration::from_secs(2);

#[derive(Default)]
struct State {
    /// A checkpoint was asked for since the last one started.
    wanted: bool,
    /// The thread is checkpointing.
    running: bool,
    stop: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    /// Signalled when the thread ends a checkpoint.
    idle: Condvar,
    /// Frames in the log after the last commit of any connection.
    log_pages: AtomicI32,
    /// Checkpoints the thread has made that copied frames.
    checkpoints: AtomicU64,
}

/// The checkpoint thread of one ledger file, shared by every connection of
/// this process that writes to it; it stops when the last one is dropped.
pub struct Checkpointer {
    path: PathBuf,
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Checkpointer {
    /// The checkpointer of the ledger at `path`, started if there is none.
    pub fn for_ledger(path: &Path) -> Arc<Checkpointer> {
        static ALL: OnceLock<Mutex<HashMap<PathBuf, Weak<Checkpointer>>>> = OnceLock::new();
        let key = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
        let mut all = ALL
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(found) = all.get(&key).and_then(Weak::upgrade) {
            return found;
        }
        all.retain(|_, weak| weak.strong_count() > 0);
        let made = Arc::new(Checkpointer {
            path: key.clone(),
            shared: Arc::default(),
            thread: Mutex::new(None),
        });
        all.insert(key, Arc::downgrade(&made));
        made
    }

    /// Has the log of `conn` checkpointed by this thread from now on,
    /// instead of by the commit that takes it past the threshold, while
    /// `fsyncs_at_commit` is false. While it is true (the connection's
    /// commits are fsync'd: a run's writes, one by one), the commit
    /// checkpoints itself, as SQLite would: measured, a checkpoint's fsyncs
    /// on another thread slow the writer's own, each a whole write's cost.
    pub fn install(
        self: Arc<Self>,
        conn: &mut Connection,
        fsyncs_at_commit: Arc<AtomicBool>,
    ) -> rusqlite::Result<()> {
        let mut nudged = false;
        conn.wal_hook(Some(move |wal: &mut rusqlite::hooks::Wal, pages: i32| {
            self.shared.log_pages.store(pages, Ordering::Relaxed);
            if pages < CHECKPOINT_PAGES {
                nudged = false;
            } else if fsyncs_at_commit.load(Ordering::Relaxed) {
                // As for the other failure below.
                let _ = wal.checkpoint_v2(CheckpointMode::PASSIVE);
            } else if !nudged {
                nudged = true;
                self.nudge();
            } else if pages >= FINISH_PAGES {
                // Far behind a writer that never pauses, the thread is
                // waited for (two checkpoints cannot run at once); then the
                // rest is copied here, so that the log starts over.
                if pages >= WAIT_PAGES {
                    self.wait_for_thread();
                }
                // The commit itself is done: an error here (the thread's
                // checkpoint still running) must not be reported as its
                // failure. The next commit tries again.
                let _ = wal.checkpoint_v2(CheckpointMode::PASSIVE);
            }
            Ok(())
        }))
    }

    /// Waits (at most `FINISH_WAIT`) until the thread is not checkpointing.
    fn wait_for_thread(&self) {
        let state = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        let _ = self
            .shared
            .idle
            .wait_timeout_while(state, FINISH_WAIT, |s| s.running && !s.stop);
    }

    /// Asks for a checkpoint soon; starts the thread on first use.
    fn nudge(&self) {
        {
            let mut state = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
            if state.wanted {
                return;
            }
            state.wanted = true;
        }
        self.shared.wake.notify_one();
        let mut thread = self.thread.lock().unwrap_or_else(|p| p.into_inner());
        if thread.is_none() {
            let (path, shared) = (self.path.clone(), self.shared.clone());
            // Without the thread, the committing connections still
            // checkpoint at `FINISH_PAGES`.
            *thread = std::thread::Builder::new()
                .name("stephost-checkpoint".into())
                .spawn(move || checkpoint_when_asked(&path, &shared))
                .ok();
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.shared
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .stop = true;
        self.shared.wake.notify_one();
        let thread = self.thread.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(thread) = thread.take() {
            let _ = thread.join();
        }
    }
}

fn checkpoint_when_asked(path: &Path, shared: &Shared) {
    let mut conn: Option<Connection> = None;
    loop {
        {
            let mut state = shared.state.lock().unwrap_or_else(|p| p.into_inner());
            while !state.wanted && !state.stop {
                state = shared.wake.wait(state).unwrap_or_else(|p| p.into_inner());
            }
            if state.stop {
                return;
            }
            state.wanted = false;
            state.running = true;
        }
        let _running = Running(shared);
        checkpoint_once(path, shared, &mut conn);
    }
}

/// Marks the thread's checkpoint over when dropped, even by a panic: a
/// committing connection past `WAIT_PAGES` would otherwise wait for it
/// the full `FINISH_WAIT` at every commit.
struct Running<'a>(&'a Shared);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .running = false;
        self.0.idle.notify_all();
    }
}

/// One checkpoint on the thread's connection, opened if need be.
fn checkpoint_once(path: &Path, shared: &Shared, conn: &mut Option<Connection>) {
    if conn.is_none() {
        *conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .and_then(|c| {
            c.busy_timeout(Duration::from_millis(100))?;
            // A checkpoint fsyncs the WAL before it copies it.
            c.pragma_update(None, "synchronous", "FULL")?;
            Ok(c)
        })
        .ok();
    }
    // A failed checkpoint leaves the frames in the log, where they are
    // durable; the next one copies them.
    let Some(c) = conn.as_ref() else { return };
    match c.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
        Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(2)?))
    }) {
        Ok((0, copied)) if copied > 0 => {
            shared.checkpoints.fetch_add(1, Ordering::Relaxed);
        }
        Ok(_) => {}
        Err(_) => *conn = None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` commits of one new page each (three WAL frames, mostly: the new
    /// page, its parent and the database header; more when the parent
    /// splits).
    fn commit_pages(conn: &Connection, n: usize) {
        let mut insert = conn
            .prepare("INSERT INTO t VALUES (zeroblob(3000))")
            .unwrap();
        for _ in 0..n {
            insert.execute([]).unwrap();
        }
    }

    #[test]
    fn the_thread_copies_the_log_and_the_committer_finishes_the_job() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("c.db");
        let mut writer = Connection::open(&db).unwrap();
        writer
            .execute_batch(
                "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;
                 CREATE TABLE t (x BLOB);",
            )
            .unwrap();
        let checkpointer = Checkpointer::for_ledger(&db);
        assert!(Arc::ptr_eq(&checkpointer, &Checkpointer::for_ledger(&db)));
        checkpointer
            .clone()
            .install(&mut writer, Arc::new(AtomicBool::new(false)))
            .unwrap();
        let shared = checkpointer.shared.clone();
        // Past the threshold but short of where the writer checkpoints
        // itself: the thread checkpoints (however late it starts, since
        // the writer stops here and does not copy the log first).
        let mut short = 0;
        while shared.log_pages.load(Ordering::Relaxed) < CHECKPOINT_PAGES {
            commit_pages(&writer, 1);
            short += 1;
        }
        assert!(shared.log_pages.load(Ordering::Relaxed) < FINISH_PAGES);
        for _ in 0..1000 {
            if shared.checkpoints.load(Ordering::Relaxed) > 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(shared.checkpoints.load(Ordering::Relaxed) > 0);
        // A writer that never pauses: the log starts over along the way
        // (it would hold 18,000 frames and more otherwise), however slow
        // the thread, and the thread is asked again each time. The commit
        // that takes the log past `WAIT_PAGES` (only a slow thread, on a
        // loaded machine, lets it get there) waits for the thread and
        // finishes the checkpoint, and the next commit starts the log over:
        // the log passes `WAIT_PAGES` by less than one commit's frames.
        let (mut most, mut step) = (0, 0);
        let mut before = shared.log_pages.load(Ordering::Relaxed);
        for _ in 0..6000 {
            commit_pages(&writer, 1);
            let pages = shared.log_pages.load(Ordering::Relaxed);
            assert!(
                before < WAIT_PAGES || pages < before,
                "the log held {before} frames and did not start over: {pages}"
            );
            step = step.max(pages - before);
            most = most.max(pages);
            before = pages;
        }
        assert!(
            most < WAIT_PAGES + step,
            "the log held {most} frames, a commit adding at most {step}"
        );
        for _ in 0..1000 {
            if shared.checkpoints.load(Ordering::Relaxed) > 1 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(shared.checkpoints.load(Ordering::Relaxed) > 1);
        let rows: i64 = writer
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 6000 + short);
        // The thread stops with the last connection that holds it.
        drop(writer);
        drop(checkpointer);
        assert!(shared.state.lock().unwrap().stop);
    }
}
