"""Shared fixtures: a fresh PostgreSQL database built by the migrations, the dev IdP, a running server.

The database server comes from ``TEST_DATABASE_URL``; unset, the tests use the local server at
``TEST_DATABASE_DEFAULT_URL`` (default 127.0.0.1:5432), and if nothing answers there, an embedded
PostgreSQL 16 (the ``pgserver`` wheel of the test extra; tests/support/embedded_postgres.py) started for
this run on a free port.
Each run creates its own database, migrates it with ``alembic upgrade head`` and drops it at the end.

``COATCHECK_TEST_AUTH_MODE=authorization-server`` runs the session server and the in-process apps in
authorization-server mode, with MCP tokens Coatcheck issues (tests/support/auth_mode.py, docs/testing.md);
tests marked ``resource_server_only`` are skipped then.
"""

import asyncio
import os
import secrets
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import pytest
from mcp import Client
from sqlalchemy.engine import make_url

from store.db import Database
from store.principal import Principal
from tests.support import figures
from tests.support.auth_mode import (
    MODE_VARIABLE,
    AuthMode,
    CoatcheckTokens,
    McpTokens,
    auth_mode_from,
    authorization_server_settings,
)
from tests.support.databases import answers
from tests.support.devidp import (
    DEMO_CLIENT_ID,
    LOGIN_CLIENT_ID,
    DevIdP,
    devidp_clients,
    server_environment,
    start_devidp,
)
from tests.support.embedded_postgres import embedded_postgres
from tests.support.inprocess import InProcessApp, settings_from, started_app
from tests.support.mcp_client import McpClientFactory, connect
from tests.support.scratch import scratch_database
from tests.support.server import RunningServer, run_server
from tests.support.waiting import free_port

# The headless-Chromium fixtures (browser and deploy tests).
pytest_plugins = ["tests.support.browser"]

DEFAULT_TEST_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
# Read once: every server and token of this run follows it.
AUTH_MODE: AuthMode = auth_mode_from()
# Which server this run uses, for the terminal summary.
_database_note: list[str] = []


@pytest.fixture(scope="session")
def admin_database_url() -> Iterator[str]:
    """A URL for a database where the tests may create and drop databases (see the module docstring)."""
    explicit = os.environ.get("TEST_DATABASE_URL")
    if explicit:
        _database_note.append("TEST_DATABASE_URL")
        yield explicit
        return
    default = os.environ.get("TEST_DATABASE_DEFAULT_URL", DEFAULT_TEST_DATABASE_URL)
    if asyncio.run(answers(default)):
        _database_note.append(f"the PostgreSQL at {make_url(default).render_as_string(hide_password=True)}")
        yield default
        return
    with embedded_postgres() as url:
        _database_note.append(
            f"an embedded PostgreSQL (pgserver) at {make_url(url).render_as_string(hide_password=True)}: "
            f"nothing answered at {make_url(default).render_as_string(hide_password=True)}"
        )
        yield url


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the tests that are about resource-server mode when this run is in authorization-server mode.

    A plain ``pytest.skip`` (not :func:`tests.support.prerequisites.missing`): the mode is a choice of the
    run, not a missing prerequisite, so ``COATCHECK_TESTS_REQUIRE_ALL=1`` does not turn it into a failure.
    """
    if AUTH_MODE != "authorization-server":
        return
    for item in items:
        marker = item.get_closest_marker("resource_server_only")
        if marker is not None:
            why = marker.kwargs.get("reason") or (marker.args[0] if marker.args else "about resource-server mode")
            item.add_marker(pytest.mark.skip(reason=f"resource-server mode only ({MODE_VARIABLE}={AUTH_MODE}): {why}"))


def pytest_report_header() -> str:
    return f"auth mode: {AUTH_MODE} ({MODE_VARIABLE})"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    figures.emit(terminalreporter)
    for note in _database_note:
        terminalreporter.write_line(f"database server: {note}")


@pytest.fixture(scope="session")
def database_url(admin_database_url: str) -> Iterator[str]:
    """A new database for this run, migrated to head and seeded with the demo catalog."""
    with scratch_database(admin_database_url, prefix="coatcheck_test", demo_catalog=True) as url:
        yield url


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


@pytest.fixture(scope="session")
def auth_mode() -> AuthMode:
    """The mode this run's servers use (``COATCHECK_TEST_AUTH_MODE``)."""
    return AUTH_MODE


@pytest.fixture(scope="session")
def as_signing_keys() -> str:
    """``AS_SIGNING_KEYS`` of this run's servers in authorization-server mode (a ring of two)."""
    return ",".join(secrets.token_urlsafe(32) for _ in range(2))


@pytest.fixture(scope="session")
def oauth_client_secrets() -> dict[str, str]:
    """Secrets of the dev IdP's static clients: Coatcheck's browser login and the "demo" provider."""
    return {LOGIN_CLIENT_ID: secrets.token_urlsafe(32), DEMO_CLIENT_ID: secrets.token_urlsafe(32)}


@pytest.fixture(scope="session")
def devidp(public_url: str, oauth_client_secrets: dict[str, str]) -> Iterator[DevIdP]:
    """The development identity provider, as a real Node process (also the "demo" provider)."""
    clients = devidp_clients(public_url, oauth_client_secrets)
    with start_devidp(port=free_port(), resources=[f"{public_url}/mcp"], clients=clients) as idp:
        yield idp


@pytest.fixture(scope="session")
def server_env(
    database_url: str,
    devidp: DevIdP,
    public_url: str,
    request_state_keys: str,
    token_encryption_keys: str,
    oauth_client_secrets: dict[str, str],
    as_signing_keys: str,
) -> dict[str, str]:
    """The environment a production server runs with in these tests: the required settings plus the demo
    provider, and in authorization-server mode that mode's settings (with the suite's pre-registered client)."""
    env = server_environment(
        database_url=database_url,
        public_url=public_url,
        idp=devidp,
        client_secrets=oauth_client_secrets,
        request_state_keys=request_state_keys,
        token_encryption_keys=token_encryption_keys,
    )
    if AUTH_MODE == "authorization-server":
        env.update(authorization_server_settings(as_signing_keys))
    return env


@pytest.fixture(scope="session")
def server(server_env: dict[str, str], server_port: int) -> Iterator[RunningServer]:
    """``coatcheck serve`` running against the test database and the dev IdP."""
    with run_server(server_env, port=server_port) as running:
        yield running


@pytest.fixture(scope="session")
async def app(server_env: dict[str, str]) -> AsyncIterator[InProcessApp]:
    """The server's app built in this process by ``create_app`` from the same settings as ``server``."""
    async with started_app(settings_from(server_env)) as started:
        yield started


@pytest.fixture
async def app_http(app: InProcessApp) -> AsyncIterator[httpx2.AsyncClient]:
    """An HTTP client whose requests go straight to the in-process app (paths relative to its base URL)."""
    async with app.http(timeout=15.0) as client:
        yield client


@pytest.fixture(scope="session")
def mcp_token(devidp: DevIdP, public_url: str, request: pytest.FixtureRequest) -> McpTokens:
    """``await mcp_token(username, resource=url)``: an MCP access token for ``username`` in this run's mode.

    Resource-server mode: minted by the dev IdP. Authorization-server mode: issued by Coatcheck through its
    own authorize, sign-in, consent and token steps, once per (server, user) and cached; the person signs in
    at the session ``server`` (a real process, so a test may ask from any event loop).
    """
    if AUTH_MODE != "authorization-server":
        return McpTokens(devidp)
    home: RunningServer = request.getfixturevalue("server")
    return McpTokens(devidp, CoatcheckTokens(devidp, home=home.base_url))


@pytest.fixture
def mcp_client(app: InProcessApp, mcp_token: McpTokens) -> McpClientFactory:
    """Open an official SDK client to the in-process app as ``username`` (a fresh user by default)."""

    @asynccontextmanager
    async def open_client(username: str | None = None, **client_options: Any) -> AsyncIterator[Client]:
        name = username or f"user-{uuid.uuid4().hex[:8]}"
        token = await mcp_token(name, resource=app.mcp_url, transport=app.transport())
        async with app.mcp_client(token, **client_options) as client:
            yield client

    return open_client


@pytest.fixture
def wire_mcp_client(server: RunningServer, mcp_token: McpTokens) -> McpClientFactory:
    """Open an official SDK client to the ``coatcheck serve`` process over real HTTP, as ``username``."""

    @asynccontextmanager
    async def open_client(username: str | None = None, **client_options: Any) -> AsyncIterator[Client]:
        token = await mcp_token(username or f"user-{uuid.uuid4().hex[:8]}", resource=server.mcp_url)
        async with connect(server.mcp_url, token, **client_options) as client:
            yield client

    return open_client
