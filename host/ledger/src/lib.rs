//! stephost-ledger: where the ledger is. A URL names the backend and its
//! place, and opening it gives a pool of that backend ([`Opener`]). Nothing
//! else names a backend: the runtime, the server and the CLI see only the
//! storage roles. One cargo feature per backend (`sqlite`, `postgres`, both
//! by default).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use stephost_core::StoreError;
use stephost_core::store::{Opener, Pool, PoolOptions};

#[cfg(feature = "faults")]
pub mod faults;

/// A ledger's location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ledger {
    /// `sqlite:PATH`: the embedded ledger, one file.
    Sqlite(PathBuf),
    /// `postgres://USER@HOST:PORT/DATABASE` (or `postgresql://`): a
    /// PostgreSQL database that workers on many machines share.
    Postgres(String),
}

/// The ledger used when none is named.
pub const DEFAULT_URL: &str = "sqlite:stephost.db";

impl Ledger {
    /// Parses a ledger URL: `sqlite:PATH` (`sqlite:///abs/path` also works)
    /// or `postgres://…`.
    pub fn parse(url: &str) -> Result<Self, StoreError> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(Ledger::Postgres(url.to_string()));
        }
        if let Some(path) = url.strip_prefix("sqlite:") {
            let path = path.strip_prefix("//").unwrap_or(path);
            if path.is_empty() {
                return Err(StoreError::Config(format!(
                    "ledger URL {url:?} names no file; use sqlite:PATH, e.g. {DEFAULT_URL}"
                )));
            }
            return Ok(Ledger::Sqlite(PathBuf::from(path)));
        }
        let scheme = url.split_once(':').map_or(url, |(scheme, _)| scheme);
        Err(StoreError::Config(format!(
            "ledger URL {url:?} has scheme {scheme:?}, which this stephost does not know; \
             use sqlite:PATH (e.g. {DEFAULT_URL}) or postgres://USER@HOST:PORT/DATABASE"
        )))
    }

    /// The embedded ledger in the file at `path`.
    pub fn sqlite(path: &Path) -> Self {
        Ledger::Sqlite(path.to_path_buf())
    }
}

impl Ledger {
    /// What changes this ledger behind stephost's back, for tests: no rule
    /// checked, no seal made.
    #[cfg(feature = "testing")]
    pub fn tamper(&self) -> Result<Box<dyn stephost_core::tamper::Tamper>, StoreError> {
        match self {
            #[cfg(feature = "sqlite")]
            Ledger::Sqlite(path) => {
                stephost_ledger_sqlite::SqlitePool::open(path, PoolOptions::default())?.tamper()
            }
            #[cfg(feature = "postgres")]
            Ledger::Postgres(url) => {
                stephost_ledger_postgres::PgPool::open(url, PoolOptions::default())?.tamper()
            }
            #[allow(unreachable_patterns)]
            other => Err(StoreError::Config(format!(
                "this stephost was built without the backend of {}",
                other.url()
            ))),
        }
    }
}

impl Opener for Ledger {
    /// Opens the ledger (creating an embedded one if absent).
    fn open(&self, options: PoolOptions) -> Result<Arc<dyn Pool>, StoreError> {
        let pool = self.open_backend(options)?;
        #[cfg(feature = "faults")]
        let pool = faults::wrap(pool)?;
        Ok(pool)
    }

    /// The URL, for messages (without a password).
    fn url(&self) -> String {
        match self {
            Ledger::Sqlite(path) => format!("sqlite:{}", path.display()),
            Ledger::Postgres(url) => redact(url),
        }
    }
}

impl Ledger {
    fn open_backend(&self, options: PoolOptions) -> Result<Arc<dyn Pool>, StoreError> {
        match self {
            #[cfg(feature = "sqlite")]
            Ledger::Sqlite(path) => Ok(Arc::new(stephost_ledger_sqlite::SqlitePool::open(
                path, options,
            )?)),
            #[cfg(feature = "postgres")]
            Ledger::Postgres(url) => Ok(Arc::new(stephost_ledger_postgres::PgPool::open(
                url, options,
            )?)),
            #[allow(unreachable_patterns)]
            other => {
                let _ = options;
                Err(StoreError::Config(format!(
                    "this stephost was built without the backend of {}",
                    other.url()
                )))
            }
        }
    }
}

/// A PostgreSQL URL with its password left out, for messages.
fn redact(url: &str) -> String {
    #[cfg(feature = "postgres")]
    {
        stephost_ledger_postgres::redact(url)
    }
    #[cfg(not(feature = "postgres"))]
    {
        url.split_once('@')
            .map_or(url.to_string(), |(_, host)| format!("postgres://…@{host}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_the_backend_and_its_place() {
        assert_eq!(
            Ledger::parse("sqlite:runs/ledger.db").unwrap(),
            Ledger::Sqlite("runs/ledger.db".into())
        );
        assert_eq!(
            Ledger::parse("sqlite:///var/lib/stephost.db").unwrap(),
            Ledger::Sqlite("/var/lib/stephost.db".into())
        );
        assert_eq!(
            Ledger::parse("postgres://ops:pw@db:5432/stephost").unwrap(),
            Ledger::Postgres("postgres://ops:pw@db:5432/stephost".into())
        );
        assert_eq!(
            Ledger::parse("postgresql://db/stephost").unwrap().url(),
            "postgresql://db/stephost"
        );
        assert_eq!(
            Ledger::parse("postgres://ops:pw@db/stephost")
                .unwrap()
                .url(),
            "postgres://ops@db/stephost"
        );
        for bad in ["sqlite:", "mysql://x", "ledger.db"] {
            assert!(
                matches!(Ledger::parse(bad), Err(StoreError::Config(_))),
                "{bad}"
            );
        }
    }
}
