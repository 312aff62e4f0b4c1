"""Bounded lists, safe retries, compact text and input schemas, through the real server and the SDK client."""

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent

from tests.conftest import McpClientFactory
from tests.support.devidp import DevIdP
from tests.support.server import RunningServer, run_server
from tests.support.waiting import free_port


def _text(result: CallToolResult) -> str:
    return " ".join(block.text for block in result.content if isinstance(block, TextContent))


async def _ok(client: Client, tool: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments or {})
    assert not result.is_error, _text(result)
    assert result.structured_content is not None
    return result.structured_content


async def test_cart_list_pages_newest_first_and_the_last_page_has_a_null_cursor(mcp_client: McpClientFactory) -> None:
    async with mcp_client() as client:
        made = [(await _ok(client, "cart_create"))["cart_id"] for _ in range(5)]
        seen: list[str] = []
        cursor = None
        sizes = []
        while True:
            page = await _ok(client, "cart_list", {"limit": 2, **({"cursor": cursor} if cursor else {})})
            sizes.append(len(page["carts"]))
            seen += [cart["cart_id"] for cart in page["carts"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
    assert sizes == [2, 2, 1]
    assert seen == list(reversed(made))


async def test_a_foreign_cursor_is_refused_with_a_clear_error(mcp_client: McpClientFactory) -> None:
    async with mcp_client() as alice:
        for _ in range(2):
            await _ok(alice, "cart_create")
        alices_cursor = (await _ok(alice, "cart_list", {"limit": 1}))["next_cursor"]
        as_order_cursor = await alice.call_tool("order_list", {"cursor": alices_cursor})
    async with mcp_client() as bob:
        await _ok(bob, "cart_create")
        foreign = await bob.call_tool("cart_list", {"cursor": alices_cursor})
        damaged = await bob.call_tool("cart_list", {"cursor": alices_cursor[:-2] + "AA"})
    assert foreign.is_error
    assert foreign.structured_content is None
    assert "This cursor was not issued to you by cart_list" in _text(foreign)
    assert "call cart_list without a cursor" in _text(foreign)
    assert _text(damaged) == _text(foreign)
    assert as_order_cursor.is_error
    assert "not issued to you by order_list" in _text(as_order_cursor)


async def test_tool_text_is_compact_json_of_the_structured_content(mcp_client: McpClientFactory) -> None:
    async with mcp_client() as client:
        cart_id = (await _ok(client, "cart_create"))["cart_id"]
        await _ok(client, "cart_set_item", {"cart_id": cart_id, "sku": "hat-beanie", "quantity": 2})
        for tool, arguments in [
            ("cart_view", {"cart_id": cart_id}),
            ("cart_list", {}),
            ("catalog_search", {"query": "coat"}),
            ("order_list", {}),
            ("connection_list", {}),
        ]:
            result = await client.call_tool(tool, arguments)
            assert not result.is_error, _text(result)
            (block,) = result.content
            assert isinstance(block, TextContent)
            assert json.loads(block.text) == result.structured_content, tool
            assert "\n" not in block.text, tool
            assert ": " not in block.text, tool


async def test_a_retried_cart_create_with_the_same_key_returns_the_same_cart(mcp_client: McpClientFactory) -> None:
    key = str(uuid.uuid4())
    async with mcp_client() as client:
        first = await _ok(client, "cart_create", {"idempotency_key": key})
        again = await _ok(client, "cart_create", {"idempotency_key": key})
        other = await _ok(client, "cart_create", {"idempotency_key": str(uuid.uuid4())})
        listed = (await _ok(client, "cart_list"))["carts"]
    assert first == again
    assert other != first
    assert len(listed) == 2


async def test_a_repeated_cart_delete_succeeds_with_deleted_false(mcp_client: McpClientFactory) -> None:
    async with mcp_client() as client:
        cart_id = (await _ok(client, "cart_create"))["cart_id"]
        assert await _ok(client, "cart_delete", {"cart_id": cart_id}) == {"cart_id": cart_id, "deleted": True}
        assert await _ok(client, "cart_delete", {"cart_id": cart_id}) == {"cart_id": cart_id, "deleted": False}
        gone = await client.call_tool("cart_view", {"cart_id": cart_id})
    assert gone.is_error
    assert "No cart with id" in _text(gone)


@pytest.fixture(scope="module")
def capped_server(server_env: dict[str, str], devidp: DevIdP, public_url: str) -> Iterator[RunningServer]:
    """A second server with MAX_OPEN_CARTS=2 and a log of its own (same resource, so the dev IdP's tokens fit)."""
    env = {**server_env, "MAX_OPEN_CARTS": "2", "ALLOWED_HOSTS": "127.0.0.1:*"}
    with run_server(env, port=free_port(), public_url=public_url) as running:
        yield running


@asynccontextmanager
async def _client(server: RunningServer, devidp: DevIdP, resource: str) -> AsyncIterator[Client]:
    token = await devidp.token(f"user-{uuid.uuid4().hex[:8]}", resource=resource)
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30.0))
    async with http, Client(streamable_http_client(server.mcp_url, http_client=http)) as client:
        yield client


async def test_the_open_cart_cap_is_a_tool_error_that_says_what_to_do(
    capped_server: RunningServer, devidp: DevIdP, public_url: str
) -> None:
    async with _client(capped_server, devidp, f"{public_url}/mcp") as client:
        first = (await _ok(client, "cart_create"))["cart_id"]
        await _ok(client, "cart_create")
        refused = await client.call_tool("cart_create", {})
        await _ok(client, "cart_delete", {"cart_id": first})
        await _ok(client, "cart_create")
    assert refused.is_error
    assert "You already have 2 open carts, the most allowed" in _text(refused)
    assert "cart_delete" in _text(refused)


async def test_nul_bytes_and_integers_past_int32_are_validation_errors_with_no_traceback_in_the_log(
    capped_server: RunningServer, devidp: DevIdP, public_url: str
) -> None:
    async with _client(capped_server, devidp, f"{public_url}/mcp") as client:
        cart_id = (await _ok(client, "cart_create"))["cart_id"]
        calls = [
            ("catalog_search", {"query": "co\x00at"}),
            ("cart_set_item", {"cart_id": cart_id, "sku": "hat\x00", "quantity": 1}),
            ("cart_set_item", {"cart_id": cart_id + "\x00", "sku": "hat-beanie", "quantity": 1}),
            ("cart_set_item", {"cart_id": cart_id, "sku": "hat-beanie", "quantity": 2**31}),
            ("cart_set_item", {"cart_id": cart_id, "sku": "hat-beanie", "quantity": 1, "expected_version": 2**31}),
            ("cart_view", {"cart_id": "cart_\x00"}),
            ("cart_create", {"idempotency_key": "k\x00"}),
            ("cart_list", {"cursor": "abc\x00"}),
            ("cart_list", {"limit": 2**31}),
            ("order_view", {"order_id": "ord_\x00"}),
            ("order_list", {"limit": 0}),
            ("connection_whoami", {"provider": "demo\x00"}),
        ]
        for tool, arguments in calls:
            result = await client.call_tool(tool, arguments)
            assert result.is_error, (tool, arguments)
            assert "validation error" in _text(result), (tool, _text(result))
        cart = await _ok(client, "cart_view", {"cart_id": cart_id})
    assert cart["version"] == 1  # nothing was written
    log = capped_server.log_text()
    assert "rejected arguments" in log
    assert "Traceback" not in log
    assert "unexpected exception" not in log
