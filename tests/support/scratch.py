"""A private, migrated database for tests that act on every row of a table (key rotation).

The session database is shared by all store tests, each under its own principal; a test that
re-encrypts *every* row would change other tests' rows, so it gets a database of its own.
"""

import asyncio
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.engine import make_url

from store.migrations import upgrade
from tests.conftest import _create_database, _drop_database


@contextmanager
def scratch_database(admin_database_url: str) -> Iterator[str]:
    """Create a database migrated to head, yield its URL, drop it afterwards."""
    name = f"coatcheck_scratch_{uuid.uuid4().hex[:10]}"
    asyncio.run(_create_database(admin_database_url, name))
    try:
        url = make_url(admin_database_url).set(database=name).render_as_string(hide_password=False)
        upgrade(url)
        yield url
    finally:
        asyncio.run(_drop_database(admin_database_url, name))
