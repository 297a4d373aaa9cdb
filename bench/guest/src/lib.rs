//! Benchmark guest for `stephost-bench`.
//!
//! Input: `{"mode": M, "count": N, "stamps": false, "gate": false,
//! "start_at_ns": null}`. Modes:
//! - `write`: N sequential calls of the effect `noop.write`;
//! - `read`: N sequential calls of the effect `noop.read`;
//! - `observe`: N calls of the recorded clock (`ctx.now_nanos()`);
//! - `none`: no call at all;
//! - `stamp`: one clock call, first thing; its value (the host's wall clock
//!   when the guest began) is returned as `first_ns`;
//! - `resume`: N clock calls, one call of `gate.read`, then one write to
//!   `noop.write` (the bench stops the run while it waits at the gate).
//!
//! With `"gate": true`, the step first calls `gate.read`, which returns when
//! the bench opens the gate: so many runs can be started together. With
//! `"start_at_ns": T` (the host's wall clock, ns), it then sleeps until T
//! (a WASI sleep, starting no process: a worker running several runs at
//! once waits on its runtime's timers, holding no thread; a run on a thread
//! of its own sleeps on it), and returns the clock it read before sleeping
//! as `arrived_ns`: many runs start together without a process each to let
//! them go. With
//! `"stamps": true`, `write`, `read` and `observe` read the recorded clock
//! once before and once after their N calls and return the values as
//! `first_ns` and `last_ns`.
//!
//! Output: `{"calls": N}` (the calls of the mode, not the gate's or the
//! sleep's clock reads), plus `first_ns`/`last_ns` and `arrived_ns` as
//! above.

use serde::Deserialize;
use serde_json::{Value, json};
use stephost_guest::{Ctx, Error};

#[derive(Debug, Deserialize)]
struct Input {
    mode: String,
    #[serde(default)]
    count: u64,
    #[serde(default)]
    stamps: bool,
    #[serde(default)]
    gate: bool,
    #[serde(default)]
    start_at_ns: Option<u64>,
}

fn effects(ctx: &mut Ctx, name: &str, count: u64) -> Result<(), Error> {
    for i in 0..count {
        let _: Value = ctx.effect(name, &json!({ "i": i }))?;
    }
    Ok(())
}

fn observe(ctx: &mut Ctx, count: u64) -> Result<(), Error> {
    let mut sum = 0u64;
    for _ in 0..count {
        sum = sum.wrapping_add(ctx.now_nanos());
    }
    std::hint::black_box(sum);
    Ok(())
}

fn run(ctx: &mut Ctx, input: Input) -> Result<Value, Error> {
    if input.gate {
        effects(ctx, "gate.read", 1)?;
    }
    let arrived_ns = input.start_at_ns.map(|at| {
        let arrived = ctx.now_nanos();
        let mut now = arrived;
        while now < at {
            std::thread::sleep(std::time::Duration::from_nanos(at - now));
            now = ctx.now_nanos();
        }
        arrived
    });
    let mut output = calls(ctx, &input)?;
    if let Some(arrived) = arrived_ns {
        output["arrived_ns"] = json!(arrived);
    }
    Ok(output)
}

/// The calls of `input`'s mode, and what they return.
fn calls(ctx: &mut Ctx, input: &Input) -> Result<Value, Error> {
    let count = input.count;
    let calls: fn(&mut Ctx, u64) -> Result<(), Error> = match input.mode.as_str() {
        "none" => return Ok(json!({ "calls": 0 })),
        "stamp" => return Ok(json!({ "calls": 1, "first_ns": ctx.now_nanos() })),
        "resume" => {
            observe(ctx, count)?;
            effects(ctx, "gate.read", 1)?;
            effects(ctx, "noop.write", 1)?;
            return Ok(json!({ "calls": count + 2 }));
        }
        "write" => |ctx, n| effects(ctx, "noop.write", n),
        "read" => |ctx, n| effects(ctx, "noop.read", n),
        "observe" => observe,
        other => stephost_guest::bail!("unknown mode {other:?}"),
    };
    let first_ns = input.stamps.then(|| ctx.now_nanos());
    calls(ctx, count)?;
    let last_ns = input.stamps.then(|| ctx.now_nanos());
    let mut output = json!({ "calls": count });
    if let (Some(first), Some(last)) = (first_ns, last_ns) {
        output["first_ns"] = json!(first);
        output["last_ns"] = json!(last);
    }
    Ok(output)
}

stephost_guest::export_step!(run);
