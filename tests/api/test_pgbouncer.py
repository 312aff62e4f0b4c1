"""Coatcheck behind a real transaction-pooling PgBouncer (Debian's 1.18) with ``DB_POOLER_MODE=transaction``.

PgBouncer runs with its stock settings (no ``ignore_startup_parameters``), so a client that put
``statement_timeout`` in its startup packet would be refused outright; and 1.18 does not track
prepared statements, so anything that relied on a statement surviving past its transaction fails.
"""

import asyncio
import uuid
from collections.abc import Iterator

import asyncpg  # type: ignore[import-untyped]
import pytest
from mcp import Client
from sqlalchemy import text
from sqlalchemy.engine import make_url

from store.db import Database
from store.errors import Unavailable
from tests.support.auth_mode import McpTokens
from tests.support.mcp_client import call_ok, connect, text_of
from tests.support.mrtr import ScriptedUser, another_instance, confirms
from tests.support.pgbouncer import RunningPgBouncer, run_pgbouncer
from tests.support.server import RunningServer

CLIENTS = 8
STATEMENT_TIMEOUT_MS = 3000
LOCK_TIMEOUT_MS = 500


@pytest.fixture(scope="module")
def pgbouncer(database_url: str) -> Iterator[RunningPgBouncer]:
    with run_pgbouncer(database_url, pool_mode="transaction", pool_size=4) as running:
        yield running


@pytest.fixture(scope="module")
def pooled_server(server_env: dict[str, str], public_url: str, pgbouncer: RunningPgBouncer) -> Iterator[RunningServer]:
    """``coatcheck serve`` whose every database connection goes through PgBouncer."""
    with another_instance(
        server_env,
        public_url=public_url,
        DATABASE_URL=pgbouncer.url,
        DB_POOLER_MODE="transaction",
        DB_POOL_SIZE="6",
        DB_STATEMENT_TIMEOUT_MS=str(STATEMENT_TIMEOUT_MS),
        DB_LOCK_TIMEOUT_MS=str(LOCK_TIMEOUT_MS),
    ) as running:
        yield running


async def _shopper(client: Client) -> int:
    """One pass over every cart tool, both checkout rounds and the order tools; returns the HTTP requests made."""
    cart_id = (await call_ok(client, "cart_create"))["cart_id"]
    await call_ok(client, "catalog_search", {"query": "hat"})
    await call_ok(client, "cart_set_item", {"cart_id": cart_id, "sku": "scarf-cashmere", "quantity": 2})
    await call_ok(client, "cart_set_item", {"cart_id": cart_id, "sku": "hat-beanie", "quantity": 3})
    cart = await call_ok(client, "cart_set_item", {"cart_id": cart_id, "sku": "hat-beanie", "quantity": 1})
    assert (cart["version"], cart["total_cents"]) == (4, 2 * 6500 + 1800)
    assert await call_ok(client, "cart_view", {"cart_id": cart_id}) == cart
    assert cart_id in [c["cart_id"] for c in (await call_ok(client, "cart_list"))["carts"]]
    placed = await call_ok(client, "cart_checkout", {"cart_id": cart_id})  # round 1, the form, round 2
    assert (placed["status"], placed["total_cents"]) == ("placed", 14800)
    order = await call_ok(client, "order_view", {"order_id": placed["order_id"]})
    assert order["cart_id"] == cart_id
    assert placed["order_id"] in [o["order_id"] for o in (await call_ok(client, "order_list"))["orders"]]
    spare = (await call_ok(client, "cart_create"))["cart_id"]
    assert (await call_ok(client, "cart_delete", {"cart_id": spare}))["deleted"] is True
    return 13


async def test_every_cart_tool_and_checkout_work_through_a_transaction_pooling_pgbouncer_under_concurrency(
    pooled_server: RunningServer, mcp_token: McpTokens, public_url: str
) -> None:
    async def session(n: int) -> int:
        token = await mcp_token(f"pooled-{n}-{uuid.uuid4().hex[:6]}", resource=f"{public_url}/mcp")
        calls = 0
        async with connect(pooled_server.mcp_url, token, elicitation_callback=ScriptedUser(confirms(True))) as client:
            for _ in range(3):
                calls += await _shopper(client)
        return calls

    outcomes = await asyncio.gather(*(session(n) for n in range(CLIENTS)), return_exceptions=True)
    failures = [repr(outcome) for outcome in outcomes if isinstance(outcome, BaseException)]
    calls = sum(outcome for outcome in outcomes if isinstance(outcome, int))
    print(f"\nthrough PgBouncer 1.18 (transaction mode): {CLIENTS} clients, {calls} requests, {len(failures)} failed")
    assert failures == [], failures
    assert calls == CLIENTS * 3 * 13
    log = pooled_server.log_text_so_far()
    assert "prepared statement" not in log
    assert "Traceback" not in log


async def test_a_lock_wait_behind_the_pooler_ends_at_lock_timeout_with_a_tool_error_and_changes_nothing(
    pooled_server: RunningServer, mcp_token: McpTokens, public_url: str, database_url: str
) -> None:
    token = await mcp_token(f"locked-{uuid.uuid4().hex[:6]}", resource=f"{public_url}/mcp")
    async with connect(pooled_server.mcp_url, token) as client:
        cart_id = (await call_ok(client, "cart_create"))["cart_id"]
        direct = await asyncpg.connect(make_url(database_url).set(drivername="postgresql").render_as_string(False))
        try:
            async with direct.transaction():
                await direct.execute("SELECT 1 FROM cart WHERE handle = $1 FOR UPDATE", cart_id)
                blocked = await client.call_tool(
                    "cart_set_item", {"cart_id": cart_id, "sku": "hat-beanie", "quantity": 1}
                )
        finally:
            await direct.close()
        assert blocked.is_error
        assert "did not answer in time (lock_timeout)" in text_of(blocked)
        assert "retry" in text_of(blocked)
        after = await call_ok(client, "cart_view", {"cart_id": cart_id})
        assert (after["version"], after["items"]) == (1, [])
        retried = await call_ok(client, "cart_set_item", {"cart_id": cart_id, "sku": "hat-beanie", "quantity": 1})
        assert retried["version"] == 2


async def test_the_statement_timeout_holds_through_the_pooler_and_never_rides_in_the_startup_packet(
    pgbouncer: RunningPgBouncer,
) -> None:
    database = Database.connect(
        pgbouncer.url, pooler_mode="transaction", pool_size=2, statement_timeout_ms=300, lock_timeout_ms=100
    )
    try:
        with pytest.raises(Unavailable, match=r"did not answer in time \(statement_timeout\)"):
            async with database.one_statement() as conn:
                await conn.execute(text("SELECT pg_sleep(3)"))
        for unit in (database.one_statement, database.transaction):
            async with unit() as conn:
                settings = (
                    await conn.execute(
                        text(
                            "SELECT current_setting('statement_timeout'), current_setting('lock_timeout'), "
                            "current_setting('jit')"
                        )
                    )
                ).one()
            assert tuple(settings) == ("300ms", "100ms", "off")
    finally:
        await database.dispose()
    assert "unsupported startup parameter" not in pgbouncer.log_text()


async def test_a_checkout_through_the_pooler_leaves_no_session_setting_on_the_shared_server_connection(
    server_env: dict[str, str], public_url: str, mcp_token: McpTokens, database_url: str
) -> None:
    # One server connection behind the pooler: whatever a unit of work left on it, the next client gets.
    with (
        run_pgbouncer(database_url, pool_mode="transaction", pool_size=1) as single,
        another_instance(
            server_env, public_url=public_url, DATABASE_URL=single.url, DB_POOLER_MODE="transaction", DB_POOL_SIZE="2"
        ) as server,
    ):
        token = await mcp_token(f"jit-{uuid.uuid4().hex[:6]}", resource=f"{public_url}/mcp")
        async with connect(server.mcp_url, token, elicitation_callback=ScriptedUser(confirms(True))) as client:
            cart_id = (await call_ok(client, "cart_create"))["cart_id"]
            await call_ok(client, "cart_set_item", {"cart_id": cart_id, "sku": "hat-beanie", "quantity": 2})
            placed = await call_ok(client, "cart_checkout", {"cart_id": cart_id})  # round 1, the form, round 2
            assert placed["status"] == "placed"
        direct_url = make_url(database_url).set(drivername="postgresql").render_as_string(False)
        direct = await asyncpg.connect(direct_url)
        try:
            server_default = await direct.fetchval("SHOW jit")
        finally:
            await direct.close()
        other = await asyncpg.connect(
            make_url(single.url).set(drivername="postgresql").render_as_string(False), statement_cache_size=0
        )
        try:
            seen = await other.fetchrow(
                "SELECT current_setting('jit') AS jit, source FROM pg_settings WHERE name = 'jit'"
            )
        finally:
            await other.close()
    assert (seen["jit"], seen["source"]) == (server_default, "default")
