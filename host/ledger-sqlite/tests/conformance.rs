//! The conformance suite every ledger backend passes, on SQLite files.

use std::sync::Arc;

use stephost_conformance::TestLedger;
use stephost_core::store::PoolOptions;
use stephost_ledger_sqlite::SqlitePool;

fn sqlite() -> TestLedger {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let pool = SqlitePool::open(&dir.path().join("ledger.db"), PoolOptions::default())
        .expect("open a new ledger");
    TestLedger {
        pool: Arc::new(pool),
        guard: Box::new(dir),
    }
}

fn sqlite_group_commit() -> TestLedger {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let pool = SqlitePool::open(
        &dir.path().join("ledger.db"),
        PoolOptions { group_commit: true },
    )
    .expect("open a new ledger");
    TestLedger {
        pool: Arc::new(pool),
        guard: Box::new(dir),
    }
}

mod direct {
    stephost_conformance::conformance_tests!(super::sqlite);
}

mod group_commit {
    stephost_conformance::conformance_tests!(super::sqlite_group_commit);
}
