"""The store's hot statements run three ways: through ``AsyncConnection``, as the store runs them, on asyncpg's pool.

    python -m bench.store_driver [--callers 16] [--calls 3000] [--rounds 6]

Both ways run the very statement objects ``store/carts.py`` defines for ``cart_view`` (``_VIEW``) and
``cart_set_item`` (``_SET_ITEM``); the direct way compiles each once for SQLAlchemy's asyncpg dialect (SQL
text with ``$n`` placeholders, plus the order of its bind names) and binds per call. Per call both do the
same unit of work: a pooled connection (pool of 10, checkout timeout 5 s, session settings applied once per
connection), shielded from cancellation, errors translated to ``Unavailable``, one statement, the rows
fetched, the connection returned.

- ``sqlalchemy``: ``Database.one_statement()`` + ``conn.execute(stmt, params).all()``, as the tools did
  before issue 20 item 3;
- ``store``: ``Database.one_statement()`` + ``store.compiled.fetch`` (the statement compiled once, run on the
  asyncpg connection under SQLAlchemy's pooled one), as the tools do now;
- ``asyncpg``: ``asyncpg.Pool.acquire()`` + ``Connection.fetch(sql, *args)`` under the same shield and
  translation, on a second pool of asyncpg's own (the floor: no SQLAlchemy at all).

``--callers`` tasks share the pool (16: as many as the HTTP bench's connections). CPU per call is this
process's CPU time ÷ calls (PostgreSQL's own work is in its processes, not here); rounds alternate the two
ways so that machine noise hits all alike; the report is the median [range] over rounds.
"""

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import asyncpg
from sqlalchemy.dialects.postgresql.asyncpg import dialect as asyncpg_dialect

from bench.__main__ import _dsn, bench_database
from store import compiled as store_compiled
from store.carts import _SET_ITEM, _VIEW, CartRepository
from store.db import Database, SessionSettings
from store.errors import Unavailable
from store.principal import Principal

PRINCIPAL = Principal(issuer="https://bench.example", subject="store-bench")
POOL_SIZE = 10
_TIMED_OUT = {"57014", "55P03"}


class Compiled:
    """A SQLAlchemy statement compiled once for asyncpg: its SQL and the bind names in ``$n`` order."""

    def __init__(self, statement: Any) -> None:
        compiled = statement.compile(dialect=asyncpg_dialect())
        self.sql: str = compiled.string
        self.names: list[str] = list(compiled.positiontup or [])

    def args(self, params: dict[str, object]) -> list[object]:
        return [params[name] for name in self.names]


async def direct_call(pool: asyncpg.Pool, compiled: Compiled, params: dict[str, object]) -> list[Any]:
    """One statement on an asyncpg pool with the unit of work's shield and error translation."""
    with anyio.CancelScope(shield=True):
        try:
            async with pool.acquire(timeout=5.0) as conn:
                return await conn.fetch(compiled.sql, *compiled.args(params))  # type: ignore[no-any-return]
        except TimeoutError:
            raise Unavailable("the server is busy: every database connection is in use") from None
        except asyncpg.PostgresError as exc:
            if getattr(exc, "sqlstate", "") in _TIMED_OUT:
                raise Unavailable("the database did not answer in time") from None
            raise


async def sqlalchemy_call(db: Database, statement: Any, params: dict[str, object]) -> list[Any]:
    async with db.one_statement() as conn:
        return list((await conn.execute(statement, params)).all())


async def store_call(db: Database, compiled: store_compiled.Compiled, params: dict[str, object]) -> list[Any]:
    async with db.one_statement() as conn:
        return list(await store_compiled.fetch(conn, compiled, params))


async def cpu_per_call(callers: int, calls: int, one: Callable[[int], Awaitable[object]]) -> float:
    """CPU µs per call with ``callers`` concurrent tasks making ``calls`` calls in all."""
    per_caller = calls // callers

    async def caller(index: int) -> None:
        for _ in range(per_caller):
            await one(index)

    started = time.process_time()
    await asyncio.gather(*(caller(i) for i in range(callers)))
    return (time.process_time() - started) * 1e6 / (per_caller * callers)


async def run(url: str, args: argparse.Namespace) -> None:
    settings = SessionSettings()
    db = Database.connect(url, pool_size=POOL_SIZE)
    set_session = settings.set_sql(local=False)

    async def init(conn: asyncpg.Connection) -> None:
        await conn.execute(set_session)  # once per physical connection, as Database.connect's listener

    pool = await asyncpg.create_pool(_dsn(url), min_size=POOL_SIZE, max_size=POOL_SIZE, init=init)
    try:
        carts: list[str] = []
        for _ in range(args.callers):
            async with db.one_statement() as conn:
                carts.append(await CartRepository(conn).create(PRINCIPAL))
        for handle in carts:
            for sku, quantity in (("hat-beanie", 2), ("scarf-cashmere", 1), ("brush-lint", 3)):
                async with db.one_statement() as conn:
                    await CartRepository(conn).set_item(PRINCIPAL, handle, sku, quantity)
        principal = {"p_iss": PRINCIPAL.issuer, "p_sub": PRINCIPAL.subject}
        view = [{"p_handle": handle, **principal} for handle in carts]
        set_item = [{**v, "p_sku": "hat-beanie", "p_quantity": 2, "p_expected": None, "p_max_lines": 100} for v in view]
        statements = {"cart_view (_VIEW)": (_VIEW, view), "cart_set_item (_SET_ITEM)": (_SET_ITEM, set_item)}
        for name, (statement, params) in statements.items():
            compiled = Compiled(statement)
            # Both ways return the same rows (values and order).
            via_sa = [tuple(r) for r in await sqlalchemy_call(db, statement, params[0])]
            via_pg = [tuple(r) for r in await direct_call(pool, compiled, params[0])]
            via_store = [tuple(r) for r in await store_call(db, store_compiled.Compiled(statement), params[0])]
            if name.startswith("cart_view") and not via_sa == via_pg == via_store:
                raise RuntimeError(f"{name}: the ways disagree: {via_sa} != {via_pg} != {via_store}")
            in_store = store_compiled.Compiled(statement)

            def through_sqlalchemy(
                i: int, s: Any = statement, p: list[dict[str, object]] = params
            ) -> Awaitable[object]:
                return sqlalchemy_call(db, s, p[i])

            def on_asyncpg(i: int, c: Compiled = compiled, p: list[dict[str, object]] = params) -> Awaitable[object]:
                return direct_call(pool, c, p[i])

            def as_the_store(
                i: int, c: store_compiled.Compiled = in_store, p: list[dict[str, object]] = params
            ) -> Awaitable[object]:
                return store_call(db, c, p[i])

            ways = {"sqlalchemy": through_sqlalchemy, "store": as_the_store, "asyncpg": on_asyncpg}
            for one in ways.values():  # warm-up: every pooled connection open, every statement prepared
                await cpu_per_call(args.callers, args.callers * 20, one)
            results: dict[str, list[float]] = {way: [] for way in ways}
            for round_no in range(args.rounds):
                order = list(ways.items()) if round_no % 2 == 0 else list(reversed(ways.items()))
                for way, one in order:
                    results[way].append(await cpu_per_call(args.callers, args.calls, one))
            ratios = {
                way: [a / s for a, s in zip(results[way], results["sqlalchemy"], strict=True)]
                for way in ("store", "asyncpg")
            }
            print(f"\n{name}: CPU µs per call, {args.callers} callers, pool {POOL_SIZE}, {args.rounds} rounds")
            for way, values in results.items():
                print(f"  {way:12} {statistics.median(values):7.1f} [{min(values):.1f}-{max(values):.1f}]")
            for way, ratio in ratios.items():
                print(f"  {way} / sqlalchemy  {statistics.median(ratio):.2f} [{min(ratio):.2f}-{max(ratio):.2f}]")
    finally:
        await pool.close()
        await db.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.store_driver")
    parser.add_argument("--callers", type=int, default=16)
    parser.add_argument("--calls", type=int, default=3000, help="calls per way per round")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    admin_url = os.environ.get("TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    with bench_database(admin_url) as url:
        asyncio.run(run(url, args))


if __name__ == "__main__":
    main()
