"""Example step in Python: a support agent that refunds orders
(stephost:step@0.2.0).

The Rust example `examples/agent-refund` written in Python with
`guest-sdk/python`: the same input, tools, effects, requests and output.

Input `{"message": "customer text mentioning order A-1001 ...",
"approval_above_cents": 10000, "approval_ttl_seconds": 86400}` (the last two
optional). A model (the alias `support` in `stephost.toml`) reads the message
and calls two tools until it answers:

- `lookup_order {"order_id"}`: the `orders.lookup` effect, a read;
- `refund {"order_id", "amount_cents", "reason"?}`: checked against the order
  (looked up again), approved by a person when above `approval_above_cents`
  (and the order looked up again after the approval), then sent through the
  `payments.refund` effect, a write with the business key `refund:{order_id}`:
  however often the run is resumed, the payment service sees one operation id
  for the refund of that order.

An unknown order, a refund that is too large or not approved, and a refusal
of the payment service go back to the model as failed tool calls (it
explains them); the run fails only on the host's other errors (a model call
over the run's budget, an effect not granted, ...).

Output `{"summary", "refunded_cents", "refunds", "turns", "tokens",
"cost_micro_usd"}`: the model's final answer, what was refunded (with the
receipts), and what the model calls took.

Every model turn, lookup, approval and refund is recorded: a run that crashes
anywhere in the loop resumes without asking the model again for an answer it
already has and without refunding twice.
"""

import json

import stephost_step
from stephost_step import (
    Ctx,
    DecodeError,
    InputError,
    RejectedError,
    StepError,
    ToolError,
    log,
    tool_def,
    user_message,
)

#: The model alias in stephost.toml (`[models.support]`).
MODEL = "support"
MAX_TURNS = 8

SYSTEM = (
    "You are the refund desk of an online shop. Read the customer's message, "
    "look the order up with `lookup_order`, and refund it with `refund` when the customer asks for "
    "a refund: amounts are in cents and never more than what is left to refund on the order "
    "(`amount_cents - refunded_cents`). If a tool reports an error, do not retry it blindly: explain "
    "it. End with a short summary for the customer."
)

TOOLS = [
    tool_def(
        "lookup_order",
        "Look a customer order up by its id: its amount and what was refunded already, in cents.",
        {
            "type": "object",
            "properties": {
                "order_id": {"type": "string", "description": "The order id, like A-1001"}
            },
            "required": ["order_id"],
            "additionalProperties": False,
        },
    ),
    tool_def(
        "refund",
        "Refund part or all of a customer order to the customer's payment method. Large "
        "refunds wait for a person's approval.",
        {
            "type": "object",
            "properties": {
                "order_id": {"type": "string"},
                "amount_cents": {"type": "integer", "minimum": 1},
                "reason": {"type": "string", "description": "Why, in a few words"},
            },
            "required": ["order_id", "amount_cents"],
            "additionalProperties": False,
        },
    ),
]

_I64 = (-(2**63), 2**63 - 1)
_U64 = (0, 2**64 - 1)


def _is_int(value, bounds=_I64):
    # JSON true/false decode to bool, a subclass of int: not a number here.
    return isinstance(value, int) and not isinstance(value, bool) and bounds[0] <= value <= bounds[1]


def _parse_input(input):
    """The input's fields, checked as the Rust step's serde types check them
    (unknown fields are refused)."""
    if not isinstance(input, dict):
        raise InputError(f"expected an object with `message`, got {json.dumps(input)}")
    unknown = sorted(set(input) - {"message", "approval_above_cents", "approval_ttl_seconds"})
    if unknown:
        raise InputError(f"unknown field `{unknown[0]}`")
    if "message" not in input:
        raise InputError("missing field `message`")
    message = input["message"]
    if not isinstance(message, str):
        raise InputError(f"`message` must be a string, got {json.dumps(message)}")
    above = input.get("approval_above_cents", 10_000)
    if not _is_int(above):
        raise InputError(f"`approval_above_cents` must be an integer, got {json.dumps(above)}")
    ttl = input.get("approval_ttl_seconds", 24 * 60 * 60)
    if not _is_int(ttl, _U64):
        raise InputError(f"`approval_ttl_seconds` must be a non-negative integer, got {json.dumps(ttl)}")
    return message, above, ttl


def dollars(cents: int) -> str:
    """`$12.34`."""
    sign = "-" if cents < 0 else ""
    cents = abs(cents)
    return f"{sign}${cents // 100}.{cents % 100:02}"


class Desk:
    """The tools, and what they have done in this run."""

    def __init__(self, ctx: Ctx, message: str, approval_above_cents: int, approval_ttl_seconds: int):
        self.ctx = ctx
        self.message = message
        self.approval_above_cents = approval_above_cents
        self.approval_ttl_seconds = approval_ttl_seconds
        self.refunds = []
        self.refunded_cents = 0
        self.tools = {"lookup_order": self.lookup_order, "refund": self.refund}

    def _fetch(self, order_id: str):
        """The order from `orders.lookup`; a refusal (no such order) is a
        `ToolError` for the model, any other failure ends the run."""
        try:
            return self.ctx.effect("orders.lookup", {"order_id": order_id})
        except RejectedError as e:
            raise ToolError(f"order {order_id} was not found: {e.message}") from None

    def lookup_order(self, args):
        log.info(f"tool lookup_order {stephost_step.to_json(args)}")
        order_id = args.get("order_id") if isinstance(args, dict) else None
        if not isinstance(order_id, str):
            raise ToolError("bad arguments: `order_id` must be a string")
        return self._fetch(order_id)

    def _refundable(self, order_id: str, amount_cents: int) -> dict:
        """The order, when `amount_cents` may be refunded from it; otherwise
        a `ToolError` saying why not."""
        if amount_cents <= 0:
            raise ToolError(f"amount_cents must be positive, got {amount_cents}")
        order = self._fetch(order_id)
        if not (
            isinstance(order, dict)
            and isinstance(order.get("order_id"), str)
            and _is_int(order.get("amount_cents"))
            and _is_int(order.get("refunded_cents", 0))
        ):
            # Not an order: the run fails (as the Rust step's decode does).
            raise DecodeError("orders.lookup", f"not an order: {json.dumps(order)}")
        paid, refunded = order["amount_cents"], order.get("refunded_cents", 0)
        left = paid - refunded
        if amount_cents > left:
            raise ToolError(
                f"order {order['order_id']} has {dollars(left)} left to refund ({dollars(paid)} paid, "
                f"{dollars(refunded)} refunded); {dollars(amount_cents)} is too much"
            )
        return order

    def refund(self, args):
        log.info(f"tool refund {stephost_step.to_json(args)}")
        if not isinstance(args, dict):
            raise ToolError("bad arguments: expected an object")
        order_id, amount_cents, reason = args.get("order_id"), args.get("amount_cents"), args.get("reason")
        if not isinstance(order_id, str):
            raise ToolError("bad arguments: `order_id` must be a string")
        if not _is_int(amount_cents):
            raise ToolError("bad arguments: `amount_cents` must be an integer")
        if reason is not None and not isinstance(reason, str):
            raise ToolError("bad arguments: `reason` must be a string")
        reason = reason if reason is not None else "customer request"

        order = self._refundable(order_id, amount_cents)
        if amount_cents > self.approval_above_cents:
            subject = f"refund {dollars(amount_cents)} of order {order['order_id']}"
            log.info(f"asking for approval: {subject}")
            # Sorted keys: the bytes the Rust step's `json!` object gives,
            # so the same details_sha256.
            details = {
                "amount_cents": amount_cents,
                "customer_message": self.message,
                "order_amount_cents": order["amount_cents"],
                "order_id": order["order_id"],
                "reason": reason,
                "refunded_cents": order.get("refunded_cents", 0),
            }
            decision = self.ctx.approval(subject, details, self.approval_ttl_seconds)
            if not decision.approved:
                who = f" by {decision.by}" if decision.by else ""
                raise ToolError(
                    f"the refund was not approved ({decision.verdict.name.capitalize()}{who}); "
                    "do not refund, tell the customer a person will follow up"
                )
            # An approval is not a licence forever: check the order again now.
            self._refundable(order_id, amount_cents)

        key = f"refund:{order['order_id']}"
        request = {"order_id": order["order_id"], "amount_cents": amount_cents, "reason": reason}
        log.info(f"refunding {dollars(amount_cents)} of order {order['order_id']} (key {key})")
        try:
            receipt = self.ctx.effect("payments.refund", request, key=key)
        except RejectedError as e:  # the payment service said no: the model explains it
            raise ToolError(f"the payment service refused the refund: {e.message}") from None
        self.refunded_cents += amount_cents
        self.refunds.append(receipt)
        return receipt


def run(ctx: Ctx, input) -> dict:
    message, approval_above_cents, approval_ttl_seconds = _parse_input(input)
    if not message.strip():
        raise StepError("message must not be empty")
    if approval_above_cents < 0:
        raise StepError("approval_above_cents must not be negative")

    desk = Desk(ctx, message, approval_above_cents, approval_ttl_seconds)
    done = ctx.run_agent_full(
        MODEL,
        {"system": SYSTEM, "messages": [user_message(message)], "tools": TOOLS},
        desk.tools,
        max_turns=MAX_TURNS,
    )
    tokens = done.usage["input"] + done.usage["output"]
    log.info(
        f"answered after {done.turns} turns, {done.tool_calls} tool calls, {tokens} tokens, "
        f"{done.cost_micro_usd} micro-USD"
    )
    return {
        "summary": done.text,
        "refunded_cents": desk.refunded_cents,
        "refunds": desk.refunds,
        "turns": done.turns,
        "tokens": tokens,
        "cost_micro_usd": done.cost_micro_usd,
    }


WitWorld = stephost_step.export_step(run)
