//! stephost-runtime: the runtime that runs steps as sandboxed WebAssembly
//! components over a ledger (see `stephost-core` for the records, rules and
//! the journal every import call passes through).
//!
//! Modules, one per concept:
//! - [`bindings`]: the step world, generated once.
//! - [`engine`]: wasmtime, the linker and the compiled-component cache;
//!   [`adapt`] and [`command`] bring WASI core modules and commands in.
//! - [`imports`]: one module per WIT interface, plus WASI clocks and random.
//! - [`effects`]: handlers, the retry loop and reconciliation.
//! - [`instance`]: one execution's store, limits and WASI.
//! - [`execution`]: an execution's journal and its end.
//! - [`runner`]: a host over a ledger: run, resume, replay, upgrade.
//! - [`worker`]: claims due runs and executes several at once.
//! - [`service`]: the views and decisions the CLI and the server share.
//! - [`telemetry`]: OpenTelemetry traces of runs, exported by OTLP.
//! - [`logs`]: what a worker or server says on stderr, text or JSON.
//! - [`config`], [`options`], [`metrics`], [`replay`], [`owner`], [`error`].

pub mod adapt;
pub mod bindings;
pub mod bounded;
pub mod cache;
pub mod command;
pub mod config;
pub mod effects;
pub mod engine;
pub mod error;
pub mod execution;
pub mod fuzzing;
pub mod imports;
pub mod instance;
pub mod limiter;
pub mod logs;
pub mod metrics;
pub mod options;
pub mod owner;
pub mod replay;
pub mod runner;
pub mod service;
pub mod telemetry;
pub mod worker;

pub use error::{HostError, exit};
pub use options::HostOptions;
pub use runner::{Host, RunReport};
