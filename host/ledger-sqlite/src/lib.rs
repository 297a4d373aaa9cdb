//! stephost-ledger-sqlite: the embedded ledger, one SQLite file in WAL mode.
//!
//! A [`SqlitePool`] opens the file (`sqlite:PATH`), creating it and its
//! schema ([`schema`], plain SQL migration files) if absent. Its stores
//! and writers each have a connection of their own. A commit that must be
//! durable is fsync'd (`synchronous = FULL`) before it is answered; others
//! are not (`NORMAL`), and become durable with the next one that is. A pool
//! opened for group commit sends its writers' commits through one committer
//! thread ([`group`]).

pub mod checkpoint;
mod commit;
mod conn;
mod errors;
mod flows;
pub mod group;
mod known;
mod retention;
mod rows;
mod schedules;
pub mod schema;
pub mod segments;
mod store;
mod stream;
#[cfg(feature = "testing")]
mod tamper;
mod tree_spend;
pub mod wake;

use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};

use stephost_core::commit::CommitPlan;
use stephost_core::store::{Commit, CommitCounts, Outbox, Pool, PoolOptions, Store, Writer};
use stephost_core::{StoreError, StoreResult};

pub use conn::BUSY_TIMEOUT_MS;
pub use store::SqliteStore;

use crate::conn::Conn;

/// A ledger in one SQLite file.
pub struct SqlitePool {
    path: PathBuf,
    group: Option<Arc<group::GroupCommitter>>,
    checkpointer: Arc<checkpoint::Lazy>,
    /// The connection that checked the file, kept for the first store.
    checked: std::sync::Mutex<Option<Conn>>,
    /// Models' flow state, made on first use.
    flows: std::sync::Mutex<Option<Arc<flows::SqliteFlows>>>,
    /// The watch on the wake file, once a worker asked for one.
    watch: std::sync::Mutex<Option<wake::Watch>>,
}

impl SqlitePool {
    /// The connection models' flow state and trees' spend share, made on
    /// first use.
    fn shared_state(&self) -> Arc<flows::SqliteFlows> {
        let mut flows = self.flows.lock().unwrap_or_else(|p| p.into_inner());
        flows
            .get_or_insert_with(|| Arc::new(flows::SqliteFlows::new(&self.path)))
            .clone()
    }

    /// Opens (or creates) the ledger at `path`: checks the file and brings
    /// its schema up to date, once; the pool's other connections trust it.
    pub fn open(path: &Path, options: PoolOptions) -> StoreResult<Self> {
        let checked = Conn::open(path)?;
        let checkpointer = Arc::new(checkpoint::Lazy::new(path));
        let group = match options.group_commit {
            true => Some(Arc::new(group::GroupCommitter::start(path)?)),
            false => None,
        };
        Ok(SqlitePool {
            path: path.to_path_buf(),
            group,
            checkpointer,
            checked: std::sync::Mutex::new(Some(checked)),
            flows: std::sync::Mutex::new(None),
            watch: std::sync::Mutex::new(None),
        })
    }

    fn connection(&self) -> StoreResult<Conn> {
        let kept = self
            .checked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        match kept {
            Some(conn) => Ok(conn),
            None => Conn::connect(&self.path),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A store of this pool's, typed.
    pub fn sqlite_store(&self) -> StoreResult<SqliteStore> {
        Ok(SqliteStore::new(self.connection()?, &self.path))
    }

    /// What changes the ledger behind stephost's back, for tests.
    #[cfg(feature = "testing")]
    pub fn tamper(&self) -> StoreResult<Box<dyn stephost_core::tamper::Tamper>> {
        Ok(Box::new(self.sqlite_store()?))
    }
}

impl Pool for SqlitePool {
    fn store(&self) -> StoreResult<Box<dyn Store>> {
        Ok(Box::new(self.sqlite_store()?))
    }

    fn outbox(&self) -> StoreResult<Box<dyn Outbox>> {
        Ok(Box::new(self.sqlite_store()?))
    }

    fn writer(&self) -> StoreResult<Box<dyn Writer>> {
        match &self.group {
            Some(group) => Ok(Box::new(group.writer()?)),
            None => Ok(Box::new(DirectWriter::new(
                &self.path,
                self.checkpointer.clone(),
            )?)),
        }
    }

    fn commit_counts(&self) -> CommitCounts {
        self.group.as_ref().map(|g| g.counts()).unwrap_or_default()
    }

    /// A run that becomes due in any process on this machine wakes `wake`
    /// ([`wake`]), where inotify is available.
    fn watch_due(&self, wake: stephost_core::store::WakeUp) -> StoreResult<bool> {
        let mut watch = self.watch.lock().unwrap_or_else(|p| p.into_inner());
        if watch.is_none() {
            *watch = wake::watch(&wake::path_of(&self.path), wake);
        }
        Ok(watch.is_some())
    }

    fn flows(&self) -> StoreResult<Arc<dyn stephost_core::flow::Flows>> {
        Ok(self.shared_state())
    }

    fn tree_spends(&self) -> StoreResult<Arc<dyn stephost_core::tree_spend::TreeSpends>> {
        Ok(self.shared_state())
    }

    fn schedules(&self) -> StoreResult<Arc<dyn stephost_core::schedules::Schedules>> {
        Ok(self.shared_state())
    }

    fn retention(&self) -> StoreResult<Arc<dyn stephost_core::retention::Retention>> {
        Ok(Arc::new(retention::SqliteRetention::new(&self.path)))
    }
}

/// A writer for one execution at a time, on connections of its own. A
/// commit that must be durable is applied on the caller's thread, once the
/// commits before it have landed. Others (buffered calls, 1,024 at a time)
/// are handed to a thread of the writer's own, started with the first, which
/// applies them while the step goes on: on two cores the step and the SQL
/// recording its calls run side by side (and so do the WAL checkpoints those
/// commits trigger). Once one of them fails, none after it is applied, and
/// its error is the answer of the writer's next commit or of `landed`.
pub struct DirectWriter {
    path: PathBuf,
    conn: Conn,
    behind: Option<Behind>,
    checkpointer: Arc<checkpoint::Lazy>,
}

/// Commits handed to the writer's thread and not yet answered.
struct Behind {
    jobs: Option<mpsc::SyncSender<CommitPlan>>,
    answers: mpsc::Receiver<StoreResult<()>>,
    in_flight: usize,
    /// The first error it answered.
    failed: Option<StoreError>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Most commits waiting for the writer's thread before a new one waits.
pub const BEHIND_COMMITS_MAX: usize = 4;

impl DirectWriter {
    fn new(path: &Path, checkpointer: Arc<checkpoint::Lazy>) -> StoreResult<Self> {
        Ok(DirectWriter {
            path: path.to_path_buf(),
            conn: Conn::connect(path)?,
            behind: None,
            checkpointer,
        })
    }

    /// Hands `plan` to the writer's thread, starting it if need be.
    fn hand_over(&mut self, plan: CommitPlan) -> StoreResult<()> {
        if self.behind.is_none() {
            let checkpointer = self.checkpointer.get()?;
            self.behind = Some(Behind::start(&self.path, &checkpointer)?);
        }
        let behind = self.behind.as_mut().expect("started just above");
        behind.collect(false)?;
        let sent = behind
            .jobs
            .as_ref()
            .map(|jobs| jobs.send(plan).is_ok())
            .unwrap_or(false);
        if !sent {
            return Err(StoreError::Unavailable(
                "the ledger writer's thread stopped".into(),
            ));
        }
        behind.in_flight += 1;
        Ok(())
    }
}

impl Behind {
    fn start(path: &Path, checkpointer: &checkpoint::Checkpointer) -> StoreResult<Self> {
        let mut conn = Conn::connect(path)?;
        // Its commits are not fsync'd: the WAL checkpoints they trigger go
        // to the pool's checkpointer, off this thread. (A writer's durable
        // commits checkpoint inline, as SQLite does: there the checkpointer's
        // fsyncs would compete with the writer's own for the disk.)
        checkpointer.take_over(&mut conn)?;
        let (jobs, queue) = mpsc::sync_channel::<CommitPlan>(BEHIND_COMMITS_MAX);
        let (answer, answers) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("stephost-write".into())
            .spawn(move || {
                let mut failed: Option<StoreError> = None;
                for plan in queue {
                    let result = match &failed {
                        Some(first) => Err(first.clone()),
                        None => conn.commit(&plan),
                    };
                    if let Err(e) = &result {
                        failed.get_or_insert_with(|| e.clone());
                    }
                    if answer.send(result).is_err() {
                        return;
                    }
                }
            })
            .map_err(|e| StoreError::Unavailable(format!("cannot start a writer thread: {e}")))?;
        Ok(Behind {
            jobs: Some(jobs),
            answers,
            in_flight: 0,
            failed: None,
            thread: Some(thread),
        })
    }

    /// Takes the answers that have come (all of them, with `wait`); the
    /// first error among them, or among those before.
    fn collect(&mut self, wait: bool) -> StoreResult<()> {
        while self.in_flight > 0 {
            let answer = if wait {
                self.answers.recv().map_err(|_| ())
            } else {
                match self.answers.try_recv() {
                    Ok(answer) => Ok(answer),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => Err(()),
                }
            };
            let answer = answer.unwrap_or_else(|()| {
                Err(StoreError::Unavailable(
                    "the ledger writer's thread stopped".into(),
                ))
            });
            self.in_flight -= 1;
            if let Err(e) = answer {
                self.failed.get_or_insert(e);
            }
        }
        match &self.failed {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }
}

impl Drop for Behind {
    fn drop(&mut self) {
        // The thread ends once its queue is closed and emptied.
        self.jobs.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Writer for DirectWriter {
    fn write(&mut self, plan: CommitPlan) -> Commit {
        if plan.durable {
            return Commit::Done(self.landed().and_then(|()| self.conn.commit(&plan)));
        }
        Commit::Done(self.hand_over(plan))
    }

    fn landed(&mut self) -> StoreResult<()> {
        match &mut self.behind {
            Some(behind) => behind.collect(true),
            None => Ok(()),
        }
    }
}
