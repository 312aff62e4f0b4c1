"""Retention: ``coatcheck purge`` deletes what no request can use any more, in batches, from several replicas at once.

Each test acts on every row of the tables, so each gets a private migrated database (tests/support/scratch.py).
"""

import asyncio
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from datetime import timedelta

import pytest
from sqlalchemy import Table, func, insert, select, text, update

from api.commands.purge import RetentionPolicy, purge
from store.audit import AuditRepository
from store.browser_sessions import BrowserSessionRepository, session_digest
from store.carts import CartRepository
from store.crypto import TokenCipher
from store.db import Database
from store.demo import seed_demo_catalog
from store.flows import FlowRepository
from store.models import AuditEvent, BrowserSession, Cart, CartItem, OAuthFlow, Order, table_of
from store.orders import OrderReceipt, OrderRepository
from store.principal import Principal
from store.retention import purge_batch
from tests.support.scratch import scratch_database
from tests.support.server import run_server
from tests.support.waiting import wait_until

CIPHER = TokenCipher([b"test-purge-key-" + b"p" * 20 + b"-0123456789"])
ALICE = Principal("https://issuer.test", "alice")
POLICY = RetentionPolicy.of(audit_days=90, cart_days=30, request_state_ttl_seconds=600)
SKU = "scarf-cashmere"

_flow, _audit, _cart, _item, _order = (table_of(m) for m in (OAuthFlow, AuditEvent, Cart, CartItem, Order))
_browser = table_of(BrowserSession)


@pytest.fixture
def scratch_url(admin_database_url: str) -> Iterator[str]:
    with scratch_database(admin_database_url) as url:
        yield url


@pytest.fixture
async def scratch(scratch_url: str) -> AsyncIterator[Database]:
    database = Database.connect(scratch_url)
    await seed_demo_catalog(database)
    yield database
    await database.dispose()


async def _age(database: Database, table: Table, column: str, handle_column: str, handle: object, ago: str) -> None:
    async with database.one_statement() as conn:
        await conn.execute(
            update(table)
            .where(getattr(table.c, handle_column) == handle)
            .values({column: func.now() - text(f"interval '{ago}'")})
        )


async def _new_cart(
    database: Database, *, checked_out: bool = False
) -> tuple[str, str | None, Callable[[], Awaitable[OrderReceipt]]]:
    """A cart with one line; checked out when asked. Returns (cart, order, a replay of its confirmation)."""
    nonce = os.urandom(8).hex()
    async with database.transaction() as conn:
        carts = CartRepository(conn)
        handle = await carts.create(ALICE)
        await carts.set_item(ALICE, handle, SKU, 2)
    async with database.one_statement() as conn:
        quote = await OrderRepository(conn).quote(ALICE, handle)

    async def confirm() -> OrderReceipt:
        async with database.transaction() as conn:
            placed = await OrderRepository(conn).place(ALICE, quote, nonce=nonce)
            assert isinstance(placed, OrderReceipt), placed
            return placed

    order = (await confirm()).handle if checked_out else None
    return handle, order, confirm


async def _remaining(database: Database, table: Table, column: str, values: Sequence[object]) -> set[object]:
    async with database.one_statement() as conn:
        col = getattr(table.c, column)
        return set((await conn.execute(select(col).where(col.in_(values)))).scalars())


async def test_purge_deletes_only_what_no_request_can_use_and_orders_outlive_their_carts(scratch: Database) -> None:
    async with scratch.transaction() as conn:
        flows = FlowRepository(conn, CIPHER)
        long_expired = await flows.begin(ALICE, "demo", ttl=timedelta(minutes=10))
        just_expired = await flows.begin(ALICE, "demo", ttl=timedelta(minutes=10))
        finished_long_ago = await flows.begin(ALICE, "demo", ttl=timedelta(minutes=10))
        open_link = await flows.begin(ALICE, "demo", ttl=timedelta(minutes=10))
        await flows.finish(finished_long_ago.handle, "connected")
    await _age(scratch, _flow, "expires_at", "handle", long_expired.handle, "2 hours")
    await _age(scratch, _flow, "expires_at", "handle", finished_long_ago.handle, "1 day")
    # Expired a minute ago: a retried call holding a requestState for it may still arrive.
    await _age(scratch, _flow, "expires_at", "handle", just_expired.handle, "1 minute")

    async with scratch.transaction() as conn:
        for detail in ("old", "recent"):
            await AuditRepository(conn).record(ALICE, "connect", provider="demo", outcome="requested", detail=detail)
    await _age(scratch, _audit, "created_at", "detail", "old", "91 days")
    await _age(scratch, _audit, "created_at", "detail", "recent", "89 days")

    async with scratch.transaction() as conn:
        for session_id in ("expired-long-ago", "expired-just-now", "live"):
            await BrowserSessionRepository(conn).start(session_id, ALICE, lifetime=timedelta(minutes=15))
    await _age(scratch, _browser, "expires_at", "session_digest", session_digest("expired-long-ago"), "1 hour")
    # Dead already, but within the margin for an instance whose clock runs behind the database's.
    await _age(scratch, _browser, "expires_at", "session_digest", session_digest("expired-just-now"), "10 seconds")

    abandoned, _, _ = await _new_cart(scratch)
    active, _, _ = await _new_cart(scratch)
    checked_out, order, replay_confirmation = await _new_cart(scratch, checked_out=True)
    assert order is not None
    for handle in (abandoned, checked_out):
        await _age(scratch, _cart, "updated_at", "handle", handle, "31 days")
    await _age(scratch, _cart, "updated_at", "handle", active, "29 days")

    totals = await purge(scratch, POLICY, batch_size=1)  # one row per batch: the loop, not one lucky statement

    assert totals == {"oauth_flow": 2, "audit_event": 1, "browser_session": 1, "cart": 2, "cart_item": 2}
    handles = [long_expired.handle, just_expired.handle, finished_long_ago.handle, open_link.handle]
    assert await _remaining(scratch, _flow, "handle", handles) == {just_expired.handle, open_link.handle}
    assert await _remaining(scratch, _audit, "detail", ["old", "recent"]) == {"recent"}
    sessions = [session_digest(name) for name in ("expired-long-ago", "expired-just-now", "live")]
    assert await _remaining(scratch, _browser, "session_digest", sessions) == set(sessions[1:])
    assert await _remaining(scratch, _cart, "handle", [abandoned, active, checked_out]) == {active}
    async with scratch.one_statement() as conn:
        placed = await OrderRepository(conn).view(ALICE, order)
    assert placed.cart_handle == checked_out
    assert [(line.sku, line.quantity) for line in placed.items] == [(SKU, 2)]
    # A replayed confirmation of the purged cart's checkout still answers with the same order, once.
    replayed = await replay_confirmation()
    assert replayed.handle == order
    async with scratch.one_statement() as conn:
        assert await conn.scalar(select(func.count()).select_from(_order)) == 1
    assert await purge(scratch, POLICY) == {
        "oauth_flow": 0,
        "audit_event": 0,
        "browser_session": 0,
        "cart": 0,
        "cart_item": 0,
    }


async def test_retention_of_zero_keeps_audit_and_carts_but_never_shortens_the_replay_window() -> None:
    keep = RetentionPolicy.of(audit_days=0, cart_days=0, request_state_ttl_seconds=600)
    assert keep.ages["audit_event"] is None
    assert keep.ages["cart"] is None
    long_replays = RetentionPolicy.of(audit_days=1, cart_days=1, request_state_ttl_seconds=86400)
    # A requestState that lives a day keeps what it may read for longer than a day.
    assert long_replays.ages["cart"] == timedelta(days=1, minutes=1)
    assert long_replays.ages["oauth_flow"] == timedelta(days=1, minutes=1)


async def test_a_batch_skips_rows_another_transaction_holds_instead_of_waiting_for_them(scratch: Database) -> None:
    async with scratch.transaction() as conn:
        for n in range(30):
            await AuditRepository(conn).record(ALICE, "connect", provider="demo", outcome="requested", detail=f"e{n}")
    async with scratch.one_statement() as conn:
        await conn.execute(update(_audit).values(created_at=func.now() - timedelta(days=100)))
    async with scratch.transactional_connection() as holder:
        await holder.begin()
        held, _ = await purge_batch(holder, "audit_event", older_than=timedelta(days=90), limit=10)
        async with asyncio.timeout(5):  # would block until the holder commits without SKIP LOCKED
            async with scratch.one_statement() as conn:
                others, _ = await purge_batch(conn, "audit_event", older_than=timedelta(days=90), limit=100)
        await holder.commit()
    assert (held, others) == (10, 20)


def _purge_process(url: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_RETENTION_DAYS") and k != "DATABASE_URL"}
    return subprocess.Popen(
        [sys.executable, "-m", "api.cli", "purge"],
        env={**env, "DATABASE_URL": url},
        cwd=tempfile.gettempdir(),  # no .env file there: only the variables given here count
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_two_purges_at_once_delete_every_row_exactly_once_without_errors(scratch_url: str) -> None:
    rows = {"audit_event": 20_000, "oauth_flow": 6_000, "browser_session": 2_000, "cart": 3_000}

    async def seed() -> None:
        database = Database.connect(scratch_url)
        try:
            await seed_demo_catalog(database)
            async with database.transaction() as conn:
                await conn.execute(
                    text(
                        "INSERT INTO audit_event (principal_iss, principal_sub, action, outcome, created_at) "
                        "SELECT 'https://issuer.test', 'u' || n, 'connect', 'requested', now() - interval '100 days' "
                        "FROM generate_series(1, :n) AS n"
                    ),
                    {"n": rows["audit_event"]},
                )
                await conn.execute(
                    text(
                        "INSERT INTO oauth_flow (handle, principal_iss, principal_sub, provider, status, expires_at) "
                        "SELECT 'flow_' || lpad(n::text, 32, '0'), 'https://issuer.test', 'u', 'demo', 'pending', "
                        "now() - interval '1 day' FROM generate_series(1, :n) AS n"
                    ),
                    {"n": rows["oauth_flow"]},
                )
                await conn.execute(
                    text(
                        "INSERT INTO browser_session (session_digest, principal_iss, principal_sub, expires_at) "
                        "SELECT sha256(n::text::bytea), 'https://issuer.test', 'u', now() - interval '1 hour' "
                        "FROM generate_series(1, :n) AS n"
                    ),
                    {"n": rows["browser_session"]},
                )
                await conn.execute(
                    text(
                        "INSERT INTO cart (handle, principal_iss, principal_sub, open_slot, updated_at) "
                        "SELECT 'cart_' || lpad(n::text, 32, '0'), 'https://issuer.test', 'u', n, "
                        "now() - interval '40 days' FROM generate_series(1, :n) AS n"
                    ),
                    {"n": rows["cart"]},
                )
                await conn.execute(
                    insert(_item).from_select(
                        ["cart_id", "sku", "quantity"], select(_cart.c.id, text(f"'{SKU}'"), text("1"))
                    )
                )
                # One of each that must stay.
                await conn.execute(
                    text(
                        "INSERT INTO audit_event (principal_iss, principal_sub, action, outcome) "
                        "VALUES ('https://issuer.test', 'keep', 'connect', 'requested')"
                    )
                )
        finally:
            await database.dispose()

    asyncio.run(seed())
    first, second = _purge_process(scratch_url), _purge_process(scratch_url)
    outputs = [process.communicate(timeout=120) for process in (first, second)]
    for process, (out, err) in zip((first, second), outputs, strict=True):
        assert process.returncode == 0, f"{out}\n{err}"
        assert "Traceback" not in err, err
    counts: dict[str, list[int]] = {}
    for out, _ in outputs:
        for table, count in re.findall(r"^(\w+): deleted (\d+)$", out, flags=re.MULTILINE):
            counts.setdefault(table, []).append(int(count))
    print("two concurrent purges deleted:", {table: f"{a} + {b}" for table, (a, b) in counts.items()})
    expected = {**rows, "cart_item": rows["cart"]}
    assert {table: sum(values) for table, values in counts.items()} == expected, counts

    async def left() -> tuple[int, int, int]:
        database = Database.connect(scratch_url)
        try:
            async with database.one_statement() as conn:
                row = (
                    await conn.execute(
                        text(
                            "SELECT (SELECT count(*) FROM audit_event), (SELECT count(*) FROM oauth_flow), "
                            "(SELECT count(*) FROM cart)"
                        )
                    )
                ).one()
            return int(row[0]), int(row[1]), int(row[2])
        finally:
            await database.dispose()

    assert asyncio.run(left()) == (1, 0, 0)


def test_serve_with_purge_every_purges_in_the_background_while_it_serves(
    scratch_url: str, server_env: dict[str, str]
) -> None:
    async def old_entry() -> None:
        database = Database.connect(scratch_url)
        try:
            async with database.transaction() as conn:
                await AuditRepository(conn).record(ALICE, "connect", provider="demo", outcome="requested")
                await conn.execute(update(_audit).values(created_at=func.now() - timedelta(days=365)))
        finally:
            await database.dispose()

    async def entries() -> int:
        database = Database.connect(scratch_url)
        try:
            async with database.one_statement() as conn:
                return int(await conn.scalar(select(func.count()).select_from(_audit)) or 0)
        finally:
            await database.dispose()

    asyncio.run(old_entry())
    env = {**server_env, "DATABASE_URL": scratch_url}
    with run_server(env, extra_args=["--purge-every", "1s"]) as server:
        wait_until(lambda: asyncio.run(entries()) == 0, timeout=30, what="the background purge")
        wait_until(lambda: "purge deleted" in server.log_text(), timeout=10, what="the purge log line")
        assert "audit_event=1" in server.log_text()
        assert "Traceback" not in server.log_text()
