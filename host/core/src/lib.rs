//! stephost-core: what every part of stephost agrees on, with no engine
//! and no database driver in it.
//!
//! - [`records`]: runs, calls, attempts and log lines as the ledger holds them.
//! - [`lifecycle`]: when a run is due, who may claim it, and what a claim,
//!   an end, a renewal or a repin make of its row.
//! - [`settle`] and [`approvals`]: a person's decisions.
//! - [`ids`], [`chain`], [`payload`]: operation ids and hashes, the
//!   tamper-evident chain, content-addressed bodies; [`trace`]: the trace
//!   a run reports into and the ids of its spans.
//! - [`commit`]: what an execution's commit means, checked once and laid
//!   out as plain data each backend writes.
//! - [`store`]: the storage roles (pool, store, writer) every backend fills;
//!   [`memory`] is one in memory (`stephost-conformance` holds the suite they all pass).
//! - [`notices`]: notifications owed to webhooks, recorded before sent.
//! - [`retention`]: which finished runs are deleted, with what they owned.
//! - [`journal`]: the one durable wrapper every import call passes through,
//!   over a [`history`] of recorded calls; [`outcome`] is what it records.

pub mod approvals;
pub mod chain;
pub mod clock;
pub mod commit;
pub mod crash;
pub mod error;
pub mod flow;
pub mod fork;
pub mod history;
pub mod ids;
pub mod journal;
pub mod lifecycle;
pub mod limits;
pub mod mac;
pub mod memory;
pub mod notices;
pub mod outcome;
pub mod payload;
pub mod promises;
pub mod records;
pub mod redact;
pub mod retention;
pub mod schedules;
pub mod settle;
pub mod store;
#[cfg(feature = "testing")]
pub mod tamper;
pub mod trace;
pub mod tree_spend;

pub use history::History;
pub use limits::{Limits, RunBudget};
pub use outcome::{CallErrorKind, CallErrorRecord, Outcome, Spent};
pub use records::{
    AttemptRecord, CallClass, CallRecord, CallState, CancelRequest, ChildArrival, Claim,
    ClaimedFrom, ForkRef, InboxEntry, LogRecord, NewRun, ParentRef, RunEnd, RunRecord, RunStatus,
};
pub use store::{Outbox, Pool, Store, StoreError, StoreResult, Views, WriteOp, Writer};
pub use trace::RunTrace;
