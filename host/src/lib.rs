//! stephost: runs agent steps as sandboxed WebAssembly components and makes
//! them durable. Every import call a step makes is recorded in a ledger
//! before the step sees its result; an interrupted run resumes by replaying
//! its recorded calls, and a write left in flight is reconciled with its
//! receiver by operation id instead of being sent twice.
//!
//! Modules, one per concept:
//! - [`bindings`]: the step world, generated once.
//! - [`engine`]: wasmtime, the linker and the compiled-component cache.
//! - [`imports`]: one module per WIT interface, plus WASI clocks and random.
//! - [`journal`]: the one durable wrapper every import call passes through.
//! - [`ledger`]: the storage trait and its SQLite implementation.
//! - [`effects`]: handlers, the retry loop and reconciliation.
//! - [`runner`]: run, resume and replay.
//! - [`replay`]: fixtures and replay reports.
//! - [`cli`]: the command line, thin over the rest.

pub mod adapt;
pub mod bindings;
pub mod cli;
pub mod clock;
pub mod command;
pub mod config;
pub mod crash;
pub mod effects;
pub mod engine;
pub mod error;
pub mod ids;
pub mod imports;
pub mod journal;
pub mod ledger;
pub mod limits;
pub mod metrics;
pub mod owner;
pub mod replay;
pub mod runner;
pub mod worker;

pub use error::{HostError, exit};
pub use runner::{Host, HostOptions, RunReport};
