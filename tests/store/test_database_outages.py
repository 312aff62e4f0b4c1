"""A unit of work under a failing database: every failure is :class:`Unavailable` with the right promise.

Real servers broken for real: a streaming standby (a demoted primary refuses writes with 25006), a TCP proxy
that keeps sessions to the old server or cuts them mid-statement, a terminated backend, a frozen (SIGSTOPped)
server, nothing listening. "Nothing was changed" where nothing can have committed; "may or may not have been
saved" where an autocommit statement was in flight, and the test shows that such a write can indeed land.
Each failure of a lone statement is met both ways a statement runs: through SQLAlchemy's ``execute`` and
compiled once, on the driver (``store.compiled``, what the hot tools run).
"""

import asyncio
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from store.compiled import Compiled, fetch
from store.db import COMMAND_GRACE_SECONDS, ClientBounds, Database
from store.errors import Unavailable
from tests.support.pg_nodes import PgNode, fetchval, primary_and_standby
from tests.support.tcp_proxy import tcp_proxy
from tests.support.waiting import eventually, free_port

NOTHING = "nothing was changed, retry in a moment"
MAYBE = "so the change may or may not have been saved; retry in a moment"


Way = Literal["sqlalchemy", "compiled"]
WAYS: list[Way] = ["sqlalchemy", "compiled"]


async def _run(conn: AsyncConnection, way: Way, sql: str, params: dict[str, object] | None = None) -> list[Any]:
    """``sql``'s rows, run through SQLAlchemy's ``execute`` or compiled once and run on the driver."""
    if way == "compiled":
        return [tuple(row) for row in await fetch(conn, Compiled(text(sql)), params or {})]
    result = await conn.execute(text(sql), params or {})
    return [tuple(row) for row in result.all()] if result.returns_rows else []


async def _backend(database: Database, way: Way = "sqlalchemy") -> int:
    async with database.one_statement() as conn:
        return int((await _run(conn, way, "SELECT pg_backend_pid()"))[0][0])


async def _write(database: Database, value: int = 1, way: Way = "sqlalchemy") -> None:
    async with database.one_statement() as conn:
        await _run(conn, way, "INSERT INTO outage_probe VALUES (:v)", {"v": value})


async def _create_probe_table(node: PgNode) -> None:
    await fetchval(node.url, "CREATE TABLE IF NOT EXISTS outage_probe (n int)")


@pytest.mark.parametrize("way", WAYS)
async def test_a_write_that_reaches_a_standby_fails_as_read_only_with_nothing_changed_and_the_pool_is_renewed(
    caplog: pytest.LogCaptureFixture, way: Way
) -> None:
    with primary_and_standby() as (primary, standby):
        await _create_probe_table(primary)
        await eventually(lambda: _has_table(standby), within=30, what="the standby to replay the CREATE TABLE")
        database = Database.connect(standby.url, pool_size=3)
        try:
            async with database.one_statement() as a, database.one_statement() as b, database.one_statement() as c:
                old = {int((await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()) for conn in (a, b, c)}
            with caplog.at_level(logging.WARNING, logger="store.db"), pytest.raises(Unavailable) as failed:
                await _write(database, way=way)
            assert str(failed.value) == f"the database is read-only right now (a failover may be under way); {NOTHING}"
            assert (failed.value.cause, failed.value.outcome_unknown) == ("read_only", False)
            warnings = [r for r in caplog.records if r.name == "store.db"]
            assert [r.getMessage() for r in warnings] == [
                "database unavailable (read_only, nothing changed): ReadOnlySQLTransactionError SQLSTATE 25006"
            ]
            assert warnings[0].exc_info is None  # no traceback for an outage
            # The connection that reached the standby left the pool, and so did every one opened before it.
            new = {await _backend(database) for _ in range(3)}
            assert not new & old, (old, new)
        finally:
            await database.dispose()


async def _has_table(node: PgNode) -> bool:
    return bool(await fetchval(node.url, "SELECT to_regclass('outage_probe') IS NOT NULL"))


@pytest.mark.parametrize("way", WAYS)
async def test_after_a_switchover_behind_a_proxy_that_keeps_old_sessions_one_call_fails_and_the_next_ones_write(
    way: Way,
) -> None:
    """Row 10 of the failover measurements: without shutdown-sessions the pool kept its standby connections."""
    with primary_and_standby() as (primary, standby):
        await _create_probe_table(primary)
        await eventually(lambda: _has_table(standby), within=30, what="the standby to replay the CREATE TABLE")
        async with tcp_proxy(standby.port) as proxy:
            database = Database.connect(proxy.url_for(), pool_size=3)
            try:
                async with database.one_statement() as a, database.one_statement() as b, database.one_statement() as c:
                    for conn in (a, b, c):
                        await conn.execute(text("SELECT 1"))
                assert proxy.open_connections == 3
                proxy.retarget(primary.port)  # the "new primary"; the pooled sessions stay on the standby
                outcomes = []
                for n in range(6):
                    try:
                        await _write(database, n, way)
                        outcomes.append("ok")
                    except Unavailable as exc:
                        outcomes.append(exc.cause)
                assert outcomes == ["read_only", "ok", "ok", "ok", "ok", "ok"]
                assert await fetchval(primary.url, "SELECT count(*) FROM outage_probe") == 5
            finally:
                await database.dispose()


async def test_no_writable_host_for_target_session_attrs_is_a_retryable_error_with_nothing_changed() -> None:
    with primary_and_standby() as (_, standby):
        database = Database.connect(f"{standby.url}?target_session_attrs=read-write", pool_size=1)
        try:
            with pytest.raises(Unavailable) as failed:
                await _backend(database)
            assert str(failed.value) == (
                f"no database server is accepting writes right now (a failover may be under way); {NOTHING}"
            )
            assert failed.value.cause == "no_writable_host"
        finally:
            await database.dispose()


@pytest.mark.parametrize("kind", ["refused", "hang-up"])
async def test_a_database_that_cannot_be_reached_is_a_retryable_error_with_nothing_changed(kind: str) -> None:
    if kind == "refused":
        database = Database.connect(f"postgresql://postgres@127.0.0.1:{free_port()}/postgres", pool_size=1)
        await _expect_unreachable(database)
        return
    async with tcp_proxy(free_port()) as proxy:
        proxy.mode = "hang-up"  # accepts, then closes: HAProxy while every backend is down
        await _expect_unreachable(Database.connect(proxy.url_for(), pool_size=1))


async def _expect_unreachable(database: Database) -> None:
    try:
        with pytest.raises(Unavailable) as failed:
            await _backend(database)
        assert str(failed.value) == (
            f"the database cannot be reached right now (a failover or restart may be under way); {NOTHING}"
        )
        assert failed.value.cause == "connect_failed"
    finally:
        await database.dispose()


@pytest.mark.parametrize("way", WAYS)
async def test_a_connection_cut_with_an_autocommit_write_in_flight_may_have_saved_it_and_says_so(way: Way) -> None:
    with primary_and_standby(standby=False) as (primary,):
        await _create_probe_table(primary)
        async with tcp_proxy(primary.port) as proxy:
            database = Database.connect(proxy.url_for(), pool_size=1)
            try:

                async def slow_write() -> None:
                    async with database.one_statement() as conn:
                        await _run(conn, way, "INSERT INTO outage_probe SELECT 7 FROM pg_sleep(1)")

                writing = asyncio.create_task(slow_write())
                await eventually(
                    lambda: _statement_running(primary, "pg_sleep(1)"), within=10, what="the INSERT to run"
                )
                assert proxy.cut() == 1
                with pytest.raises(Unavailable) as failed:
                    await writing
                assert str(failed.value) == (
                    "the connection was lost while the change was being made (a failover or restart may be under "
                    f"way), {MAYBE}"
                )
                assert (failed.value.cause, failed.value.outcome_unknown) == ("connection_lost", True)
                # The promise is not hypothetical: the server finishes the statement and commits it.
                await eventually(
                    lambda: _count_is(primary, 1), within=10, what="the cut INSERT to commit on the server"
                )
                async with database.one_statement() as conn:  # the cut connection left the pool
                    assert (await conn.execute(text("SELECT count(*) FROM outage_probe"))).scalar_one() == 1
            finally:
                await database.dispose()


async def test_a_connection_cut_inside_a_transaction_before_commit_changed_nothing() -> None:
    with primary_and_standby(standby=False) as (primary,):
        await _create_probe_table(primary)
        async with tcp_proxy(primary.port) as proxy:
            database = Database.connect(proxy.url_for(), pool_size=1)
            try:

                async def transaction() -> None:
                    async with database.transaction() as conn:
                        await conn.execute(text("INSERT INTO outage_probe VALUES (1)"))
                        await conn.execute(text("SELECT pg_sleep(1)"))

                running = asyncio.create_task(transaction())
                await eventually(lambda: _statement_running(primary, "pg_sleep(1)"), within=10, what="the sleep")
                proxy.cut()
                with pytest.raises(Unavailable) as failed:
                    await running
                assert str(failed.value) == (
                    "the connection was lost before the change was committed (a failover or restart may be under "
                    f"way); {NOTHING}"
                )
                assert failed.value.outcome_unknown is False
                await eventually(
                    lambda: _no_backend_sleeping(primary), within=10, what="the cut session to end on the server"
                )
                assert await fetchval(primary.url, "SELECT count(*) FROM outage_probe") == 0
            finally:
                await database.dispose()


@pytest.mark.parametrize("way", WAYS)
async def test_a_backend_terminated_mid_statement_is_connection_lost_with_the_outcome_unknown(way: Way) -> None:
    with primary_and_standby(standby=False) as (primary,):
        database = Database.connect(primary.url, pool_size=1)
        try:

            async def sleep() -> None:
                async with database.one_statement() as conn:
                    await _run(conn, way, "SELECT pg_sleep(5)")

            running = asyncio.create_task(sleep())
            await eventually(lambda: _statement_running(primary, "pg_sleep(5)"), within=10, what="the sleep")
            await fetchval(
                primary.url,
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(5)%'"
                " AND pid <> pg_backend_pid()",
            )
            with pytest.raises(Unavailable) as failed:
                await running
            assert (failed.value.cause, failed.value.outcome_unknown) == ("connection_lost", True)
            assert await _backend(database, way) > 0  # a new connection serves the next call
        finally:
            await database.dispose()


@pytest.mark.parametrize("way", WAYS)
async def test_a_frozen_server_fails_calls_within_the_client_side_bounds_and_they_work_again_after_it_thaws(
    way: Way,
) -> None:
    statement_timeout_ms, pool_timeout = 1000, 1.0
    bounds = ClientBounds.derived(statement_timeout_ms=statement_timeout_ms, pool_timeout=pool_timeout)
    bound, connect_bound = bounds.command_timeout_s, bounds.connect_timeout_s
    assert (bound, connect_bound) == (1 + COMMAND_GRACE_SECONDS, 2.0)  # 2 s: the floor of a connect
    with primary_and_standby(standby=False) as (primary,):
        database = Database.connect(
            primary.url,
            pool_size=1,
            statement_timeout_ms=statement_timeout_ms,
            lock_timeout_ms=500,
            pool_timeout=pool_timeout,
        )
        try:
            await _backend(database)  # a pooled connection, as in production
            primary.freeze()
            try:
                started = time.monotonic()
                with pytest.raises(Unavailable) as failed:
                    await _backend(database, way)
                on_pooled = time.monotonic() - started
                started = time.monotonic()
                with pytest.raises(Unavailable) as refused:
                    await _backend(database, way)
                on_new = time.monotonic() - started
            finally:
                primary.thaw()
            assert str(failed.value) == (
                "the database stopped answering while the change was being made (a failover or restart may be "
                f"under way), {MAYBE}"
            )
            assert (failed.value.cause, failed.value.outcome_unknown) == ("no_answer", True)
            assert bound * 0.9 <= on_pooled < bound + 3, on_pooled  # the bound, not the length of the freeze
            # The frozen connection left the pool; a new one cannot complete its start-up within the connect bound.
            assert str(refused.value) == (
                "the database did not answer a new connection in time (a failover or restart may be under way); "
                f"{NOTHING}"
            )
            assert refused.value.cause == "connect_failed"
            assert connect_bound * 0.9 <= on_new < connect_bound + 3, on_new
            await eventually(_answers(database), within=30, what="calls to work again after the thaw")
        finally:
            await database.dispose()


def _answers(database: Database) -> Callable[[], Awaitable[bool]]:
    async def probe() -> bool:
        try:
            return await _backend(database) > 0
        except Unavailable:
            return False

    return probe


async def test_pooled_connections_have_tcp_keepalives_derived_from_the_pool_timeout(database_url: str) -> None:
    database = Database.connect(
        database_url, pool_size=1, pool_timeout=6.0, statement_timeout_ms=9000, lock_timeout_ms=1000
    )
    try:
        async with database.one_statement() as conn:
            driver = (await conn.get_raw_connection()).driver_connection
            sock = driver._transport.get_extra_info("socket")  # type: ignore[union-attr]
            options = {
                name: sock.getsockopt(level, getattr(socket, name))
                for level, name in [
                    (socket.SOL_SOCKET, "SO_KEEPALIVE"),
                    (socket.IPPROTO_TCP, "TCP_KEEPIDLE"),
                    (socket.IPPROTO_TCP, "TCP_KEEPINTVL"),
                    (socket.IPPROTO_TCP, "TCP_KEEPCNT"),
                    (socket.IPPROTO_TCP, "TCP_USER_TIMEOUT"),
                ]
            }
        assert options == {
            "SO_KEEPALIVE": 1,
            "TCP_KEEPIDLE": 6,
            "TCP_KEEPINTVL": 2,
            "TCP_KEEPCNT": 3,
            "TCP_USER_TIMEOUT": int((9 + COMMAND_GRACE_SECONDS) * 1000),
        }
    finally:
        await database.dispose()


async def _statement_running(node: PgNode, fragment: str) -> bool:
    return bool(
        await fetchval(
            node.url,
            "SELECT count(*) > 0 FROM pg_stat_activity WHERE state = 'active' AND query LIKE $1 "
            "AND pid <> pg_backend_pid()",
            f"%{fragment}%",
        )
    )


async def _no_backend_sleeping(node: PgNode) -> bool:
    return not await _statement_running(node, "pg_sleep(1)")


async def _count_is(node: PgNode, expected: int) -> bool:
    return await fetchval(node.url, "SELECT count(*) FROM outage_probe") == expected
