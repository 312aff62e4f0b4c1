"""What every operator command does around its own work: read its settings, open the database, close it.

A command states only its work: ``run_with_database(load_settings(Kind), work)``. Settings errors
end the process with exit status 2 and the message naming each bad variable; so does a database that
cannot be reached or refuses the connection (one sentence naming where and why, never the URL's
password, instead of a traceback); the database is disposed of however the work ends.
"""

import asyncio
import logging
import os
import socket
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from api.database import operator_database
from api.settings import DatabaseSettings, SettingsError
from store.db import Database

__all__ = ["load_settings", "run_with_database"]

SettingsT = TypeVar("SettingsT", bound=DatabaseSettings)
ResultT = TypeVar("ResultT")


def load_settings(kind: type[SettingsT]) -> SettingsT:
    """``kind`` from the environment, or exit 2 with the message naming each bad variable.

    Each command reads the smallest member of the settings family it needs (``migrate`` only
    :class:`DatabaseSettings`), so an operator's shell need not hold the server's secrets.
    """
    try:
        return kind.from_env()
    except SettingsError as exc:
        print(f"coatcheck: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def run_with_database(
    settings: SettingsT,
    work: Callable[[Database], Awaitable[ResultT]],
    *,
    open_database: Callable[[SettingsT], Database] = operator_database,
) -> ResultT:
    """Run ``work`` on a database opened from ``settings`` in a fresh event loop; dispose of it afterwards.

    ``open_database`` chooses the pool (default :func:`operator_database`; ``api.database.database_from``
    for a command that runs the server's own code paths with the server's pool).
    """

    async def run() -> ResultT:
        database = open_database(settings)
        try:
            return await work(database)
        finally:
            await database.dispose()

    # The store logs each outage as a WARNING line for a server's log; an operator gets the command's own
    # sentence instead (below, or the command's), not both on the terminal.
    outages = logging.getLogger("store.db")
    level = outages.level
    outages.setLevel(logging.ERROR)
    try:
        return asyncio.run(run())
    except Exception as exc:
        reason = _connection_failure(exc)
        if reason is None:
            raise  # not the database's reachability: a bug, whose traceback is wanted
        message = f"coatcheck: cannot use the database at {_where(settings.database_url)}: {reason}"
        print(_without_password(message, settings.database_url), file=sys.stderr)
        raise SystemExit(2) from None
    finally:
        outages.setLevel(level)


def _connection_errors() -> tuple[type[BaseException], ...]:
    """What a connection attempt (or a connection lost meanwhile) raises beneath SQLAlchemy's wrapping.

    The network, the server refusing this role, password or database, or not taking connections. asyncpg
    is imported only here, when a command has failed, so a command's start-up does not pay for it.
    """
    import asyncpg  # type: ignore[import-untyped]

    return (
        OSError,  # refused, unreachable, unknown host, timed out
        asyncpg.PostgresConnectionError,
        asyncpg.InvalidAuthorizationSpecificationError,
        asyncpg.InvalidCatalogNameError,
        asyncpg.CannotConnectNowError,
        asyncpg.TooManyConnectionsError,
    )


def _causes(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        orig = getattr(current, "orig", None)  # SQLAlchemy's DBAPIError keeps the driver's error there
        current = orig if isinstance(orig, BaseException) else (current.__cause__ or current.__context__)


def _connection_failure(exc: BaseException) -> str | None:
    """A short reason if ``exc`` comes from reaching the database, else ``None``."""
    connection_errors = _connection_errors()
    for cause in _causes(exc):
        if not isinstance(cause, connection_errors):
            continue
        if isinstance(cause, socket.gaierror):
            return f"unknown host ({cause.strerror})"
        if isinstance(cause, TimeoutError):
            return "timed out"
        if isinstance(cause, OSError):
            return os.strerror(cause.errno).lower() if cause.errno else type(cause).__name__
        return str(cause).splitlines()[0] if str(cause) else type(cause).__name__  # the server's own words
    return None


def _where(url: str) -> str:
    try:
        parsed = make_url(url)
    except ArgumentError:
        return "DATABASE_URL"
    return f"{parsed.host or 'localhost'}:{parsed.port or 5432}/{parsed.database or ''}"


def _without_password(text: str, url: str) -> str:
    try:
        password = make_url(url).password
    except ArgumentError:
        return text
    return text.replace(str(password), "***") if password else text
