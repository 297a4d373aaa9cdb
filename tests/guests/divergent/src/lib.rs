//! Test guest: the same calls as `multi-write`, except that the second write
//! (0-based write 1, call 6) adds `"divergent": true` to its request. Replaying
//! a `multi-write` run with this module must report call 6 as divergent.

#[path = "../../multi-write/src/writes.rs"]
mod writes;

use serde_json::Value;
use stephost_guest::{Ctx, Error};

fn run(ctx: &mut Ctx, input: writes::Input) -> Result<Value, Error> {
    writes::run(ctx, input, Some(1))
}

stephost_guest::export_step!(run);
