"""Official MCP SDK clients to a running server, authenticated with a bearer token."""

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

# What the ``mcp_client`` fixture returns: ``async with mcp_client(username, **client_options) as client``.
McpClientFactory = Callable[..., AbstractAsyncContextManager[Client]]


@contextlib.asynccontextmanager
async def connect(mcp_url: str, token: str, **client_options: Any) -> AsyncIterator[Client]:
    """An official SDK client to ``mcp_url`` presenting ``token``."""
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30.0))
    async with http, Client(streamable_http_client(mcp_url, http_client=http), **client_options) as client:
        yield client
