//! Test guest: starts `n` children of step `square` in join set `squares`
//! (`{"n": i}` each, failing where `fail` lists `i`, sleeping `sleep_ms[i]`
//! durably first), joins them all in the order they end, then calls one
//! more (`{"n": 100}`) and looks once in the empty set. Returns
//! `{"started": [ids], "joined": [{"run_id", "ok", "value"}], "called": v,
//! "left": null}`. With `"keyed": true` each child has the business key
//! `sq-i`; with `"step"` another step name is started; with `"detach":
//! true` the children go on if the parent ends first; with `"join": false`
//! the parent returns `{"started": [ids]}` without joining them; with
//! `"child_input"` every child (the called one too) gets it as its input;
//! `"cancel": [i, …]` cancels those children once all are started.

use serde_json::{Value, json};
use stephost_guest::{Child, Ctx, Error};

fn run(ctx: &mut Ctx, input: Value) -> Result<Value, Error> {
    let n = input["n"].as_u64().unwrap_or(0);
    let step = input["step"].as_str().unwrap_or("square");
    let fail: Vec<u64> = input["fail"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    let given = input.get("child_input");
    let mut started = Vec::new();
    for i in 0..n {
        let sleep_ms = input["sleep_ms"][i as usize].as_u64().unwrap_or(0);
        let mut child = Child::new(
            step,
            given.unwrap_or(&json!({ "n": i, "fail": fail.contains(&i), "sleep_ms": sleep_ms })),
        )?;
        if input["keyed"].as_bool() == Some(true) {
            child = child.key(&format!("sq-{i}"));
        }
        if input["detach"].as_bool() == Some(true) {
            child = child.detach();
        }
        started.push(ctx.start("squares", &child)?);
    }
    for i in input["cancel"].as_array().into_iter().flatten() {
        ctx.cancel_child(&started[i.as_u64().unwrap_or(0) as usize])?;
    }
    if input["join"].as_bool() == Some(false) {
        return Ok(json!({ "started": started }));
    }
    let mut joined = Vec::new();
    for _ in 0..n {
        let end = ctx.join_next("squares")?;
        joined.push(match &end.result {
            Ok(_) => json!({ "run_id": end.run_id, "ok": true, "value": end.output::<Value>()? }),
            Err(e) => json!({
                "run_id": end.run_id,
                "ok": false,
                "value": e,
                "cancelled": end.cancelled,
            }),
        });
    }
    let called = ctx.call_step(&Child::new(step, given.unwrap_or(&json!({ "n": 100 })))?)?;
    let left = ctx.join_try_next("squares")?;
    Ok(json!({
        "started": started,
        "joined": joined,
        "called": called.output::<Value>()?,
        "left": left.map(|e| e.run_id),
    }))
}

stephost_guest::export_step!(run);
