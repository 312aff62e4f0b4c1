"""The SDK's ``/mcp`` handler with its own middleware, without the Starlette application around it.

``MCPServer.streamable_http_app()`` returns a Starlette app: the SDK's auth middleware (Starlette's
``AuthenticationMiddleware`` with the SDK's bearer backend, then ``AuthContextMiddleware``) around a router
whose one route runs ``RequireAuthMiddleware`` around the streamable-HTTP handler. Starlette adds layers of
its own that ``/mcp`` never uses: the error and exception middlewares, the router and the route. The edge
(:mod:`api.edge`) already decided that the request is for ``/mcp``, and nothing below raises Starlette's
``HTTPException``; an exception that escapes reaches uvicorn, which answers 500 as Starlette's error
middleware would. Those layers cost ~0.03 ms of every tool call (docs/performance.md).

:func:`sdk_pipeline` composes exactly what the SDK configured (the same middleware classes with the same
arguments, around the same route handler), so the SDK still decides everything about auth and transport.
"""

from collections.abc import Callable
from typing import Any, cast

from mcp.server.auth.middleware.bearer_auth import RequireAuthMiddleware
from starlette.applications import Starlette
from starlette.routing import Route
from starlette.types import ASGIApp

MCP_ROUTE = "/"  # where api.app mounts the SDK's handler (streamable_http_path)


def sdk_pipeline(app: Starlette, *, transport: Callable[[ASGIApp], ASGIApp] | None = None) -> ASGIApp:
    """The handler of ``app``'s ``/`` route wrapped in ``app``'s user middleware, outermost first.

    ``transport``, if given, wraps the SDK's transport handler inside the route's auth check, so that what it
    returns only sees authenticated requests (:class:`api.mcp.lanes.ToolLanes`).

    Call after every change to ``app.user_middleware`` (:func:`api.mcp.auth_errors.answer_verifier_outages`).

    Raises:
        RuntimeError: ``app`` has no such route, or ``transport`` is given and the route is not the SDK's
            auth check around its transport (an SDK change this wiring must follow).
    """
    routes = [route for route in app.routes if isinstance(route, Route) and route.path == MCP_ROUTE]
    if len(routes) != 1 or routes[0].methods is not None:
        raise RuntimeError("the SDK's app has no single all-methods route at / to serve /mcp")
    handler: ASGIApp = routes[0].app
    if transport is not None:
        if not isinstance(handler, RequireAuthMiddleware):
            raise RuntimeError("the SDK's /mcp route is not its auth check around the transport")
        handler = RequireAuthMiddleware(transport(handler.app), handler.required_scopes, handler.resource_metadata_url)
    for entry in reversed(app.user_middleware):
        factory = cast(Any, entry.cls)
        handler = factory(handler, *entry.args, **entry.kwargs)
    return handler
