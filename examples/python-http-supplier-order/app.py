"""Example step in Python: the supplier order over the step's own HTTP
client (`stephost_http`, `wasi:http`), like the Rust example
`examples/http-supplier-order`.

Input `{"sku": "WIDGET-7", "quantity": 10, "supplier":
"http://127.0.0.1:8080"}`. The step reads the stock with
`GET /inventory/{sku}` and orders the shortage with `POST /orders`; the host
journals both (the POST as a write with its Idempotency-Key).

Output `{"sku", "on_hand", "shortage", "ordered", "receipt"}`.
"""

import stephost_http
import stephost_step
from stephost_step import Ctx, StepError, log


def run(ctx: Ctx, input: dict) -> dict:
    sku = input.get("sku")
    quantity = input.get("quantity")
    if not isinstance(sku, str) or not sku:
        raise StepError("sku must not be empty")
    if not isinstance(quantity, int) or isinstance(quantity, bool):
        raise StepError("`quantity` must be an integer")
    supplier = input.get("supplier", "http://127.0.0.1:8080")

    stock = stephost_http.get(f"{supplier}/inventory/{sku}")
    if not stock.ok:
        raise StepError(f"GET /inventory/{sku} answered {stock.status}")
    on_hand = stock.json()["on_hand"]
    shortage = quantity - on_hand
    log.info(f"{sku}: {quantity} wanted, {on_hand} on hand")

    receipt = None
    if shortage > 0:
        placed = stephost_http.post_json(f"{supplier}/orders", {"sku": sku, "quantity": shortage})
        if not placed.ok:
            raise StepError(f"POST /orders answered {placed.status}: {placed.text()}")
        receipt = placed.json()
        log.info(f"the supplier accepted the order: {stephost_step.to_json(receipt, sort_keys=True)}")
    return {
        "sku": sku,
        "on_hand": on_hand,
        "shortage": max(shortage, 0),
        "ordered": receipt is not None,
        "receipt": receipt,
    }


WitWorld = stephost_step.export_step(run)
