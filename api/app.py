"""The composition root: ``create_app(settings)`` builds every part of a Coatcheck server.

Nothing is created at import time. Tests build their own app with their own settings.
"""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from functools import partial
from typing import Any

import httpx2
from litestar import Litestar, Request, Response, get, route
from litestar.datastructures import State
from litestar.handlers import BaseRouteHandler
from mcp.server.auth.provider import TokenVerifier
from mcp.server.mcpserver import MCPServer
from opentelemetry.trace import TracerProvider
from prometheus_client import CONTENT_TYPE_LATEST

from api.auth import Audiences, BearerVerifier, JwtVerifier
from api.authserver.clients import DEFAULT_SCOPE as AS_SCOPE
from api.authserver.setup import build_authorization_server
from api.commands.purge import RetentionPolicy, purge_periodically
from api.database import database_from
from api.draining import Drain
from api.durability import SyncStandbyCheck
from api.edge import Edge
from api.introspection import TokenIntrospection
from api.jose import IssuerMetadata, JwksCache
from api.logs import install_access_log_redaction, principal_digest_key
from api.mcp.auth_errors import answer_verifier_outages
from api.mcp.endpoint import (
    McpEndpoint,
    foreign_request_refusal,
    install_quiet_client_disconnects,
    transport_security,
)
from api.mcp.lanes import ToolLanes, inline_twin
from api.mcp.observer import ToolCallObserver
from api.mcp.sdk_pipeline import sdk_pipeline
from api.mcp.server import build_mcp_server
from api.metrics import Metrics
from api.oauth.browser_sessions import BrowserSessions
from api.oauth.setup import browser_login, build_browser_routes, build_connections, cookie_jar
from api.search_health import SearchHealth
from api.settings import Settings
from api.tracing import trace_statements

logger = logging.getLogger(__name__)


METADATA_CORS_HEADERS = {"Access-Control-Allow-Origin": "*"}
# Clients send MCP-Protocol-Version on metadata requests too, which makes them preflighted.
METADATA_PREFLIGHT_HEADERS = {
    **METADATA_CORS_HEADERS,
    "Access-Control-Allow-Methods": "GET",
    "Access-Control-Allow-Headers": "MCP-Protocol-Version",
    "Access-Control-Max-Age": "600",
}


def protected_resource_metadata(settings: Settings) -> dict[str, object]:
    """The RFC 9728 document describing the MCP endpoint as an OAuth protected resource.

    In authorization-server mode it names Coatcheck itself as the authorization server.
    """
    as_mode = settings.auth_mode == "authorization-server"
    return {
        "resource": settings.mcp_resource_url,
        "authorization_servers": [settings.authorization_server_url],
        "bearer_methods_supported": ["header"],
        "scopes_supported": [AS_SCOPE] if as_mode else list(settings.mcp_scopes),
        "resource_name": "Coatcheck",
    }


def _introspection(settings: Settings, issuer: IssuerMetadata, http: httpx2.AsyncClient) -> TokenIntrospection | None:
    """RFC 7662 introspection of opaque access tokens, when ``OIDC_INTROSPECTION_CLIENT_ID`` turns it on."""
    if settings.oidc_introspection_client_id is None or settings.oidc_introspection_client_secret is None:
        return None
    return TokenIntrospection(
        issuer=issuer,
        http=http,
        client_id=settings.oidc_introspection_client_id,
        client_secret=settings.oidc_introspection_client_secret.get_secret_value(),
        audiences=Audiences(settings.mcp_resource_url, tuple(settings.oidc_extra_audiences)),
        leeway=settings.jwt_leeway_seconds,
        cache_seconds=settings.oidc_introspection_cache_seconds,
        timeout=settings.oidc_introspection_timeout_seconds,
        endpoint=settings.oidc_introspection_url,
    )


def create_app(
    settings: Settings,
    *,
    configure_mcp: Callable[[MCPServer], None] | None = None,
    purge_every: timedelta | None = None,
    tracer_provider: TracerProvider | None = None,
) -> Litestar:
    """Build the Litestar app with the MCP endpoint, OAuth metadata and health routes.

    ``configure_mcp`` may register more tools before the server starts; ``purge_every`` runs the
    retention purge in the background at that interval while the app is up; ``tracer_provider``
    (from :func:`api.tracing.configure_tracing`) adds a span per database statement.
    """
    db = database_from(settings)
    # Observability: a registry of this app's own (none at import time); spans only when tracing is on.
    metrics = Metrics(db.sync_engine) if settings.metrics_enabled else None
    if metrics is not None:
        db.on_unavailable(metrics.record_db_unavailable)
    if tracer_provider is not None:
        trace_statements(db.sync_engine, tracer_provider)
    http = httpx2.AsyncClient(timeout=httpx2.Timeout(10.0), follow_redirects=False)
    issuer = IssuerMetadata(settings.oidc_issuer, http, internal_url=settings.oidc_issuer_internal_url)
    jwks = JwksCache(issuer, http, ttl=settings.jwks_cache_seconds)
    verifier = BearerVerifier(
        JwtVerifier(
            issuer=settings.oidc_issuer,
            resource=settings.mcp_resource_url,
            jwks=jwks,
            leeway=settings.jwt_leeway_seconds,
            extra_audiences=tuple(settings.oidc_extra_audiences),
        ),
        _introspection(settings, issuer, http),
    )
    # Connections: the token vault's cipher, the provider registry, and the /connect + /oauth browser routes.
    connections = build_connections(
        settings, db, http, record_refresh=metrics.record_refresh if metrics is not None else None
    )
    # Authorization-server mode: Coatcheck issues the MCP tokens itself (api/authserver); off by default.
    # One browser sign-in for /connect and the consent pages: both name the user by the same (issuer, subject).
    login = browser_login(settings, issuer, jwks, http)
    authorization_server = None
    if settings.auth_mode == "authorization-server":
        sessions = BrowserSessions(cookie_jar(settings), db)
        authorization_server = build_authorization_server(settings, db, login=login, sessions=sessions)
    mcp_verifier: TokenVerifier = verifier if authorization_server is None else authorization_server.verifier
    mcp, store_tools = build_mcp_server(settings, db, mcp_verifier, connections)
    mcp.middleware.append(
        ToolCallObserver(mcp, digest_key=principal_digest_key(settings.token_key_ring), metrics=metrics)
    )
    if configure_mcp is not None:
        configure_mcp(mcp)
    # One Host/Origin allow-list for /mcp (the SDK enforces it) and /metrics (enforced below).
    security = transport_security(settings)
    mcp_asgi = mcp.streamable_http_app(
        streamable_http_path="/",
        stateless_http=True,
        json_response=settings.mcp_json_response,
        transport_security=security,
        max_request_body_size=settings.max_request_body_bytes,
    )
    answer_verifier_outages(mcp_asgi)  # an IdP that cannot answer about a token: 503, not 401 or 500
    install_quiet_client_disconnects()
    # Streaming by default, but the store tools' calls are answered inline: the same answer without the
    # stream's per-call tasks (api/mcp/lanes.py). Both managers serve the one MCP server.
    managers = [mcp.session_manager]
    transport = None
    if not settings.mcp_json_response:
        inline = inline_twin(mcp.session_manager)
        managers.append(inline)
        transport = partial(ToolLanes, inline=inline, tools=store_tools)
    endpoint = McpEndpoint(
        sdk_pipeline(mcp_asgi, transport=transport),  # type: ignore[arg-type]  # Starlette's and Litestar's ASGI types
        body_limit=settings.max_request_body_bytes,
        reject_legacy=settings.legacy_clients == "reject",
        resource_metadata_url=f"{settings.public_url}/.well-known/oauth-protected-resource/mcp",
        cors_origins=frozenset(settings.cors_allowed_origins),
    )

    prm = protected_resource_metadata(settings)
    search_health = SearchHealth(db)
    prm_paths = ["/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"]

    # Public metadata: any web page may read it (browser MCP clients start OAuth discovery here). One
    # handler for GET and its preflight: Litestar would otherwise add its own OPTIONS handler, without CORS.
    @route(prm_paths, http_method=["GET", "OPTIONS"], sync_to_thread=False)
    def oauth_protected_resource(request: Request[Any, Any, Any]) -> Response[dict[str, object] | None]:
        if request.method == "OPTIONS":
            return Response(None, status_code=204, headers=METADATA_PREFLIGHT_HEADERS)
        return Response(prm, headers=METADATA_CORS_HEADERS)

    @get("/healthz", sync_to_thread=False)
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    drain = Drain(settings.shutdown_drain_seconds)
    sync_check = (
        SyncStandbyCheck(db, on_count=metrics.record_sync_standbys if metrics is not None else None)
        if settings.db_require_sync_standby
        else None
    )

    @get("/readyz")
    async def readyz() -> Response[dict[str, str]]:
        if drain.draining:  # leave the balancer's rotation before the listener closes
            return Response({"status": "shutting down"}, status_code=503)
        readiness = await db.readiness(settings.readyz_timeout_seconds)
        if readiness == "ready" and sync_check is not None and not sync_check.durable:
            # DB_REQUIRE_SYNC_STANDBY: an order acknowledged now would not survive a failover.
            return Response({"status": "no synchronous standby", "durability": sync_check.status}, status_code=503)
        if readiness == "ready":
            body = {"status": "ready"}
            if sync_check is not None:
                body["durability"] = sync_check.status
            search = await search_health.status()
            if search is not None:
                body["catalog_search"] = search
            return Response(body, status_code=200)
        # A standby answers queries but refuses every write: not ready, so a balancer routes elsewhere.
        status = "database read-only" if readiness == "read-only" else "database unreachable"
        return Response({"status": status}, status_code=503)

    observability: list[BaseRouteHandler] = []
    if metrics is not None:

        @get("/metrics", sync_to_thread=False, include_in_schema=False)
        def metrics_endpoint(request: Request[Any, Any, Any]) -> Response[bytes]:
            # A DNS-rebinding page reaches this port under its own host name: refuse it as /mcp does.
            refusal = foreign_request_refusal(request.headers.get("host"), request.headers.get("origin"), security)
            if refusal is not None:
                status, text = refusal
                return Response(text.encode(), status_code=status, media_type="text/plain")
            return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

        observability.append(metrics_endpoint)

    @asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        install_access_log_redaction()  # after the server configured logging: no codes in access lines
        purger = None
        if purge_every is not None:
            # A background task on the app's pool: one short statement at a time, never in a request's way.
            purger = asyncio.create_task(
                purge_periodically(
                    db,
                    RetentionPolicy.from_settings(settings),
                    purge_every,
                    on_purged=metrics.record_purged if metrics is not None else None,
                ),
                name="coatcheck-purge",
            )
        if authorization_server is not None:
            await authorization_server.start()
        checker = None
        if sync_check is not None:
            checker = asyncio.create_task(
                sync_check.run(settings.db_sync_standby_check_seconds), name="coatcheck-sync-standby-check"
            )
        try:
            async with contextlib.AsyncExitStack() as running:
                for manager in managers:
                    await running.enter_async_context(manager.run())
                yield
        finally:
            if authorization_server is not None:
                await authorization_server.stop()
            for task in (purger, checker):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            await http.aclose()
            await db.dispose()

    app = Litestar(
        route_handlers=[
            # /mcp is routed before Litestar's router, by the edge (below).
            oauth_protected_resource,
            healthz,
            readyz,
            *build_browser_routes(settings, connections, login),
            *(authorization_server.route_handlers if authorization_server is not None else []),
            *observability,
        ],
        lifespan=[lifespan],
        # Litestar's default logging config would reset the root logger to INFO with a format of its own;
        # api.logs configures every logger for the process instead.
        logging_config=None,
        openapi_config=None,
        state=State({"drain": drain}),  # run_http_server starts the drain on SIGTERM
    )
    # Every HTTP request enters the edge first (request id, its one log line); /mcp goes from there straight
    # to the MCP endpoint, everything else to Litestar's own handler (router, exception handling). The
    # lifespan still runs through Litestar.
    app.asgi_handler = Edge(app.asgi_handler, endpoint)
    return app
