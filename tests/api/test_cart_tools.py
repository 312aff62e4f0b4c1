"""Cart tools end to end: the official ``mcp`` SDK client, real HTTP, a running server, PostgreSQL."""

from tests.support.mcp_client import McpClientFactory, call_ok, text_of


async def test_tools_are_listed_with_input_and_output_schemas(mcp_client: McpClientFactory) -> None:
    async with mcp_client() as client:
        assert client.protocol_version == "2026-07-28"
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    expected = {"catalog_search", "cart_create", "cart_set_item", "cart_view", "cart_list", "cart_delete"}
    assert expected <= set(tools)
    for name in expected:
        assert tools[name].input_schema["type"] == "object"
        assert tools[name].output_schema is not None, name
    assert tools["cart_set_item"].input_schema["required"] == ["cart_id", "sku", "quantity"]
    assert tools["cart_set_item"].input_schema["properties"]["quantity"]["maximum"] == 999


async def test_create_fill_view_list_and_delete_a_cart_by_handle(mcp_client: McpClientFactory) -> None:
    async with mcp_client() as client:
        products = (await call_ok(client, "catalog_search", {"query": "scarf"}))["products"]
        assert [p["sku"] for p in products] == ["scarf-cashmere"]

        cart_id = (await call_ok(client, "cart_create"))["cart_id"]
        assert cart_id.startswith("cart_")
        await call_ok(client, "cart_set_item", {"cart_id": cart_id, "sku": "scarf-cashmere", "quantity": 2})
        cart = await call_ok(client, "cart_set_item", {"cart_id": cart_id, "sku": "hat-beanie", "quantity": 1})
        assert cart["total_cents"] == 2 * 6500 + 1800
        assert cart["currency"] == "USD"
        assert cart["version"] == 3

        viewed = await call_ok(client, "cart_view", {"cart_id": cart_id})
        assert viewed == cart
        assert viewed["items"] == [
            {
                "sku": "hat-beanie",
                "name": "Knit beanie",
                "quantity": 1,
                "unit_price_cents": 1800,
                "line_total_cents": 1800,
                "available": True,
            },
            {
                "sku": "scarf-cashmere",
                "name": "Cashmere scarf",
                "quantity": 2,
                "unit_price_cents": 6500,
                "line_total_cents": 13000,
                "available": True,
            },
        ]

        listed = (await call_ok(client, "cart_list"))["carts"]
        assert [(c["cart_id"], c["item_count"], c["total_cents"]) for c in listed] == [(cart_id, 3, 14800)]

        assert await call_ok(client, "cart_delete", {"cart_id": cart_id}) == {"cart_id": cart_id, "deleted": True}
        assert (await call_ok(client, "cart_list"))["carts"] == []


async def test_retrying_set_item_has_the_effect_of_one_call(mcp_client: McpClientFactory) -> None:
    async with mcp_client() as client:
        cart_id = (await call_ok(client, "cart_create"))["cart_id"]
        arguments = {"cart_id": cart_id, "sku": "gloves-leather", "quantity": 4}
        first = await call_ok(client, "cart_set_item", arguments)
        second = await call_ok(client, "cart_set_item", arguments)
    assert first["items"] == second["items"]
    assert second["total_cents"] == 4 * 4200


async def test_bad_arguments_are_tool_errors_that_say_what_to_do(mcp_client: McpClientFactory) -> None:
    async with mcp_client() as client:
        cart_id = (await call_ok(client, "cart_create"))["cart_id"]
        cases = {
            "unknown sku 'nope'; use catalog_search": {"cart_id": cart_id, "sku": "nope", "quantity": 1},
            "between 0 and 999; use 0 to remove": {"cart_id": cart_id, "sku": "hat-beanie", "quantity": 1000},
            "version 1, not 7": {"cart_id": cart_id, "sku": "hat-beanie", "quantity": 1, "expected_version": 7},
        }
        for expected, arguments in cases.items():
            result = await client.call_tool("cart_set_item", arguments)
            assert result.is_error
            assert expected.lower() in text_of(result).lower()
        assert (await call_ok(client, "cart_view", {"cart_id": cart_id}))["version"] == 1


async def test_another_principal_cannot_view_change_list_or_delete_a_cart_and_sees_the_made_up_handle_error(
    mcp_client: McpClientFactory,
) -> None:
    made_up = "cart_" + "Z" * 32
    async with mcp_client("alice") as alice:
        alices_cart = (await call_ok(alice, "cart_create"))["cart_id"]
        await call_ok(alice, "cart_set_item", {"cart_id": alices_cart, "sku": "hat-beanie", "quantity": 1})

    async with mcp_client("bob") as bob:
        for tool, extra in [
            ("cart_view", {}),
            ("cart_set_item", {"sku": "hat-beanie", "quantity": 5}),
        ]:
            foreign = await bob.call_tool(tool, {"cart_id": alices_cart, **extra})
            unknown = await bob.call_tool(tool, {"cart_id": made_up, **extra})
            assert foreign.is_error
            assert unknown.is_error
            assert text_of(foreign).replace(alices_cart, "<id>") == text_of(unknown).replace(made_up, "<id>")
            assert "No cart with id" in text_of(foreign)
            assert foreign.structured_content is None
        # Deleting is idempotent, so "not yours" answers like "already gone": deleted false, same text.
        foreign_delete = await call_ok(bob, "cart_delete", {"cart_id": alices_cart})
        unknown_delete = await call_ok(bob, "cart_delete", {"cart_id": made_up})
        assert foreign_delete == {"cart_id": alices_cart, "deleted": False}
        assert unknown_delete == {"cart_id": made_up, "deleted": False}
        assert alices_cart not in str((await call_ok(bob, "cart_list"))["carts"])

    async with mcp_client("alice") as alice:
        cart = await call_ok(alice, "cart_view", {"cart_id": alices_cart})
    assert (cart["version"], cart["items"][0]["quantity"]) == (2, 1)


# What a client may assume about each tool before calling it (MCP tool annotations; absent hints default to
# the cautious value, so every one is spelled out). Only the connection tools reach outside Coatcheck.
HINTS = {
    # tool: (readOnly, destructive, idempotent, openWorld)
    "catalog_search": (True, None, True, False),
    "cart_create": (False, False, False, False),
    "cart_set_item": (False, False, True, False),
    "cart_view": (True, None, True, False),
    "cart_list": (True, None, True, False),
    "cart_delete": (False, True, True, False),
    "cart_checkout": (False, False, True, False),
    "order_view": (True, None, True, False),
    "order_list": (True, None, True, False),
    "connection_list": (True, None, True, False),
    "connection_whoami": (True, None, True, True),
    "connection_disconnect": (False, True, True, True),
}


async def test_every_tool_advertises_whether_it_writes_destroys_repeats_safely_and_reaches_outside(
    mcp_client: McpClientFactory,
) -> None:
    async with mcp_client() as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(tools) == set(HINTS)
    for name, tool in tools.items():
        hints = tool.annotations
        assert hints is not None, name
        advertised = (hints.read_only_hint, hints.destructive_hint, hints.idempotent_hint, hints.open_world_hint)
        assert advertised == HINTS[name], name
