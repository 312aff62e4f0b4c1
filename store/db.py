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
* **A bound on the client side too** (:class:`ClientBounds`): a server that stops answering (frozen,
  partitioned) fails the call within seconds instead of holding it, and its connection is discarded.

A failover, restart or frozen server fails a call with :class:`~store.errors.Unavailable`, whose text says
whether anything can have been written; the connection, and every pooled one opened before it, is replaced
(see :mod:`store.outages`).
"""

import asyncio
import math
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

import anyio
import asyncpg  # type: ignore[import-untyped]
from sqlalchemy import event, text
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import DisconnectionError, MissingGreenlet, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import QueuePool
from sqlalchemy.util.concurrency import in_greenlet

from store.errors import Unavailable
from store.outages import DATABASE_ERRORS, Phase, mark_failover_disconnects, report, set_keepalives, translate

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

Readiness = Literal["ready", "read-only", "unreachable"]
"""What :meth:`Database.readiness` found: a writable primary, a standby or read-only server, or no answer."""

# One round trip, like the SELECT 1 it replaces: a standby (or a server with default_transaction_read_only)
# answers it too, so readiness asks whether this session could write.
_READINESS_SQL = "SELECT pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on'"
# What a readiness probe may meet besides success; anything else is a bug and propagates.
_PROBE_ERRORS: tuple[type[BaseException], ...] = (*DATABASE_ERRORS, SQLAlchemyError, Unavailable)


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


def _open_in_greenlet(*args: Any, **kwargs: Any) -> Any:
    """asyncpg's ``connect``, refused outside SQLAlchemy's greenlet bridge (the engine's ``async_creator_fn``).

    :meth:`Database._idle_connection` checks out without the bridge, where opening a connection cannot
    work: refused here, before asyncpg's coroutine exists (SQLAlchemy would drop it unawaited), the pool
    treats it as a failed connect and the unit of work opens one on the async path.
    """
    if not in_greenlet():
        raise MissingGreenlet("connections are opened on SQLAlchemy's async path only")
    return asyncpg.connect(*args, **kwargs)


def _discard_closed_connections(dbapi_connection: Any, _record: object, _proxy: object) -> None:
    """Replace a pooled connection the server has closed (restart, failover, idle kill) before it is used.

    asyncpg notices a server-side close as soon as the socket reports it, so this check costs no round
    trip, unlike ``pool_pre_ping``. A connection that died silently (a network partition) still fails the
    one call that draws it; that call's transaction is rolled back and the pool discards the connection.
    """
    if dbapi_connection.driver_connection.is_closed():
        raise DisconnectionError("pooled connection was closed by the server")


COMMAND_GRACE_SECONDS = 2.0
"""How much longer than ``statement_timeout`` the client waits for an answer before it gives up."""
MIN_CONNECT_TIMEOUT_SECONDS = 2.0
"""The least time a new connection gets (TCP, TLS, authentication), however short the pool timeout."""


@dataclass(frozen=True, slots=True)
class ClientBounds:
    """How long the client waits on the server, derived from the server-side timeouts (see docs/deployment.md).

    ``command_timeout_s`` bounds every round trip (asyncpg's ``command_timeout``): the statement timeout plus
    :data:`COMMAND_GRACE_SECONDS`, so the server's own cancel always arrives first and the client bound only
    fires when the server stopped answering. ``connect_timeout_s`` bounds opening a connection (asyncpg's
    ``timeout``, across every host of a multi-host URL): the pool timeout (at least
    :data:`MIN_CONNECT_TIMEOUT_SECONDS`), so drawing a connection takes at most about twice the pool timeout.
    Keepalives start after ``connect_timeout_s`` idle and probe every third of it, three times.
    """

    command_timeout_s: float
    connect_timeout_s: float

    @classmethod
    def derived(cls, *, statement_timeout_ms: int, pool_timeout: float) -> "ClientBounds":
        """The bounds for a pool with ``pool_timeout`` whose sessions run with ``statement_timeout_ms``."""
        return cls(
            command_timeout_s=statement_timeout_ms / 1000 + COMMAND_GRACE_SECONDS,
            connect_timeout_s=max(pool_timeout, MIN_CONNECT_TIMEOUT_SECONDS),
        )

    @property
    def keepalive_idle_s(self) -> int:
        return max(1, math.ceil(self.connect_timeout_s))

    @property
    def keepalive_interval_s(self) -> int:
        return max(1, math.ceil(self.connect_timeout_s / 3))

    KEEPALIVE_COUNT = 3


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
        idle_checkout: bool = False,
    ) -> None:
        """Wrap ``engine``, which must have been created with ``isolation_level="AUTOCOMMIT"`` (see :meth:`connect`).

        ``idle_checkout``: lone statements may take an idle pooled connection without SQLAlchemy's greenlet
        bridge; only for an engine whose connections open through :func:`_open_in_greenlet` (as
        :meth:`connect` builds it), which keeps a connection from ever being opened outside that bridge.
        """
        self._engine = engine
        self._idle_checkout = idle_checkout
        self.pooler_mode: PoolerMode = pooler_mode
        self._begin_sql = "BEGIN; " + (session or SessionSettings()).set_sql(local=True)
        self._on_unavailable: Callable[[str], None] | None = None
        # Units whose statements commit one by one: a statement in flight when its connection dies may
        # have committed. Behind a transaction pooler every unit is one explicit transaction instead.
        self._autocommit_each_statement = pooler_mode != "transaction"

    def on_unavailable(self, observer: Callable[[str], None]) -> None:
        """Call ``observer`` with the cause (:data:`store.errors.UNAVAILABLE_CAUSES`) of every failed unit of work."""
        self._on_unavailable = observer

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
        bounds = ClientBounds.derived(statement_timeout_ms=statement_timeout_ms, pool_timeout=pool_timeout)
        # Client-side bounds ride in no packet: asyncpg enforces them locally (see ClientBounds).
        connect_args: dict[str, object] = {
            "timeout": bounds.connect_timeout_s,
            "command_timeout": bounds.command_timeout_s,
            "async_creator_fn": _open_in_greenlet,
        }
        if pooler_mode == "transaction":
            # Both caches off: asyncpg then uses the unnamed statement and re-parses it in the very
            # exchange that executes it, so no statement outlives the pooled server connection.
            connect_args |= {"statement_cache_size": 0, "prepared_statement_cache_size": 0}
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
        event.listen(engine.sync_engine, "handle_error", mark_failover_disconnects)

        def keep_alive(dbapi_connection: Any, _record: object) -> None:
            set_keepalives(
                dbapi_connection,
                idle_s=bounds.keepalive_idle_s,
                interval_s=bounds.keepalive_interval_s,
                count=ClientBounds.KEEPALIVE_COUNT,
                user_timeout_ms=math.ceil(bounds.command_timeout_s * 1000),
            )

        event.listen(engine.sync_engine, "connect", keep_alive)
        if pooler_mode == "none":
            set_session = session.set_sql(local=False)

            def apply_session_settings(dbapi_connection: Any, _record: object) -> None:
                # Once per physical connection (one round trip), never per call.
                dbapi_connection.run_async(lambda driver: driver.execute(set_session))

            event.listen(engine.sync_engine, "connect", apply_session_settings)
        return cls(engine, pooler_mode=pooler_mode, session=session, idle_checkout=True)

    def transaction(self) -> AbstractAsyncContextManager[AsyncConnection]:
        """Run a block in one transaction: commit on success, roll back on any exception.

        The block must be database work only: it is shielded from cancellation, so it must never
        wait on the network or on another request.

        Raises:
            Unavailable: no pooled connection freed up in time, or a statement hit a timeout.
        """
        # Behind a transaction pooler every unit of work is an explicit transaction (see PoolerMode).
        opened = self._explicit_transaction() if self.pooler_mode == "transaction" else self._begin_direct()
        return self._unit_of_work(opened, commits_each_statement=False)

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
        opened = self._explicit_transaction() if self.pooler_mode == "transaction" else self._pooled()
        return self._unit_of_work(opened, commits_each_statement=self._autocommit_each_statement)

    @asynccontextmanager
    async def _pooled(self) -> AsyncIterator[AsyncConnection]:
        # An idle pooled connection is taken and given back without SQLAlchemy's greenlet round trips (two per
        # unit of work, plus the task AsyncConnection closes in): 0.04-0.07 ms of every tool call's CPU (see
        # docs/performance.md). Whenever that needs I/O (all connections busy, a new or replaced one to open,
        # a transaction to end) SQLAlchemy's own async path does it, as for any other unit of work. Only for
        # shielded units of work: the inline return cannot be interrupted by a cancellation.
        conn = self._idle_connection() if self._idle_checkout else None
        if conn is None:
            async with self._engine.connect() as conn:
                yield conn
            return
        try:
            yield conn
        finally:
            await self._give_back(conn)

    def _idle_connection(self) -> AsyncConnection | None:
        """A pooled connection if one is idle and usable as it is, else ``None`` (nothing is held then)."""
        sync_engine = self._engine.sync_engine
        pool = sync_engine.pool
        if not isinstance(pool, QueuePool) or pool.checkedin() == 0:
            return None  # none idle: the pool would wait or open one, which needs the async path
        try:
            # Pool.connect() is synchronous. An idle connection that must be replaced first (closed by the
            # server, or opened before a failover invalidated the pool) would be reopened: outside a greenlet
            # _open_in_greenlet refuses before anything is opened, and the pool puts the entry back, as after
            # any failed connect. The unit of work then takes SQLAlchemy's async path.
            pooled = pool.connect()
        except MissingGreenlet:
            return None
        return AsyncConnection(self._engine, Connection(sync_engine, connection=pooled))

    @staticmethod
    async def _give_back(conn: AsyncConnection) -> None:
        sync = conn.sync_connection
        if sync is not None and not sync.closed and not sync.invalidated and not sync.in_transaction():
            # In autocommit with no transaction open, the return (the pool's reset is a driver-side no-op
            # then) does no I/O.
            sync.close()
        else:
            await conn.close()

    def _opened_autocommit(self) -> AbstractAsyncContextManager[AsyncConnection]:
        return self._explicit_transaction() if self.pooler_mode == "transaction" else self._engine.connect()

    @asynccontextmanager
    async def _unit_of_work(
        self, opened: AbstractAsyncContextManager[AsyncConnection], *, commits_each_statement: bool
    ) -> AsyncIterator[AsyncConnection]:
        # Every unit of work alike: shielded from cancellation, its errors translated. One generator for
        # all three (these methods return it rather than wrap it): each layer costs every tool call. The
        # phase costs two assignments; the translation runs only when something failed.
        with anyio.CancelScope(shield=True):
            phase = Phase.CONNECTING
            try:
                async with opened as conn:
                    phase = Phase.RUNNING
                    yield conn
                    phase = Phase.ENDING
            except DATABASE_ERRORS as exc:
                unavailable = translate(exc, phase, commits_each_statement=commits_each_statement)
                if unavailable is None:
                    raise
                report(unavailable, exc, self._on_unavailable)
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
            try:
                await driver.execute(self._begin_sql)
            except BaseException:
                # Sent on the raw connection, so SQLAlchemy saw nothing: a connection whose BEGIN failed
                # (closed, frozen, busy) is in an unknown state and must not go back to the pool.
                await conn.invalidate()
                raise
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

    async def readiness(self, within: float) -> Readiness:
        """Whether the database answers within ``within`` seconds, and as a server that takes writes.

        One statement, one round trip. A probe is no tool call: its failures are neither logged nor counted
        (a balancer probes every few seconds), though a connection it finds broken still leaves the pool.
        """
        try:
            async with asyncio.timeout(within), self._opened_autocommit() as conn:
                read_only = (await conn.execute(text(_READINESS_SQL))).scalar_one()
        except _PROBE_ERRORS:
            return "unreachable"
        return "read-only" if read_only else "ready"

    async def ping(self, within: float) -> bool:
        """Tell whether the database answers within ``within`` seconds as a writable primary."""
        return await self.readiness(within) == "ready"

    async def dispose(self) -> None:
        """Close every pooled connection."""
        await self._engine.dispose()
