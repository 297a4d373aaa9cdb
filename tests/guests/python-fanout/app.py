"""Test guest in Python, the Rust `fanout` guest's twin: starts `n` children
of step `square` in join set `squares` (`{"n": i, "fail": ...}`), joins
them all in the order they end, calls one more (`{"n": 100}`) and looks
once in the empty set (`"cancel": [i, ...]` cancels those children once
all are started). Returns `{"started", "joined": [{"run_id", "ok",
"value"}], "called", "left"}`. With `"promise": TTL` it makes a promise
instead, hands its token to `orders`, waits and returns `{"promise": ID,
"settled": {"resolved": VALUE} | {"rejected": MESSAGE} | "expired"}`, as
the Rust `promise-step` guest does."""

import stephost_step
from stephost_step import Ctx


def run(ctx: Ctx, input: dict) -> dict:
    if "promise" in input:
        return promised(ctx, int(input["promise"]))
    n = int(input.get("n", 0))
    fail = set(input.get("fail", []))
    started = [
        ctx.start("squares", "square", {"n": i, "fail": i in fail, "sleep_ms": 0})
        for i in range(n)
    ]
    for i in input.get("cancel", []):
        ctx.cancel_child(started[i])
    joined = []
    for _ in range(n):
        end = ctx.join_next("squares")
        joined.append({"run_id": end.run_id, "ok": end.ok, "value": end.value() if end.ok else end.output})
    called = ctx.call_step("square", {"n": 100}).value()
    left = ctx.join_try_next("squares")
    return {"started": started, "joined": joined, "called": called, "left": left and left.run_id}


def promised(ctx: Ctx, ttl_seconds: int) -> dict:
    p = ctx.promise("payment", ttl_seconds)
    ctx.effect("orders", {"promise": p.id, "token": p.token})
    settled = ctx.wait_promise(p)
    if settled.state == "resolved":
        return {"promise": p.id, "settled": {"resolved": settled.json()}}
    if settled.state == "rejected":
        return {"promise": p.id, "settled": {"rejected": settled.value}}
    return {"promise": p.id, "settled": "expired"}


WitWorld = stephost_step.export_step(run)
