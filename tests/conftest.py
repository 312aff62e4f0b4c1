"""Shared fixtures: a fresh PostgreSQL database built by the migrations, the dev IdP, a running server.

The database server comes from ``TEST_DATABASE_URL``; unset, the tests use the local server at
``TEST_DATABASE_DEFAULT_URL`` (default 127.0.0.1:5432), and if nothing answers there, an embedded
PostgreSQL 16 (the ``pgserver`` wheel of the test extra; tests/support/embedded_postgres.py) started for
this run on a free port.
Each run creates its own database, migrates it with ``alembic upgrade head`` and drops it at the end.
"""

import asyncio
import json
import os
import secrets
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import asyncpg
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from sqlalchemy.engine import make_url

from store.db import Database
from store.demo import seed_demo_catalog
from store.migrations import upgrade
from store.principal import Principal
from tests.support import figures
from tests.support.devidp import DevIdP, start_devidp
from tests.support.embedded_postgres import embedded_postgres
from tests.support.server import RunningServer, run_server
from tests.support.waiting import free_port

DEFAULT_TEST_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
PROBE_TIMEOUT = 3.0
# Which server this run uses, for the terminal summary.
_database_note: list[str] = []


def _asyncpg_dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def _create_database(admin_url: str, name: str) -> None:
    conn = await asyncpg.connect(_asyncpg_dsn(admin_url))
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()


async def _drop_database(admin_url: str, name: str) -> None:
    conn = await asyncpg.connect(_asyncpg_dsn(admin_url))
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


async def _answers(url: str) -> bool:
    """Whether a PostgreSQL server accepts connections at ``url`` (refused or silent: no; anything else raises)."""
    try:
        conn = await asyncpg.connect(_asyncpg_dsn(url), timeout=PROBE_TIMEOUT)
    except (OSError, TimeoutError):
        return False
    await conn.close()
    return True


@pytest.fixture(scope="session")
def admin_database_url() -> Iterator[str]:
    """A URL for a database where the tests may create and drop databases (see the module docstring)."""
    explicit = os.environ.get("TEST_DATABASE_URL")
    if explicit:
        _database_note.append("TEST_DATABASE_URL")
        yield explicit
        return
    default = os.environ.get("TEST_DATABASE_DEFAULT_URL", DEFAULT_TEST_DATABASE_URL)
    if asyncio.run(_answers(default)):
        _database_note.append(f"the PostgreSQL at {make_url(default).render_as_string(hide_password=True)}")
        yield default
        return
    with embedded_postgres() as url:
        _database_note.append(
            f"an embedded PostgreSQL (pgserver) at {make_url(url).render_as_string(hide_password=True)}: "
            f"nothing answered at {make_url(default).render_as_string(hide_password=True)}"
        )
        yield url


def pytest_terminal_summary(terminalreporter: Any) -> None:
    figures.emit(terminalreporter)
    for note in _database_note:
        terminalreporter.write_line(f"database server: {note}")


@pytest.fixture(scope="session")
def database_url(admin_database_url: str) -> Iterator[str]:
    """A new database for this run, migrated to head and seeded with the demo catalog."""
    name = f"coatcheck_test_{uuid.uuid4().hex[:10]}"
    asyncio.run(_create_database(admin_database_url, name))
    url = make_url(admin_database_url).set(database=name).render_as_string(hide_password=False)
    upgrade(url)

    async def seed() -> None:
        db = Database.connect(url)
        try:
            await seed_demo_catalog(db)
        finally:
            await db.dispose()

    asyncio.run(seed())
    yield url
    asyncio.run(_drop_database(admin_database_url, name))


@pytest.fixture(scope="session")
async def database(database_url: str) -> AsyncIterator[Database]:
    """The store's database handle on the test database (commits are real)."""
    db = Database.connect(database_url)
    yield db
    await db.dispose()


@pytest.fixture
def new_principal() -> Callable[[], Principal]:
    """Make a fresh principal, so tests never see each other's rows."""

    def make() -> Principal:
        return Principal(issuer="https://issuer.test", subject=f"user-{uuid.uuid4().hex[:12]}")

    return make


@pytest.fixture(scope="session")
def server_port() -> int:
    return free_port()


@pytest.fixture(scope="session")
def public_url(server_port: int) -> str:
    return f"http://127.0.0.1:{server_port}"


@pytest.fixture(scope="session")
def request_state_keys() -> str:
    return ",".join(secrets.token_urlsafe(32) for _ in range(2))


@pytest.fixture(scope="session")
def token_encryption_keys() -> str:
    return ",".join(secrets.token_urlsafe(32) for _ in range(2))


LOGIN_CLIENT_ID = "coatcheck-login"
DEMO_CLIENT_ID = "coatcheck-demo"


@pytest.fixture(scope="session")
def oauth_client_secrets() -> dict[str, str]:
    """Secrets of the dev IdP's static clients: Coatcheck's browser login and the "demo" provider."""
    return {LOGIN_CLIENT_ID: secrets.token_urlsafe(32), DEMO_CLIENT_ID: secrets.token_urlsafe(32)}


def devidp_clients(public_url: str, client_secrets: dict[str, str]) -> list[dict[str, object]]:
    """The static confidential clients Coatcheck needs at the dev IdP (DEVIDP_CLIENTS)."""
    return [
        {
            "client_id": LOGIN_CLIENT_ID,
            "client_secret": client_secrets[LOGIN_CLIENT_ID],
            "client_name": "Coatcheck sign-in",
            "redirect_uris": [f"{public_url}/oauth/login/callback"],
            "grant_types": ["authorization_code"],
            "scope": "openid",
        },
        {
            "client_id": DEMO_CLIENT_ID,
            "client_secret": client_secrets[DEMO_CLIENT_ID],
            "client_name": "Coatcheck (demo provider connection)",
            "redirect_uris": [f"{public_url}/oauth/callback"],
            "grant_types": ["authorization_code", "refresh_token"],
            "scope": "openid profile email offline_access",
        },
    ]


@pytest.fixture(scope="session")
def devidp(public_url: str, oauth_client_secrets: dict[str, str]) -> Iterator[DevIdP]:
    """The development identity provider, as a real Node process (also the "demo" provider)."""
    clients = devidp_clients(public_url, oauth_client_secrets)
    with start_devidp(port=free_port(), resources=[f"{public_url}/mcp"], clients=clients) as idp:
        yield idp


def demo_provider_config(issuer: str) -> str:
    """PROVIDERS for the dev IdP playing the "demo" provider (endpoints by OIDC discovery)."""
    return json.dumps(
        {
            "demo": {
                "display_name": "Demo provider",
                "issuer": issuer,
                "client_id": DEMO_CLIENT_ID,
                "client_secret_env": "DEMO_CLIENT_SECRET",
                "scopes": ["openid", "profile", "email"],
            }
        }
    )


@pytest.fixture(scope="session")
def server_env(
    database_url: str,
    devidp: DevIdP,
    public_url: str,
    request_state_keys: str,
    token_encryption_keys: str,
    oauth_client_secrets: dict[str, str],
) -> dict[str, str]:
    """The environment a production server runs with in these tests: the required settings plus the demo provider."""
    return {
        "DATABASE_URL": database_url,
        "PUBLIC_URL": public_url,
        "OIDC_ISSUER": devidp.issuer,
        "REQUEST_STATE_KEYS": request_state_keys,
        "TOKEN_ENCRYPTION_KEYS": token_encryption_keys,
        "OIDC_CLIENT_ID": LOGIN_CLIENT_ID,
        "OIDC_CLIENT_SECRET": oauth_client_secrets[LOGIN_CLIENT_ID],
        "PROVIDERS": demo_provider_config(devidp.issuer),
        "DEMO_CLIENT_SECRET": oauth_client_secrets[DEMO_CLIENT_ID],
    }


@pytest.fixture(scope="session")
def server(server_env: dict[str, str], server_port: int) -> Iterator[RunningServer]:
    """``coatcheck serve`` running against the test database and the dev IdP."""
    with run_server(server_env, port=server_port) as running:
        yield running


McpClientFactory = Callable[..., AbstractAsyncContextManager[Client]]


@pytest.fixture
def mcp_client(server: RunningServer, devidp: DevIdP) -> McpClientFactory:
    """Open an official SDK client to the running server as ``username`` (a fresh user by default)."""

    @asynccontextmanager
    async def connect(username: str | None = None, **client_options: Any) -> AsyncIterator[Client]:
        token = await devidp.token(username or f"user-{uuid.uuid4().hex[:8]}", resource=server.mcp_url)
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30.0))
        async with http, Client(streamable_http_client(server.mcp_url, http_client=http), **client_options) as client:
            yield client

    return connect
