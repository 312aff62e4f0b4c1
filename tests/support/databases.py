"""Create and drop PostgreSQL databases for tests (session, scratch and install databases)."""

import asyncpg  # type: ignore[import-untyped]
from sqlalchemy.engine import make_url

PROBE_TIMEOUT = 3.0


def asyncpg_dsn(url: str) -> str:
    """``url`` (any SQLAlchemy PostgreSQL URL) as a plain ``postgresql://`` DSN for asyncpg."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def create_database(admin_url: str, name: str) -> None:
    """(Re)create the empty database ``name`` on the server of ``admin_url``."""
    conn = await asyncpg.connect(asyncpg_dsn(admin_url))
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()


def quote_identifier(name: str) -> str:
    """``name`` as a PostgreSQL quoted identifier."""
    return '"' + name.replace('"', '""') + '"'


async def drop_database(admin_url: str, name: str) -> None:
    """Drop ``name`` (disconnecting its sessions) if it exists."""
    conn = await asyncpg.connect(asyncpg_dsn(admin_url))
    try:
        await conn.execute(f"DROP DATABASE IF EXISTS {quote_identifier(name)} WITH (FORCE)")
    finally:
        await conn.close()


async def answers(url: str) -> bool:
    """Whether a PostgreSQL server accepts connections at ``url`` (refused or silent: no; anything else raises)."""
    try:
        conn = await asyncpg.connect(asyncpg_dsn(url), timeout=PROBE_TIMEOUT)
    except (OSError, TimeoutError):
        return False
    await conn.close()
    return True
