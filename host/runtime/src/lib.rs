//! stephost-runtime: the runtime that runs steps as sandboxed WebAssembly
//! components over a ledger (see `stephost-core` for the records, rules and
//! the journal every import call passes through, and `stephost-effects` for
//! the handlers behind the step's effects and model calls).
//!
//! Modules, one per concept, in layers: each uses only the modules of its
//! own layer and of the layers above it in this table (a test,
//! `tests/layers.rs`, holds the crate to it):
//!
//! | layer | modules |
//! |---|---|
//! | leaves | `adapt` (WASI core modules to components), `bindings` (the step world, generated once), `bounded` (bounded caches), `error` (errors, exit codes), `limiter` (a run's memories and tables), `logs` (stderr, text or JSON), `metrics`, `owner` (claim owners), `randomness` (the host's own) |
//! | the host's services | `cache` (compiled components on disk), `effects_host` (what the effects take from this process) |
//! | the step's imports | `imports` (one module per WIT interface, WASI clocks, random and waits) |
//! | WASI commands | `command` |
//! | the engine | `engine` (wasmtime, the linker) |
//! | traces | `telemetry` (OpenTelemetry, exported by OTLP) |
//! | how a host runs steps | `options` |
//! | an execution | `instance` (one execution's store, limits and WASI) |
//! | its journal | `execution` (an execution's journal and its end), `replay` (fixtures and reports) |
//! | a host over a ledger | `runner` (run, resume, replay, upgrade, fork), `schedules` (schedules as an operator changes them and workers fire them) |
//! | its users | `service` (what the CLI and the server share), `retention` (finished runs deleted in the background), `worker` (claims due runs, executes several at once) |
//! | configuration | `config` (`stephost.toml`, composed of the effects' sections), `fuzzing` (what the fuzz targets feed) |

pub mod adapt;
pub mod bindings;
pub mod bounded;
pub mod cache;
pub mod command;
pub mod config;
pub mod effects_host;
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
pub mod randomness;
pub mod replay;
pub mod retention;
pub mod runner;
pub mod schedules;
pub mod service;
pub mod telemetry;
pub mod worker;

pub use error::{HostError, exit};
pub use options::HostOptions;
pub use runner::{Host, RunReport};
