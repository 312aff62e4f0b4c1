"""Build authorization-server mode from the settings (called by ``create_app`` when ``AUTH_MODE`` asks for it).

The SDK's ``create_auth_routes`` gives the OAuth endpoints as Starlette routes (``/authorize``, ``/token``,
``/register``, ``/revoke``); they are served under one Litestar ASGI handler, the way ``/mcp`` serves the
SDK's MCP app. Two things are served by Coatcheck itself: the RFC 8414 metadata (the SDK's lacks
``jwks_uri``, the ``none`` client authentication that public clients use, and RFC 9207's
``authorization_response_iss_parameter_supported``) and the JWKS.
"""

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, cast
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from litestar import Request, Response, route
from litestar.handlers import BaseRouteHandler, asgi
from litestar.types import Message, Receive, Scope, Send
from mcp.server.auth.routes import build_metadata, create_auth_routes
from mcp.server.auth.settings import ClientRegistrationOptions, RevocationOptions
from pydantic import AnyHttpUrl
from starlette.routing import Router

from api.auth import canonical_resource
from api.authserver.cimd import CimdFetcher, CimdRefused, is_metadata_url
from api.authserver.clients import DEFAULT_SCOPE, REQUESTABLE_SCOPES, parse_static_clients
from api.authserver.consent import consent_routes
from api.authserver.keys import SigningKeys
from api.authserver.provider import PostgresProvider
from api.authserver.retention import purge_periodically
from api.authserver.revocation import RevokedGrants
from api.authserver.verifier import AuthorizationServerTokenVerifier
from api.oauth.browser_sessions import BrowserSessions
from api.oauth.login import BrowserLogin
from api.settings import Settings
from store.db import Database

METADATA_PATH = "/.well-known/oauth-authorization-server"
JWKS_PATH = "/.well-known/jwks.json"
SCOPES = [DEFAULT_SCOPE]
_CORS = {"Access-Control-Allow-Origin": "*"}
_PREFLIGHT = {
    **_CORS,
    "Access-Control-Allow-Methods": "GET",
    "Access-Control-Allow-Headers": "MCP-Protocol-Version",
    "Access-Control-Max-Age": "600",
}


@dataclass
class AuthorizationServer:
    """What ``create_app`` wires in: the MCP token verifier, the routes, and what runs with the app."""

    verifier: AuthorizationServerTokenVerifier
    revoked: RevokedGrants
    provider: PostgresProvider
    database: Database
    route_handlers: list[BaseRouteHandler] = field(default_factory=list)

    purger: "asyncio.Task[None] | None" = None

    async def start(self) -> None:
        """Start the revocation listener and the periodic purge (with the app's lifespan)."""
        await self.revoked.start()
        self.purger = asyncio.create_task(purge_periodically(self.database), name="coatcheck-as-purge")

    async def stop(self) -> None:
        """Stop both and close the metadata-document client."""
        if self.purger is not None:
            self.purger.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.purger
        await self.revoked.stop()
        await self.provider.cimd.aclose()


def with_metadata_document_check(app: Callable[[Scope, Receive, Send], Awaitable[None]], cimd: CimdFetcher) -> Any:
    """``app`` (the SDK's authorize handler), first fetching a metadata-document ``client_id`` so that a
    refusal says why (the SDK would only say the client was not found): a 400 ``invalid_request`` page,
    never a redirect, since the redirect URI is not known to be the client's (RFC 6749 §4.1.2.1)."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        client_id = query.get("client_id", "")
        if scope.get("method") == "GET" and is_metadata_url(client_id):
            try:
                await cimd.client(client_id)
            except CimdRefused as exc:
                await _answer_json(send, 400, {"error": "invalid_request", "error_description": str(exc)})
                return
        await app(scope, receive, send)

    return wrapped


def with_issuer_on_redirects(app: Callable[[Scope, Receive, Send], Awaitable[None]], issuer: str) -> Any:
    """``app`` with RFC 9207 ``iss`` added to every redirect it sends to a client (its error responses).

    The SDK's authorize handler redirects errors to the client's redirect URI itself; success and consent
    answers are built by :mod:`api.authserver.consent`, which adds ``iss`` already.
    """

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_iss(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] in (302, 303):
                headers = []
                for name, value in message.get("headers", []):
                    if name.lower() == b"location" and not value.decode().startswith(issuer + "/"):
                        parts = urlsplit(value.decode())
                        query = [*parse_qsl(parts.query, keep_blank_values=True), ("iss", issuer)]
                        value = urlunsplit(parts._replace(query=urlencode(query))).encode()
                    headers.append((name, value))
                message = {**message, "headers": headers}
            await send(message)

        await app(scope, receive, send_with_iss)

    return wrapped


MAX_FORM_BYTES = 64 * 1024


async def _answer_json(send: Send, status: int, body: dict[str, str]) -> None:
    headers = [(b"content-type", b"application/json"), (b"cache-control", b"no-store")]
    await send(cast(Message, {"type": "http.response.start", "status": status, "headers": headers}))
    await send({"type": "http.response.body", "body": json.dumps(body).encode(), "more_body": False})


def with_form_check(
    app: Callable[[Scope, Receive, Send], Awaitable[None]],
    check: Callable[[list[tuple[str, str]]], tuple[bytes | None, dict[str, str] | None]],
) -> Any:
    """``app`` behind a look at its form body: ``check(pairs)`` returns a body to pass on instead (or ``None``
    to pass it as it came) and an RFC 6749 error to answer with instead (400). Bodies over 64 KiB get 413."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > MAX_FORM_BYTES:
                await _answer_json(send, 413, {"error": "invalid_request", "error_description": "request too large"})
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replacement, error = check(parse_qsl(body.decode("latin-1"), keep_blank_values=True))
        if error is not None:
            await _answer_json(send, 400, error)
            return
        body = body if replacement is None else replacement
        delivered = False

        async def replay() -> Any:
            nonlocal delivered
            if delivered:
                return await receive()
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}

        await app(scope, cast(Receive, replay), send)

    return wrapped


def optional_client_secret(pairs: list[tuple[str, str]]) -> tuple[bytes | None, dict[str, str] | None]:
    """For the SDK's revocation handler: accept a public client's request without ``client_secret``.

    RFC 7009 lets a public client send just ``token`` and ``client_id``; the SDK's request model (mcp 2.3)
    declares ``client_secret`` without a default, so such a request would be refused as malformed. An absent
    ``client_secret`` is sent on as an empty one, which the SDK's client authentication reads as "none".
    """
    if any(key == "client_secret" for key, _ in pairs):
        return None, None
    return urlencode([*pairs, ("client_secret", "")]).encode(), None


def resource_is(resource: str) -> Callable[[list[tuple[str, str]]], tuple[bytes | None, dict[str, str] | None]]:
    """For the SDK's token handler, which ignores a token request's RFC 8707 ``resource``: one that is not
    Coatcheck's MCP URL is ``invalid_target`` (RFC 8707 §2)."""

    def check(pairs: list[tuple[str, str]]) -> tuple[bytes | None, dict[str, str] | None]:
        for key, value in pairs:
            if key == "resource" and canonical_resource(value) != canonical_resource(resource):
                return None, {
                    "error": "invalid_target",
                    "error_description": f"resource must be this server's MCP endpoint, {resource}",
                }
        return None, None

    return check


def build_authorization_server(
    settings: Settings, database: Database, *, login: BrowserLogin, sessions: BrowserSessions
) -> AuthorizationServer:
    """The provider, its routes, the consent pages and the MCP verifier for authorization-server mode."""
    issuer = settings.public_url
    keys = SigningKeys(settings.signing_key_ring)
    access_lifetime = timedelta(seconds=settings.as_access_token_seconds)
    revoked = RevokedGrants(
        database,
        settings.database_url,
        window=access_lifetime + timedelta(seconds=settings.jwt_leeway_seconds + 60),
        listen=settings.db_pooler_mode == "none",
    )
    verifier = AuthorizationServerTokenVerifier(
        keys, issuer=issuer, resource=settings.mcp_resource_url, revoked=revoked, leeway=settings.jwt_leeway_seconds
    )
    cimd = CimdFetcher(
        database,
        timeout=settings.as_cimd_timeout_seconds,
        allow_loopback=settings.as_cimd_allow_loopback,
        enabled=settings.as_cimd_enabled,
    )
    provider = PostgresProvider(
        database=database,
        keys=keys,
        verifier=verifier,
        cipher_keys=settings.token_key_ring,
        issuer=issuer,
        resource=settings.mcp_resource_url,
        static_clients=parse_static_clients(settings.as_clients) if settings.as_clients else (),
        access_token_lifetime=access_lifetime,
        refresh_token_lifetime=timedelta(days=settings.as_refresh_token_days),
        registrations_per_minute=settings.as_registrations_per_minute,
        cimd=cimd,
    )
    registration = ClientRegistrationOptions(
        enabled=settings.as_registrations_per_minute > 0, valid_scopes=list(REQUESTABLE_SCOPES), default_scopes=SCOPES
    )
    revocation = RevocationOptions(enabled=True)
    issuer_url = AnyHttpUrl(issuer)
    sdk_routes = [
        r
        for r in create_auth_routes(provider, issuer_url, None, registration, revocation)
        if getattr(r, "path", None) != METADATA_PATH
    ]
    # Starlette and Litestar spell the same ASGI types differently; both are plain ASGI callables.
    router = cast(Any, Router(routes=sdk_routes))
    authorize_with_iss = with_metadata_document_check(with_issuer_on_redirects(router, issuer), cimd)
    revoke_without_secret = with_form_check(router, optional_client_secret)
    token_for_this_resource = with_form_check(router, resource_is(settings.mcp_resource_url))
    paths = [str(getattr(r, "path", "")) for r in sdk_routes]

    @asgi(paths, copy_scope=True)
    async def oauth_endpoints(scope: Scope, receive: Receive, send: Send) -> None:
        sdk_scope = dict(scope)
        sdk_scope.update(root_path="")
        app = {
            "/authorize": authorize_with_iss,
            "/revoke": revoke_without_secret,
            "/token": token_for_this_resource,
        }.get(scope["path"], router)
        await app(sdk_scope, receive, send)

    metadata = build_metadata(issuer_url, None, registration, revocation).model_dump(mode="json", exclude_none=True)
    metadata.update(
        issuer=issuer,  # exactly PUBLIC_URL: RFC 8414 issuers compare as strings (no added slash)
        jwks_uri=f"{issuer}{JWKS_PATH}",
        token_endpoint_auth_methods_supported=["none", "client_secret_basic", "client_secret_post"],
        revocation_endpoint_auth_methods_supported=["none", "client_secret_basic", "client_secret_post"],
        authorization_response_iss_parameter_supported=True,
        client_id_metadata_document_supported=settings.as_cimd_enabled,
        scopes_supported=SCOPES,
    )
    for key in ("authorization_endpoint", "token_endpoint", "registration_endpoint", "revocation_endpoint"):
        if key in metadata:
            metadata[key] = f"{issuer}{urlsplit(str(metadata[key])).path}"
    jwks = keys.jwks()

    @route([METADATA_PATH], http_method=["GET", "OPTIONS"], sync_to_thread=False)
    def authorization_server_metadata(request: Request[Any, Any, Any]) -> Response[dict[str, Any] | None]:
        if request.method == "OPTIONS":
            return Response(None, status_code=204, headers=_PREFLIGHT)
        return Response(metadata, headers=_CORS)

    @route([JWKS_PATH], http_method=["GET", "OPTIONS"], sync_to_thread=False)
    def jwks_document(request: Request[Any, Any, Any]) -> Response[dict[str, Any] | None]:
        if request.method == "OPTIONS":
            return Response(None, status_code=204, headers=_PREFLIGHT)
        return Response(jwks, headers={**_CORS, "Cache-Control": "public, max-age=300"})

    pages = consent_routes(
        provider, database, login, sessions, public_url=settings.public_url, csrf_key=settings.token_key_ring[0]
    )
    return AuthorizationServer(
        verifier=verifier,
        revoked=revoked,
        provider=provider,
        database=database,
        route_handlers=[oauth_endpoints, authorization_server_metadata, jwks_document, *pages],
    )
