//! stephost-ledger-postgres: the ledger on PostgreSQL, for workers on many
//! machines sharing one database.
//!
//! A [`PgPool`] is opened from a URL (`postgres://USER@HOST:PORT/DB`,
//! over TLS as its `sslmode` asks: [`tls`]), bringing the schema up to date ([`schema`], plain SQL migration files).
//! Its stores and writers take connections from a bounded set
//! ([`conns`]); the driver runs on a small runtime of the pool's own, so
//! the pool can be used from any thread, inside a worker's runtime or not.
//!
//! Durability: every commit that holds a durable op (a write's `started`,
//! a run's end) is committed with `synchronous_commit = on`, its WAL
//! flushed before it is answered; others with `synchronous_commit = off`,
//! flushed with the next durable one. Every commit locks its run's row and
//! checks its fencing token in the same transaction ([`commit`]). A pool
//! opened for group commit sends its writers' commits through one
//! committer ([`group`]). Workers learn that a run became due from
//! `LISTEN/NOTIFY` ([`notify`]).

mod commit;
pub mod conns;
mod errors;
mod flows;
pub mod group;
pub mod notify;
mod retention;
mod rows;
mod schedules;
pub mod schema;
mod store;
mod stream;
#[cfg(feature = "testing")]
mod tamper;
#[cfg(any(test, feature = "throwaway"))]
pub mod throwaway;
pub mod tls;
mod tree_spend;
mod writer;

use std::future::Future;
use std::sync::{Arc, Mutex};

use stephost_core::store::{CommitCounts, Outbox, Pool, PoolOptions, Store, WakeUp, Writer};
use stephost_core::{StoreError, StoreResult};

pub use errors::redact;
pub use store::PgStore;

use crate::conns::{Conns, Lease};

/// Threads of a pool's runtime, which drives its connections.
pub const RUNTIME_THREADS: usize = 1;

/// What a pool's stores, writers and committer share.
pub(crate) struct Shared {
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
    handle: tokio::runtime::Handle,
    conns: Arc<Conns>,
}

impl Shared {
    /// Runs `work` on the pool's runtime with a connection from the pool,
    /// and waits for its answer on this thread.
    pub fn block<T, F, Fut>(&self, work: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(Lease) -> Fut + Send + 'static,
        Fut: Future<Output = StoreResult<T>> + Send,
    {
        let (answer, answered) = std::sync::mpsc::sync_channel(1);
        let conns = self.conns.clone();
        self.handle.spawn(async move {
            let result = match conns.get().await {
                Ok(conn) => work(conn).await,
                Err(e) => Err(e),
            };
            let _ = answer.send(result);
        });
        answered
            .recv()
            .unwrap_or_else(|_| Err(StoreError::Unavailable("the ledger's pool stopped".into())))
    }

    /// Runs `task` on the pool's runtime.
    pub fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        self.handle.spawn(task);
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Dropped from within another runtime's task, a runtime must not
        // wait for its own: its tasks are abandoned, its connections closed.
        if let Some(runtime) = self
            .runtime
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            runtime.shutdown_background();
        }
    }
}

/// A ledger in a PostgreSQL database.
pub struct PgPool {
    shared: Arc<Shared>,
    group: Option<group::GroupCommitter>,
    listening: Mutex<bool>,
}

impl PgPool {
    /// What changes the ledger behind stephost's back, for tests.
    #[cfg(feature = "testing")]
    pub fn tamper(&self) -> StoreResult<Box<dyn stephost_core::tamper::Tamper>> {
        Ok(Box::new(store::PgStore::new(self.shared.clone())))
    }

    /// Opens the ledger at `url`, creating its schema if the database (or
    /// the schema `search_path` names first) has none yet. Its connections
    /// use TLS as the URL's `sslmode` asks ([`tls`]).
    pub fn open(url: &str, options: PoolOptions) -> StoreResult<Self> {
        let location = redact(url);
        let server = conns::Server::from_url(url, &location)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(RUNTIME_THREADS)
            .thread_name("stephost-pg")
            .enable_all()
            .build()
            .map_err(|e| {
                StoreError::Unavailable(format!("cannot start the ledger's runtime: {e}"))
            })?;
        let shared = Arc::new(Shared {
            handle: runtime.handle().clone(),
            runtime: Mutex::new(Some(runtime)),
            conns: Conns::new(server, conns::CONNECTIONS_MAX),
        });
        shared.block(move |mut conn| async move { schema::prepare(&mut conn, &location).await })?;
        let group = options
            .group_commit
            .then(|| group::GroupCommitter::start(&shared));
        Ok(PgPool {
            shared,
            group,
            listening: Mutex::new(false),
        })
    }
}

impl Pool for PgPool {
    fn store(&self) -> StoreResult<Box<dyn Store>> {
        Ok(Box::new(PgStore::new(self.shared.clone())))
    }

    fn outbox(&self) -> StoreResult<Box<dyn Outbox>> {
        Ok(Box::new(PgStore::new(self.shared.clone())))
    }

    fn writer(&self) -> StoreResult<Box<dyn Writer>> {
        Ok(match &self.group {
            Some(group) => Box::new(group.writer()),
            None => Box::new(writer::DirectWriter::start(&self.shared)),
        })
    }

    fn commit_counts(&self) -> CommitCounts {
        self.group.as_ref().map(|g| g.counts()).unwrap_or_default()
    }

    fn flows(&self) -> StoreResult<Arc<dyn stephost_core::flow::Flows>> {
        Ok(Arc::new(flows::PgFlows::new(self.shared.clone())))
    }

    fn tree_spends(&self) -> StoreResult<Arc<dyn stephost_core::tree_spend::TreeSpends>> {
        Ok(Arc::new(flows::PgFlows::new(self.shared.clone())))
    }

    fn schedules(&self) -> StoreResult<Arc<dyn stephost_core::schedules::Schedules>> {
        Ok(Arc::new(flows::PgFlows::new(self.shared.clone())))
    }

    fn retention(&self) -> StoreResult<Arc<dyn stephost_core::retention::Retention>> {
        Ok(Arc::new(flows::PgFlows::new(self.shared.clone())))
    }

    fn watch_due(&self, wake: WakeUp) -> StoreResult<bool> {
        let mut listening = self.listening.lock().unwrap_or_else(|p| p.into_inner());
        if !*listening {
            self.shared
                .spawn(notify::listen(self.shared.conns.server.clone(), wake));
            *listening = true;
        }
        Ok(true)
    }
}
