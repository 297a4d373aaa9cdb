//! Test guest: reads the clock once, then spins forever. The host must stop
//! it (fuel or epoch deadline) and record the run as timed out.

use serde_json::Value;
use stephost_guest::{Ctx, Error};

fn run(ctx: &mut Ctx, _input: Value) -> Result<Value, Error> {
    let mut x = ctx.now_nanos();
    loop {
        x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1));
    }
}

stephost_guest::export_step!(run);
