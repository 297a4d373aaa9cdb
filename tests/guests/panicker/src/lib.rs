//! Test guest: panics. On wasm32-wasip2 a panic prints its message to stderr
//! and aborts, which traps the component.

use serde_json::Value;
use stephost_guest::{Ctx, Error};

fn run(_ctx: &mut Ctx, _input: Value) -> Result<Value, Error> {
    panic!("step panicked on purpose");
}

stephost_guest::export_step!(run);
