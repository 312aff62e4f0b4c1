"""Official MCP SDK clients to a running server, authenticated with a bearer token."""

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent

# What the ``mcp_client`` fixture returns: ``async with mcp_client(username, **client_options) as client``.
McpClientFactory = Callable[..., AbstractAsyncContextManager[Client]]


@contextlib.asynccontextmanager
async def connect(
    mcp_url: str, token: str, *, transport: httpx2.AsyncBaseTransport | None = None, **client_options: Any
) -> AsyncIterator[Client]:
    """An official SDK client to ``mcp_url`` presenting ``token`` (over ``transport``: default, the network)."""
    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30.0), transport=transport
    )
    async with http, Client(streamable_http_client(mcp_url, http_client=http), **client_options) as client:
        yield client


def text_of(result: CallToolResult) -> str:
    """The text blocks of a tool result, joined (what a failing assertion should show)."""
    return " ".join(block.text for block in result.content if isinstance(block, TextContent))


async def call_ok(client: Client, tool: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    """Call ``tool`` and return its structured content, failing with the tool's text if it errs."""
    result = await client.call_tool(tool, arguments or {})
    assert not result.is_error, f"{tool}: {text_of(result)}"
    content: dict[str, Any] | None = result.structured_content
    assert content is not None, f"{tool} returned no structured content"
    return content


async def cart_with_first_product(client: Client, quantity: int) -> tuple[str, str]:
    """Create a cart holding ``quantity`` of the catalog's first product; return the cart id and the product's sku."""
    sku: str = (await call_ok(client, "catalog_search", {"limit": 1}))["products"][0]["sku"]
    cart_id: str = (await call_ok(client, "cart_create"))["cart_id"]
    await call_ok(client, "cart_set_item", {"cart_id": cart_id, "sku": sku, "quantity": quantity})
    return cart_id, sku
