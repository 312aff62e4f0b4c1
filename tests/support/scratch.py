"""A database of one's own, migrated to head: the session database and databases for tests that need a private one.

The session database is shared by all store tests, each under its own principal; a test that
re-encrypts *every* row would change other tests' rows, so it gets a database of its own.
"""

import asyncio
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.engine import make_url

from store.db import Database
from store.demo import seed_demo_catalog
from store.migrations import upgrade
from tests.support.databases import create_database, drop_database


async def _seed_demo_catalog(url: str) -> None:
    database = Database.connect(url)
    try:
        await seed_demo_catalog(database)
    finally:
        await database.dispose()


@contextmanager
def scratch_database(
    admin_database_url: str, *, prefix: str = "coatcheck_scratch", demo_catalog: bool = False
) -> Iterator[str]:
    """Create a database migrated to head (and seeded with the demo catalog if asked), yield its URL, drop it after."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    asyncio.run(create_database(admin_database_url, name))
    try:
        url = make_url(admin_database_url).set(database=name).render_as_string(hide_password=False)
        upgrade(url)
        if demo_catalog:
            asyncio.run(_seed_demo_catalog(url))
        yield url
    finally:
        asyncio.run(drop_database(admin_database_url, name))
