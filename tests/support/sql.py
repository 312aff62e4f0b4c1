"""Watch what the store sends to PostgreSQL, for tests that count statements."""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event

from store.db import Database


@contextmanager
def recorded_statements(database: Database) -> Iterator[list[str]]:
    """Collect every SQL statement sent through the engine while the block runs."""
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        seen.append(statement)

    event.listen(database.sync_engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(database.sync_engine, "before_cursor_execute", record)
