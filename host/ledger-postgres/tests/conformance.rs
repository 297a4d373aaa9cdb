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
