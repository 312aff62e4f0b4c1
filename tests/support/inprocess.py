"""The server's app built in this process by ``create_app(settings, …)`` and reached through an ASGI transport.

This is the same code path as ``coatcheck serve`` from the HTTP request to SQL, against the same PostgreSQL
and the same dev IdP, minus the socket and the subprocess. Tests whose behaviour does not depend on the wire
(tool semantics, errors, scoping, the MCP handshake, metadata routes) use it; wire, shutdown, multi-instance
and interop tests keep a real ``coatcheck serve`` (tests/support/server.py).
"""

import asyncio
import contextlib
import os
import secrets
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import httpx2
from litestar import Litestar
from mcp import Client
from mcp.server.mcpserver import MCPServer

from api.app import create_app
from api.mcp.server import BuiltServer, build_mcp_server
from api.oauth.setup import build_connections
from api.settings import Settings
from store.db import Database
from tests.support.mcp_client import connect


@contextlib.contextmanager
def environment(env: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` with ``env`` on top for the duration, then exactly as it was."""
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def settings_from(env: Mapping[str, str]) -> Settings:
    """The settings ``coatcheck serve`` would load from ``env`` (provider secrets included).

    The server reads its configuration from the environment, provider client secrets from the variables the
    provider configuration names; building them under ``env`` is the same path, with no ``.env`` file.
    """
    with environment(env):
        return Settings.from_env(_env_file=None)


@dataclass(frozen=True)
class InProcessApp:
    """A started app and the base URL its settings advertise (requests never leave the process)."""

    app: Litestar
    base_url: str

    @property
    def mcp_url(self) -> str:
        return f"{self.base_url}/mcp"

    def transport(self) -> httpx2.AsyncBaseTransport:
        """A transport that hands each request straight to the app."""
        # Litestar types its ASGI callable with its own event TypedDicts; httpx2 wants the generic signature.
        return httpx2.ASGITransport(app=self.app)  # type: ignore[arg-type]

    def http(self, **options: Any) -> httpx2.AsyncClient:
        """An HTTP client whose requests go straight to the app (``base_url`` set, so paths suffice)."""
        return httpx2.AsyncClient(transport=self.transport(), base_url=self.base_url, **options)

    def mcp_client(self, token: str, **client_options: Any) -> AbstractAsyncContextManager[Client]:
        """An official SDK client to this app's ``/mcp`` presenting ``token``."""
        return connect(self.mcp_url, token, transport=self.transport(), **client_options)


@contextlib.asynccontextmanager
async def started_app(settings: Settings, **create_app_options: Any) -> AsyncIterator[InProcessApp]:
    """``create_app(settings, …)`` with its lifespan entered (pool, session manager, HTTP client) until exit.

    The lifespan runs in a task of its own: the SDK's session manager holds an anyio task group, which must
    be exited by the task that entered it, and a fixture's setup and teardown may run in different tasks.
    """
    app = create_app(settings, **create_app_options)
    started, stop = asyncio.Event(), asyncio.Event()

    async def run_lifespan() -> None:
        async with app.lifespan():
            started.set()
            await stop.wait()

    task = asyncio.create_task(run_lifespan(), name="coatcheck-app-lifespan")
    ready = asyncio.create_task(started.wait())
    await asyncio.wait({task, ready}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    if not started.is_set():
        ready.cancel()
        if task.done():
            task.result()  # start-up failed: raise its error here
        task.cancel()
        raise TimeoutError("the app's lifespan did not start within 30 s")
    try:
        yield InProcessApp(app=app, base_url=settings.public_url)
    finally:
        stop.set()
        await task


class _NoVerifier:
    async def verify_token(self, token: str) -> None:
        return None


def production_mcp_server() -> MCPServer[Any]:
    """The MCP server ``create_app`` would build, with every tool, but no database, IdP or network behind it.

    For tests of what the server advertises or how the SDK's hooks treat its tools; nothing here connects.
    """
    return production_server().mcp


def production_server() -> BuiltServer:
    """:func:`production_mcp_server` with the names of its store tools (``build_mcp_server``'s answer)."""
    settings = Settings.from_env(
        database_url="postgresql://coatcheck@127.0.0.1:5432/unused",  # never connected to here
        public_url="http://127.0.0.1:9",
        oidc_issuer="http://127.0.0.1:9/idp",
        request_state_keys=secrets.token_urlsafe(32),
        token_encryption_keys=secrets.token_urlsafe(32),
        oidc_client_id="coatcheck-test",
        oidc_client_secret=secrets.token_urlsafe(32),
    )
    database = Database.connect(settings.database_url)
    connections = build_connections(settings, database, httpx2.AsyncClient())  # never called here
    return build_mcp_server(settings, database, _NoVerifier(), connections)
