"""What the tools reach through the MCP server's lifespan: the SDK's way to hand a handler its dependencies.

The composition root (``build_mcp_server``) builds one :class:`ToolDeps` and makes the server's lifespan
yield it; the SDK enters that lifespan once, when the app starts the session manager, and puts the value
on every request's context. So the tools are plain module-level functions that a reader (or a test) can
import by name, and nothing is created at import time.
"""

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from mcp.server.mcpserver import Context, MCPServer

from api.mcp.cursors import CursorSigner
from api.oauth.service import Connections
from store.db import Database


@dataclass(frozen=True, slots=True)
class ToolDeps:
    """Everything a tool call needs beyond its arguments and the caller's principal."""

    database: Database
    cursors: CursorSigner
    connections: Connections
    max_cart_lines: int
    max_open_carts: int
    idempotency_key_ttl: timedelta


ToolContext = Context[ToolDeps, Any]
"""The ``ctx`` parameter of a tool: the SDK injects it and leaves it out of the input schema."""


def deps(ctx: ToolContext) -> ToolDeps:
    """The dependencies the composition root built, as the server's lifespan yielded them."""
    return ctx.request_context.lifespan_context


def lifespan_yielding(
    tool_deps: ToolDeps,
) -> Callable[[MCPServer[ToolDeps]], AbstractAsyncContextManager[ToolDeps]]:
    """A server lifespan that yields ``tool_deps``; their resources are owned (and closed) by the app."""

    @asynccontextmanager
    async def lifespan(_: MCPServer[ToolDeps]) -> AsyncIterator[ToolDeps]:
        yield tool_deps

    return lifespan
