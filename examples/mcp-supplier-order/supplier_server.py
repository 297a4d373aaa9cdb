"""The supplier as an MCP server (Python, the `mcp` package, 2.x).

Tools:
- `check_stock(sku)`: what is on hand. Annotated read-only, so stephost
  records its calls as reads when told to trust the server's annotations
  (`trust_annotations = true` in stephost.toml).
- `place_order(sku, quantity)`: appends the order to the file named by
  SUPPLIER_ORDERS (default supplier-orders.jsonl) and answers with it. An
  order whose `dev.stephost/operation_id` (in the request's `_meta`) was
  seen before is answered with the first one and not placed again: the
  server deduplicates, so stephost may send a write again after a lost
  answer (`idempotent = true` in stephost.toml).

usage: python supplier_server.py                 (stdio)
       python supplier_server.py http PORT       (streamable HTTP on
                                                  127.0.0.1:PORT/mcp)

For tests, SUPPLIER_MCP_FAULT makes `place_order` misbehave: `die-after`
places the order and exits before answering (a server killed mid-call);
`die-before` exits before placing it; `slow` waits ten minutes before
placing it (cancelled when the client gives up or leaves); `rpc-error`
answers with a JSON-RPC error (-32001) instead of a result; `is-error`
answers with a tool result marked `isError` (the supplier refuses it). Others make the
server itself misbehave: `slow-start` waits 4 s before it reads anything
(a server that takes long to start, as one run by npx or uvx may);
`version-1999` answers `initialize` with protocol version 1999-01-01, which
no client speaks; `list-error-once` answers its first `tools/list` with a
JSON-RPC internal error (-32603); `read-only-order` annotates `place_order`
read-only (a server whose hints are wrong); `huge-stderr` prints a line of
1 MiB on stderr when it starts, then a short one.
SUPPLIER_MCP_PIDFILE names a file the server appends its process id to.
"""

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from mcp.types import ToolAnnotations

ORDERS = Path(os.environ.get("SUPPLIER_ORDERS", "supplier-orders.jsonl"))
FAULT = os.environ.get("SUPPLIER_MCP_FAULT", "")
STOCK = {"WIDGET-7": 3, "GADGET-2": 40}

server = MCPServer("supplier", version="1.4.0")

if FAULT == "version-1999":
    # Only the answer says 1999-01-01: the server goes on serving with the
    # version it negotiated, so a client that does not leave gets its calls
    # answered.
    from mcp.server.runner import ServerRunner

    handle_initialize = ServerRunner._handle_initialize

    def handle_initialize_1999(self: Any, params: Any) -> Any:
        answer = handle_initialize(self, params)
        return answer.model_copy(update={"protocol_version": "1999-01-01"})

    ServerRunner._handle_initialize = handle_initialize_1999

if FAULT == "list-error-once":
    list_tools = server.list_tools
    lists_failed = []

    async def list_tools_failing_once() -> Any:
        if not lists_failed:
            lists_failed.append(True)
            raise MCPError(code=-32603, message="the tool list is not ready yet")
        return await list_tools()

    server.list_tools = list_tools_failing_once


def placed() -> list[dict[str, Any]]:
    if not ORDERS.exists():
        return []
    return [json.loads(line) for line in ORDERS.read_text().splitlines() if line]


@server.tool(annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
def check_stock(sku: str) -> dict[str, Any]:
    """What is on hand of `sku`."""
    if sku not in STOCK:
        raise ToolError(f"unknown sku {sku}")
    return {"sku": sku, "on_hand": STOCK[sku]}


@server.tool(annotations=ToolAnnotations(read_only_hint=FAULT == "read-only-order",
                                         destructive_hint=False, idempotent_hint=False,
                                         open_world_hint=True))
async def place_order(sku: str, quantity: int, ctx: Context) -> dict[str, Any]:
    """Orders `quantity` of `sku`; one order per operation id."""
    if quantity <= 0:
        raise ToolError(f"quantity must be positive, got {quantity}")
    meta = ctx.request_context.meta or {}
    operation = meta.get("dev.stephost/operation_id")
    if operation is not None:
        for order in placed():
            if order.get("operation_id") == operation:
                return order
    if FAULT == "die-before":
        os._exit(3)
    if FAULT == "rpc-error":
        raise MCPError(code=-32001, message="the supplier takes no orders today")
    if FAULT == "is-error":
        raise ToolError("the supplier is closed for inventory today")
    if FAULT == "slow":
        await anyio.sleep(600)
    order = {
        "order_id": f"PO-{len(placed()) + 1}",
        "sku": sku,
        "quantity": quantity,
        "operation_id": operation,
        "fence": meta.get("dev.stephost/fence"),
        # The span of the call that sent it, when the host reports traces.
        "traceparent": meta.get("traceparent"),
    }
    with ORDERS.open("a") as f:
        f.write(json.dumps(order) + "\n")
        f.flush()
        os.fsync(f.fileno())
    if FAULT == "die-after":
        os._exit(3)
    return order


if __name__ == "__main__":
    pidfile = os.environ.get("SUPPLIER_MCP_PIDFILE")
    if pidfile:
        with open(pidfile, "a") as f:
            f.write(f"{os.getpid()}\n")
    if FAULT == "slow-start":
        time.sleep(4)
    if FAULT == "huge-stderr":
        sys.stderr.write("x" * (1 << 20) + "\n")
        sys.stderr.write("the supplier is up\n")
        sys.stderr.flush()
    if sys.argv[1:2] == ["http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]),
                   stateless_http=True, json_response=True)
    else:
        server.run()
