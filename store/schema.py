"""Run the Alembic migration chain programmatically (``coatcheck migrate`` and the tests use this)."""

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy.engine import Connection

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def alembic_config(database_url: str | None = None, connection: Connection | None = None) -> Config:
    """An Alembic config read from ``pyproject.toml`` ([tool.alembic]) for ``database_url`` or ``connection``."""
    config = Config(toml_file=str(PROJECT_ROOT / "pyproject.toml"))
    config.set_main_option("script_location", str(PROJECT_ROOT / "migrations"))
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
