"""The engine and the unit of work.

One tool call is one transaction: callers open :meth:`Database.transaction` once and
pass the connection to every repository they use within it.
"""

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine


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


class Database:
    """Owns an :class:`AsyncEngine` and hands out transactions."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        # Shares the pool; asyncpg then sends no BEGIN/COMMIT around a lone statement.
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")

    @classmethod
    def connect(
        cls, url: str, *, pool_size: int = 10, max_overflow: int = 10, statement_timeout_ms: int = 15000
    ) -> "Database":
        """Create a database handle for ``url`` (no connection is opened until first use)."""
        engine = create_async_engine(
            async_database_url(url),
            pool_size=pool_size,
            max_overflow=max_overflow,
            # No pre-ping round trip; see _discard_closed_connections for the cheap local check instead.
            connect_args={"server_settings": {"statement_timeout": str(statement_timeout_ms)}},
        )
        event.listen(engine.sync_engine, "checkout", _discard_closed_connections)
        return cls(engine)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection]:
        """Run a block in one transaction: commit on success, roll back on any exception."""
        async with self.engine.begin() as conn:
            yield conn

    @asynccontextmanager
    async def one_statement(self) -> AsyncIterator[AsyncConnection]:
        """Run a block that issues exactly one statement, as its own transaction (autocommit).

        A lone statement is atomic anyway; this saves the BEGIN and COMMIT round trips.

        A block that issues more than one statement must use :meth:`transaction` instead.
        """
        async with self._autocommit.connect() as conn:
            yield conn

    async def ping(self, within: float) -> bool:
        """Tell whether the database answers ``SELECT 1`` within ``within`` seconds."""
        try:
            async with asyncio.timeout(within), self.engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
        except (SQLAlchemyError, OSError, TimeoutError):
            return False
        return True

    async def dispose(self) -> None:
        """Close every pooled connection."""
        await self.engine.dispose()
