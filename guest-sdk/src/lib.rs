//! Write stephost steps in Rust.
//!
//! A step is a function from a JSON input to a JSON output that reaches the
//! world only through the host: effects (the single gate for side effects),
//! models, a clock, randomness, durable timers, approvals and a log. The host
//! records every one of these calls in its ledger, so a run can be resumed or
//! replayed: on replay the recorded results come back instead of new ones,
//! and no completed effect is performed twice. Write the step as straight-line
//! code; the host takes care of the rest.
//!
//! This crate hides the WebAssembly bindings: a step crate depends on
//! `stephost-guest` (plus `serde` for its own types), is built as a `cdylib`
//! for `wasm32-wasip2`, and exports its run function with [`export_step!`].
//!
//! ```no_run
//! use serde::{Deserialize, Serialize};
//! use stephost_guest::{Ctx, Error, log};
//!
//! #[derive(Deserialize)]
//! struct Input { sku: String }
//!
//! #[derive(Deserialize)]
//! struct Stock { on_hand: i64 }
//!
//! #[derive(Serialize)]
//! struct Output { sku: String, on_hand: i64 }
//!
//! fn run(ctx: &mut Ctx, input: Input) -> Result<Output, Error> {
//!     let stock: Stock = ctx.effect("inventory.read", &serde_json::json!({ "sku": input.sku }))?;
//!     log::info(format_args!("{} on hand: {}", input.sku, stock.on_hand));
//!     Ok(Output { sku: input.sku, on_hand: stock.on_hand })
//! }
//!
//! stephost_guest::export_step!(run);
//! # fn main() {}
//! ```
//!
//! Model calls take a provider-neutral [`ChatRequest`] and give a
//! [`ChatResponse`] ([`Ctx::chat`]); [`Agent`] runs a model with tools in a
//! loop until it answers. The model behind an alias (OpenAI or Anthropic) is
//! chosen in `stephost.toml`, not in the step.
//!
//! Determinism: everything the step observes must come through [`Ctx`] (or be
//! recorded by the host, as WASI clocks and random seeds are). Replay checks
//! that the step makes the same calls with the same requests in the same order
//! and stops with a divergence report otherwise.

mod agent;
mod children;
mod ctx;
mod error;
pub mod log;
mod promises;

pub use agent::{Agent, AgentRun, ToolOutput};
pub use children::{Child, ChildEnd};
pub use ctx::{Ctx, Decision, Verdict};
pub use error::{EffectError, Error};
pub use promises::{Promise, Settled};
/// The provider-neutral chat types ([`ChatRequest`], [`ChatResponse`], ...),
/// from the contract the host reads too, so both sides read the same JSON.
pub use stephost_contract::{
    ChatRequest, ChatResponse, Cost, Message, Part, Role, StopReason, ToolChoice, ToolDef, Usage,
};

/// The generated bindings for the `stephost:step@0.3.0` world. Not part of the API:
/// use [`Ctx`], [`log`] and [`export_step!`] instead.
#[doc(hidden)]
#[allow(unsafe_code)] // generated code: the canonical ABI glue is unsafe by nature
pub mod bindings {
    wit_bindgen::generate!({
        world: "step",
        path: "../wit/0.3.0",
        pub_export_macro: true,
        export_macro_name: "__export_step_world",
        default_bindings_module: "stephost_guest::bindings",
    });
}

/// Exports a function as the step's `run`.
///
/// The function has the shape
/// `fn(&mut Ctx, In) -> Result<Out, E>` where `In: serde::de::DeserializeOwned`,
/// `Out: serde::Serialize` and `E: std::fmt::Display` (usually [`Error`]).
/// The run's JSON input is decoded into `In`; input that does not decode
/// ends the run with the error `invalid input: ...`. `Ok(out)` is encoded as the
/// run's JSON output and `Err(e)` becomes the run's error message.
///
/// Use it once per crate, at module level:
///
/// ```no_run
/// # use stephost_guest::{Ctx, Error};
/// fn double(_ctx: &mut Ctx, n: u64) -> Result<u64, Error> {
///     Ok(n * 2)
/// }
/// stephost_guest::export_step!(double);
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! export_step {
    ($run:expr $(,)?) => {
        #[doc(hidden)]
        struct __StephostStep;

        impl $crate::__private::Guest for __StephostStep {
            fn run(input: ::std::string::String) -> ::core::result::Result<::std::string::String, ::std::string::String> {
                $crate::__private::run_json(&input, $run)
            }
        }

        $crate::bindings::__export_step_world!(__StephostStep with_types_in $crate::bindings);

        // The step's declared name and version (its crate's), in a custom
        // section the host pins runs to next to the module digest.
        #[cfg(target_family = "wasm")]
        const __STEPHOST_STEP_ID: &str =
            ::core::concat!(::core::env!("CARGO_PKG_NAME"), "@", ::core::env!("CARGO_PKG_VERSION"));
        #[cfg(target_family = "wasm")]
        #[used]
        #[allow(unsafe_code)]
        #[unsafe(link_section = "stephost-step")]
        static __STEPHOST_STEP: [u8; __STEPHOST_STEP_ID.len()] =
            $crate::__private::bytes(__STEPHOST_STEP_ID);
    };
}

/// Returns early from a step with an [`Error`] built from a format string,
/// like `anyhow::bail!`.
///
/// ```
/// # fn check(quantity: i64) -> Result<(), stephost_guest::Error> {
/// if quantity <= 0 {
///     stephost_guest::bail!("quantity must be positive, got {quantity}");
/// }
/// # Ok(())
/// # }
/// # assert_eq!(check(0).unwrap_err().to_string(), "quantity must be positive, got 0");
/// ```
#[macro_export]
macro_rules! bail {
    ($($arg:tt)+) => {
        return ::core::result::Result::Err(
            ::core::convert::From::from($crate::Error::msg(::std::format!($($arg)+))),
        )
    };
}

/// Support for [`export_step!`]; not part of the API.
#[doc(hidden)]
pub mod __private {
    use crate::Ctx;
    pub use crate::bindings::Guest;
    use serde::Serialize;
    use serde::de::DeserializeOwned;
    use std::fmt::Display;

    /// `s` as a byte array (for the `stephost-step` custom section).
    pub const fn bytes<const N: usize>(s: &str) -> [u8; N] {
        let from = s.as_bytes();
        let mut out = [0u8; N];
        let mut i = 0;
        while i < N && i < from.len() {
            out[i] = from[i];
            i += 1;
        }
        out
    }

    /// Decodes the input, runs the step and encodes its output.
    pub fn run_json<In, Out, E, F>(input: &str, run: F) -> Result<String, String>
    where
        In: DeserializeOwned,
        Out: Serialize,
        E: Display,
        F: FnOnce(&mut Ctx, In) -> Result<Out, E>,
    {
        let input: In = serde_json::from_str(input).map_err(|e| format!("invalid input: {e}"))?;
        let output = run(&mut Ctx::new(), input).map_err(|e| e.to_string())?;
        serde_json::to_string(&output).map_err(|e| format!("invalid output: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::__private::run_json;
    use super::{Ctx, EffectError, Error};

    fn double(_ctx: &mut Ctx, n: u64) -> Result<u64, Error> {
        if n == 0 {
            bail!("zero is not allowed");
        }
        Ok(n * 2)
    }

    #[test]
    fn run_json_decodes_runs_and_encodes() {
        assert_eq!(run_json("21", double), Ok("42".to_owned()));
    }

    #[test]
    fn bad_input_is_the_steps_error() {
        let err = run_json("\"twenty\"", double).unwrap_err();
        assert!(err.starts_with("invalid input: "), "{err}");
    }

    #[test]
    fn step_error_is_its_message() {
        assert_eq!(run_json("0", double), Err("zero is not allowed".to_owned()));
    }

    #[test]
    fn effect_error_converts_with_its_effect_name() {
        let e = EffectError::Rejected {
            effect: "supplier.order".to_owned(),
            message: "out of stock".to_owned(),
        };
        assert_eq!(e.effect(), "supplier.order");
        assert_eq!(e.message(), "out of stock");
        assert_eq!(
            Error::from(e).to_string(),
            "effect `supplier.order` rejected the request: out of stock"
        );
    }
}
