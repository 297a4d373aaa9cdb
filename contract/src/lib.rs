//! `stephost-contract`: what a step and its host agree on beyond the WIT
//! interfaces (`wit/`), which carry JSON as strings: the neutral shapes that
//! JSON takes. Both sides depend on this crate; it depends on neither (a
//! step compiles none of the host's code, and the host's provider
//! translation stays in `host/models`).
//!
//! - [`chat`]: a model chat's request and answer (`stephost:step/models`),
//!   their parts and tool calls, usage and cost.

pub mod chat;
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;

pub use chat::{
    Charged, ChatRequest, ChatResponse, Cost, Message, Part, Role, StopReason, ToolChoice, ToolDef,
    Usage, validate,
};
