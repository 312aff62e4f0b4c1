"""The engine, the connection pool and the unit of work.

One tool call is one unit of work: callers open :meth:`Database.transaction` (or
:meth:`Database.one_statement` for a lone statement) once and pass the connection to every
repository they use within it.

Three rules keep the pool whole under load:

* **A fixed-size pool.** ``pool_size`` connections are opened on demand and kept; a call that
  finds them all busy waits up to ``pool_timeout`` seconds and then fails with
  :class:`~store.errors.Unavailable` instead of opening a connection per call.
* **Cancellation cannot interrupt database work.** A unit of work runs shielded from
  cancellation (a client that drops its HTTP connection cancels the request task): the
  statements finish, the connection goes back to the pool in a clean state, and only then
  does the cancellation take effect. Every wait inside is bounded: the pool wait by
  ``pool_timeout``, lock waits by ``lock_timeout``, statements by ``statement_timeout``.
* **Timeouts never ride in the startup packet**, which connection poolers refuse. See
  :class:`PoolerMode` for how they reach the server.
"""

import asyncio
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

import anyio
from sqlalchemy import event, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from store.errors import Unavailable

PoolerMode = Literal["none", "transaction"]
"""How Coatcheck talks to whatever sits between it and PostgreSQL.

``none``
    Direct PostgreSQL (or a pooler that tracks protocol-level prepared statements and session
    settings, such as PgBouncer >= 1.21 with ``max_prepared_statements``). Statements are
    prepared once per connection and cached; a lone statement runs in autocommit, one round trip.
    The timeouts are set once per connection, with ``SET`` right after it is opened.
``transaction``
    A transaction-pooling PgBouncer without prepared-statement tracking (e.g. 1.18): a pooled
    server connection belongs to this client only for the length of one transaction. So no
    statement is cached (each is parsed again in the exchange that executes it), every unit of
    work is an explicit transaction, and the timeouts are ``SET LOCAL`` in the same message as
    its ``BEGIN``. A lone statement then costs four round trips instead of one.
"""

POOLER_MODES: tuple[PoolerMode, ...] = ("none", "transaction")

# SQLSTATEs after which nothing was written and the same call may simply be retried.
_TIMED_OUT = {"57014": "statement_timeout", "55P03": "lock_timeout"}
_REFUSED = {"53300": "too many clients", "57P03": "not accepting connections yet"}


def async_database_url(url: str) -> str:
    """Accept ``postgresql://`` or ``postgresql+asyncpg://`` and return the asyncpg form.

    Raises:
        ValueError: if the URL is not a PostgreSQL URL.
    """
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend not in {"postgresql", "postgres"}:
        raise ValueError("must be a postgresql:// or postgresql+asyncpg:// URL")
    if parsed.get_driver_name() not in {"asyncpg", "psycopg2", ""} and "+" in parsed.drivername:
        raise ValueError("only the asyncpg driver is supported")
    return parsed.set(drivername="postgresql+asyncpg").render_as_string(hide_password=False)


def _discard_closed_connections(dbapi_connection: Any, _record: object, _proxy: object) -> None:
    """Replace a pooled connection the server has closed (restart, failover, idle kill) before it is used.

    asyncpg notices a server-side close as soon as the socket reports it, so this check costs no round
    trip, unlike ``pool_pre_ping``. A connection that died silently (a network partition) still fails the
    one call that draws it; that call's transaction is rolled back and the pool discards the connection.
    """
    if dbapi_connection.driver_connection.is_closed():
        raise DisconnectionError("pooled connection was closed by the server")


def _unavailable(exc: PoolTimeoutError | DBAPIError) -> Unavailable | None:
    """The retryable error ``exc`` stands for (nothing was changed), or ``None`` if it is not one."""
    if isinstance(exc, PoolTimeoutError):
        return Unavailable(
            "the server is busy: every database connection is in use; nothing was changed, retry in a moment"
        )
    sqlstate = getattr(exc.orig, "sqlstate", None) or ""
    if sqlstate in _TIMED_OUT:
        return Unavailable(
            f"the database did not answer in time ({_TIMED_OUT[sqlstate]}); nothing was changed, retry in a moment"
        )
    if sqlstate in _REFUSED:
        # Only a new connection can be refused; with a fixed pool that is warm-up or a restart.
        return Unavailable(
            f"the database refused a connection ({_REFUSED[sqlstate]}); nothing was changed, retry in a moment"
        )
    return None


@dataclass(frozen=True, slots=True)
class SessionSettings:
    """The server settings every application session runs with."""

    statement_timeout_ms: int = 15000
    lock_timeout_ms: int = 5000

    def __post_init__(self) -> None:
        if not 0 < self.lock_timeout_ms < self.statement_timeout_ms:
            # A lock wait that outlives the statement timeout would surface as a statement timeout,
            # hiding which of the two the operator has to look at.
            raise ValueError("lock_timeout must be greater than 0 and below statement_timeout")

    def assignments(self) -> list[tuple[str, str]]:
        """``(name, value)`` pairs; JIT is off because these are short OLTP statements (see docs/database.md)."""
        return [
            ("statement_timeout", str(self.statement_timeout_ms)),
            ("lock_timeout", str(self.lock_timeout_ms)),
            ("jit", "off"),
        ]

    def set_sql(self, *, local: bool) -> str:
        """One simple-protocol string that applies every setting (numbers and keywords only)."""
        verb = "SET LOCAL" if local else "SET"
        return "; ".join(f"{verb} {name} = {value}" for name, value in self.assignments())


class Database:
    """Owns an :class:`AsyncEngine` and hands out units of work.

    The engine's connections are in autocommit (``isolation_level="AUTOCOMMIT"``, set once per physical
    connection), because the hot path of every tool call is a lone statement: SQLAlchemy then neither sends
    ``BEGIN``/``COMMIT`` around it nor switches the isolation level at checkout and back at return. The rarer
    transactions pay that switch instead (:meth:`transaction`). An ``engine.connect()`` + ``conn.begin()``
    would open no transaction on the server, so the engine is private: work goes through the units of work
    below, and work that commits batch by batch on one connection through :meth:`transactional_connection`.
    Instrumentation (event listeners, pool statistics) uses :attr:`sync_engine`.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        pooler_mode: PoolerMode = "none",
        session: SessionSettings | None = None,
    ) -> None:
        """Wrap ``engine``, which must have been created with ``isolation_level="AUTOCOMMIT"`` (see :meth:`connect`)."""
        self._engine = engine
        self.pooler_mode: PoolerMode = pooler_mode
        self._begin_sql = "BEGIN; " + (session or SessionSettings()).set_sql(local=True)

    @property
    def sync_engine(self) -> Engine:
        """The engine's synchronous core, for event listeners and pool statistics.

        Not a way to run statements: opening a connection on it from async code fails (no greenlet).
        """
        return self._engine.sync_engine

    @classmethod
    def connect(
        cls,
        url: str,
        *,
        pool_size: int = 10,
        max_overflow: int = 0,
        pool_timeout: float = 5.0,
        statement_timeout_ms: int = 15000,
        lock_timeout_ms: int = 5000,
        pooler_mode: PoolerMode = "none",
    ) -> "Database":
        """Create a database handle for ``url`` (no connection is opened until first use).

        ``max_overflow`` connections beyond ``pool_size`` are opened and closed per call: leave it
        at 0 in production (see docs/database.md, the connection budget).
        """
        if pooler_mode not in POOLER_MODES:
            raise ValueError(f"pooler_mode must be one of {', '.join(POOLER_MODES)}")
        session = SessionSettings(statement_timeout_ms=statement_timeout_ms, lock_timeout_ms=lock_timeout_ms)
        connect_args: dict[str, object] = {}
        if pooler_mode == "transaction":
            # Both caches off: asyncpg then uses the unnamed statement and re-parses it in the very
            # exchange that executes it, so no statement outlives the pooled server connection.
            connect_args = {"statement_cache_size": 0, "prepared_statement_cache_size": 0}
        engine = create_async_engine(
            async_database_url(url),
            pool_size=pool_size,
            max_overflow=max_overflow,
            pool_timeout=pool_timeout,
            # Set once per physical connection; see the class docstring.
            isolation_level="AUTOCOMMIT",
            # Bound values (subjects, idempotency keys, checkout nonces) never ride along in an error's text
            # into a log line: only the SQL with its placeholders does.
            hide_parameters=True,
            # No pre-ping round trip; see _discard_closed_connections for the cheap local check instead.
            connect_args=connect_args,
        )
        event.listen(engine.sync_engine, "checkout", _discard_closed_connections)
        if pooler_mode == "none":
            set_session = session.set_sql(local=False)

            def apply_session_settings(dbapi_connection: Any, _record: object) -> None:
                # Once per physical connection (one round trip), never per call.
                dbapi_connection.run_async(lambda driver: driver.execute(set_session))

            event.listen(engine.sync_engine, "connect", apply_session_settings)
        return cls(engine, pooler_mode=pooler_mode, session=session)

    def transaction(self) -> AbstractAsyncContextManager[AsyncConnection]:
        """Run a block in one transaction: commit on success, roll back on any exception.

        The block must be database work only: it is shielded from cancellation, so it must never
        wait on the network or on another request.

        Raises:
            Unavailable: no pooled connection freed up in time, or a statement hit a timeout.
        """
        # Behind a transaction pooler every unit of work is an explicit transaction (see PoolerMode).
        opened = self._explicit_transaction() if self.pooler_mode == "transaction" else self._begin_direct()
        return self._unit_of_work(opened)

    def one_statement(self) -> AbstractAsyncContextManager[AsyncConnection]:
        """Run a block that issues exactly one statement, as its own transaction (autocommit).

        A lone statement is atomic anyway; this saves the BEGIN and COMMIT round trips
        (except in ``transaction`` pooler mode, where every unit of work is a transaction).

        A block that issues more than one statement must use :meth:`transaction` instead, unless
        each statement is written to be correct on its own (see :meth:`autocommit`).
        """
        return self.autocommit()

    def autocommit(self) -> AbstractAsyncContextManager[AsyncConnection]:
        """Run a block whose statements each commit on their own.

        For blocks whose every statement is self-validating (a compare-and-swap that writes nothing
        when what it read has moved on), so no lock or transaction has to span two statements.
        Shielded from cancellation like :meth:`transaction`.
        """
        opened = self._explicit_transaction() if self.pooler_mode == "transaction" else self._engine.connect()
        return self._unit_of_work(opened)

    @asynccontextmanager
    async def _unit_of_work(
        self, opened: AbstractAsyncContextManager[AsyncConnection]
    ) -> AsyncIterator[AsyncConnection]:
        # Every unit of work alike: shielded from cancellation, its errors translated. One generator for
        # all three (these methods return it rather than wrap it): each layer costs every tool call.
        with anyio.CancelScope(shield=True):
            try:
                async with opened as conn:
                    yield conn
            except (PoolTimeoutError, DBAPIError) as exc:
                unavailable = _unavailable(exc)
                if unavailable is None:
                    raise
                raise unavailable from None

    @asynccontextmanager
    async def transactional_connection(self) -> AsyncIterator[AsyncConnection]:
        """A pooled connection outside any transaction, on which SQLAlchemy's ``begin()`` and autobegin work.

        For operator commands that commit batch by batch on one connection (``coatcheck keys rotate``).
        Not shielded from cancellation and without error translation: tool calls use the units of work above.
        """
        async with self._engine.connect() as conn:
            # The server's default level, as SQLAlchemy read it from the first connection (PostgreSQL's
            # READ COMMITTED unless configured otherwise): what a connection opened without AUTOCOMMIT runs.
            await conn.execution_options(isolation_level=self._engine.dialect.default_isolation_level)
            yield conn

    @asynccontextmanager
    async def _begin_direct(self) -> AsyncIterator[AsyncConnection]:
        # SQLAlchemy's own transaction (BEGIN with the first statement, COMMIT or ROLLBACK at the end), so a
        # failure anywhere is a DBAPIError and a connection the server dropped is invalidated, as for a statement.
        async with self.transactional_connection() as conn, conn.begin():
            yield conn

    @asynccontextmanager
    async def _explicit_transaction(self) -> AsyncIterator[AsyncConnection]:
        # BEGIN and the SET LOCALs travel in one simple-protocol message: the settings cost no round trip
        # and hold for exactly this transaction, on whichever server connection the pooler picked.
        async with self._engine.connect() as conn:
            driver = (await conn.get_raw_connection()).driver_connection
            assert driver is not None  # a checked-out connection always has one  # noqa: S101
            await driver.execute(self._begin_sql)
            try:
                yield conn
            except BaseException:
                await self._end(conn, driver, "ROLLBACK")
                raise
            await self._end(conn, driver, "COMMIT")

    @staticmethod
    async def _end(conn: AsyncConnection, driver: Any, command: str) -> None:
        try:
            await driver.execute(command)
        except BaseException:
            # A connection whose transaction state is unknown must not go back to the pool.
            await conn.invalidate()
            raise

    async def ping(self, within: float) -> bool:
        """Tell whether the database answers ``SELECT 1`` within ``within`` seconds."""
        try:
            async with asyncio.timeout(within), self.one_statement() as conn:
                await conn.execute(text("SELECT 1"))
        except (SQLAlchemyError, OSError, TimeoutError, Unavailable):
            return False
        return True

    async def dispose(self) -> None:
        """Close every pooled connection."""
        await self._engine.dispose()
