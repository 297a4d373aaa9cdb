//! The one `bindgen!` of the step world; everything else imports from here.
//!
//! Every import is trappable: a failed ledger write, a divergence or a fenced
//! writer traps the guest instead of handing it a result that was never
//! recorded.

#![allow(clippy::all)]

wasmtime::component::bindgen!({
    world: "step",
    path: "../../wit",
    imports: { default: trappable },
});

pub use self::stephost::step::types::CallError;
