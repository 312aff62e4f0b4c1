"""The ``db`` service: the local PostgreSQL given the role and database the postgres image would create."""

import asyncpg  # type: ignore[import-untyped]

from tests.support.compose.errors import ComposeUpError
from tests.support.compose.project import Service
from tests.support.databases import quote_identifier

LOCAL_POSTGRES = ("127.0.0.1", 5432)


def _quote_literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


async def provision(admin_dsn: str, user: str, password: str, database: str) -> None:
    """Create (or reset the password of) ``user`` and a fresh ``database`` it owns; an old one is dropped."""
    conn = await asyncpg.connect(admin_dsn)
    try:
        # The postgres image makes POSTGRES_USER the cluster's superuser.
        exists = await conn.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", user)
        verb = "ALTER" if exists else "CREATE"
        await conn.execute(
            f"{verb} ROLE {quote_identifier(user)} WITH LOGIN SUPERUSER PASSWORD {_quote_literal(password)}"
        )
        await conn.execute(f"DROP DATABASE IF EXISTS {quote_identifier(database)} WITH (FORCE)")
        await conn.execute(f"CREATE DATABASE {quote_identifier(database)} OWNER {quote_identifier(user)}")
    finally:
        await conn.close()


def postgres_env(service: Service) -> tuple[str, str, str]:
    """The (user, password, database) the postgres image creates from the service's ``POSTGRES_*``."""
    env = service.environment
    if "POSTGRES_PASSWORD" not in env:
        raise ComposeUpError(f"{service.name}: the postgres image refuses to start without POSTGRES_PASSWORD")
    user = env.get("POSTGRES_USER", "postgres")
    return user, env["POSTGRES_PASSWORD"], env.get("POSTGRES_DB", user)
