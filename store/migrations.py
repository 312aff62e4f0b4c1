"""Run the Alembic migration chain in `migrations/` programmatically (`coatcheck migrate` and the tests use this)."""

import asyncio
from dataclasses import dataclass
from importlib.resources import files

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine


def migrations_directory() -> str:
    """Where the Alembic scripts are: the ``migrations`` package, in a source tree or an installed wheel."""
    return str(files("migrations"))


def alembic_config(database_url: str | None = None, connection: Connection | None = None) -> Config:
    """An Alembic config for ``database_url`` or ``connection``, independent of the working directory.

    Only the script location is needed to migrate; ``pyproject.toml``'s [tool.alembic] serves the
    ``alembic`` command line in a checkout (``alembic revision``), which a wheel install has no use for.
    """
    config = Config()
    config.set_main_option("script_location", migrations_directory())
    if database_url is not None:
        # ConfigParser interpolation would eat a "%" in a password.
        config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    """Bring the database at ``database_url`` to ``revision``."""
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str) -> None:
    """Take the database at ``database_url`` back to ``revision``."""
    command.downgrade(alembic_config(database_url), revision)


@dataclass(frozen=True, slots=True)
class SchemaStatus:
    """Where a database's schema is against the migrations shipped with this code."""

    current: tuple[str, ...]
    heads: tuple[str, ...]

    @property
    def at_head(self) -> bool:
        return set(self.current) == set(self.heads)


def schema_status(database_url: str) -> SchemaStatus:
    """The database's Alembic revision(s) and this code's head revision(s). Reads only.

    Raises:
        OSError, SQLAlchemyError: the database cannot be reached.
    """
    heads = tuple(sorted(ScriptDirectory.from_config(alembic_config()).get_heads()))

    async def read_current() -> tuple[str, ...]:
        engine = create_async_engine(database_url)
        try:
            async with engine.connect() as conn:
                current = await conn.run_sync(lambda sync: MigrationContext.configure(sync).get_current_heads())
                return tuple(sorted(current))
        finally:
            await engine.dispose()

    return SchemaStatus(current=asyncio.run(read_current()), heads=heads)
