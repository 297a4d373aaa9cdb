//! The conformance suite every ledger backend passes, on PostgreSQL: each
//! case in a new schema of a throwaway cluster (or of the server
//! `STEPHOST_TEST_POSTGRES` names).

use std::sync::Arc;

use stephost_conformance::TestLedger;
use stephost_core::store::PoolOptions;
use stephost_ledger_postgres::PgPool;
use stephost_ledger_postgres::throwaway::TestServer;

fn ledger(options: PoolOptions) -> TestLedger {
    let url = TestServer::shared().fresh_ledger();
    let pool = PgPool::open(&url, options).expect("open a new ledger");
    TestLedger {
        pool: Arc::new(pool),
        guard: Box::new(()),
    }
}

fn postgres() -> TestLedger {
    ledger(PoolOptions::default())
}

fn postgres_group_commit() -> TestLedger {
    ledger(PoolOptions { group_commit: true })
}

mod direct {
    stephost_conformance::conformance_tests!(super::postgres);
}

mod group_commit {
    stephost_conformance::conformance_tests!(super::postgres_group_commit);
}

/// `sql` run on the ledger at `url` (its schema first in the search path).
fn psql(url: &str, sql: &str) -> String {
    let out = std::process::Command::new("psql")
        .arg(url)
        .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .output()
        .expect("run psql");
    assert!(
        out.status.success(),
        "{sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Rolling upgrades: a ledger a newer build migrated is used as it is by
/// this build when the newer build says builds of this schema may use it
/// (a migration that only adds), and refused when it says they may not.
#[test]
fn a_newer_ledger_is_used_when_it_says_this_build_may_and_refused_when_not() {
    use stephost_core::StoreError;
    use stephost_ledger_postgres::schema::{COMPATIBLE_FROM, MIGRATIONS};
    let url = TestServer::shared().fresh_ledger();
    drop(PgPool::open(&url, PoolOptions::default()).expect("a new ledger"));
    let version = MIGRATIONS.len() as i64;
    assert_eq!(
        psql(
            &url,
            "SELECT value FROM stephost_meta WHERE key = 'compatible_from'"
        ),
        COMPATIBLE_FROM.to_string()
    );
    // What the next build's expanding migration would leave.
    psql(
        &url,
        &format!(
            "CREATE TABLE next_release_table (x int); \
             UPDATE stephost_meta SET value = '{}' WHERE key = 'version'",
            version + 1
        ),
    );
    let pool = PgPool::open(&url, PoolOptions::default()).expect("a compatible newer ledger");
    use stephost_core::store::Pool;
    let store = pool.store().unwrap();
    store.put_module("m", b"m").unwrap();
    assert_eq!(store.module("m").unwrap(), b"m");
    drop(store);
    drop(pool);
    assert_eq!(
        psql(
            &url,
            "SELECT value FROM stephost_meta WHERE key = 'version'"
        ),
        (version + 1).to_string(),
        "never migrated down"
    );
    // The next build's contracting migration says older builds may not.
    psql(
        &url,
        &format!(
            "UPDATE stephost_meta SET value = '{}' WHERE key = 'compatible_from'",
            version + 1
        ),
    );
    let err = PgPool::open(&url, PoolOptions::default())
        .err()
        .expect("refused");
    assert!(
        matches!(err, StoreError::TooNew { compatible_from, .. } if compatible_from == version + 1),
        "{err:?}"
    );
}
