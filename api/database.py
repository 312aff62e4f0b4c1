"""Which database handle a process opens from its settings.

The server opens its pool (:func:`database_from`); an operator command works serially on one connection
(:func:`operator_database`). Both honour ``DB_POOLER_MODE``. A module of its own so that a command can
open either without importing the server's app.
"""

from api.settings import DatabaseSettings
from store.db import Database

__all__ = ["database_from", "operator_database"]


def database_from(settings: DatabaseSettings) -> Database:
    """The database handle the server uses: pool, timeouts and pooler mode from ``settings``."""
    return Database.connect(
        settings.database_url,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_max_overflow,
        pool_timeout=settings.db_pool_timeout_seconds,
        statement_timeout_ms=settings.db_statement_timeout_ms,
        lock_timeout_ms=settings.db_lock_timeout_ms,
        pooler_mode=settings.db_pooler_mode,
    )


def operator_database(settings: DatabaseSettings) -> Database:
    """One connection, through ``DB_POOLER_MODE`` like the servers: an operator command works serially."""
    return Database.connect(settings.database_url, pool_size=1, max_overflow=0, pooler_mode=settings.db_pooler_mode)
