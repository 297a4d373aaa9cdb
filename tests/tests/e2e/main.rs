//! stephost end to end, in one test binary with a module per topic: guests
//! built from source, the real binary as a child process (with crash
//! points), real ledger files, real receivers on 127.0.0.1 and real
//! signals.

mod bad_input;
mod children;
mod crash_resume;
mod embedding;
mod forks;
mod golden;
mod http_effects;
mod languages;
mod mcp;
mod models;
mod promises;
mod redaction;
mod run_replay;
mod schedules;
mod server;
mod sim;
mod suspension;
mod tamper;
mod traces;
mod unknown_outcome;
mod versioning;
mod wasi_http;
mod workers;
