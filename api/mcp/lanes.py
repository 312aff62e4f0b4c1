"""Which of the SDK's two ways of answering serves a ``/mcp`` request: inline, or beside a stream.

The SDK answers a 2026-07-28 request one of two ways, chosen for the whole server by ``json_response``
(``MCP_JSON_RESPONSE``):

* **streaming** (Coatcheck's default): the handler runs as a task beside a disconnect watcher, feeding a
  memory stream, so a notification it sends (progress, a log message) reaches the client on an event stream,
  a client that goes away cancels it, and one that runs past 15 s gets keep-alive pings. A handler that
  finishes within that window without sending anything still gets one plain JSON response;
* **inline**: the handler is awaited in the request's own task and its result is the JSON response.

For a handler that sends nothing and finishes within 15 s the two give the same answer on the wire, but
the streaming machinery (a task group, two tasks, a stream, a timer) costs about 0.14 ms of CPU per call on
these machines, more than a cart tool's own store work (docs/performance.md). Coatcheck's store tools
(catalog, carts, orders) never notify, so :class:`ToolLanes` sends their ``tools/call`` requests inline even
when the server streams. What differs for them:

* a client that goes away no longer cuts the call short. Their units of work are shielded from cancellation
  anyway, so the effect is the same; only the result building now runs for nobody;
* a call slower than 15 s gets no keep-alive pings, so a proxy's idle timeout (60 s in the shipped HAProxy
  configuration) applies to it. Their waits are bounded: ``DB_POOL_TIMEOUT_SECONDS`` (5 s) for a connection,
  ``DB_STATEMENT_TIMEOUT_MS`` (15 s) per statement, and a call near those bounds is failing anyway.

Everything else (other methods, the connection tools, which wait on providers, tools added by
``configure_mcp`` such as the conformance fixtures, handshake-era requests) is served as configured.

The lane is chosen from the ``Mcp-Method`` and ``Mcp-Name`` headers, which 2026-07-28 requires and the SDK
checks against the body in either lane (a mismatch is refused with 400 before anything runs), so a request
cannot take the inline lane for a tool other than the one it names.
"""

from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from starlette.types import ASGIApp, Receive, Scope, Send

_TOOLS_CALL = b"tools/call"


def inline_twin(manager: StreamableHTTPSessionManager) -> StreamableHTTPSessionManager:
    """A session manager like ``manager`` (same server, security and limits) that answers inline.

    It must be run (``async with twin.run()``) beside ``manager`` for as long as it serves. Running it enters
    the server's lifespan a second time, which Coatcheck's allows: it only yields the dependencies the app
    owns (:func:`api.mcp.lifespan.lifespan_yielding`).
    """
    return StreamableHTTPSessionManager(
        app=manager.app,
        event_store=manager.event_store,
        json_response=True,
        stateless=manager.stateless,
        security_settings=manager.security_settings,
        retry_interval=manager.retry_interval,
        session_idle_timeout=manager.session_idle_timeout,
        max_request_body_size=manager.max_request_body_size,
        max_sessions=manager.max_sessions,
    )


class ToolLanes:
    """Sends a ``tools/call`` of one of ``tools`` to ``inline``, every other request to ``configured``."""

    def __init__(self, configured: ASGIApp, inline: StreamableHTTPSessionManager, tools: frozenset[str]) -> None:
        self.configured = configured
        self.inline: ASGIApp = StreamableHTTPASGIApp(inline)
        self.tools = frozenset(name.encode() for name in tools)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = name = None
        # Header names are lower case in ASGI; api.mcp.endpoint has already stripped surrounding whitespace.
        for key, value in scope["headers"]:
            if key == b"mcp-method":
                method = value
            elif key == b"mcp-name":
                name = value
        lane = self.inline if method == _TOOLS_CALL and name in self.tools else self.configured
        await lane(scope, receive, send)
