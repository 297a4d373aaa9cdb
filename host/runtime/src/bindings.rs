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

/// The `stephost:step@0.2.0` world: the 0.1.0 interfaces under their 0.2.0
/// names (served by the same code, [`crate::imports::v0_2`]) and `models`.
pub mod v0_2 {
    wasmtime::component::bindgen!({
        world: "step",
        path: "../../wit/0.2.0",
        imports: { default: trappable },
    });

    pub use self::stephost::step::types::CallError;
}
