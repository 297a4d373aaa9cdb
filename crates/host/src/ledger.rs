//! Where the ledger is: a URL names the backend and its place, and opening
//! it gives a pool of that backend. Nothing else in the host names a
//! backend.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use stephost_core::StoreError;
use stephost_core::store::{Pool, PoolOptions};

/// A ledger's location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ledger {
    /// `sqlite:PATH`: the embedded ledger, one file.
    Sqlite(PathBuf),
}

/// The ledger used when none is named.
pub const DEFAULT_URL: &str = "sqlite:stephost.db";

impl Ledger {
    /// Parses a ledger URL: `sqlite:PATH` (`sqlite:///abs/path` also works).
    pub fn parse(url: &str) -> Result<Self, StoreError> {
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
             use sqlite:PATH (e.g. {DEFAULT_URL})"
        )))
    }

    /// The embedded ledger in the file at `path`.
    pub fn sqlite(path: &Path) -> Self {
        Ledger::Sqlite(path.to_path_buf())
    }

    /// Opens the ledger (creating an embedded one if absent).
    pub fn open(&self, options: PoolOptions) -> Result<Arc<dyn Pool>, StoreError> {
        match self {
            Ledger::Sqlite(path) => Ok(Arc::new(stephost_ledger_sqlite::SqlitePool::open(
                path, options,
            )?)),
        }
    }

    /// The URL, for messages.
    pub fn url(&self) -> String {
        match self {
            Ledger::Sqlite(path) => format!("sqlite:{}", path.display()),
        }
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
        for bad in ["sqlite:", "mysql://x", "ledger.db"] {
            assert!(
                matches!(Ledger::parse(bad), Err(StoreError::Config(_))),
                "{bad}"
            );
        }
    }
}
