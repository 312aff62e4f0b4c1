"""What an MCP client sees of a database outage: a tool error that says retry, and whether the change happened.

The in-process app (``create_app``) against a scratch database that the test makes read-only
(``default_transaction_read_only``, what a standby enforces) or reaches through a TCP proxy it cuts while
``cart_set_item`` waits on a row lock. Real SDK client, real PostgreSQL, no traceback in the log.
"""

import asyncio
import logging
import uuid
from collections.abc import Iterator

import asyncpg  # type: ignore[import-untyped]
import pytest
from sqlalchemy.engine import make_url

from tests.support.auth_mode import McpTokens
from tests.support.inprocess import settings_from, started_app
from tests.support.mcp_client import call_ok, text_of
from tests.support.mrtr import ScriptedUser, confirms
from tests.support.scratch import scratch_database
from tests.support.tcp_proxy import tcp_proxy
from tests.support.waiting import eventually


@pytest.fixture
def scratch_url(admin_database_url: str) -> Iterator[str]:
    with scratch_database(admin_database_url, prefix="coatcheck_outage", demo_catalog=True) as url:
        yield url


def _dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def _admin(url: str, statement: str) -> None:
    conn = await asyncpg.connect(_dsn(url))
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


@pytest.mark.resource_server_only(
    reason="counts the tool calls' outage lines exactly; in authorization-server mode the server's background "
    "clean-up of expired codes meets the read-only database too and adds its own"
)
async def test_writes_on_a_read_only_database_say_nothing_was_changed_reads_work_and_readyz_is_503(
    server_env: dict[str, str], mcp_token: McpTokens, scratch_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    env = {**server_env, "DATABASE_URL": scratch_url, "METRICS_ENABLED": "true"}
    username = f"ro-{uuid.uuid4().hex[:8]}"
    async with started_app(settings_from(env)) as app:
        token = await mcp_token(username, resource=app.mcp_url, transport=app.transport())
        async with app.mcp_client(token) as client:
            cart = await call_ok(client, "cart_create")
            await call_ok(client, "cart_set_item", {**cart, "sku": "hat-beanie", "quantity": 1})
    name = make_url(scratch_url).database
    await _admin(scratch_url, f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
    read_only = (
        "The database is read-only right now (a failover may be under way); nothing was changed, retry in a moment."
    )
    with caplog.at_level(logging.INFO):
        async with started_app(settings_from(env)) as app, app.http(timeout=10) as http:
            ready = await http.get("/readyz")
            token = await mcp_token(username, resource=app.mcp_url, transport=app.transport())
            async with app.mcp_client(token, elicitation_callback=ScriptedUser(confirms(True))) as client:
                set_item = await client.call_tool("cart_set_item", {**cart, "sku": "hat-beanie", "quantity": 2})
                view = await call_ok(client, "cart_view", cart)  # a standby still answers reads
                checkout = await client.call_tool("cart_checkout", cart)  # round 1 reads; round 2 cannot write
            metrics = (await http.get("/metrics")).text
    assert ready.status_code == 503
    assert ready.json() == {"status": "database read-only"}
    assert set_item.is_error
    assert text_of(set_item) == f"Error executing tool cart_set_item: {read_only}"
    assert [(line["sku"], line["quantity"]) for line in view["items"]] == [("hat-beanie", 1)]
    assert checkout.is_error
    assert text_of(checkout) == f"Error executing tool cart_checkout: {read_only}"
    assert 'coatcheck_db_unavailable_total{cause="read_only"} 2.0' in metrics
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name == "store.db"]
    assert len(warnings) == 2, [r.getMessage() for r in warnings]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], "an outage is no bug"


async def _lock_waits(url: str) -> bool:
    conn = await asyncpg.connect(_dsn(url))
    try:
        return bool(
            await conn.fetchval(
                "SELECT count(*) > 0 FROM pg_stat_activity "
                "WHERE wait_event_type = 'Lock' AND datname = current_database()"
            )
        )
    finally:
        await conn.close()


async def test_cart_set_item_cut_mid_statement_says_it_may_have_been_saved_and_the_same_retry_is_safe(
    server_env: dict[str, str], mcp_token: McpTokens, scratch_url: str
) -> None:
    target = make_url(scratch_url)
    async with tcp_proxy(target.port or 5432) as proxy:
        env = {**server_env, "DATABASE_URL": proxy.url_for(target.database or ""), "DB_LOCK_TIMEOUT_MS": "10000"}
        async with started_app(settings_from(env)) as app:
            token = await mcp_token(f"cut-{uuid.uuid4().hex[:8]}", resource=app.mcp_url, transport=app.transport())
            async with app.mcp_client(token) as client:
                cart = await call_ok(client, "cart_create")
                arguments = {**cart, "sku": "hat-beanie", "quantity": 3}
                # Another session holds the cart row, so the call's statement waits on the server, in flight.
                holder = await asyncpg.connect(_dsn(scratch_url))
                try:
                    locked = holder.transaction()
                    await locked.start()
                    await holder.execute("SELECT 1 FROM cart WHERE handle = $1 FOR UPDATE", cart["cart_id"])
                    call = asyncio.create_task(client.call_tool("cart_set_item", arguments))
                    await eventually(lambda: _lock_waits(scratch_url), within=10, what="cart_set_item to wait")
                    assert proxy.cut() >= 1
                    cut = await call
                    await locked.rollback()  # the orphaned statement gets the row and commits
                finally:
                    await holder.close()
                retried = await call_ok(client, "cart_set_item", arguments)
    assert cut.is_error
    assert text_of(cut) == (
        "Error executing tool cart_set_item: The connection was lost while the change was being made (a failover "
        "or restart may be under way), so the change may or may not have been saved; retry in a moment. Retrying "
        "is safe: cart_set_item sets an absolute quantity, so a repeat has the effect of one call (with "
        "expected_version, a saved first attempt makes the retry a version conflict: cart_view shows the cart)."
    )
    assert [(line["sku"], line["quantity"]) for line in retried["items"]] == [("hat-beanie", 3)]
