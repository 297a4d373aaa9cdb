//! The one `bindgen!` of the step world; everything else imports from here.
//!
//! Every import is trappable: a failed ledger write, a divergence or a fenced
//! writer traps the guest instead of handing it a result that was never
//! recorded.

#![allow(clippy::all)]

/// The step worlds this build runs: 0.1.0 (runs pinned to it keep running
/// and replaying), 0.2.0 (0.1.0 and model calls) and 0.3.0 (0.2.0 and
/// child runs).
pub const WORLD_0_1: &str = "stephost:step/step@0.1.0";
pub const WORLD_0_2: &str = "stephost:step/step@0.2.0";
pub const WORLD_0_3: &str = "stephost:step/step@0.3.0";

/// What `stephost` says a step must look like: the newest step world.
pub const WORLD: &str = WORLD_0_3;

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

/// The `stephost:step@0.3.0` world: the 0.2.0 interfaces under their 0.3.0
/// names (served by the same code, [`crate::imports::v0_3`]) and `runs`.
pub mod v0_3 {
    wasmtime::component::bindgen!({
        world: "step",
        path: "../../wit/0.3.0",
        imports: { default: trappable },
    });

    pub use self::stephost::step::types::CallError;
}
