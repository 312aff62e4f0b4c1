"""The migration chain is the schema: it matches the models and goes down and up cleanly."""

import asyncio
import uuid
from collections.abc import Iterator

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.ext.asyncio import create_async_engine

from store.db import async_database_url
from store.migrations import downgrade, upgrade
from store.models import Base
from tests.conftest import _create_database, _drop_database


@pytest.fixture
def scratch_database_url(admin_database_url: str) -> Iterator[str]:
    """An empty database that this test may migrate up and down."""
    name = f"coatcheck_mig_{uuid.uuid4().hex[:10]}"
    asyncio.run(_create_database(admin_database_url, name))
    yield make_url(admin_database_url).set(database=name).render_as_string(hide_password=False)
    asyncio.run(_drop_database(admin_database_url, name))


def _inspect(url: str, fn: "type[object] | object") -> object:
    async def run() -> object:
        engine = create_async_engine(async_database_url(url))
        try:
            async with engine.connect() as conn:
                return await conn.run_sync(fn)  # type: ignore[arg-type]
        finally:
            await engine.dispose()

    return asyncio.run(run())


def _diff(conn: Connection) -> list[object]:
    context = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": True})
    installed = set(conn.execute(text("SELECT extname FROM pg_extension")).scalars())
    needs = {
        index.name: index.info["requires_extension"]
        for table in Base.metadata.tables.values()
        for index in table.indexes
        if "requires_extension" in index.info
    }

    def expected(change: object) -> bool:
        # An index that needs an extension the server lacks is skipped by the migration on purpose.
        if isinstance(change, tuple) and change[0] == "add_index" and change[1].name in needs:
            return needs[change[1].name] in installed
        return True

    return [change for change in compare_metadata(context, Base.metadata) if expected(change)]


def _tables(conn: Connection) -> set[str]:
    return set(inspect(conn).get_table_names())


def test_models_match_the_migrations(scratch_database_url: str) -> None:
    upgrade(scratch_database_url)
    assert _inspect(scratch_database_url, _diff) == []


def test_every_migration_downgrades_to_an_empty_schema_and_upgrades_again(scratch_database_url: str) -> None:
    upgrade(scratch_database_url)
    downgrade(scratch_database_url, "base")
    assert _inspect(scratch_database_url, _tables) == {"alembic_version"}
    upgrade(scratch_database_url)
    assert _inspect(scratch_database_url, _diff) == []
