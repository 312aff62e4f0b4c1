"""The composition root: ``create_app(settings)`` builds every part of a Coatcheck server.

Nothing is created at import time. Tests build their own app with their own settings.
"""

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

import httpx2
from litestar import Litestar, Response, get
from litestar.handlers import asgi
from litestar.types import HTTPResponseBodyEvent, HTTPResponseStartEvent, Receive, Scope, Send
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings

from api.auth import JwksCache, JwtVerifier
from api.mcp.server import build_mcp_server
from api.settings import Settings
from store.db import Database

logger = logging.getLogger(__name__)

_LOOPBACK = ("localhost", "127.0.0.1", "[::1]")
_METHOD_NOT_ALLOWED = b'{"jsonrpc":"2.0","error":{"code":-32600,"message":"Method not allowed: POST only"}}'


def transport_security(settings: Settings) -> TransportSecuritySettings:
    """Host and Origin allow-lists derived from ``PUBLIC_URL`` plus the configured extras.

    A loopback public URL also admits the other loopback spellings on the same port, so
    ``localhost`` and ``127.0.0.1`` both work in development.
    """
    public = urlsplit(settings.public_url)
    port = f":{public.port}" if public.port else ""
    netlocs = [public.netloc]
    if public.hostname in {"localhost", "127.0.0.1", "::1"}:
        netlocs = [f"{host}{port}" for host in _LOOPBACK]
    hosts = [*netlocs, *settings.allowed_hosts]
    origins = [*(f"{public.scheme}://{netloc}" for netloc in netlocs), *settings.allowed_origins]
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins)


def protected_resource_metadata(settings: Settings) -> dict[str, object]:
    """The RFC 9728 document describing the MCP endpoint as an OAuth protected resource."""
    return {
        "resource": settings.mcp_resource_url,
        "authorization_servers": [settings.oidc_issuer],
        "bearer_methods_supported": ["header"],
        "scopes_supported": ["openid"],
        "resource_name": "Coatcheck",
    }


def create_app(
    settings: Settings,
    *,
    database: Database | None = None,
    configure_mcp: Callable[[MCPServer], None] | None = None,
) -> Litestar:
    """Build the Litestar app with the MCP endpoint, OAuth metadata and health routes.

    ``database`` lets a caller share an engine it owns (it is then not disposed here);
    ``configure_mcp`` may register more tools before the server starts.
    """
    owns_database = database is None
    db = database or Database.connect(
        settings.database_url, pool_size=settings.db_pool_size, max_overflow=settings.db_max_overflow
    )
    http = httpx2.AsyncClient(timeout=httpx2.Timeout(10.0), follow_redirects=False)
    verifier = JwtVerifier(
        issuer=settings.oidc_issuer,
        resource=settings.mcp_resource_url,
        jwks=JwksCache(
            settings.oidc_issuer, http, ttl=settings.jwks_cache_seconds, internal_url=settings.oidc_issuer_internal_url
        ),
        leeway=settings.jwt_leeway_seconds,
    )
    mcp = build_mcp_server(settings, db, verifier)
    if configure_mcp is not None:
        configure_mcp(mcp)
    mcp_asgi = mcp.streamable_http_app(
        streamable_http_path="/",
        stateless_http=True,
        json_response=settings.mcp_json_response,
        transport_security=transport_security(settings),
    )

    @asgi("/mcp", is_mount=True, copy_scope=True)
    async def mcp_endpoint(scope: Scope, receive: Receive, send: Send) -> None:
        # 2026-07-28 has no GET stream and no session to DELETE; without this the SDK's
        # legacy lane would open an SSE stream for a GET.
        if scope.get("method") != "POST":
            await send(
                HTTPResponseStartEvent(
                    type="http.response.start",
                    status=405,
                    headers=[(b"allow", b"POST"), (b"content-type", b"application/json")],
                )
            )
            await send(HTTPResponseBodyEvent(type="http.response.body", body=_METHOD_NOT_ALLOWED, more_body=False))
            return
        await mcp_asgi(scope, receive, send)  # type: ignore[arg-type]

    prm = protected_resource_metadata(settings)

    @get(["/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"], sync_to_thread=False)
    def oauth_protected_resource() -> dict[str, object]:
        return prm

    @get("/healthz", sync_to_thread=False)
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @get("/readyz")
    async def readyz() -> Response[dict[str, str]]:
        if await db.ping(settings.readyz_timeout_seconds):
            return Response({"status": "ready"}, status_code=200)
        return Response({"status": "database unreachable"}, status_code=503)

    @asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        try:
            async with mcp.session_manager.run():
                yield
        finally:
            await http.aclose()
            if owns_database:
                await db.dispose()

    return Litestar(
        route_handlers=[mcp_endpoint, oauth_protected_resource, healthz, readyz],
        lifespan=[lifespan],
        openapi_config=None,
    )
