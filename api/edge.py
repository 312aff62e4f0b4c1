"""The ASGI edge every HTTP request enters first: its request id, its one log line, and where it goes.

Routing starts here: ``/mcp`` goes straight to the MCP endpoint (:class:`api.mcp.endpoint.McpEndpoint`, the
SDK's app behind it), every other path to Litestar (its router, exception handling and route handlers,
declared in :func:`api.app.create_app`). ``/mcp`` skips Litestar's router and middleware stack: it is one
ASGI app with no Litestar features to route to, and that machinery cost ~0.03 ms of every tool call.

Every HTTP request gets:

* a request id (:mod:`api.request_id`): set for every log line the request causes and sent back as
  ``X-Request-Id``;
* one INFO line on ``coatcheck.access`` when its response is complete (it replaces uvicorn's access line
  and, for a ``tools/call``, the tool-call line): client, method, path (query string redacted), HTTP version,
  status, duration, and what the MCP endpoint learnt about it (:class:`RequestFacts`: the JSON-RPC method,
  and for a ``tools/call`` the tool, its outcome and the caller's keyed principal digest).
"""

import logging
import time
from contextvars import ContextVar
from typing import Any
from urllib.parse import quote

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Receive, Scope, Send

from api.logs import REQUEST_ID
from api.request_id import REQUEST_ID_HEADER, request_id_for

logger = logging.getLogger("coatcheck.access")

MCP_PATHS = frozenset({"/mcp", "/mcp/"})  # Litestar's router treated a trailing slash as the same route


class RequestFacts:
    """What the layers below the edge learnt about the request, for its log line (set by the tool observer)."""

    __slots__ = ("mcp_method", "outcome", "principal", "tool")

    def __init__(self) -> None:
        self.mcp_method: str | None = None
        self.tool: str | None = None
        self.outcome: str | None = None
        self.principal: str | None = None


#: The facts of the HTTP request being handled; ``None`` outside the edge (e.g. an in-memory MCP client).
CURRENT_REQUEST: ContextVar[RequestFacts | None] = ContextVar("coatcheck_request_facts", default=None)


def _client(scope: Scope) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "-"


def _logged_path(scope: Scope) -> str:
    # The query string may carry OAuth codes and states, or a token someone put there: never logged.
    path = quote(scope.get("root_path", "") + scope["path"])
    return f"{path}?[redacted]" if scope.get("query_string") else path


def _log(scope: Scope, path: str, status: int, started: float, facts: RequestFacts) -> None:
    if not logger.isEnabledFor(logging.INFO):  # LOG_LEVEL=WARNING: not even the arguments are built
        return
    duration_ms = round((time.perf_counter() - started) * 1000, 1)
    client, method, version = _client(scope), scope.get("method", "-"), scope.get("http_version", "1.1")
    extra: dict[str, Any] = {
        "client": client,
        "method": method,
        "path": path,
        "status": status,
        "duration_ms": duration_ms,
    }
    if facts.mcp_method is None:
        logger.info(
            '%s - "%s %s HTTP/%s" %d in %.1f ms', client, method, path, version, status, duration_ms, extra=extra
        )
        return
    extra.update(mcp_method=facts.mcp_method, tool=facts.tool, outcome=facts.outcome, principal=facts.principal)
    if facts.tool is None:
        logger.info(
            '%s - "%s %s HTTP/%s" %d in %.1f ms: %s',
            *(client, method, path, version, status, duration_ms, facts.mcp_method),
            extra=extra,
        )
        return
    logger.info(
        '%s - "%s %s HTTP/%s" %d in %.1f ms: %s %s %s (principal %s)',
        *(client, method, path, version, status, duration_ms, facts.mcp_method, facts.tool, facts.outcome),
        facts.principal or "-",
        extra=extra,
    )


class Edge:
    """The outermost ASGI app of an HTTP request (see the module docstring); lifespan goes to Litestar."""

    def __init__(self, litestar: ASGIApp, mcp: ASGIApp) -> None:
        self._litestar = litestar
        self._mcp = mcp

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await self._litestar(scope, receive, send)
            return
        started = time.perf_counter()
        supplied = None
        for name, value in scope["headers"]:
            if name == REQUEST_ID_HEADER:
                supplied = value
                break
        request_id = request_id_for(supplied)
        REQUEST_ID.set(request_id)
        facts = RequestFacts()
        CURRENT_REQUEST.set(facts)
        echoed = (REQUEST_ID_HEADER, request_id.encode())
        path = _logged_path(scope)
        status = 500  # what uvicorn answers if the app fails (or returns) before starting a response
        logged = False

        async def send_with_id(message: Any) -> None:
            nonlocal status, logged
            kind = message["type"]
            if kind == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), echoed]
                await send(message)
            elif kind == "http.response.body" and not message.get("more_body", False):
                await send(message)
                logged = True
                _log(scope, path, status, started, facts)
            else:
                await send(message)

        try:
            if scope["path"] in MCP_PATHS:
                # The SDK handler was configured at "/" (api/mcp/sdk_pipeline.py); the path is logged as sent.
                scope["path"], scope["raw_path"], scope["root_path"] = "/", b"/", ""
                await self._mcp(scope, receive, send_with_id)
            else:
                await self._litestar(scope, receive, send_with_id)
        finally:
            if not logged:  # no complete response: the client went away, or the app failed
                _log(scope, path, status, started, facts)
