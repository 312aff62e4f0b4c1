"""What every operator command does around its own work: read its settings, open the database, close it.

A command states only its work: ``run_with_database(load_settings(Kind), work)``. Settings errors
end the process with exit status 2 and the message naming each bad variable; the database is
disposed of however the work ends.
"""

import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

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

    return asyncio.run(run())
