//! WAL checkpoints off the thread that commits buffered calls.
//!
//! SQLite copies its write-ahead log back into the database file (a
//! checkpoint) inside whichever commit takes the log past 1,000 pages, and
//! with `synchronous = NORMAL` fsyncs the database file there: milliseconds
//! on the thread that records a step's calls, about a fifth of an observe
//! or read call's cost on this project's machines. A connection that commits
//! buffered calls (a writer's thread) instead nudges one checkpointer thread
//! per pool, which makes `PASSIVE` checkpoints (they never wait for a writer
//! or make one wait) on a connection of its own. Durability does not
//! change: a commit is durable once it is in the fsync'd log.
//!
//! The log starts over only when a writer begins a transaction after a
//! checkpoint has copied all of it, which a writer that never pauses would
//! not let the thread do; so past [`INLINE_PAGES`] the committing
//! connection checkpoints too, copying only what the thread has not, and
//! the log stays bounded however slow the thread.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use rusqlite::wal::CheckpointMode;
use stephost_core::{StoreError, StoreResult};

use crate::conn::Conn;
use crate::errors::error;

/// A log of this many pages (4 KiB each) asks for a checkpoint: SQLite's
/// own default threshold.
pub const CHECKPOINT_PAGES: i32 = 1000;

/// A log of this many pages is checkpointed by the connection that commits.
pub const INLINE_PAGES: i32 = 4 * CHECKPOINT_PAGES;

#[derive(Default)]
struct Shared {
    wanted: Mutex<bool>,
    wake: Condvar,
    stop: AtomicBool,
}

/// A pool's checkpointer, started by the first connection that needs it.
pub struct Lazy {
    path: std::path::PathBuf,
    started: Mutex<Option<Arc<Checkpointer>>>,
}

impl Lazy {
    pub fn new(path: &std::path::Path) -> Self {
        Lazy {
            path: path.to_path_buf(),
            started: Mutex::new(None),
        }
    }

    /// The checkpointer, started if need be.
    pub fn get(&self) -> StoreResult<Arc<Checkpointer>> {
        let mut started = self.started.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(running) = started.as_ref() {
            return Ok(running.clone());
        }
        let running = Arc::new(Checkpointer::start(&self.path)?);
        *started = Some(running.clone());
        Ok(running)
    }
}

/// One pool's checkpointer thread.
pub struct Checkpointer {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Checkpointer {
    /// Starts the thread, with a connection of its own to the ledger at
    /// `path`.
    pub fn start(path: &std::path::Path) -> StoreResult<Self> {
        let conn = Conn::connect(path)?;
        let shared = Arc::new(Shared::default());
        let theirs = shared.clone();
        let thread = std::thread::Builder::new()
            .name("stephost-checkpoint".into())
            .spawn(move || run(&conn, &theirs))
            .map_err(|e| StoreError::Unavailable(format!("cannot start the checkpointer: {e}")))?;
        Ok(Checkpointer {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Makes `conn`'s commits nudge this checkpointer instead of
    /// checkpointing themselves (until the log passes [`INLINE_PAGES`]).
    pub fn take_over(&self, conn: &mut Conn) -> StoreResult<()> {
        conn.conn
            .pragma_update(None, "wal_autocheckpoint", 0)
            .map_err(error)?;
        let shared = self.shared.clone();
        conn.conn
            .wal_hook(Some(move |wal: &mut rusqlite::hooks::Wal, pages| {
                if pages >= INLINE_PAGES {
                    // Busy (another checkpoint runs): the next commit tries again.
                    let _ = wal.checkpoint_v2(CheckpointMode::PASSIVE);
                } else if pages >= CHECKPOINT_PAGES {
                    *shared.wanted.lock().unwrap_or_else(|p| p.into_inner()) = true;
                    shared.wake.notify_one();
                }
                Ok(())
            }))
            .map_err(error)
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = thread.join();
        }
    }
}

fn run(conn: &Conn, shared: &Shared) {
    loop {
        {
            let mut wanted = shared.wanted.lock().unwrap_or_else(|p| p.into_inner());
            while !*wanted && !shared.stop.load(Ordering::SeqCst) {
                wanted = shared.wake.wait(wanted).unwrap_or_else(|p| p.into_inner());
            }
            if shared.stop.load(Ordering::SeqCst) {
                return;
            }
            *wanted = false;
        }
        // Busy or failing: the log only grows until the next nudge, or
        // until a committing connection checkpoints it.
        let _ = conn
            .conn
            .wal_checkpoint_v2(None::<&str>, CheckpointMode::PASSIVE);
    }
}
