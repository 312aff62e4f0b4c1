"""FastMCP's Python client (the ``fastmcp`` package, pinned in the test extra) runs the cart flow and checkout;
the checkout confirmation goes through FastMCP's own ``input_required`` loop and elicitation handler."""

import uuid
from typing import Any

import anyio
from fastmcp import Client

from tests.support.auth_mode import McpTokens
from tests.support.server import RunningServer

BOUND = 90.0


async def test_fastmcp_runs_the_cart_flow_and_checks_out_through_its_input_required_loop(
    server: RunningServer, mcp_token: McpTokens
) -> None:
    token = await mcp_token(f"fastmcp-{uuid.uuid4().hex[:8]}", resource=server.mcp_url)
    questions: list[str] = []

    async def confirm(message: str, response_type: Any, params: Any, context: Any) -> dict[str, bool]:
        questions.append(message)
        return {"confirm": True}

    with anyio.fail_after(BOUND):
        async with Client(server.mcp_url, auth=token, elicitation_handler=confirm) as client:
            assert client.protocol_version == "2026-07-28"
            found = await client.call_tool("catalog_search", {"limit": 1})
            product = found.structured_content["products"][0]
            created = await client.call_tool("cart_create", {})
            cart_id = created.structured_content["cart_id"]
            await client.call_tool("cart_set_item", {"cart_id": cart_id, "sku": product["sku"], "quantity": 3})
            viewed = await client.call_tool("cart_view", {"cart_id": cart_id})
            total = viewed.structured_content["total_cents"]
            assert total == 3 * product["unit_price_cents"]

            ordered = await client.call_tool("cart_checkout", {"cart_id": cart_id})
            assert not ordered.is_error, ordered
            assert ordered.structured_content["status"] == "placed"
            assert ordered.structured_content["total_cents"] == total
            order_id = ordered.structured_content["order_id"]
            assert len(questions) == 1, questions
            assert "3 items" in questions[0]

            order = await client.call_tool("order_view", {"order_id": order_id})
            assert order.structured_content["total_cents"] == total
