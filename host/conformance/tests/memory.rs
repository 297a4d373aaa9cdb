//! The conformance suite on the in-memory ledger, the reference.

use stephost_conformance::TestLedger;

fn memory() -> TestLedger {
    TestLedger {
        pool: std::sync::Arc::new(stephost_core::memory::MemoryPool::new()),
        guard: Box::new(()),
    }
}

stephost_conformance::conformance_tests!(memory);
