"""The composition root: ``create_app(settings)`` builds every part of a Coatcheck server.

Nothing is created at import time. Tests build their own app with their own settings.
"""

import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import httpx2
from litestar import Litestar, Response, get
from litestar.handlers import asgi
from litestar.types import HTTPResponseBodyEvent, HTTPResponseStartEvent, Receive, Scope, Send
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import HEADER_MISMATCH, INVALID_REQUEST, UNSUPPORTED_PROTOCOL_VERSION
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from api.auth import JwksCache, JwtVerifier
from api.mcp.server import build_mcp_server
from api.oauth.routes import install_access_log_redaction
from api.oauth.setup import build_browser_routes, build_connections
from api.settings import Settings
from store.db import Database

logger = logging.getLogger(__name__)

_LOOPBACK = ("localhost", "127.0.0.1", "[::1]")
_METHOD_NOT_ALLOWED = b'{"jsonrpc":"2.0","error":{"code":-32600,"message":"Method not allowed: POST only"}}'
_PROTOCOL_VERSION_META = "io.modelcontextprotocol/protocolVersion"


async def _send_jsonrpc_error(
    send: Send, status: int, code: int, message: str, *, request_id: object = None, data: object = None
) -> None:
    error: dict[str, object] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    body = json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}).encode()
    await send(
        HTTPResponseStartEvent(
            type="http.response.start", status=status, headers=[(b"content-type", b"application/json")]
        )
    )
    await send(HTTPResponseBodyEvent(type="http.response.body", body=body, more_body=False))


def _header(scope: Scope, name: bytes) -> str | None:
    return next((value.decode("latin-1") for key, value in scope["headers"] if key == name), None)


def _declared_body_too_large(scope: Scope, limit: int) -> bool:
    length = _header(scope, b"content-length")
    return length is not None and length.strip().isdigit() and int(length) > limit


def _is_legacy_lane(scope: Scope) -> bool:
    """Whether the SDK would serve this POST on its handshake-era (2025-11-25 and older) lane.

    Mirrors the SDK's own routing: only a known handshake version, or no version header at all,
    goes to the legacy transport; anything else gets the 2026-07-28 checks.
    """
    version = _header(scope, b"mcp-protocol-version")
    return version is None or version in HANDSHAKE_PROTOCOL_VERSIONS


async def _refuse_legacy_client(scope: Scope, receive: Receive, send: Send, limit: int) -> None:
    """Answer a handshake-era request with 400 and an error naming the versions we do serve."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return  # the client went away
        size += len(message.get("body", b""))
        if size > limit:
            await _send_jsonrpc_error(send, 413, INVALID_REQUEST, f"Request body exceeds {limit} bytes")
            return
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    try:
        body = json.loads(b"".join(chunks))
    except ValueError:
        body = None
    request: dict[str, Any] = body if isinstance(body, dict) else {}
    request_id = request.get("id") if isinstance(request.get("id"), str | int) else None
    params: dict[str, Any] = request["params"] if isinstance(request.get("params"), dict) else {}
    meta: dict[str, Any] = params["_meta"] if isinstance(params.get("_meta"), dict) else {}
    header = _header(scope, b"mcp-protocol-version")
    supported = list(MODERN_PROTOCOL_VERSIONS)
    if header is None and _PROTOCOL_VERSION_META in meta:
        # A 2026-07-28 request that forgot its header: the spec's answer is HeaderMismatch.
        await _send_jsonrpc_error(
            send, 400, HEADER_MISMATCH, "Missing MCP-Protocol-Version header", request_id=request_id
        )
        return
    requested = header or params.get("protocolVersion")
    data: dict[str, object] = {"supported": supported}
    if isinstance(requested, str):
        data["requested"] = requested
    await _send_jsonrpc_error(
        send,
        400,
        UNSUPPORTED_PROTOCOL_VERSION,
        f"Unsupported protocol version: this server accepts only {', '.join(supported)} "
        "(the initialize handshake of 2025-11-25 and earlier is turned off)",
        request_id=request_id,
        data=data,
    )


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
    jwks = JwksCache(
        settings.oidc_issuer, http, ttl=settings.jwks_cache_seconds, internal_url=settings.oidc_issuer_internal_url
    )
    verifier = JwtVerifier(
        issuer=settings.oidc_issuer, resource=settings.mcp_resource_url, jwks=jwks, leeway=settings.jwt_leeway_seconds
    )
    # Connections: the token vault's cipher, the provider registry, and the /connect + /oauth browser routes.
    connections = build_connections(settings, db, http)
    mcp = build_mcp_server(settings, db, verifier, connections=connections)
    if configure_mcp is not None:
        configure_mcp(mcp)
    mcp_asgi = mcp.streamable_http_app(
        streamable_http_path="/",
        stateless_http=True,
        json_response=settings.mcp_json_response,
        transport_security=transport_security(settings),
        max_request_body_size=settings.max_request_body_bytes,
    )
    body_limit = settings.max_request_body_bytes
    reject_legacy = settings.legacy_clients == "reject"

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
        # Refused unread, before auth and parsing; a body without Content-Length is
        # counted as it arrives (here or by the SDK) against the same limit.
        if _declared_body_too_large(scope, body_limit):
            message = f"Request body exceeds {body_limit} bytes"
            await _send_jsonrpc_error(send, 413, INVALID_REQUEST, message)
            return
        if reject_legacy and _is_legacy_lane(scope):
            await _refuse_legacy_client(scope, receive, send, body_limit)
            return
        # Surrounding whitespace is not part of a field value (RFC 9110 5.5), but uvicorn's httptools
        # parser keeps trailing blanks and the SDK compares Mcp-Name/Mcp-Method values verbatim.
        scope["headers"] = [(name, value.strip(b" \t")) for name, value in scope["headers"]]
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
        install_access_log_redaction()  # after the server configured logging: no codes in access lines
        try:
            async with mcp.session_manager.run():
                yield
        finally:
            await http.aclose()
            if owns_database:
                await db.dispose()

    return Litestar(
        route_handlers=[
            mcp_endpoint,
            oauth_protected_resource,
            healthz,
            readyz,
            *build_browser_routes(settings, connections, jwks, http),
        ],
        lifespan=[lifespan],
        openapi_config=None,
    )
