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
component.
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
from wit_world.imports import types as _types

__all__ = [
    "Ctx",
    "Decision",
    "DecodeError",
    "DeniedError",
    "EffectError",
    "EncodeError",
    "ExhaustedError",
    "InputError",
    "InvalidError",
    "RejectedError",
    "StepError",
    "Verdict",
    "export_step",
    "log",
    "to_json",
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
)


def _call_error(effect: str, err: Err) -> EffectError:
    for wit_type, error_type in _CALL_ERRORS:
        if isinstance(err.value, wit_type):
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
