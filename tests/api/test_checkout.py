"""Checkout in two rounds, end to end: the official SDK client (its automatic MRTR loop and the manual one),
raw JSON-RPC where the client would hide the behaviour, PostgreSQL. The app runs in-process (``create_app``)
except where another instance is the point: those rounds cross real ``coatcheck serve`` processes."""

import asyncio
import secrets
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client, MCPError
from mcp.types import (
    CallToolResult,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitResult,
    InputRequiredResult,
    InputResponses,
)
from sqlalchemy import func, select

from store.db import Database
from store.models import Order, table_of
from tests.support.auth_mode import McpTokens
from tests.support.catalog_cli import coatcheck
from tests.support.inprocess import InProcessApp, settings_from, started_app
from tests.support.mcp_client import McpClientFactory, call_ok, connect, text_of
from tests.support.mrtr import ScriptedUser, another_instance, confirms, flip_one_character
from tests.support.server import RunningServer
from tests.support.waiting import eventually
from tests.support.wire import post_async, response_message

INVALID_STATE = "Invalid or expired requestState"
CANCELLED = "Checkout cancelled."


async def _cart(client: Client, lines: dict[str, int]) -> str:
    cart_id: str = (await call_ok(client, "cart_create"))["cart_id"]
    for sku, quantity in lines.items():
        await call_ok(client, "cart_set_item", {"cart_id": cart_id, "sku": sku, "quantity": quantity})
    return cart_id


async def _round_one(client: Client, cart_id: str) -> InputRequiredResult:
    """Round 1 through the manual loop, so the test holds the sealed state."""
    first = await client.session.call_tool("cart_checkout", {"cart_id": cart_id}, allow_input_required=True)
    assert isinstance(first, InputRequiredResult), first
    assert first.request_state is not None
    return first


async def _final_round(
    client: Client, cart_id: str, state: str | None, answer: ElicitResult | None = None, tool: str = "cart_checkout"
) -> CallToolResult | InputRequiredResult:
    responses: InputResponses = {"confirm": answer if answer is not None else confirms(True)}
    return await client.session.call_tool(
        tool, {"cart_id": cart_id}, input_responses=responses, request_state=state, allow_input_required=True
    )


@asynccontextmanager
async def _asked(
    mcp_client: McpClientFactory, lines: dict[str, int], username: str | None = None
) -> AsyncIterator[tuple[Client, str, InputRequiredResult]]:
    """A client whose user would confirm, a cart holding ``lines``, and round 1 of checking that cart out."""
    async with mcp_client(username, elicitation_callback=ScriptedUser(confirms(True))) as client:
        cart_id = await _cart(client, lines)
        yield client, cart_id, await _round_one(client, cart_id)


def _status_and_total(result: CallToolResult | InputRequiredResult) -> tuple[str, int]:
    """The outcome of a round that finished instead of asking again: its status and total."""
    assert isinstance(result, CallToolResult), result
    assert result.structured_content is not None, text_of(result)
    return result.structured_content["status"], result.structured_content["total_cents"]


async def _assert_state_refused(
    client: Client, cart_id: str, state: str | None, *, tool: str = "cart_checkout"
) -> None:
    """A confirming final round with ``state`` is refused as a protocol error before ``tool`` runs."""
    with pytest.raises(MCPError) as caught:
        await _final_round(client, cart_id, state, tool=tool)
    assert (caught.value.code, caught.value.message) == (-32602, INVALID_STATE), tool


def _question(result: InputRequiredResult) -> ElicitRequestFormParams:
    assert result.input_requests is not None
    assert list(result.input_requests) == ["confirm"]
    request = result.input_requests["confirm"]
    assert isinstance(request, ElicitRequest)
    assert isinstance(request.params, ElicitRequestFormParams)
    return request.params


async def _orders_for(database: Database, cart_id: str) -> int:
    orders = table_of(Order)
    async with database.transaction() as conn:
        count = await conn.scalar(select(func.count()).select_from(orders).where(orders.c.cart_handle == cart_id))
    return int(count or 0)


async def _status(client: Client, cart_id: str) -> tuple[str, int]:
    cart = await call_ok(client, "cart_view", {"cart_id": cart_id})
    return cart["status"], cart["version"]


# --- the round trip -------------------------------------------------------------------------------------------


async def test_the_sdk_client_confirms_through_its_elicitation_callback_and_the_order_is_placed(
    mcp_client: McpClientFactory, database: Database
) -> None:
    user = ScriptedUser(confirms(True))
    async with mcp_client(elicitation_callback=user) as client:
        cart_id = await _cart(client, {"scarf-cashmere": 2, "hat-beanie": 1})
        result = await client.call_tool("cart_checkout", {"cart_id": cart_id})
        assert not result.is_error, text_of(result)
        placed = result.structured_content
        assert placed is not None
        assert placed == {"order_id": placed["order_id"], "total_cents": 14800, "currency": "USD", "status": "placed"}
        assert placed["order_id"].startswith("ord_")
        assert text_of(result) == f"Order {placed['order_id']} placed: total USD 148.00."

        [question] = user.questions
        assert question.message == "Place the order? 3 items, total USD 148.00."
        assert question.requested_schema["properties"]["confirm"]["type"] == "boolean"
        assert question.requested_schema["required"] == ["confirm"]
        assert all(
            prop["type"] in {"boolean", "string", "number", "integer"}
            for prop in question.requested_schema["properties"].values()
        )

        assert await _status(client, cart_id) == ("checked_out", 4)
        change = await client.call_tool("cart_set_item", {"cart_id": cart_id, "sku": "hat-beanie", "quantity": 5})
        assert change.is_error
        assert "checked out and can no longer be changed" in text_of(change)

        order = await call_ok(client, "order_view", {"order_id": placed["order_id"]})
        assert (order["cart_id"], order["status"], order["item_count"], order["total_cents"]) == (
            cart_id,
            "placed",
            3,
            14800,
        )
        assert [(i["sku"], i["quantity"], i["unit_price_cents"]) for i in order["items"]] == [
            ("hat-beanie", 1, 1800),
            ("scarf-cashmere", 2, 6500),
        ]
        listed = (await call_ok(client, "order_list"))["orders"]
        assert [(o["order_id"], o["item_count"], o["total_cents"]) for o in listed] == [(placed["order_id"], 3, 14800)]
    assert await _orders_for(database, cart_id) == 1


async def test_round_one_asks_with_a_sealed_state_and_writes_nothing(
    mcp_client: McpClientFactory, database: Database
) -> None:
    async with _asked(mcp_client, {"gloves-leather": 1}) as (client, cart_id, first):
        assert _question(first).message == "Place the order? 1 item, total USD 42.00."
        assert first.request_state is not None
        assert first.request_state.startswith("v1.")
        assert "nonce" not in first.request_state
        assert str(4200) not in first.request_state
        assert await _status(client, cart_id) == ("open", 2)
    assert await _orders_for(database, cart_id) == 0


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(ElicitResult(action="decline"), id="decline"),
        pytest.param(ElicitResult(action="cancel"), id="cancel"),
        pytest.param(confirms(False), id="confirm-false"),
        pytest.param(confirms("true"), id="confirm-as-string"),
        pytest.param(ElicitResult(action="accept"), id="accept-without-content"),
        pytest.param(ElicitResult(action="accept", content={"other": True}), id="accept-without-confirm"),
    ],
)
async def test_anything_but_accept_with_confirm_true_cancels_and_writes_nothing(
    mcp_client: McpClientFactory, database: Database, answer: ElicitResult
) -> None:
    user = ScriptedUser(answer)
    async with mcp_client(elicitation_callback=user) as client:
        cart_id = await _cart(client, {"hat-beanie": 2})
        result = await client.call_tool("cart_checkout", {"cart_id": cart_id})
        assert not result.is_error
        assert text_of(result) == CANCELLED
        assert result.structured_content == {
            "order_id": None,
            "total_cents": 3600,
            "currency": "USD",
            "status": "cancelled",
        }
        assert len(user.questions) == 1
        assert await _status(client, cart_id) == ("open", 2)
    assert await _orders_for(database, cart_id) == 0


async def test_a_retry_without_an_answer_cancels(mcp_client: McpClientFactory, database: Database) -> None:
    async with _asked(mcp_client, {"hat-beanie": 1}) as (client, cart_id, first):
        for responses in ({}, {"something_else": confirms(True)}):
            result = await client.session.call_tool(
                "cart_checkout",
                {"cart_id": cart_id},
                input_responses=responses,  # type: ignore[arg-type]
                request_state=first.request_state,
                allow_input_required=True,
            )
            assert isinstance(result, CallToolResult)
            assert text_of(result) == CANCELLED
    assert await _orders_for(database, cart_id) == 0


async def test_an_empty_cart_is_a_tool_error_that_says_to_add_items_first(mcp_client: McpClientFactory) -> None:
    user = ScriptedUser(confirms(True))
    async with mcp_client(elicitation_callback=user) as client:
        cart_id = await _cart(client, {})
        result = await client.call_tool("cart_checkout", {"cart_id": cart_id})
    assert result.is_error
    assert text_of(result).endswith("The cart is empty; add items with cart_set_item first, then check out.")
    assert user.questions == []


async def test_a_cart_changed_between_the_rounds_is_asked_again_with_the_new_total(
    mcp_client: McpClientFactory, database: Database
) -> None:
    async with _asked(mcp_client, {"hat-beanie": 1}, "shared-cart-user") as (client, cart_id, first):
        # Another agent of the same user edits the cart while the user reads the question.
        await call_ok(client, "cart_set_item", {"cart_id": cart_id, "sku": "hat-beanie", "quantity": 3})
        again = await _final_round(client, cart_id, first.request_state)
        assert isinstance(again, InputRequiredResult)
        assert _question(again).message == (
            "Your cart changed since you were asked. Place the order now? 3 items, total USD 54.00."
        )
        assert again.request_state not in {None, first.request_state}
        assert await _orders_for(database, cart_id) == 0

        placed = await _final_round(client, cart_id, again.request_state)
        assert _status_and_total(placed) == ("placed", 5400)
    assert await _orders_for(database, cart_id) == 1


async def test_a_price_changed_through_the_catalog_import_between_the_rounds_is_asked_again(
    mcp_client: McpClientFactory, database: Database, database_url: str, tmp_path: Path
) -> None:
    sku = f"import-{uuid.uuid4().hex[:10]}"
    catalog = tmp_path / "catalog.csv"

    def import_price(cents: int) -> str:
        # Only this test's sku, and no --retire-missing: the rest of the shared catalog is left alone.
        catalog.write_text(f"sku,name,unit_price_cents,currency\n{sku},Imported umbrella,{cents},USD\n")
        done = coatcheck("catalog", "import", str(catalog), database_url=database_url)
        assert done.returncode == 0, done.stderr.decode()
        return done.stdout.decode().splitlines()[0]

    assert import_price(1000).startswith("added 1, changed 0,")
    async with _asked(mcp_client, {sku: 2}) as (client, cart_id, first):
        assert _question(first).message == "Place the order? 2 items, total USD 20.00."
        assert import_price(1250).startswith("added 0, changed 1,")  # the cart's version stays as it was
        again = await _final_round(client, cart_id, first.request_state)
        assert isinstance(again, InputRequiredResult)
        assert _question(again).message == (
            "Your cart changed since you were asked. Place the order now? 2 items, total USD 25.00."
        )
        assert await _orders_for(database, cart_id) == 0
        placed = await _final_round(client, cart_id, again.request_state)
        assert _status_and_total(placed) == ("placed", 2500)


async def test_the_sdk_loop_shows_the_user_the_new_total_when_the_cart_changes_mid_checkout(
    mcp_client: McpClientFactory,
) -> None:
    async with mcp_client("busy-user") as editor:
        cart_id = await _cart(editor, {"brush-lint": 1})

        class EditsOnceThenConfirms(ScriptedUser):
            async def __call__(self, context: Any, params: Any) -> ElicitResult:
                answer = await super().__call__(context, params)
                if len(self.questions) == 1:
                    await call_ok(editor, "cart_set_item", {"cart_id": cart_id, "sku": "brush-lint", "quantity": 2})
                return answer

        user = EditsOnceThenConfirms(confirms(True))
        async with mcp_client("busy-user", elicitation_callback=user) as client:
            result = await client.call_tool("cart_checkout", {"cart_id": cart_id})
    assert _status_and_total(result) == ("placed", 1400)
    assert [q.message for q in user.questions] == [
        "Place the order? 1 item, total USD 7.00.",
        "Your cart changed since you were asked. Place the order now? 2 items, total USD 14.00.",
    ]


# --- single use and exactly once ---------------------------------------------------------------------------------


async def test_replaying_the_completed_final_round_returns_the_same_order_and_creates_no_other(
    mcp_client: McpClientFactory, database: Database
) -> None:
    async with _asked(mcp_client, {"coat-rain-yellow": 1}) as (client, cart_id, first):
        placed = await _final_round(client, cart_id, first.request_state)
        replayed = await _final_round(client, cart_id, first.request_state)  # e.g. the response was lost
        assert isinstance(placed, CallToolResult)
        assert isinstance(replayed, CallToolResult)
        assert not replayed.is_error
        assert replayed.structured_content == placed.structured_content
        assert text_of(replayed) == text_of(placed)
    assert await _orders_for(database, cart_id) == 1


async def test_the_spent_state_with_a_different_answer_is_refused_naming_the_order(
    mcp_client: McpClientFactory, database: Database
) -> None:
    async with _asked(mcp_client, {"coat-rain-yellow": 1}) as (client, cart_id, first):
        placed = await _final_round(client, cart_id, first.request_state)
        assert isinstance(placed, CallToolResult)
        assert placed.structured_content is not None
        order_id = placed.structured_content["order_id"]
        for answer in (ElicitResult(action="decline"), confirms(False)):
            reused = await _final_round(client, cart_id, first.request_state, answer)
            assert isinstance(reused, CallToolResult)
            assert reused.is_error
            assert text_of(reused).endswith(
                f"This confirmation was already used to place order {order_id} and cannot be used again; "
                "use order_view to see the order."
            )
    assert await _orders_for(database, cart_id) == 1


async def test_concurrent_identical_final_rounds_produce_one_order_and_every_caller_gets_it(
    mcp_client: McpClientFactory, database: Database
) -> None:
    async with _asked(mcp_client, {"coat-wool-navy": 1, "umbrella-compact": 2}) as (client, cart_id, first):
        results = await asyncio.gather(*(_final_round(client, cart_id, first.request_state) for _ in range(6)))
    assert all(isinstance(r, CallToolResult) and not r.is_error for r in results)
    contents = {str(r.structured_content) for r in results if isinstance(r, CallToolResult)}
    assert len(contents) == 1
    assert await _orders_for(database, cart_id) == 1


async def test_two_confirmations_of_one_cart_racing_place_one_order_and_the_other_is_told_which(
    mcp_client: McpClientFactory, database: Database
) -> None:
    async with mcp_client(elicitation_callback=ScriptedUser(confirms(True))) as client:
        cart_id = await _cart(client, {"scarf-cashmere": 1})
        states = [(await _round_one(client, cart_id)).request_state for _ in range(3)]
        assert len(set(states)) == 3
        results = await asyncio.gather(*(_final_round(client, cart_id, state) for state in states))
    finals = [r for r in results if isinstance(r, CallToolResult)]
    assert len(finals) == 3
    winners = [r.structured_content for r in finals if not r.is_error]
    assert len(winners) == 1
    assert winners[0] is not None
    order_id = winners[0]["order_id"]
    refusals = {text_of(r).removeprefix("Error executing tool cart_checkout: ") for r in finals if r.is_error}
    assert refusals == {
        f"This cart is already checked out (order {order_id}); use order_view to see the order, "
        "or cart_create to start a new cart."
    }
    assert await _orders_for(database, cart_id) == 1


# --- requestState protection -----------------------------------------------------------------------------------


async def test_a_tampered_state_is_rejected_before_the_tool_runs(
    mcp_client: McpClientFactory,
    database: Database,
    app_http: httpx2.AsyncClient,
    app: InProcessApp,
    mcp_token: McpTokens,
) -> None:
    username = f"tamper-{uuid.uuid4().hex[:6]}"
    async with _asked(mcp_client, {"hat-beanie": 1}, username) as (client, cart_id, first):
        assert first.request_state is not None
        tampered = flip_one_character(first.request_state)
        assert tampered != first.request_state
        await _assert_state_refused(client, cart_id, tampered)

    token = await mcp_token(username, resource=app.mcp_url, transport=app.transport())
    params = {
        "name": "cart_checkout",
        "arguments": {"cart_id": cart_id},
        "inputResponses": {"confirm": {"action": "accept", "content": {"confirm": True}}},
        "requestState": tampered,
    }
    response = await post_async(
        app_http, app.mcp_url, "tools/call", params, token=token, capabilities={"elicitation": {}}
    )
    assert response.status_code == 400
    error = response_message(response)["error"]
    assert error == {"code": -32602, "message": INVALID_STATE, "data": {"reason": "invalid_request_state"}}
    assert await _orders_for(database, cart_id) == 0


async def test_another_principal_replaying_the_state_is_rejected(
    mcp_client: McpClientFactory, database: Database
) -> None:
    async with mcp_client("alice", elicitation_callback=ScriptedUser(confirms(True))) as alice:
        cart_id = await _cart(alice, {"hat-beanie": 1})
        first = await _round_one(alice, cart_id)
    async with mcp_client("bob", elicitation_callback=ScriptedUser(confirms(True))) as bob:
        await _assert_state_refused(bob, cart_id, first.request_state)
    assert await _orders_for(database, cart_id) == 0


async def test_the_state_is_bound_to_cart_checkout_and_to_its_cart(
    mcp_client: McpClientFactory, database: Database
) -> None:
    async with mcp_client(elicitation_callback=ScriptedUser(confirms(True))) as client:
        cart_id = await _cart(client, {"hat-beanie": 1})
        other_cart = await _cart(client, {"hat-beanie": 1})
        first = await _round_one(client, cart_id)
        for tool, arguments in [("cart_checkout", other_cart), ("cart_view", cart_id), ("cart_delete", cart_id)]:
            await _assert_state_refused(client, arguments, first.request_state, tool=tool)
        assert await _status(client, cart_id) == ("open", 2)
        assert await _status(client, other_cart) == ("open", 2)
    assert await _orders_for(database, cart_id) == await _orders_for(database, other_cart) == 0


async def test_an_expired_state_is_rejected_and_places_nothing(
    server_env: dict[str, str], mcp_token: McpTokens, app: InProcessApp, database: Database
) -> None:
    token = await mcp_token(f"slow-{uuid.uuid4().hex[:6]}", resource=app.mcp_url, transport=app.transport())
    short_lived_settings = settings_from({**server_env, "REQUEST_STATE_TTL_SECONDS": "3"})
    user = ScriptedUser(confirms(True))
    async with (
        started_app(short_lived_settings) as short_lived,
        short_lived.mcp_client(token, elicitation_callback=user) as client,
    ):
        cart_id = await _cart(client, {"hat-beanie": 1})
        first = await _round_one(client, cart_id)
        outcomes: list[CallToolResult | MCPError] = []

        async def rejected() -> bool:
            # A declining retry writes nothing, so it can probe the state until it expires.
            try:
                result = await _final_round(client, cart_id, first.request_state, ElicitResult(action="decline"))
            except MCPError as exc:
                outcomes.append(exc)
                return True
            assert isinstance(result, CallToolResult)
            outcomes.append(result)
            return False

        await eventually(rejected, within=20, what="the 3-second requestState to expire")
        *before, expired = outcomes
        assert isinstance(expired, MCPError)
        assert (expired.code, expired.message) == (-32602, INVALID_STATE)
        assert before, "the state should have been accepted before it expired"
        assert {text_of(r) for r in before if isinstance(r, CallToolResult)} == {CANCELLED}
        await _assert_state_refused(client, cart_id, first.request_state)
    assert await _orders_for(database, cart_id) == 0


# --- any instance, key rotation ----------------------------------------------------------------------------------


async def test_round_one_on_one_instance_and_round_two_on_another_places_the_order(
    server_env: dict[str, str], public_url: str, mcp_token: McpTokens, server: RunningServer, database: Database
) -> None:
    token = await mcp_token(f"roamer-{uuid.uuid4().hex[:6]}", resource=server.mcp_url)
    user = ScriptedUser(confirms(True))
    with another_instance(server_env, public_url=public_url) as second:
        assert second.base_url != server.base_url
        async with connect(server.mcp_url, token, elicitation_callback=user) as on_first:
            cart_id = await _cart(on_first, {"gloves-leather": 2})
            first = await _round_one(on_first, cart_id)
        async with connect(second.mcp_url, token, elicitation_callback=user) as on_second:
            placed = await _final_round(on_second, cart_id, first.request_state)
            assert _status_and_total(placed) == ("placed", 8400)
        async with connect(server.mcp_url, token, elicitation_callback=user) as on_first:
            replayed = await _final_round(on_first, cart_id, first.request_state)
            assert isinstance(placed, CallToolResult)
            assert isinstance(replayed, CallToolResult)
            assert replayed.structured_content == placed.structured_content
    assert await _orders_for(database, cart_id) == 1


async def test_a_state_sealed_under_the_old_key_is_accepted_after_rotating_to_new_old(
    server_env: dict[str, str], mcp_token: McpTokens, app: InProcessApp, database: Database
) -> None:
    old, new = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    token = await mcp_token(f"rotating-{uuid.uuid4().hex[:6]}", resource=app.mcp_url, transport=app.transport())
    user = ScriptedUser(confirms(True))
    before_settings = settings_from({**server_env, "REQUEST_STATE_KEYS": old})
    async with started_app(before_settings) as before, before.mcp_client(token, elicitation_callback=user) as client:
        cart_id = await _cart(client, {"hanger-cedar": 3})
        first = await _round_one(client, cart_id)
    after_settings = settings_from({**server_env, "REQUEST_STATE_KEYS": f"{new},{old}"})
    async with started_app(after_settings) as after, after.mcp_client(token, elicitation_callback=user) as client:
        placed = await _final_round(client, cart_id, first.request_state)
    assert _status_and_total(placed) == ("placed", 2700)
    assert await _orders_for(database, cart_id) == 1

    # The session's app never held `old`: the same state means nothing to it.
    async with app.mcp_client(token, elicitation_callback=user) as client:
        await _assert_state_refused(client, cart_id, first.request_state)


# --- clients that cannot take part --------------------------------------------------------------------------------


async def test_a_client_without_form_elicitation_gets_missing_capability_not_a_form(
    mcp_client: McpClientFactory,
    database: Database,
    app_http: httpx2.AsyncClient,
    app: InProcessApp,
    mcp_token: McpTokens,
) -> None:
    username = f"formless-{uuid.uuid4().hex[:6]}"
    async with mcp_client(username) as client:  # no elicitation callback: no elicitation capability declared
        cart_id = await _cart(client, {"hat-beanie": 1})
        with pytest.raises(MCPError) as caught:
            await client.session.call_tool("cart_checkout", {"cart_id": cart_id}, allow_input_required=True)
    assert caught.value.code == -32021
    assert caught.value.data == {"requiredCapabilities": {"elicitation": {"form": {}}}}

    token = await mcp_token(username, resource=app.mcp_url, transport=app.transport())
    no_form: list[dict[str, Any]] = [{}, {"elicitation": {"url": {}}}, {"sampling": {}}]
    for capabilities in no_form:
        params = {"name": "cart_checkout", "arguments": {"cart_id": cart_id}}
        response = await post_async(app_http, app.mcp_url, "tools/call", params, token=token, capabilities=capabilities)
        assert response.status_code == 400, capabilities
        error = response_message(response)["error"]
        assert error["code"] == -32021
        assert isinstance(error["data"]["requiredCapabilities"]["elicitation"], dict)
        assert "inputRequests" not in response.text
    for capabilities in ({"elicitation": {}}, {"elicitation": {"form": {}}}):
        params = {"name": "cart_checkout", "arguments": {"cart_id": cart_id}}
        response = await post_async(app_http, app.mcp_url, "tools/call", params, token=token, capabilities=capabilities)
        result = response_message(response)["result"]
        assert result["resultType"] == "input_required"
        assert result["inputRequests"]["confirm"]["params"]["mode"] == "form"
    assert await _orders_for(database, cart_id) == 0


async def test_a_legacy_client_keeps_the_cart_tools_and_gets_a_clear_error_from_checkout(
    mcp_client: McpClientFactory, database: Database
) -> None:
    user = ScriptedUser(confirms(True))
    async with mcp_client(mode="legacy", elicitation_callback=user) as client:
        assert client.protocol_version == "2025-11-25"
        cart_id = await _cart(client, {"hat-beanie": 2})
        result = await asyncio.wait_for(client.call_tool("cart_checkout", {"cart_id": cart_id}), timeout=15)
        assert result.is_error
        assert "needs an MCP client that speaks protocol 2026-07-28" in text_of(result)
        assert "this client speaks 2025-11-25" in text_of(result)
        assert await _status(client, cart_id) == ("open", 2)
    assert user.questions == []  # never a pushed elicitation
    assert await _orders_for(database, cart_id) == 0


# --- order tools ----------------------------------------------------------------------------------------------------


async def test_another_principal_cannot_see_an_order_and_gets_the_made_up_handle_error(
    mcp_client: McpClientFactory,
) -> None:
    made_up = "ord_" + "Z" * 32
    async with mcp_client("order-owner", elicitation_callback=ScriptedUser(confirms(True))) as owner:
        cart_id = await _cart(owner, {"hat-beanie": 1})
        placed = await owner.call_tool("cart_checkout", {"cart_id": cart_id})
        assert placed.structured_content is not None
        order_id = placed.structured_content["order_id"]
    async with mcp_client("order-snoop", elicitation_callback=ScriptedUser(confirms(True))) as snoop:
        foreign = await snoop.call_tool("order_view", {"order_id": order_id})
        unknown = await snoop.call_tool("order_view", {"order_id": made_up})
        assert foreign.is_error
        assert unknown.is_error
        assert text_of(foreign).replace(order_id, "<id>") == text_of(unknown).replace(made_up, "<id>")
        assert text_of(unknown).endswith(
            f"No order with id '{made_up}' exists for you; use order_list to see your orders."
        )
        assert order_id not in str(await call_ok(snoop, "order_list"))
        checkout = await snoop.call_tool("cart_checkout", {"cart_id": cart_id})
        assert checkout.is_error
        assert "No cart with id" in text_of(checkout)
