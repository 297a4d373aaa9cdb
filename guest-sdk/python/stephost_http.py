"""HTTP for Python steps: requests over `wasi:http`, journaled by the host.

Build the step against the `step-http` world (`guest-sdk/python/wit-http`),
which adds `wasi:http/outgoing-handler` to the step world:

    import stephost_http

    stock = stephost_http.get("http://127.0.0.1:8080/inventory/WIDGET-7").json()
    placed = stephost_http.post_json("http://127.0.0.1:8080/orders", {"sku": "WIDGET-7"})

Each exchange is one call in the run's ledger: GET, HEAD and OPTIONS are
reads, other methods writes, recorded as started before they leave and sent
with their operation id as `Idempotency-Key`. A replay answers from the
ledger with no network. Only origins granted in stephost.toml
(`[http."ORIGIN"]`) can be reached; others fail with `HttpError`
("HttpRequestDenied"). The body of a request and of a response is held
whole, bounded by the run's `payload_bytes_max`.

The Python packages that open sockets (urllib3, requests) cannot run in a
step: a step has no sockets. This module is the client.
"""

import json as _json
from typing import Any, Iterable, Optional, Tuple
from urllib.parse import urlsplit

from componentize_py_types import Err
from wit_world.imports import outgoing_handler
from wit_world.imports import wasi_http_types as _t
from wit_world.imports.streams import StreamError_Closed

_METHODS = {
    "GET": _t.Method_Get,
    "HEAD": _t.Method_Head,
    "POST": _t.Method_Post,
    "PUT": _t.Method_Put,
    "DELETE": _t.Method_Delete,
    "CONNECT": _t.Method_Connect,
    "OPTIONS": _t.Method_Options,
    "TRACE": _t.Method_Trace,
    "PATCH": _t.Method_Patch,
}
# blocking-write-and-flush takes at most 4096 bytes at a time.
_WRITE_BYTES_MAX = 4096


class HttpError(Exception):
    """The request got no response: denied, refused, too large, or lost."""


class Response:
    def __init__(self, status: int, headers: list, body: bytes):
        self.status = status
        #: (name, value) pairs, names in lower case.
        self.headers = headers
        self.body = body

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def header(self, name: str) -> Optional[str]:
        name = name.lower()
        return next((v for k, v in self.headers if k == name), None)

    def text(self) -> str:
        return self.body.decode("utf-8")

    def json(self) -> Any:
        return _json.loads(self.body)


def request(
    method: str,
    url: str,
    headers: Iterable[Tuple[str, str]] = (),
    body: bytes = b"",
) -> Response:
    """Sends one request and reads its whole response."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise HttpError(f"not an http(s) URL: {url}")
    try:
        fields = _t.Fields.from_list([(k.lower(), v.encode()) for k, v in headers])
    except Err as e:
        raise HttpError(f"header refused: {e.value}") from None
    req = _t.OutgoingRequest(fields)
    verb = _METHODS.get(method.upper())
    req.set_method(verb() if verb else _t.Method_Other(method))
    req.set_scheme(_t.Scheme_Https() if parts.scheme == "https" else _t.Scheme_Http())
    req.set_authority(parts.netloc)
    req.set_path_with_query((parts.path or "/") + (f"?{parts.query}" if parts.query else ""))
    outgoing = req.body()
    try:
        future = outgoing_handler.handle(req, None)
    except Err as e:
        raise HttpError(f"{method} {url}: {e.value}") from None
    with outgoing.write() as stream:
        for at in range(0, len(body), _WRITE_BYTES_MAX):
            stream.blocking_write_and_flush(body[at : at + _WRITE_BYTES_MAX])
    _t.OutgoingBody.finish(outgoing, None)
    with future.subscribe() as ready:
        ready.block()
    # option<result<result<incoming-response, error-code>>>
    got = future.get()
    if got is None or isinstance(got, Err):
        raise HttpError(f"{method} {url}: no response")
    if isinstance(got.value, Err):
        code = got.value.value
        raise HttpError(f"{method} {url}: {type(code).__name__}{_detail(code)}")
    incoming = got.value.value
    status = incoming.status()
    names = [(k, v.decode("utf-8", "replace")) for k, v in incoming.headers().entries()]
    received = incoming.consume()
    chunks = []
    with received.stream() as stream:
        while True:
            try:
                chunks.append(stream.blocking_read(65536))
            except Err as e:
                if isinstance(e.value, StreamError_Closed):
                    break
                raise HttpError(f"{method} {url}: reading the response: {e.value}") from None
    _t.IncomingBody.finish(received)
    return Response(status, names, b"".join(chunks))


def _detail(code: Any) -> str:
    value = getattr(code, "value", None)
    return f" ({value})" if value is not None else ""


def get(url: str, headers: Iterable[Tuple[str, str]] = ()) -> Response:
    return request("GET", url, headers)


def post_json(url: str, value: Any, headers: Iterable[Tuple[str, str]] = ()) -> Response:
    """POSTs `value` as JSON and returns the response."""
    data = _json.dumps(value, separators=(",", ":")).encode()
    return request("POST", url, [("content-type", "application/json"), *headers], data)
