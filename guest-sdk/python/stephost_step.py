"""Write stephost steps in Python (built with componentize-py).

A step is a function from a JSON input to a JSON output that reaches the
world only through the host: effects, a model, a clock, randomness, timers,
approvals and a log. The host records each of these calls in its ledger, so a
run can be resumed or replayed; the step must therefore take time and
randomness only through `Ctx` (never `time`, `random`, `os.urandom`, ...) and
make the same calls, with the same requests, in the same order.

    import stephost_step
    from stephost_step import Ctx, StepError, log

    def run(ctx: Ctx, input: dict) -> dict:
        if not input.get("sku"):
            raise StepError("sku must not be empty")
        stock = ctx.effect("inventory.read", {"sku": input["sku"]})
        log.info(f"{input['sku']} on hand: {stock['on_hand']}")
        return {"sku": input["sku"], "on_hand": stock["on_hand"]}

    WitWorld = stephost_step.export_step(run)

`componentize-py` looks for the class `WitWorld` in the app module: bind the
result of `export_step` to that name.

This module wraps the bindings that `componentize-py` generates for the
`stephost:step` world (the `wit_world` package); it is not usable outside a
component. It serves every world version: built against `wit/`
(stephost:step@0.1.0), `wit/0.2.0` (stephost:step@0.2.0, which adds the
`models` interface: `chat`, `run_agent` and the `BudgetError` kind) or
`wit/0.3.0` (stephost:step@0.3.0, which adds child runs: `Ctx.start`,
`Ctx.join_next`, `Ctx.join_try_next`, `Ctx.call_step`).
"""

import json
import os as _os
import random as _py_random
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from enum import Enum
from typing import Any, Callable, Optional

from componentize_py_types import Err
from wit_world import WitWorld as _WitWorld
from wit_world.imports import approvals as _approvals
from wit_world.imports import clock as _clock
from wit_world.imports import effects as _effects
from wit_world.imports import llm as _llm
from wit_world.imports import log as _log
from wit_world.imports import random as _random
from wit_world.imports import timers as _timers
try:
    from wit_world.imports import types as _types
except ImportError:
    # A world that also imports wasi:http (stephost_http) has two `types`.
    from wit_world.imports import stephost_step_types as _types

try:  # stephost:step@0.2.0 only; absent from a 0.1.0 build
    from wit_world.imports import models as _models
except ImportError:
    _models = None

try:  # stephost:step@0.3.0 only: child runs
    from wit_world.imports import runs as _runs
except ImportError:
    _runs = None

try:  # stephost:step@0.3.0 only: promises
    from wit_world.imports import promises as _promises
except ImportError:
    _promises = None

__all__ = [
    "Promise",
    "Settled",
    "AgentRun",
    "BudgetError",
    "ChildEnd",
    "ChildError",
    "Ctx",
    "Decision",
    "DecodeError",
    "DeniedError",
    "EffectError",
    "EncodeError",
    "ExhaustedError",
    "InputError",
    "InvalidError",
    "MaxTurnsError",
    "RejectedError",
    "StepError",
    "ToolError",
    "Verdict",
    "chat",
    "export_step",
    "log",
    "response_text",
    "run_agent",
    "run_agent_full",
    "to_json",
    "tool_calls",
    "tool_def",
    "user_message",
]

_U64_MAX = 2**64 - 1


def _small_reseed() -> None:
    """Makes `random.seed()` without an argument take 16 bytes of WASI
    randomness instead of CPython's 2,496.

    componentize-py calls `random.seed()` once before the first export call,
    so that Python's PRNG does not keep the state baked in at build time. The
    host records every WASI random read (a replay gets the same bytes back),
    so the default reseed would put 2,496 random bytes (5 KB of hex) in the
    ledger of every run before the step's first call. 128 bits are plenty
    for a PRNG that a step must not use anyway (take randomness from
    `Ctx.random_bytes`); `random.seed(x)` with an argument is unchanged.
    """
    original = _py_random.seed

    def seed(a: Any = None, version: int = 2) -> None:
        if a is None:
            a = int.from_bytes(_os.urandom(16), "little")
        original(a, version)

    seed.__doc__ = original.__doc__
    _py_random.seed = seed


_small_reseed()


def to_json(value: Any, **kwargs: Any) -> str:
    """`value` as compact JSON (no spaces, UTF-8 kept as is), the form the
    Rust SDK's serde_json writes. Extra keyword arguments go to `json.dumps`."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False, **kwargs)


# --- errors ------------------------------------------------------------------


class StepError(Exception):
    """A step's error: its message ends the run as the run's error.

    Raise it for a business failure (`raise StepError("sku must not be empty")`).
    """

    @property
    def message(self) -> str:
        return str(self)


class InputError(StepError):
    """The input is not what the step accepts; the run's error is
    `invalid input: <message>` (as for input that is not JSON)."""


class EffectError(StepError):
    """An import call that gave no response the step can use.

    `effect` names the effect (`"llm"`, `"approvals"` for those imports) and
    `message` is the host's or decoder's message. The first four subclasses
    are the host's `call-error` kinds (it has already retried what was
    retryable); `EncodeError` and `DecodeError` are raised in the step.
    """

    #: How the error reads after the effect's name (as in the Rust SDK).
    what = "failed"

    def __init__(self, effect: str, message: str):
        super().__init__(effect, message)
        self.effect = effect
        self._message = message

    @property
    def message(self) -> str:
        return self._message

    def __str__(self) -> str:
        return f"effect `{self.effect}` {self.what}: {self._message}"


class RejectedError(EffectError):
    """The receiver refused the request; retrying the same request will not help."""

    what = "rejected the request"


class DeniedError(EffectError):
    """The effect is not granted to this step by the host configuration."""

    what = "is denied"


class ExhaustedError(EffectError):
    """The effect failed in a retryable way and the host's retry policy is used up."""

    what = "failed and its retries are used up"


class InvalidError(EffectError):
    """The host found the request malformed: not JSON, too large, or not what
    the effect accepts."""

    what = "got an invalid request"


class BudgetError(EffectError):
    """The model call was not sent: it would take the run past its budget
    (model tokens or cost, `[limits]` in stephost.toml). Nothing was spent.
    stephost:step@0.2.0 only."""

    what = "is over the run's budget"


class EncodeError(EffectError):
    """The request could not be encoded as JSON; it was not sent."""

    what = "request could not be encoded as JSON"


class DecodeError(EffectError):
    """The effect answered, but its response is not the JSON the step expects.
    The call is recorded as answered: replay gives the same response.
    Raise it yourself when a response lacks a field the step needs."""

    what = "response did not decode"


_CALL_ERRORS = (
    (_types.CallError_Rejected, RejectedError),
    (_types.CallError_Denied, DeniedError),
    (_types.CallError_Exhausted, ExhaustedError),
    (_types.CallError_Invalid, InvalidError),
    # `budget` is a 0.2.0 kind: None (never matched) in a 0.1.0 build.
    (getattr(_types, "CallError_Budget", None), BudgetError),
)


def _call_error(effect: str, err: Err) -> EffectError:
    for wit_type, error_type in _CALL_ERRORS:
        if wit_type is not None and isinstance(err.value, wit_type):
            return error_type(effect, err.value.value)
    return EffectError(effect, repr(err.value))


# --- approvals ---------------------------------------------------------------


class Verdict(str, Enum):
    """What a person decided about an approval."""

    APPROVED = "approved"
    REJECTED = "rejected"
    #: Nobody decided before the approval's time to live ran out.
    EXPIRED = "expired"


_VERDICTS = {
    _approvals.Verdict.APPROVED: Verdict.APPROVED,
    _approvals.Verdict.REJECTED: Verdict.REJECTED,
    _approvals.Verdict.EXPIRED: Verdict.EXPIRED,
}


@dataclass(frozen=True)
class Decision:
    """A decision on an approval: the verdict, who (empty when expired), an
    optional note, and when (milliseconds since the Unix epoch)."""

    verdict: Verdict
    by: str
    note: Optional[str]
    at_ms: int

    @property
    def approved(self) -> bool:
        return self.verdict is Verdict.APPROVED

    @property
    def at(self) -> datetime:
        return datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(milliseconds=self.at_ms)


# --- child runs (stephost:step@0.3.0) ----------------------------------------


class ChildError(StepError):
    """A child run that failed or was cancelled, read as a value."""

    def __init__(self, end: "ChildEnd"):
        super().__init__(f"child run {end.run_id} {end.status}: {end.output}")
        self.end = end


@dataclass(frozen=True)
class ChildEnd:
    """A child run's end, as its parent joins it: `status` is `completed`
    (`output` is its JSON), `failed` (`output` is its error) or `cancelled`
    (`output` says by whom and why)."""

    run_id: str
    status: str
    output: str

    @property
    def ok(self) -> bool:
        return self.status == "completed"

    def value(self) -> Any:
        """The child's output, decoded; raises `ChildError` if it did not
        complete."""
        if not self.ok:
            raise ChildError(self)
        return _decode(f"child {self.run_id}", self.output)


_CHILD_STATUSES = {}
if _runs is not None:
    _CHILD_STATUSES = {
        _runs.ChildStatus.COMPLETED: "completed",
        _runs.ChildStatus.FAILED: "failed",
        _runs.ChildStatus.CANCELLED: "cancelled",
    }


def _child_end(end: Any) -> ChildEnd:
    return ChildEnd(run_id=end.run_id, status=_CHILD_STATUSES[end.status], output=end.output)


def _child_spec(
    step: str,
    input: Any,
    key: Optional[str],
    detach: bool,
    model_tokens_max: Optional[int],
    model_cost_micro_usd_max: Optional[int],
) -> Any:
    if _runs is None:
        raise StepError("child runs need a step built against stephost:step@0.3.0 (wit/0.3.0)")
    return _runs.ChildSpec(
        step=step,
        input=_encode(f"runs.start {step}", input),
        key=key,
        model_tokens_max=model_tokens_max,
        model_cost_micro_usd_max=model_cost_micro_usd_max,
        detach=detach,
    )


@dataclass(frozen=True)
class Promise:
    """A promise `ctx.promise` made: its id in the run (for
    `ctx.wait_promise`), the token that completes it (`POST
    /api/promises/{token}` or `stephost complete TOKEN`; a secret: send it in
    a field the effect's `[redact]` covers) and when it expires (ms since
    the Unix epoch)."""

    id: int
    token: str
    expires_at_ms: int


@dataclass(frozen=True)
class Settled:
    """How a promise ended: `state` is `resolved` (`value` is its JSON),
    `rejected` (`value` is the message) or `expired` (`value` is None)."""

    state: str
    value: Optional[str]

    def json(self) -> Any:
        """A resolved promise's value, decoded; None otherwise."""
        if self.state != "resolved":
            return None
        return _decode("promises.wait", self.value)


# --- the context -------------------------------------------------------------


class Ctx:
    """The step's access to the host. Each method is one import call that the
    host records in the run's ledger, in the order the step makes it."""

    def effect(self, name: str, request: Any, key: Optional[str] = None) -> Any:
        """Calls the effect `name` with `request` encoded as JSON and returns
        its decoded JSON response.

        `key` is an optional business key (e.g. `"order:WIDGET-7:10"`): a
        `write` effect's operation id is then derived from the run, the effect
        name and the key instead of the call's sequence number.

        Raises an `EffectError` subclass: `RejectedError`, `DeniedError`,
        `ExhaustedError`, `InvalidError` from the host, `EncodeError` or
        `DecodeError` for JSON that does not encode or decode.
        """
        body = _encode(name, request)
        try:
            response = _effects.call(name, body, key)
        except Err as e:
            raise _call_error(name, e) from None
        return _decode(name, response)

    def effect_with_key(self, name: str, key: str, request: Any) -> Any:
        """`effect(name, request, key=key)`, in the Rust SDK's argument order."""
        return self.effect(name, request, key)

    def llm(self, request: Any) -> Any:
        """An OpenAI-style chat completion: `request` is the body without
        `model` (`{"messages": [...]}`); returns the provider's JSON response.
        Errors as for `effect`, with the effect name `llm`."""
        body = _encode("llm", request)
        try:
            response = _llm.complete(body)
        except Err as e:
            raise _call_error("llm", e) from None
        return _decode("llm", response)

    def chat(self, model: str, request: dict) -> dict:
        """`chat(model, request)`: one turn with the model aliased `model`
        (stephost:step@0.2.0)."""
        return chat(model, request)

    def run_agent(
        self,
        model: str,
        request: dict,
        tools: "dict[str, Callable[[Any], Any]]",
        max_turns: int = 10,
    ) -> dict:
        """`run_agent(model, request, tools, max_turns)` (stephost:step@0.2.0)."""
        return run_agent(model, request, tools, max_turns)

    def run_agent_full(
        self,
        model: str,
        request: dict,
        tools: "dict[str, Callable[[Any], Any]]",
        max_turns: int = 10,
    ) -> "AgentRun":
        """`run_agent_full(model, request, tools, max_turns)` (stephost:step@0.2.0)."""
        return run_agent_full(model, request, tools, max_turns)

    def now_ns(self) -> int:
        """Wall-clock time in nanoseconds since the Unix epoch, as recorded."""
        return _clock.now()

    def now(self) -> datetime:
        """Wall-clock time as a UTC `datetime` (microsecond precision), as
        recorded. One `clock.now` call, as is `now_ns`."""
        ns = self.now_ns()
        return datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=ns // 1000)

    def random_bytes(self, n: int) -> bytes:
        """`n` random bytes, as recorded (the host limits `n`)."""
        return bytes(_random.get_bytes(n))

    def random_u64(self) -> int:
        """A random 64-bit unsigned number, as recorded."""
        return _random.get_u64()

    def sleep(self, seconds: float) -> None:
        """Sleeps durably for `seconds` (whole milliseconds, rounded down): the
        wake time is recorded, a replay returns at once, and a long sleep
        takes the run out of memory until it is due."""
        ms = int(seconds * 1000) if seconds > 0 else 0
        _timers.sleep(min(ms, _U64_MAX))

    def approval(self, subject: str, details: Any, ttl_seconds: int) -> Decision:
        """Asks a person to approve `subject`; `details` (encoded as JSON) is the
        object approved, and the approval is tied to its hash. The run waits,
        out of memory, until someone decides or `ttl_seconds` (at least 1)
        pass (verdict `EXPIRED`). Re-check the business precondition after it.

        Raises `EncodeError` or the host's error, with the effect name
        `approvals`."""
        body = _encode("approvals", details)
        ttl = min(max(int(ttl_seconds), 1), _U64_MAX)
        try:
            d = _approvals.request(subject, body, ttl)
        except Err as e:
            raise _call_error("approvals", e) from None
        return Decision(verdict=_VERDICTS[d.verdict], by=d.by, note=d.note, at_ms=d.at_ms)


    def start(
        self,
        join_set: str,
        step: str,
        input: Any,
        key: Optional[str] = None,
        detach: bool = False,
        model_tokens_max: Optional[int] = None,
        model_cost_micro_usd_max: Optional[int] = None,
    ) -> str:
        """Starts step `step` (`[steps.NAME]`) on `input` (encoded as JSON) as
        a child run in `join_set`; its run id. `key` derives the child's id
        from a business key instead of the call's place; `detach` lets it go
        on if this run ends first (else it is cancelled with it)
        (stephost:step@0.3.0)."""
        spec = _child_spec(step, input, key, detach, model_tokens_max, model_cost_micro_usd_max)
        try:
            return _runs.start(join_set, spec)
        except Err as e:
            raise _call_error(f"runs.start {step}", e) from None

    def join_next(self, join_set: str) -> ChildEnd:
        """The next child of `join_set` to end, waiting (out of memory) until
        one does; the order is recorded (stephost:step@0.3.0)."""
        if _runs is None:
            raise StepError("child runs need a step built against stephost:step@0.3.0")
        try:
            return _child_end(_runs.join_next(join_set))
        except Err as e:
            raise _call_error("runs.join-next", e) from None

    def join_try_next(self, join_set: str) -> Optional[ChildEnd]:
        """`join_next` without waiting: None if no child of the set has ended
        yet, or none is left (stephost:step@0.3.0)."""
        if _runs is None:
            raise StepError("child runs need a step built against stephost:step@0.3.0")
        try:
            found = _runs.join_try_next(join_set)
        except Err as e:
            raise _call_error("runs.join-try-next", e) from None
        if isinstance(found, _runs.TryNext_Found):
            return _child_end(found.value)
        return None

    def cancel_child(self, run_id: str) -> None:
        """Cancels child `run_id` (one this run started) with the runs below
        it; its join gives it `cancelled`. A child that has ended is left as
        it ended (stephost:step@0.3.0)."""
        if _runs is None:
            raise StepError("child runs need a step built against stephost:step@0.3.0")
        try:
            _runs.cancel(run_id)
        except Err as e:
            raise _call_error("runs.cancel", e) from None

    def call_step(
        self,
        step: str,
        input: Any,
        key: Optional[str] = None,
        model_tokens_max: Optional[int] = None,
        model_cost_micro_usd_max: Optional[int] = None,
    ) -> ChildEnd:
        """Starts step `step` on `input` as a child run and waits for its end
        (stephost:step@0.3.0)."""
        spec = _child_spec(step, input, key, False, model_tokens_max, model_cost_micro_usd_max)
        try:
            return _child_end(_runs.call(spec))
        except Err as e:
            raise _call_error(f"runs.call {step}", e) from None


    def promise(self, name: str, ttl_seconds: int) -> Promise:
        """Makes a promise named `name` that expires after `ttl_seconds` (1
        at least); a resumed or replayed run gets the same token
        (stephost:step@0.3.0). Raises `DeniedError` on a host without the
        operator's key."""
        if _promises is None:
            raise StepError("promises need a step built against stephost:step@0.3.0")
        ttl = min(max(int(ttl_seconds), 1), _U64_MAX)
        try:
            made = _promises.create(name, ttl)
        except Err as e:
            raise _call_error("promises.create", e) from None
        return Promise(id=made.id, token=made.token, expires_at_ms=made.expires_at_ms)

    def wait_promise(self, promise: Promise) -> Settled:
        """Waits, out of memory, until `promise` is completed or expires; one
        completed already ends the wait at once (stephost:step@0.3.0)."""
        if _promises is None:
            raise StepError("promises need a step built against stephost:step@0.3.0")
        try:
            settled = _promises.wait(promise.id)
        except Err as e:
            raise _call_error("promises.wait", e) from None
        if isinstance(settled, _promises.Settled_Resolved):
            return Settled(state="resolved", value=settled.value)
        if isinstance(settled, _promises.Settled_Rejected):
            return Settled(state="rejected", value=settled.value)
        return Settled(state="expired", value=None)


def _encode(effect: str, value: Any) -> str:
    try:
        return to_json(value)
    except (TypeError, ValueError) as e:
        raise EncodeError(effect, str(e)) from None


def _decode(effect: str, text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as e:
        raise DecodeError(effect, str(e)) from None


# --- models (stephost:step@0.2.0) ---------------------------------------------


def chat(model: str, request: dict) -> dict:
    """One turn of a conversation with the model aliased `model` in
    stephost.toml (`[models.NAME]`), through `models.chat`.

    `request` is a provider-neutral chat request (a dict): `messages` (each
    `{"role": "user" | "assistant" | "tool", "content": [parts]}`, a part
    being `{"type": "text", "text"}`, `{"type": "tool_call", "id", "name",
    "arguments"}` with `arguments` JSON text, or `{"type": "tool_result",
    "call_id", "name", "content", "is_error"}`), and optionally `system`,
    `tools` (`[{"name", "description", "parameters"}]`, parameters a JSON
    Schema), `tool_choice` (`{"type": "auto" | "none" | "required"}` or
    `{"type": "tool", "name"}`), `max_tokens`, `temperature`, `stop`,
    `parallel_tool_calls` and `raw`. Its `model` field is set to `model` (the
    host records the alias, whichever provider serves it). Unknown fields are
    refused by the host (`InvalidError`).

    Returns the answer as a dict: `content` (text and tool-call parts),
    `stop` (`stop`, `length`, `tool_calls`, `content_filter`, `other`),
    `usage` (`input`, `cached_input`, `cache_write`, `output`, `reasoning`
    tokens), `cost` (`micro_usd`, ...; absent without prices), and `api`,
    `model`, `id`, `stop_raw`, `refusal`, `usage_raw`.

    The answer is committed to the ledger before the step sees it: a resumed
    or replayed run gets it back and spends nothing.

    Raises an `EffectError` subclass with the effect name `models.<model>`:
    `BudgetError` (not sent: over the run's token or cost budget),
    `RejectedError`, `DeniedError` (no such model alias), `ExhaustedError`,
    `InvalidError` (the host refused the request), `EncodeError`,
    `DecodeError`.
    """
    effect = f"models.{model}"
    if _models is None:
        raise DeniedError(
            effect,
            "this step was built against stephost:step@0.1.0, which has no `models` "
            "interface; build it against wit/0.2.0",
        )
    if not isinstance(request, dict):
        raise EncodeError(effect, f"a chat request is a dict, got {type(request).__name__}")
    body = _encode(effect, {**request, "model": model})
    try:
        response = _models.chat(model, body)
    except Err as e:
        raise _call_error(effect, e) from None
    return _decode(effect, response)


def user_message(text: str) -> dict:
    """A user message holding one text part."""
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def tool_def(name: str, description: str, parameters: Optional[dict] = None) -> dict:
    """A tool definition: `parameters` is the JSON Schema of its arguments
    (an object schema), or None for a tool without arguments."""
    return {"name": name, "description": description, "parameters": parameters}


def response_text(response: dict) -> str:
    """The concatenated text parts of a chat answer."""
    return "".join(p["text"] for p in response.get("content", []) if p.get("type") == "text")


def tool_calls(response: dict) -> list:
    """The tool-call parts of a chat answer (`{"type": "tool_call", "id",
    "name", "arguments"}`, `arguments` as JSON text), in order."""
    return [p for p in response.get("content", []) if p.get("type") == "tool_call"]


class ToolError(Exception):
    """Raised by a tool given to `run_agent`: the model gets `str(e)` as the
    call's result with `is_error: true` (and may try something else),
    instead of the step failing."""


class MaxTurnsError(StepError):
    """`run_agent` asked the model `max_turns` times and its last answer still
    called tools (those calls were not run)."""


@dataclass
class AgentRun:
    """How `run_agent_full` ended."""

    #: The model's last answer: no tool calls in it.
    response: dict
    #: The request with the whole conversation, the last answer included
    #: (append a user message to its `messages` to go on).
    request: dict
    #: Model calls made (replayed ones included).
    turns: int
    #: Tool calls run.
    tool_calls: int
    #: Tokens of every turn, summed (`input`, `cached_input`, `cache_write`,
    #: `output`, `reasoning`).
    usage: dict
    #: Cost of every turn in micro-USD, summed (0 when the model has no prices).
    cost_micro_usd: int

    @property
    def text(self) -> str:
        """The text of the last answer."""
        return response_text(self.response)


_USAGE_FIELDS = ("input", "cached_input", "cache_write", "output", "reasoning")


def run_agent(
    model: str,
    request: dict,
    tools: "dict[str, Callable[[Any], Any]]",
    max_turns: int = 10,
) -> dict:
    """Runs a tool-calling conversation to its end and returns the model's
    last answer (the one without tool calls; `response_text(answer)` is its
    text). `run_agent_full` gives the conversation, turns, usage and cost too.

    Each turn calls `chat(model, request)` and appends the answer's `content`
    (as it came) as an assistant message. If the answer calls tools, it runs
    `tools[name](arguments)` for each call, in order (the arguments decoded
    from JSON), appends one `tool` message per call with the tool's result
    (a `str` as it is, anything else as compact JSON with sorted keys) and
    asks again; otherwise the answer is returned.

    A tool that raises `ToolError`, a tool name not in `tools` and arguments
    that are not JSON give the model an error result (`is_error: true`) to
    react to; any other exception ends the loop and propagates (e.g. an
    `EffectError` from a tool's effect, or a `StepError`).

    At most `max_turns` model calls (at least 1): if the last one still calls
    tools, those calls are not run and `MaxTurnsError` is raised. Every name
    in the request's `tools` (`tool_def(...)`) must have a function in
    `tools`. `request` is not modified. Errors of `chat` (`BudgetError`, ...)
    propagate.

    Every model turn and every effect of a tool is a recorded call: a resumed
    run replays the turns already answered without asking the model again, so
    the tools must make the same calls for the same arguments.
    """
    return run_agent_full(model, request, tools, max_turns).response


def run_agent_full(
    model: str,
    request: dict,
    tools: "dict[str, Callable[[Any], Any]]",
    max_turns: int = 10,
) -> AgentRun:
    """`run_agent`, returning an `AgentRun`: the last answer, the request
    with the whole conversation, the number of turns and tool calls, and the
    summed usage and cost."""
    defined = [t.get("name") for t in request.get("tools", [])]
    missing = [name for name in defined if name not in tools]
    if missing:
        raise StepError(f"run_agent: no function for the tool(s) {', '.join(map(str, missing))}")
    max_turns = max(int(max_turns), 1)
    request = {**request, "messages": list(request.get("messages", []))}
    messages = request["messages"]
    usage = dict.fromkeys(_USAGE_FIELDS, 0)
    cost = 0
    ran = 0
    for turn in range(1, max_turns + 1):
        response = chat(model, request)
        for field in _USAGE_FIELDS:
            usage[field] += int((response.get("usage") or {}).get(field, 0))
        cost += int((response.get("cost") or {}).get("micro_usd", 0))
        calls = tool_calls(response)
        if response.get("content"):
            messages.append({"role": "assistant", "content": response["content"]})
        if not calls:
            return AgentRun(response, request, turn, ran, usage, cost)
        if turn == max_turns:
            names = ", ".join(c["name"] for c in calls)
            raise MaxTurnsError(
                f"the model was still calling tools ({names}) after {max_turns} turns (max_turns)"
            )
        for call in calls:
            content, is_error = _run_tool(tools, call)
            ran += 1
            messages.append(
                {
                    "role": "tool",
                    "content": [
                        {
                            "type": "tool_result",
                            "call_id": call["id"],
                            "name": call["name"],
                            "content": content,
                            "is_error": is_error,
                        }
                    ],
                }
            )
    raise AssertionError("unreachable: the last turn returns or raises")


def _run_tool(tools: dict, call: dict) -> "tuple[str, bool]":
    name = call["name"]
    tool = tools.get(name)
    if tool is None:
        return f"there is no tool `{name}`", True
    try:
        arguments = json.loads(call["arguments"]) if call["arguments"].strip() else {}
    except ValueError as e:
        return f"the arguments are not JSON: {e}", True
    try:
        result = tool(arguments)
    except ToolError as e:
        return str(e), True
    if isinstance(result, str):
        return result, False
    try:
        # Sorted keys: the text the Rust SDK sends for a serde_json::Value.
        return to_json(result, sort_keys=True), False
    except (TypeError, ValueError) as e:
        raise StepError(f"tool `{name}` returned a value that is not JSON: {e}") from None


# --- the log -----------------------------------------------------------------


class _Log:
    """The run's log. Lines are not ledger calls: a replay marks them as
    replayed, so logging never makes a replay diverge.

    `log.info("...")`, `log.warn(...)` etc.; anything is turned into text
    with `str`.
    """

    Level = _log.Level

    def emit(self, level: "_log.Level", message: Any) -> None:
        _log.emit(level, str(message))

    def trace(self, message: Any) -> None:
        self.emit(_log.Level.TRACE, message)

    def debug(self, message: Any) -> None:
        self.emit(_log.Level.DEBUG, message)

    def info(self, message: Any) -> None:
        self.emit(_log.Level.INFO, message)

    def warn(self, message: Any) -> None:
        self.emit(_log.Level.WARN, message)

    def error(self, message: Any) -> None:
        self.emit(_log.Level.ERROR, message)


log = _Log()


# --- the export --------------------------------------------------------------


def run_json(run: Callable[[Ctx, Any], Any], input: str) -> str:
    """Decodes `input`, calls `run(ctx, value)` and encodes its result as
    compact JSON. Raises `Err(message)`, the world's `run` error: `invalid
    input: ...` for input that is not JSON (or an `InputError`), the message
    of a `StepError`, `TypeName: message` for any other exception, and
    `invalid output: ...` for a result that is not JSON."""
    try:
        value = json.loads(input)
    except ValueError as e:
        raise Err(f"invalid input: {e}") from None
    try:
        output = run(Ctx(), value)
    except Err:
        raise
    except InputError as e:
        raise Err(f"invalid input: {e}") from None
    except StepError as e:
        raise Err(str(e)) from None
    except Exception as e:  # a bug in the step: still a message, not a trap
        raise Err(f"{type(e).__name__}: {e}") from None
    try:
        return to_json(output)
    except (TypeError, ValueError) as e:
        raise Err(f"invalid output: {e}") from None


def export_step(run: Callable[[Ctx, Any], Any]) -> type:
    """The world's export for `run(ctx, input) -> output`: bind it to the name
    `WitWorld` in the app module (`WitWorld = export_step(run)`)."""

    class WitWorld(_WitWorld):
        def run(self, input: str) -> str:
            return run_json(run, input)

    WitWorld.__doc__ = f"The step `{getattr(run, '__qualname__', run)}`."
    return WitWorld
