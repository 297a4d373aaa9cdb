"""Example step in Python: orders missing stock from a supplier.

The same step as the Rust example `examples/supplier-order`: the same calls in
the same order with the same requests, the same log lines, errors and output.

Input `{"sku": "WIDGET-7", "quantity": 10}` (optionally
`"approval_ttl_seconds": 3600`). The step reads the stock of `sku` through the
`inventory.read` effect, and when `quantity` is more than what is on hand it
orders the shortage through the `supplier.order` effect with the business key
`order:{sku}:{quantity}`.

Output `{"sku", "on_hand", "shortage", "ordered", "receipt"}` where `receipt`
is the supplier's response (or `null` when nothing was ordered).
"""

import json

import stephost_step
from stephost_step import Ctx, DecodeError, InputError, StepError, log

_I64 = (-(2**63), 2**63 - 1)
_U64 = (0, 2**64 - 1)


def _integer(value, name, bounds, what):
    # JSON true/false decode to bool, a subclass of int: not a number here.
    if not isinstance(value, int) or isinstance(value, bool) or not bounds[0] <= value <= bounds[1]:
        raise InputError(f"`{name}` must be {what}, got {json.dumps(value)}")
    return value


def _parse_input(input):
    """The input's fields, checked as the Rust step's serde types check them
    (unknown fields are ignored)."""
    if not isinstance(input, dict):
        raise InputError(f"expected an object with `sku` and `quantity`, got {json.dumps(input)}")
    for field in ("sku", "quantity"):
        if field not in input:
            raise InputError(f"missing field `{field}`")
    sku = input["sku"]
    if not isinstance(sku, str):
        raise InputError(f"`sku` must be a string, got {json.dumps(sku)}")
    quantity = _integer(input["quantity"], "quantity", _I64, "an integer")
    ttl = input.get("approval_ttl_seconds")
    if ttl is not None:
        ttl = _integer(ttl, "approval_ttl_seconds", _U64, "a non-negative integer")
    return sku, quantity, ttl


def _read_stock(ctx: Ctx, sku: str) -> int:
    """`on_hand` from the `inventory.read` response (other fields are ignored)."""
    stock = ctx.effect("inventory.read", {"sku": sku})
    on_hand = stock.get("on_hand") if isinstance(stock, dict) else None
    if not isinstance(on_hand, int) or isinstance(on_hand, bool):
        raise DecodeError("inventory.read", f"no integer `on_hand` in {json.dumps(stock)}")
    return on_hand


def run(ctx: Ctx, input) -> dict:
    sku, quantity, approval_ttl_seconds = _parse_input(input)
    if not sku:
        raise StepError("sku must not be empty")
    if quantity < 0:
        raise StepError(f"quantity must not be negative, got {quantity}")

    on_hand = _read_stock(ctx, sku)
    if approval_ttl_seconds is not None and quantity > on_hand:
        decision = ctx.approval(
            f"order {quantity - on_hand} of {sku}",
            # Keys in the order the Rust step's `json!` object writes them
            # (sorted), so the approved document is byte-identical.
            {"on_hand": on_hand, "quantity": quantity, "sku": sku},
            approval_ttl_seconds,
        )
        if not decision.approved:
            raise StepError(
                f"the order was not approved ({decision.verdict.name.capitalize()} "
                f"by {json.dumps(decision.by, ensure_ascii=False)})"
            )
        # Re-check the precondition now, not when the approval was asked.
        on_hand = _read_stock(ctx, sku)

    shortage = quantity - on_hand
    log.info(f"{sku}: {quantity} wanted, {on_hand} on hand")

    ordered = shortage > 0
    receipt = None
    if ordered:
        # Time and randomness come from the host (recorded), clock first.
        requested_at_ms = ctx.now_ns() // 1_000_000
        request = {
            "sku": sku,
            "quantity": shortage,
            "requested_at_ms": requested_at_ms,
            "request_nonce": ctx.random_bytes(8).hex(),
        }
        key = f"order:{sku}:{quantity}"
        log.info(f"ordering {shortage} of {sku} (key {key})")
        receipt = ctx.effect("supplier.order", request, key=key)
        # Sorted keys: the text the Rust step logs (serde_json's Value).
        log.info(f"supplier accepted the order: {stephost_step.to_json(receipt, sort_keys=True)}")
    else:
        log.info("enough stock, nothing to order")

    return {
        "sku": sku,
        "on_hand": on_hand,
        "shortage": max(shortage, 0),
        "ordered": ordered,
        "receipt": receipt,
    }


WitWorld = stephost_step.export_step(run)
