"""The unit of work under what a database does in production: restarts and killed connections.

Most killed connections are noticed locally and replaced at checkout (no round trip); one that is not yet
noticed fails exactly the call that draws it, with nothing written, and is discarded.
"""

import gc
import warnings
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.ext.asyncio import engine as sqlalchemy_async_engine

from store.compiled import Compiled, fetch
from store.db import Database
from store.errors import Unavailable
from tests.support.private_postgres import private_postgres
from tests.support.waiting import eventually


async def _kill_backends(database_url: str) -> int:
    dsn = make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)
    admin = await asyncpg.connect(dsn)
    try:
        name = make_url(database_url).database
        return int(
            await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = $1 AND pid <> pg_backend_pid()",
                name,
            )
        )
    finally:
        await admin.close()


async def test_connections_killed_by_the_server_fail_at_most_one_call_each_and_the_pool_recovers(
    database_url: str,
) -> None:
    database = Database.connect(database_url, pool_size=3, max_overflow=0)
    try:
        async with database.transaction() as a, database.transaction() as b, database.transaction() as c:
            for conn in (a, b, c):
                await conn.execute(text("SELECT 1"))
        assert await _kill_backends(database_url) >= 3

        outcomes: list[str] = []
        for _ in range(8):
            try:
                async with database.transaction() as conn:
                    assert (await conn.execute(text("SELECT 41 + 1"))).scalar_one() == 42
                outcomes.append("ok")
            except Unavailable as exc:
                # The documented outcome: this one call fails, its transaction is void, the connection is dropped.
                clear = exc.cause == "connection_lost" and not exc.outcome_unknown and "nothing was changed" in str(exc)
                outcomes.append("failed" if clear else f"unexpected: {exc!r}")
        assert set(outcomes) <= {"ok", "failed"}, outcomes
        assert outcomes.count("failed") <= 3
        assert outcomes[-5:] == ["ok"] * 5
    finally:
        await database.dispose()


async def test_when_every_pooled_connection_is_busy_a_call_waits_a_bounded_time_then_fails_clearly(
    database_url: str,
) -> None:
    database = Database.connect(database_url, pool_size=1, max_overflow=0, pool_timeout=0.2)
    try:
        async with database.transaction() as held:
            await held.execute(text("SELECT 1"))
            with pytest.raises(Unavailable, match="server is busy: every database connection is in use; nothing"):
                async with database.one_statement() as conn:
                    await conn.execute(text("SELECT 1"))
        async with database.one_statement() as conn:  # the connection came back; nothing new was opened
            assert (await conn.execute(text("SELECT 1"))).scalar_one() == 1
        assert database.sync_engine.pool.checkedin() == 1  # type: ignore[attr-defined]
    finally:
        await database.dispose()


async def test_a_statement_past_statement_timeout_is_a_retryable_error_and_the_connection_stays_pooled(
    database_url: str,
) -> None:
    database = Database.connect(database_url, pool_size=1, statement_timeout_ms=200, lock_timeout_ms=100)
    try:
        async with database.one_statement() as conn:
            backend = (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
        with pytest.raises(Unavailable, match=r"did not answer in time \(statement_timeout\); nothing was changed"):
            async with database.one_statement() as conn:
                await conn.execute(text("SELECT pg_sleep(2)"))
        async with database.one_statement() as conn:
            assert (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one() == backend
    finally:
        await database.dispose()


async def test_every_pooled_session_runs_with_the_configured_timeouts_and_without_jit(database_url: str) -> None:
    database = Database.connect(database_url, pool_size=2, statement_timeout_ms=7000, lock_timeout_ms=3000)
    try:
        for unit in (database.one_statement, database.transaction, database.autocommit):
            async with unit() as conn:
                row = (
                    await conn.execute(
                        text(
                            "SELECT current_setting('statement_timeout'), current_setting('lock_timeout'), "
                            "current_setting('jit')"
                        )
                    )
                ).one()
            assert tuple(row) == ("7s", "3s", "off")
    finally:
        await database.dispose()


async def test_a_transaction_spans_its_statements_while_autocommit_units_commit_each_statement(
    database_url: str,
) -> None:
    """The engine's connections are in autocommit; transaction() and transactional_connection() still open one."""
    database = Database.connect(database_url, pool_size=1)
    xid = text("SELECT pg_current_xact_id()::text")  # assigns a transaction id: same one within a transaction
    try:

        async def two_ids(conn: AsyncConnection) -> tuple[str, str]:
            return (await conn.execute(xid)).scalar_one(), (await conn.execute(xid)).scalar_one()

        async with database.autocommit() as conn:
            first, second = await two_ids(conn)
        assert first != second
        async with database.transaction() as conn:
            first, second = await two_ids(conn)
        assert first == second
        async with database.transactional_connection() as conn:
            async with conn.begin():
                first, second = await two_ids(conn)
            assert first == second
            async with conn.begin():
                assert (await conn.execute(xid)).scalar_one() != first  # the first one committed
        async with database.one_statement() as conn:  # the pooled connection is back in autocommit
            first, second = await two_ids(conn)
        assert first != second
    finally:
        await database.dispose()


async def test_a_failed_transaction_leaves_nothing_written(database_url: str) -> None:
    database = Database.connect(database_url, pool_size=1)
    try:
        async with database.one_statement() as conn:
            await conn.execute(text("CREATE TABLE scratch_rollback (n int)"))

        async def insert_then_fail() -> None:
            async with database.transaction() as conn:
                await conn.execute(text("INSERT INTO scratch_rollback VALUES (1)"))
                raise RuntimeError("half-way")

        with pytest.raises(RuntimeError, match="half-way"):
            await insert_then_fail()
        async with database.one_statement() as conn:
            assert (await conn.execute(text("SELECT count(*) FROM scratch_rollback"))).scalar_one() == 0
    finally:
        await database.dispose()


def test_a_lock_timeout_not_below_the_statement_timeout_is_refused() -> None:
    with pytest.raises(ValueError, match="lock_timeout must be greater than 0 and below statement_timeout"):
        Database.connect("postgresql://u@h/d", statement_timeout_ms=1000, lock_timeout_ms=1000)


async def test_a_database_that_refuses_new_connections_is_a_retryable_error_not_a_crash() -> None:
    with private_postgres("max_connections=3", "superuser_reserved_connections=0") as cluster:
        hogs = [await asyncpg.connect(cluster.url) for _ in range(3)]
        database = Database.connect(cluster.url, pool_size=1)
        try:
            with pytest.raises(Unavailable, match=r"refused a connection \(too many clients\); nothing was changed"):
                async with database.one_statement() as conn:
                    await conn.execute(text("SELECT 1"))
            await hogs.pop().close()
            async with database.one_statement() as conn:  # room again: the next call simply works
                assert (await conn.execute(text("SELECT 1"))).scalar_one() == 1
        finally:
            await database.dispose()
            for hog in hogs:
                await hog.close()


_PID = Compiled(text("SELECT pg_backend_pid() AS pid"))


async def test_a_lone_statement_takes_an_idle_pooled_connection_and_gives_it_back_without_a_greenlet(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hot path's unit of work: no greenlet round trip when a connection is idle (docs/performance.md)."""
    spawned: list[object] = []
    real_spawn = sqlalchemy_async_engine.greenlet_spawn  # type: ignore[attr-defined]  # where AsyncConnection finds it

    async def counting_spawn(fn: Any, *args: Any, **kwargs: Any) -> Any:
        spawned.append(fn)
        return await real_spawn(fn, *args, **kwargs)

    database = Database.connect(database_url, pool_size=2, max_overflow=0)
    try:
        async with database.one_statement() as conn:  # opens the pool's first connection: the async path
            (first,) = await fetch(conn, _PID, {})
        monkeypatch.setattr(sqlalchemy_async_engine, "greenlet_spawn", counting_spawn)
        for _ in range(5):
            async with database.one_statement() as conn:
                (row,) = await fetch(conn, _PID, {})
                assert row.pid == first.pid  # the one idle connection, again and again
        assert spawned == []
        pool = database.sync_engine.pool
        assert (pool.checkedin(), pool.checkedout()) == (1, 0)  # type: ignore[attr-defined]
    finally:
        await database.dispose()


async def test_an_idle_connection_the_server_closed_is_replaced_on_the_async_path_with_no_coroutine_left_unawaited(
    database_url: str,
) -> None:
    database = Database.connect(database_url, pool_size=1, max_overflow=0)
    try:
        async with database.one_statement() as conn:
            (before,) = await fetch(conn, _PID, {})
            driver = (await conn.get_raw_connection()).driver_connection
        assert driver is not None
        assert await _kill_backends(database_url) >= 1

        async def noticed() -> bool:
            return bool(driver.is_closed())

        await eventually(noticed, within=10, what="asyncpg to notice that the server closed the idle connection")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            async with database.one_statement() as conn:
                (after,) = await fetch(conn, _PID, {})
            gc.collect()  # an unawaited coroutine warns when it is collected
        assert after.pid != before.pid
        assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == []
        pool = database.sync_engine.pool
        assert (pool.checkedin(), pool.checkedout()) == (1, 0)  # type: ignore[attr-defined]
    finally:
        await database.dispose()
