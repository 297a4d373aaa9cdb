//! `stephost-effects`: the handlers behind a step's effects and model calls,
//! with no engine in them. Each capability owns its section of
//! `stephost.toml`: it parses and checks it, builds its handlers, and names
//! its own errors; the host composes the sections ([`config::build`]) and
//! knows none of their fields. What the effects need from the host (its
//! log, its randomness) comes through one small trait, [`Host`].
//!
//! The modules, each using only the ones above it in this list:
//!
//! | layer | modules |
//! |---|---|
//! | leaves | `services` (the [`Host`] trait, what a live call uses), `retry` (backoff), `section` (secrets from the environment, class names, JSON pointers) |
//! | a handler | `handler` (the [`Handler`] trait, [`Effect`], requests and answers) |
//! | a call | `call` ([`EffectCall`]: attempts, retries, lookups, reconciliation: the only live I/O) |
//! | capabilities | `builtin` (echo, static, file, reject), `command`, `http`, `origin` (a step's own HTTP client), `llm`, `flow` (a model's admission), `model`, `mcp` |
//! | the set | `granted` ([`Effects`]: what a step may reach) |
//! | the sections | `config` (`stephost.toml`'s effects, origins, MCP servers, models, redactions) |

pub mod builtin;
pub mod call;
pub mod command;
pub mod config;
pub mod flow;
pub mod granted;
pub mod handler;
pub mod http;
pub mod llm;
pub mod mcp;
pub mod model;
pub mod origin;
pub mod retry;
pub mod section;
pub mod services;

pub use call::EffectCall;
pub use granted::Effects;
pub use handler::{
    Effect, Failure, Handler, Lookup, RECEIPT_OPERATION_POINTER, RESPONSE_TOO_LARGE, Reply,
    Request, SPENT, Spend, blocking, check_receipt, payload_sha256,
};
pub use model::ModelEffect;
pub use origin::Granted;
pub use retry::RetryPolicy;
pub use services::{Host, Level, ModelProgress, Services, StreamFn, StreamSink, host, set_host};
