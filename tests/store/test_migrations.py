"""The migration chain is the schema: it matches the models and goes down and up cleanly."""

import asyncio
import uuid
from collections.abc import Callable, Iterator

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.schema import CreateIndex, CreateTable

from store.db import async_database_url
from store.migrations import downgrade, upgrade
from store.models import Base
from tests.support.databases import create_database, drop_database


def _empty_database(admin_database_url: str) -> Iterator[str]:
    name = f"coatcheck_mig_{uuid.uuid4().hex[:10]}"
    asyncio.run(create_database(admin_database_url, name))
    yield make_url(admin_database_url).set(database=name).render_as_string(hide_password=False)
    asyncio.run(drop_database(admin_database_url, name))


@pytest.fixture
def scratch_database_url(admin_database_url: str) -> Iterator[str]:
    """An empty database that this test may migrate up and down."""
    yield from _empty_database(admin_database_url)


@pytest.fixture
def models_database_url(admin_database_url: str) -> Iterator[str]:
    """Another empty database, for the schema the models create."""
    yield from _empty_database(admin_database_url)


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

    # Reflection reports an index on (sku COLLATE "C") as one on the column sku, so Alembic would remove
    # it and add the model's; such indexes are compared by their definitions instead (test below).
    collated = {
        index.name
        for table in Base.metadata.tables.values()
        for index in table.indexes
        if " COLLATE " in str(CreateIndex(index).compile(dialect=conn.dialect))
    }

    def expected(change: object) -> bool:
        if isinstance(change, tuple) and change[0] in {"add_index", "remove_index"} and change[1].name in collated:
            return False
        # An index that needs an extension the server lacks is skipped by the migration on purpose.
        if isinstance(change, tuple) and change[0] == "add_index" and change[1].name in needs:
            return needs[change[1].name] in installed
        return True

    return [change for change in compare_metadata(context, Base.metadata) if expected(change)]


def _create_from_models(extensions: set[str]) -> Callable[[Connection], None]:
    def create(conn: Connection) -> None:
        for extension in sorted(extensions):
            conn.execute(text(f'CREATE EXTENSION IF NOT EXISTS "{extension}"'))
        for table in Base.metadata.sorted_tables:
            conn.execute(CreateTable(table))
        for table in Base.metadata.sorted_tables:
            for index in table.indexes:
                needs = index.info.get("requires_extension")
                if needs is None or needs in extensions:  # as the migration, which skips what the server lacks
                    conn.execute(CreateIndex(index))
        conn.commit()

    return create


def _extensions(conn: Connection) -> set[str]:
    return set(conn.execute(text("SELECT extname FROM pg_extension WHERE extname <> 'plpgsql'")).scalars())


def _definitions(conn: Connection) -> dict[str, str]:
    """Every index and constraint on the models' tables, as PostgreSQL spells it back.

    Alembic's comparison does not see index collations or operator classes, nor check constraints; this
    does, because both sides are rendered by the server from its catalogs.
    """
    tables = sorted(Base.metadata.tables)
    indexes = conn.execute(
        text(
            "SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE i.indrelid::regclass::text = ANY(:tables)"
        ),
        {"tables": tables},
    ).all()
    constraints = conn.execute(
        text(
            "SELECT conrelid::regclass::text || '.' || conname, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid::regclass::text = ANY(:tables)"
        ),
        {"tables": tables},
    ).all()
    return {f"index {name}": ddl for name, ddl in indexes} | {f"constraint {name}": ddl for name, ddl in constraints}


def _tables(conn: Connection) -> set[str]:
    return set(inspect(conn).get_table_names())


def test_models_match_the_migrations(scratch_database_url: str) -> None:
    upgrade(scratch_database_url)
    assert _inspect(scratch_database_url, _diff) == []


def test_the_migrations_create_the_indexes_and_constraints_the_models_declare_down_to_collations(
    scratch_database_url: str, models_database_url: str
) -> None:
    upgrade(scratch_database_url)
    extensions = _inspect(scratch_database_url, _extensions)
    assert isinstance(extensions, set)
    _inspect(models_database_url, _create_from_models(extensions))
    migrated = _inspect(scratch_database_url, _definitions)
    assert isinstance(migrated, dict)
    # The comparison sees what Alembic's cannot: a collated index and a CHECK constraint.
    assert 'COLLATE "C"' in migrated["index ix_product_sku_prefix"]
    assert "open_slot IS NOT NULL" in migrated["constraint cart.ck_cart_open_holds_slot"]
    assert migrated == _inspect(models_database_url, _definitions)


def test_every_migration_downgrades_to_an_empty_schema_and_upgrades_again(scratch_database_url: str) -> None:
    upgrade(scratch_database_url)
    downgrade(scratch_database_url, "base")
    assert _inspect(scratch_database_url, _tables) == {"alembic_version"}
    upgrade(scratch_database_url)
    assert _inspect(scratch_database_url, _diff) == []


def test_the_catalog_migration_run_again_after_an_interrupted_index_build_completes_it(
    scratch_database_url: str, models_database_url: str
) -> None:
    # A run stopped during CREATE INDEX CONCURRENTLY (outside the migration's transaction) has committed the
    # column and left an invalid index of that name behind, but not the revision: it runs again from the top.
    upgrade(scratch_database_url, "a1b2c3d40006")

    def interrupted(conn: Connection) -> None:
        conn.execute(text("ALTER TABLE product ADD COLUMN active boolean DEFAULT true NOT NULL"))
        conn.execute(text("CREATE INDEX ix_product_sku_ci_prefix ON product (sku)"))  # the wrong definition
        conn.commit()

    _inspect(scratch_database_url, interrupted)
    upgrade(scratch_database_url)
    extensions = _inspect(scratch_database_url, _extensions)
    assert isinstance(extensions, set)
    _inspect(models_database_url, _create_from_models(extensions))
    migrated = _inspect(scratch_database_url, _definitions)
    assert isinstance(migrated, dict)
    assert "lower((sku)::text)" in migrated["index ix_product_sku_ci_prefix"]
    assert migrated == _inspect(models_database_url, _definitions)
    valid = _inspect(
        scratch_database_url,
        lambda conn: conn.execute(
            text("SELECT indisvalid FROM pg_index WHERE indexrelid = 'ix_product_sku_ci_prefix'::regclass")
        ).scalar_one(),
    )
    assert valid is True
    assert _inspect(scratch_database_url, _diff) == []
