//! One model budget for a tree of runs: what each run of a tree has spent
//! on model calls (or holds for a call in flight) counts against its
//! root's budget, in every process on the ledger.
//!
//! Each run keeps one row in its tree: its own spend, written whole (not
//! added to), so a write made again after a crash changes nothing, and a
//! run that resumes elsewhere writes its true figure at its next call.
//! Before a live model call a run in a tree (a child, or a run that has
//! started one) holds its spend so far plus the call's worst case, and
//! only if the tree's total with it stays within the root's budget; after
//! the call it writes what it has spent. A process that dies between the
//! two leaves the worst case held until the run's next call: a tree can
//! be refused a call it could have afforded, never pass its budget. The
//! rule is here once; a ledger applies it under a lock on the tree
//! ([`TreeSpends`]).

use crate::error::StoreResult;
use crate::outcome::Spent;

/// Whether `mine`, with `others` (the rest of the tree), stays within
/// `cap`.
pub fn fits(others: Spent, mine: Spent, cap: Spent) -> bool {
    let total = others.plus(mine);
    total.tokens <= cap.tokens && total.micro_usd <= cap.micro_usd
}

/// A figure as a ledger's signed 64-bit column keeps it (a budget past
/// 2^63 is as good as none).
pub fn column(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Trees' model spend, shared by every process on the ledger.
pub trait TreeSpends: Send + Sync {
    /// Sets run `run_id`'s spend in the tree of `root_run_id` to `spent`;
    /// with a `cap`, only if the tree's total stays within it, under a lock
    /// on the tree: `Ok(Err(others))`, what the rest of the tree has
    /// spent, when it would not.
    fn set_spent(
        &self,
        root_run_id: &str,
        run_id: &str,
        spent: Spent,
        cap: Option<Spent>,
    ) -> StoreResult<Result<(), Spent>>;

    /// What the runs of the tree of `root_run_id` have spent (and hold).
    fn tree_spent(&self, root_run_id: &str) -> StoreResult<Spent>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spent(tokens: u64, micro_usd: u64) -> Spent {
        Spent { tokens, micro_usd }
    }

    #[test]
    fn a_spend_fits_when_the_trees_total_with_it_stays_within_both_bounds() {
        let cap = spent(1_000, 50);
        assert!(fits(spent(400, 10), spent(600, 40), cap));
        assert!(!fits(spent(401, 10), spent(600, 40), cap));
        assert!(!fits(spent(0, 11), spent(0, 40), cap));
        assert!(fits(spent(u64::MAX, 0), spent(0, 0), spent(u64::MAX, 0)));
        assert_eq!(column(u64::MAX), i64::MAX);
    }
}
