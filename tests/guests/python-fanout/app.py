"""Test guest in Python, the Rust `fanout` guest's twin: starts `n` children
of step `square` in join set `squares` (`{"n": i, "fail": ...}`), joins
them all in the order they end, calls one more (`{"n": 100}`) and looks
once in the empty set. Returns `{"started", "joined": [{"run_id", "ok",
"value"}], "called", "left"}`."""

import stephost_step
from stephost_step import Ctx


def run(ctx: Ctx, input: dict) -> dict:
    n = int(input.get("n", 0))
    fail = set(input.get("fail", []))
    started = [
        ctx.start("squares", "square", {"n": i, "fail": i in fail, "sleep_ms": 0})
        for i in range(n)
    ]
    joined = []
    for _ in range(n):
        end = ctx.join_next("squares")
        joined.append({"run_id": end.run_id, "ok": end.ok, "value": end.value() if end.ok else end.output})
    called = ctx.call_step("square", {"n": 100}).value()
    left = ctx.join_try_next("squares")
    return {"started": started, "joined": joined, "called": called, "left": left and left.run_id}


WitWorld = stephost_step.export_step(run)
