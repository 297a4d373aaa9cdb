//! Wake-ups without polling, between the processes of one machine: a file
//! beside the ledger (`LEDGER-wake`) is written to after every commit that
//! leaves a run due and held by nobody (submitted, released, decided,
//! waiting for a timer), and workers watch it with inotify. The rule is
//! PostgreSQL's `runs_due_notify` trigger's
//! ([`lifecycle::wakes_workers`]): each statement that writes a run's row
//! notes it, and the commit that ends the transaction signals. A worker's
//! poll stays as the fallback, and where inotify is not there (other
//! systems) it is all there is.

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use stephost_core::lifecycle;
use stephost_core::store::WakeUp;

/// The file workers watch for `ledger`.
pub fn path_of(ledger: &Path) -> PathBuf {
    let mut path = ledger.as_os_str().to_owned();
    path.push("-wake");
    PathBuf::from(path)
}

thread_local! {
    /// Set when this thread wrote a run row that wakes workers in the
    /// transaction it has open; taken when that transaction ends.
    static NOTED: Cell<bool> = const { Cell::new(false) };
}

/// Notes that the transaction this thread has open wrote a run row with
/// `due_at`, held (`owned`) or not ([`lifecycle::wakes_workers`]).
pub fn note(due_at: Option<i64>, owned: bool) {
    if lifecycle::wakes_workers(due_at, owned) {
        NOTED.with(|n| n.set(true));
    }
}

/// Whether the transaction this thread just ended noted a row (and forgets
/// it).
pub fn take_noted() -> bool {
    NOTED.with(|n| n.replace(false))
}

/// The wake file, opened for writing (created, owner-only, if absent).
fn open(wake: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(wake)
}

/// Tells the workers watching `wake` that a run may have become due.
pub fn signal(wake: &Path) {
    use std::os::unix::fs::FileExt;
    // Best effort: a worker that misses it finds the run at its next poll.
    if let Ok(file) = open(wake) {
        let _ = file.write_at(&[1], 0);
    }
}

/// A watch on a wake file; it stops (within [`STOP_CHECK_MS`]) when dropped.
pub struct Watch {
    stop: Arc<AtomicBool>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// How often a watch looks whether it should stop, in milliseconds.
pub const STOP_CHECK_MS: i32 = 1_000;

/// Calls `wake` whenever `wake_file` is written to, from a thread of its
/// own; `None` where inotify is not available.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
pub fn watch(wake_file: &Path, wake: WakeUp) -> Option<Watch> {
    use std::os::unix::ffi::OsStrExt;
    // The file must be there to be watched (created, not written: that
    // would wake the other workers for nothing).
    open(wake_file).ok()?;
    let path = std::ffi::CString::new(wake_file.as_os_str().as_bytes()).ok()?;
    // SAFETY: plain system calls on a descriptor this function owns.
    let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `path` is a NUL-terminated string that outlives the call.
    if unsafe { libc::inotify_add_watch(fd, path.as_ptr(), libc::IN_MODIFY) } < 0 {
        // SAFETY: `fd` is ours and closed once.
        unsafe { libc::close(fd) };
        return None;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    let spawned = std::thread::Builder::new()
        .name("stephost-wake".into())
        .spawn(move || {
            let mut events = [0u8; 4096];
            while !stopped.load(Ordering::Relaxed) {
                let mut ready = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one pollfd, owned by this frame.
                let n = unsafe { libc::poll(&mut ready, 1, STOP_CHECK_MS) };
                if n <= 0 {
                    continue;
                }
                // Drain every event queued: one wake-up for all of them.
                // SAFETY: `events` is a buffer of its length, owned here.
                while unsafe { libc::read(fd, events.as_mut_ptr().cast(), events.len()) } > 0 {}
                wake();
            }
            // SAFETY: `fd` is ours and closed once.
            unsafe { libc::close(fd) };
        });
    match spawned {
        Ok(_) => Some(Watch { stop }),
        Err(_) => {
            // SAFETY: the thread did not start: `fd` is still ours.
            unsafe { libc::close(fd) };
            None
        }
    }
}

/// Calls `wake` whenever `wake_file` is written to; `None` where inotify
/// is not available.
#[cfg(not(target_os = "linux"))]
pub fn watch(_wake_file: &Path, _wake: WakeUp) -> Option<Watch> {
    None
}
