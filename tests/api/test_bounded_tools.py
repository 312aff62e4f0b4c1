"""Bounded lists, safe retries, compact text and input schemas, through the app in-process and the SDK client."""

import json
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from mcp import Client
from mcp.types import TextContent

from tests.support.auth_mode import McpTokens
from tests.support.inprocess import InProcessApp, settings_from, started_app
from tests.support.mcp_client import McpClientFactory, call_ok, text_of


async def test_cart_list_pages_newest_first_and_the_last_page_has_a_null_cursor(mcp_client: McpClientFactory) -> None:
    async with mcp_client() as client:
        made = [(await call_ok(client, "cart_create"))["cart_id"] for _ in range(5)]
        seen: list[str] = []
        cursor = None
        sizes = []
        while True:
            page = await call_ok(client, "cart_list", {"limit": 2, **({"cursor": cursor} if cursor else {})})
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
            await call_ok(alice, "cart_create")
        alices_cursor = (await call_ok(alice, "cart_list", {"limit": 1}))["next_cursor"]
        as_order_cursor = await alice.call_tool("order_list", {"cursor": alices_cursor})
    async with mcp_client() as bob:
        await call_ok(bob, "cart_create")
        foreign = await bob.call_tool("cart_list", {"cursor": alices_cursor})
        damaged = await bob.call_tool("cart_list", {"cursor": alices_cursor[:-2] + "AA"})
    assert foreign.is_error
    assert foreign.structured_content is None
    assert "This cursor was not issued to you by cart_list" in text_of(foreign)
    assert "call cart_list without a cursor" in text_of(foreign)
    assert text_of(damaged) == text_of(foreign)
    assert as_order_cursor.is_error
    assert "not issued to you by order_list" in text_of(as_order_cursor)


async def test_tool_text_is_compact_json_of_the_structured_content(mcp_client: McpClientFactory) -> None:
    async with mcp_client() as client:
        cart_id = (await call_ok(client, "cart_create"))["cart_id"]
        await call_ok(client, "cart_set_item", {"cart_id": cart_id, "sku": "hat-beanie", "quantity": 2})
        for tool, arguments in [
            ("cart_view", {"cart_id": cart_id}),
            ("cart_list", {}),
            ("catalog_search", {"query": "coat"}),
            ("order_list", {}),
            ("connection_list", {}),
        ]:
            result = await client.call_tool(tool, arguments)
            assert not result.is_error, text_of(result)
            (block,) = result.content
            assert isinstance(block, TextContent)
            assert json.loads(block.text) == result.structured_content, tool
            assert "\n" not in block.text, tool
            assert ": " not in block.text, tool


async def test_a_retried_cart_create_with_the_same_key_returns_the_same_cart(mcp_client: McpClientFactory) -> None:
    key = str(uuid.uuid4())
    async with mcp_client() as client:
        first = await call_ok(client, "cart_create", {"idempotency_key": key})
        again = await call_ok(client, "cart_create", {"idempotency_key": key})
        other = await call_ok(client, "cart_create", {"idempotency_key": str(uuid.uuid4())})
        listed = (await call_ok(client, "cart_list"))["carts"]
    assert first == again
    assert other != first
    assert len(listed) == 2


async def test_a_repeated_cart_delete_succeeds_with_deleted_false(mcp_client: McpClientFactory) -> None:
    async with mcp_client() as client:
        cart_id = (await call_ok(client, "cart_create"))["cart_id"]
        assert await call_ok(client, "cart_delete", {"cart_id": cart_id}) == {"cart_id": cart_id, "deleted": True}
        assert await call_ok(client, "cart_delete", {"cart_id": cart_id}) == {"cart_id": cart_id, "deleted": False}
        gone = await client.call_tool("cart_view", {"cart_id": cart_id})
    assert gone.is_error
    assert "No cart with id" in text_of(gone)


@pytest.fixture(scope="module")
async def capped_app(server_env: dict[str, str]) -> AsyncIterator[InProcessApp]:
    """A second app with MAX_OPEN_CARTS=2 (same resource, so the dev IdP's tokens fit)."""
    async with started_app(settings_from({**server_env, "MAX_OPEN_CARTS": "2"})) as started:
        yield started


@asynccontextmanager
async def _client(app: InProcessApp, mcp_token: McpTokens) -> AsyncIterator[Client]:
    token = await mcp_token(f"user-{uuid.uuid4().hex[:8]}", resource=app.mcp_url, transport=app.transport())
    async with app.mcp_client(token) as client:
        yield client


async def test_the_open_cart_cap_is_a_tool_error_that_says_what_to_do(
    capped_app: InProcessApp, mcp_token: McpTokens
) -> None:
    async with _client(capped_app, mcp_token) as client:
        first = (await call_ok(client, "cart_create"))["cart_id"]
        await call_ok(client, "cart_create")
        refused = await client.call_tool("cart_create", {})
        await call_ok(client, "cart_delete", {"cart_id": first})
        await call_ok(client, "cart_create")
    assert refused.is_error
    assert "You already have 2 open carts, the most allowed" in text_of(refused)
    assert "cart_delete" in text_of(refused)


async def test_nul_bytes_and_integers_past_int32_are_validation_errors_with_no_traceback_in_the_log(
    capped_app: InProcessApp, mcp_token: McpTokens, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with _client(capped_app, mcp_token) as client:
        cart_id = (await call_ok(client, "cart_create"))["cart_id"]
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
            assert "validation error" in text_of(result), (tool, text_of(result))
        cart = await call_ok(client, "cart_view", {"cart_id": cart_id})
    assert cart["version"] == 1  # nothing was written
    # The records the server's log handlers would format: a traceback is printed only for one with exc_info.
    messages = [record.getMessage() for record in caplog.records]
    assert any("rejected arguments" in message for message in messages), messages
    assert [record.getMessage() for record in caplog.records if record.exc_info] == []
    assert not any("unexpected exception" in message for message in messages), messages
