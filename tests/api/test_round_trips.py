"""Round trips per tool call as PostgreSQL itself saw them.

The app (in-process, ``create_app``) runs against a private cluster that logs every protocol step (parse, bind, execute,
simple-query statement) with ``log_min_duration_statement = 0``. Its pool has one connection, so every
logged step of a call comes from that one session, and a warm call's log is the whole truth: a driver-level
prepare shows up as a ``parse``, a pool ``ROLLBACK`` on return or a ``BEGIN``/``COMMIT`` as a ``statement``.
"""

import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
from mcp import Client
from mcp.types import CallToolResult, InputRequiredResult
from sqlalchemy import text

from store.carts import CartRepository
from store.db import Database
from store.principal import Principal
from tests.support.auth_mode import McpTokens
from tests.support.inprocess import InProcessApp, settings_from, started_app
from tests.support.mcp_client import call_ok, text_of
from tests.support.mrtr import ScriptedUser, confirms
from tests.support.private_postgres import LoggedMessage, PrivatePostgres, private_postgres
from tests.support.scratch import scratch_database


@pytest.fixture(scope="module")
def logged_cluster() -> Iterator[PrivatePostgres]:
    with private_postgres() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def logged_database_url(logged_cluster: PrivatePostgres) -> Iterator[str]:
    with scratch_database(logged_cluster.url, prefix="coatcheck_logged", demo_catalog=True) as url:
        yield url


@pytest.fixture(scope="module")
async def logged_app(server_env: dict[str, str], logged_database_url: str) -> AsyncIterator[InProcessApp]:
    """The app in-process on the logged cluster: what it sends PostgreSQL does not depend on the socket."""
    env = {**server_env, "DATABASE_URL": logged_database_url, "DB_POOL_SIZE": "1", "MAX_CART_LINES": "2"}
    async with started_app(settings_from(env)) as started:
        yield started


def round_trips(messages: list[LoggedMessage]) -> int:
    """Round trips in DB_POOLER_MODE=none: a named prepare is one, an execution one, a simple query one.

    (A bind travels with its execute in the same exchange.)
    """
    kinds = Counter(message.kind for message in messages)
    return kinds["parse"] + kinds["execute"] + kinds["statement"]


async def _logged(cluster: PrivatePostgres, call: Callable[[], Awaitable[Any]]) -> tuple[Any, list[LoggedMessage]]:
    offset = cluster.log_size()
    result = await call()
    return result, cluster.messages_since(offset)


async def _round_one(client: Client, cart_id: str) -> InputRequiredResult:
    first = await client.session.call_tool("cart_checkout", {"cart_id": cart_id}, allow_input_required=True)
    assert isinstance(first, InputRequiredResult), first
    return first


async def _round_two(client: Client, cart_id: str, state: str | None) -> dict[str, Any]:
    placed = await client.session.call_tool(
        "cart_checkout",
        {"cart_id": cart_id},
        input_responses={"confirm": confirms(True)},
        request_state=state,
        allow_input_required=True,
    )
    assert isinstance(placed, CallToolResult), placed
    assert not placed.is_error, text_of(placed)
    content: dict[str, Any] | None = placed.structured_content
    assert content is not None
    return content


async def _session(client: Client) -> dict[str, Callable[[], Awaitable[Any]]]:
    """One call of each tool (fresh carts where a call consumes one), in the order they are measured."""
    cart_id = (await call_ok(client, "cart_create"))["cart_id"]
    spare = (await call_ok(client, "cart_create"))["cart_id"]
    state: dict[str, Any] = {}

    async def round_one() -> None:
        state["first"] = await _round_one(client, cart_id)

    async def round_two() -> None:
        state["order"] = await _round_two(client, cart_id, state["first"].request_state)

    async def refused() -> None:
        stale = await client.call_tool(
            "cart_set_item", {"cart_id": cart_id, "sku": "hat-beanie", "quantity": 9, "expected_version": 1}
        )
        assert stale.is_error
        assert "version" in text_of(stale)

    async def over_the_cap() -> None:
        refused = await client.call_tool("cart_set_item", {"cart_id": cart_id, "sku": "brush-lint", "quantity": 1})
        assert refused.is_error
        assert text_of(refused) == (
            "Error executing tool cart_set_item: This cart already has 2 lines, the most a cart may hold (2); "
            "remove a line (quantity 0), or put the item in another cart with cart_create."
        )

    return {
        "catalog_search": lambda: call_ok(client, "catalog_search", {"query": "coat"}),
        "cart_create": lambda: call_ok(client, "cart_create"),
        "cart_set_item (add a line)": lambda: call_ok(
            client, "cart_set_item", {"cart_id": cart_id, "sku": "hat-beanie", "quantity": 2}
        ),
        "cart_set_item (change it)": lambda: call_ok(
            client, "cart_set_item", {"cart_id": cart_id, "sku": "hat-beanie", "quantity": 3, "expected_version": 2}
        ),
        "cart_set_item (refused: stale version)": refused,
        "cart_set_item (second line)": lambda: call_ok(
            client, "cart_set_item", {"cart_id": cart_id, "sku": "scarf-cashmere", "quantity": 1}
        ),
        "cart_set_item (refused: MAX_CART_LINES)": over_the_cap,
        "cart_view": lambda: call_ok(client, "cart_view", {"cart_id": cart_id}),
        "cart_list": lambda: call_ok(client, "cart_list"),
        "cart_checkout round 1": round_one,
        "cart_checkout round 2 (consent)": round_two,
        "order_view": lambda: call_ok(client, "order_view", {"order_id": state["order"]["order_id"]}),
        "order_list": lambda: call_ok(client, "order_list"),
        "cart_delete": lambda: call_ok(client, "cart_delete", {"cart_id": spare}),
    }


_PRINCIPAL = Principal(issuer="https://issuer.test", subject=f"rt-{uuid.uuid4().hex[:8]}")

EXPECTED = {
    "catalog_search": 1,
    "cart_create": 1,
    "cart_set_item (add a line)": 1,
    "cart_set_item (change it)": 1,
    "cart_set_item (refused: stale version)": 2,
    "cart_set_item (second line)": 1,
    "cart_set_item (refused: MAX_CART_LINES)": 2,
    "cart_view": 1,
    "cart_list": 1,
    "cart_checkout round 1": 1,
    "cart_checkout round 2 (consent)": 2,
    "order_view": 1,
    "order_list": 1,
    "cart_delete": 1,
}


async def test_each_tool_call_costs_postgresql_the_documented_round_trips_and_nothing_else(
    logged_app: InProcessApp, logged_cluster: PrivatePostgres, mcp_token: McpTokens
) -> None:
    token = await mcp_token(
        f"counted-{uuid.uuid4().hex[:6]}", resource=logged_app.mcp_url, transport=logged_app.transport()
    )
    async with logged_app.mcp_client(token, elicitation_callback=ScriptedUser(confirms(True))) as client:
        for call in (await _session(client)).values():  # warm-up: every statement prepared once
            await call()
        measured: dict[str, list[LoggedMessage]] = {}
        for name, call in (await _session(client)).items():
            _, measured[name] = await _logged(logged_cluster, call)

    counts = {name: round_trips(messages) for name, messages in measured.items()}
    print("\nround trips per call (PostgreSQL's log, DB_POOLER_MODE=none):")
    for name, count in counts.items():
        print(f"  {name:42} {count}")
    assert counts == EXPECTED
    everything = [message for messages in measured.values() for message in messages]
    assert [m for m in everything if m.kind in {"parse", "statement"}] == []  # no re-prepare, BEGIN or ROLLBACK
    assert len({m.pid for m in everything}) == 1  # one pooled session served every call


async def test_transaction_pooler_mode_spends_begin_commit_and_a_parse_per_statement_and_nothing_more(
    logged_cluster: PrivatePostgres, logged_database_url: str
) -> None:
    database = Database.connect(logged_database_url, pooler_mode="transaction", pool_size=1)
    try:
        async with database.autocommit() as conn:
            owner_cart = await CartRepository(conn).create(_PRINCIPAL)
        for _ in range(2):  # the second pass is as warm as this mode gets: nothing is cached

            async def view() -> None:
                async with database.one_statement() as conn:
                    await CartRepository(conn).view(_PRINCIPAL, owner_cart)

            async def write() -> None:
                async with database.autocommit() as conn:
                    await CartRepository(conn).set_item(_PRINCIPAL, owner_cart, "hat-beanie", 1)

            _, viewed = await _logged(logged_cluster, view)
            _, written = await _logged(logged_cluster, write)
        for messages in (viewed, written):
            kinds = [m.kind for m in messages]
            # BEGIN + SET LOCALs in one message; a describe-only parse; parse+bind+execute in one exchange; COMMIT.
            assert kinds == ["statement", "parse", "parse", "bind", "execute", "statement"], messages
            assert messages[0].text.startswith("BEGIN; SET LOCAL statement_timeout = 15000; SET LOCAL lock_timeout")
            assert messages[-1].text == "COMMIT"
        async with database.one_statement() as conn:
            timeout = (await conn.execute(text("SELECT current_setting('statement_timeout')"))).scalar_one()
        assert timeout == "15s"
    finally:
        await database.dispose()
