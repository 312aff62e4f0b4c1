"""The edge of the /mcp endpoint: what Coatcheck decides before the SDK's transport sees a request.

The SDK speaks the protocol; this wrapper only adds the operator's policy around it:

* ``GET``/``DELETE`` get 405 for every client (2026-07-28 has no GET stream and no session to delete;
  otherwise the SDK's legacy lane would open an SSE stream for a GET);
* a declared body over ``MAX_REQUEST_BODY_BYTES`` is refused unread with 413, before auth and parsing
  (a body without Content-Length is counted by the SDK against the same limit);
* with ``LEGACY_CLIENTS=reject``, handshake-era requests get 400 naming the versions served;
* header values lose surrounding whitespace (RFC 9110 §5.5), which uvicorn's parser keeps and the
  SDK's ``Mcp-Name``/``Mcp-Method`` comparison would otherwise trip over;
* web pages on ``CORS_ALLOWED_ORIGINS`` get CORS: their preflight is answered here, and every answer to
  them carries ``Access-Control-Allow-Origin`` and exposes ``WWW-Authenticate`` (so a browser client can
  start OAuth discovery from a 401). Any other origin's preflight gets 403, and the SDK's Origin check
  still refuses its requests;
* a request with no bearer credentials at all gets a bare ``401`` challenge: RFC 6750 §3.1 says no error
  code then (the SDK would say ``invalid_token``, which it still does for a token that fails);
* a client that goes away before its body has arrived (it closed the connection, or the body deadline of
  :mod:`api.http_guard` closed it) ends the request with one DEBUG line. The SDK's body read raises
  Starlette's ``ClientDisconnect``: its 2026-07-28 lane lets it reach uvicorn as "Exception in ASGI
  application" with three chained tracebacks (caught here), its handshake-era lane logs it itself as
  "Error handling POST request" with a traceback (that record is dropped by
  :func:`install_quiet_client_disconnects`). Either would be a log flood any client could buy.
"""

import json
import logging
from typing import Any
from urllib.parse import urlsplit

from litestar.types import ASGIApp, HTTPResponseBodyEvent, HTTPResponseStartEvent, Receive, Scope, Send
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import HEADER_MISMATCH, INVALID_REQUEST, UNSUPPORTED_PROTOCOL_VERSION
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from starlette.requests import ClientDisconnect

from api.settings import Settings

logger = logging.getLogger(__name__)

_LOOPBACK = ("localhost", "127.0.0.1", "[::1]")
_PROTOCOL_VERSION_META = "io.modelcontextprotocol/protocolVersion"

# Request headers a browser MCP client sends; ``Mcp-Param-*`` are per-tool names (SEP-2243), so any header
# with that prefix is allowed rather than a list derived from today's tool schemas.
_CORS_REQUEST_HEADERS = frozenset(
    {"authorization", "content-type", "accept", "mcp-protocol-version", "mcp-method", "mcp-name", "last-event-id"}
)
_CORS_PARAM_PREFIX = "mcp-param-"
_CORS_EXPOSED = b"WWW-Authenticate, MCP-Protocol-Version"
_CORS_METHODS = b"POST, GET, DELETE"  # GET/DELETE answer 405, which the page should be able to read
_CORS_MAX_AGE = b"600"


async def _send_jsonrpc_error(
    send: Send,
    status: int,
    code: int,
    message: str,
    *,
    request_id: object = None,
    data: object = None,
    headers: tuple[tuple[bytes, bytes], ...] = (),
) -> None:
    error: dict[str, object] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    body = json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}).encode()
    await send(
        HTTPResponseStartEvent(
            type="http.response.start", status=status, headers=[(b"content-type", b"application/json"), *headers]
        )
    )
    await send(HTTPResponseBodyEvent(type="http.response.body", body=body, more_body=False))


def _has_bearer_credentials(authorization: bytes | None) -> bool:
    return authorization is not None and authorization.strip()[:7].lower() == b"bearer "


async def _send_challenge(send: Send, resource_metadata_url: str) -> None:
    body = json.dumps({"error_description": "Authentication required: send a bearer token"}).encode()
    challenge = f'Bearer resource_metadata="{resource_metadata_url}"'.encode()
    await send(
        HTTPResponseStartEvent(
            type="http.response.start",
            status=401,
            headers=[(b"content-type", b"application/json"), (b"www-authenticate", challenge)],
        )
    )
    await send(HTTPResponseBodyEvent(type="http.response.body", body=body, more_body=False))


def _header(scope: Scope, name: bytes) -> str | None:
    return next((value.decode("latin-1") for key, value in scope["headers"] if key == name), None)


_OWS = (b" ", b"\t")


def _scan_headers(scope: Scope) -> tuple[bytes | None, bytes | None, bytes | None, bool]:
    """One pass over the request headers: the first ``Origin``, ``Content-Length`` and ``Authorization``
    values, and whether any value has surrounding whitespace to strip."""
    origin = length = authorization = None
    padded = False
    for name, value in scope["headers"]:
        if name == b"authorization":
            authorization = value if authorization is None else authorization
        elif name == b"content-length":
            length = value if length is None else length
        elif name == b"origin":
            origin = value if origin is None else origin
        if not padded and (value.startswith(_OWS) or value.endswith(_OWS)):
            padded = True
    return origin, length, authorization, padded


def _allowed_request_headers(requested: str | None) -> bytes:
    """The subset of a preflight's ``Access-Control-Request-Headers`` that a browser MCP client may send."""
    names = [name.strip().lower() for name in (requested or "").split(",") if name.strip()]
    allowed = [
        name
        for name in names
        if name in _CORS_REQUEST_HEADERS or (name.startswith(_CORS_PARAM_PREFIX) and name.isascii())
    ]
    return ", ".join(allowed).encode("latin-1")


async def _answer_preflight(scope: Scope, send: Send, origin: str) -> None:
    headers = [
        (b"access-control-allow-origin", origin.encode("latin-1")),
        (b"access-control-allow-methods", _CORS_METHODS),
        (b"access-control-max-age", _CORS_MAX_AGE),
        (b"vary", b"Origin, Access-Control-Request-Headers"),
        (b"content-length", b"0"),
    ]
    allowed = _allowed_request_headers(_header(scope, b"access-control-request-headers"))
    if allowed:
        headers.append((b"access-control-allow-headers", allowed))
    await send(HTTPResponseStartEvent(type="http.response.start", status=204, headers=headers))
    await send(HTTPResponseBodyEvent(type="http.response.body", body=b"", more_body=False))


def _with_cors(send: Send, origin: str) -> Send:
    """``send`` that adds the CORS response headers for an allowed ``origin`` to the response start."""
    extra = [
        (b"access-control-allow-origin", origin.encode("latin-1")),
        (b"access-control-expose-headers", _CORS_EXPOSED),
        (b"vary", b"Origin"),
    ]

    async def send_with_cors(message: Any) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *extra]}
        await send(message)

    return send_with_cors


def _declared_body_too_large(length: bytes | None, limit: int) -> bool:
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
    origins = [
        *(f"{public.scheme}://{netloc}" for netloc in netlocs),
        *settings.allowed_origins,
        *settings.cors_allowed_origins,
    ]
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins)


def _listed(value: str, allowed: list[str]) -> bool:
    """The SDK's rule for its allow-lists: an exact entry, or ``name:*`` for that name on any port."""
    return value in allowed or any(entry.endswith(":*") and value.startswith(entry[:-1]) for entry in allowed)


def foreign_request_refusal(
    host: str | None, origin: str | None, security: TransportSecuritySettings
) -> tuple[int, str] | None:
    """The status and text the SDK's transport answers a request from a foreign Host or Origin, else ``None``.

    For routes outside the SDK (``/metrics``) that must refuse DNS-rebinding pages exactly as ``/mcp`` does:
    a ``Host`` not on the allow-list is ``421``, an ``Origin`` not on it is ``403`` (no ``Origin`` at all is a
    same-origin or non-browser request, which is allowed).
    """
    if not security.enable_dns_rebinding_protection:
        return None
    if not host or not _listed(host, security.allowed_hosts):
        return 421, "Invalid Host header"
    if origin and not _listed(origin, security.allowed_origins):
        return 403, "Invalid Origin header"
    return None


_GONE = "the client went away before its request body arrived"
_LEGACY_TRANSPORT_LOGGER = "mcp.server.streamable_http"  # the SDK's handshake-era transport


class _QuietClientDisconnect(logging.Filter):
    """Replace the legacy transport's error record for a ``ClientDisconnect`` with one DEBUG line of ours."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info is not None and isinstance(record.exc_info[1], ClientDisconnect):
            logger.debug(_GONE)
            return False
        return True


def install_quiet_client_disconnects() -> None:
    """Attach :class:`_QuietClientDisconnect` to the SDK's legacy transport logger, once per process."""
    sdk_logger = logging.getLogger(_LEGACY_TRANSPORT_LOGGER)
    if not any(isinstance(f, _QuietClientDisconnect) for f in sdk_logger.filters):
        sdk_logger.addFilter(_QuietClientDisconnect())


class McpEndpoint:
    """ASGI wrapper applying the edge policy above, then handing the request to the SDK's app."""

    def __init__(
        self,
        sdk_app: ASGIApp,
        *,
        body_limit: int,
        reject_legacy: bool,
        resource_metadata_url: str,
        cors_origins: frozenset[str] = frozenset(),
    ) -> None:
        self._sdk_app = sdk_app
        self._body_limit = body_limit
        self._reject_legacy = reject_legacy
        self._resource_metadata_url = resource_metadata_url
        self._cors_origins = cors_origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw_origin, length, authorization, padded = _scan_headers(scope)
        origin = raw_origin.decode("latin-1") if raw_origin is not None else None
        if origin is not None and origin in self._cors_origins:
            if scope.get("method") == "OPTIONS" and _header(scope, b"access-control-request-method"):
                await _answer_preflight(scope, send, origin)
                return
            send = _with_cors(send, origin)
        elif origin is not None and scope.get("method") == "OPTIONS":
            await _send_jsonrpc_error(
                send, 403, INVALID_REQUEST, "Cross-origin requests from this origin are not allowed"
            )
            return
        if scope.get("method") != "POST":
            await _send_jsonrpc_error(
                send, 405, INVALID_REQUEST, "Method not allowed: POST only", headers=((b"allow", b"POST"),)
            )
            return
        if _declared_body_too_large(length, self._body_limit):
            await _send_jsonrpc_error(send, 413, INVALID_REQUEST, f"Request body exceeds {self._body_limit} bytes")
            return
        if self._reject_legacy and _is_legacy_lane(scope):
            await _refuse_legacy_client(scope, receive, send, self._body_limit)
            return
        if not _has_bearer_credentials(authorization):
            await _send_challenge(send, self._resource_metadata_url)
            return
        if padded:
            scope["headers"] = [(name, value.strip(b" 	")) for name, value in scope["headers"]]
        try:
            await self._sdk_app(scope, receive, send)
        except ClientDisconnect:
            # Nobody is left to answer; whatever the SDK tried to send went nowhere (uvicorn drops it).
            logger.debug(_GONE)
