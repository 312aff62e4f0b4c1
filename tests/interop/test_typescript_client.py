"""A second real client: the official TypeScript MCP client (``@modelcontextprotocol/client`` 2.x, Node).

``tests/support/npm/interop/ts_client.mjs`` drives ``coatcheck serve`` over HTTP with its own bearer token and prints a
transcript of what the client saw; the assertions live here. The checkout test uses the client's
own multi-round-trip loop: the server's ``input_required`` result is answered by the elicitation
handler the script registers, and the client retries with the answer and the echoed state.
"""

import asyncio
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support import figures
from tests.support.auth_mode import McpTokens
from tests.support.node import INTEROP_DIR, TS_CLIENT_SCRIPT, ensure_typescript_client
from tests.support.server import RunningServer

SECTION = "MCP conformance and interop"

CLIENT_TIMEOUT = 120.0
CART_TOOLS = {"catalog_search", "cart_create", "cart_set_item", "cart_view", "cart_list", "cart_delete"}


@pytest.fixture(scope="module")
def node() -> Path:
    return ensure_typescript_client()


async def _drive(
    node: Path, scenario: str, server: RunningServer, mcp_token: McpTokens, *, expected_version: str = "2026-07-28"
) -> dict[str, Any]:
    token = await mcp_token(f"ts-{uuid.uuid4().hex[:10]}", resource=server.mcp_url)
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        str(node),
        str(TS_CLIENT_SCRIPT),
        scenario,
        env={**os.environ, "MCP_URL": server.mcp_url, "MCP_TOKEN": token},
        cwd=INTEROP_DIR,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        raw_out, raw_err = await asyncio.wait_for(process.communicate(), timeout=CLIENT_TIMEOUT)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    stdout, stderr = raw_out.decode(), raw_err.decode()
    elapsed = time.monotonic() - started
    figures.note(SECTION, f"typescript client, {scenario}: exit {process.returncode} in {elapsed:.1f}s")
    assert process.returncode == 0, stderr
    transcript: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    assert "error" not in transcript, f"client error: {transcript['error']}\nstderr:\n{stderr}"
    assert transcript["protocolVersion"] == expected_version
    assert transcript["era"] == ("modern" if expected_version == "2026-07-28" else "legacy")
    assert transcript["serverVersion"]["name"] == "coatcheck"
    return transcript


def _steps(transcript: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {step["step"]: step for step in transcript["steps"]}


async def test_the_typescript_client_negotiates_2026_07_28_and_drives_the_whole_cart_flow(
    node: Path, server: RunningServer, mcp_token: McpTokens
) -> None:
    transcript = await _drive(node, "cart-flow", server, mcp_token)
    steps = _steps(transcript)
    cart_id = transcript["cartId"]
    first_sku, _ = transcript["skus"]

    assert set(transcript["tools"]) >= CART_TOOLS
    assert not any(step["isError"] for name, step in steps.items() if name != "cart_view (deleted)")
    assert len(steps["catalog_search"]["structuredContent"]["products"]) == 5
    assert cart_id.startswith("cart_")
    viewed = steps["cart_view"]["structuredContent"]
    assert [(item["sku"], item["quantity"]) for item in viewed["items"]] == [(first_sku, 2)]
    assert viewed["total_cents"] == 2 * viewed["items"][0]["unit_price_cents"]
    assert viewed["status"] == "open"
    assert cart_id in {cart["cart_id"] for cart in steps["cart_list"]["structuredContent"]["carts"]}
    assert steps["cart_delete"]["structuredContent"] == {"cart_id": cart_id, "deleted": True}
    gone = steps["cart_view (deleted)"]
    assert gone["isError"]
    assert "No cart with id" in gone["text"]
    assert cart_id not in {cart["cart_id"] for cart in steps["cart_list (after delete)"]["structuredContent"]["carts"]}
    assert transcript["elicitations"] == []


async def test_the_typescript_client_completes_checkout_through_its_own_input_required_loop(
    node: Path, server: RunningServer, mcp_token: McpTokens
) -> None:
    transcript = await _drive(node, "checkout", server, mcp_token)
    steps = _steps(transcript)

    # Round 1 reached the client's elicitation handler as one form question {confirm: boolean}.
    question, declined_question = transcript["elicitations"]
    assert question.get("mode", "form") == "form"
    assert question["requestedSchema"]["properties"]["confirm"]["type"] == "boolean"
    viewed = steps["cart_view"]["structuredContent"]
    assert str(viewed["total_cents"] // 100) in question["message"]

    # Round 2 (the client's automatic retry with the answer and the echoed requestState).
    checkout = steps["cart_checkout"]
    assert not checkout["isError"], checkout["text"]
    order = checkout["structuredContent"]
    assert set(order) >= {"order_id", "total_cents", "currency", "status"}
    assert order["order_id"].startswith("ord_")
    assert order["total_cents"] == viewed["total_cents"]
    assert order["currency"] == viewed["currency"]
    assert order["status"] == "placed"
    assert steps["cart_view (after checkout)"]["structuredContent"]["status"] == "checked_out"

    # A declined confirmation places nothing and leaves the cart open.
    assert declined_question["requestedSchema"] == question["requestedSchema"]
    declined = steps["cart_checkout (declined)"]
    assert not declined["isError"], declined["text"]
    assert declined["structuredContent"]["status"] == "cancelled"
    assert declined["structuredContent"]["order_id"] is None
    assert steps["cart_view (declined)"]["structuredContent"]["status"] == "open"


async def test_the_typescript_client_with_default_options_speaks_2025_11_25_and_is_told_checkout_needs_2026_07_28(
    node: Path, server: RunningServer, mcp_token: McpTokens
) -> None:
    # The TypeScript client negotiates the modern era only when asked (versionNegotiation); by default
    # it runs the 2025-11-25 initialize handshake, which Coatcheck serves on the same endpoint.
    transcript = await _drive(node, "legacy-default", server, mcp_token, expected_version="2025-11-25")
    steps = _steps(transcript)

    assert set(transcript["tools"]) >= CART_TOOLS
    for name in ("catalog_search", "cart_create", "cart_set_item", "cart_view"):
        assert not steps[name]["isError"], steps[name]["text"]
    assert transcript["elicitations"] == []
    if "cart_checkout" in transcript["tools"]:
        assert steps["cart_checkout"]["isError"]
        assert "2026-07-28" in steps["cart_checkout"]["text"]
        assert steps["cart_view"]["structuredContent"]["status"] == "open"
