"""What an operator relies on at the HTTP edge: real hostnames behind a proxy, discover and cache hints,
routing-header validation, a request-size limit, and a bounded shutdown with requests in flight.

Host, Origin, discover and routing-header checks are the app's own, so they run in-process (``create_app``);
body limits, raw header bytes and shutdown need the real server and socket."""

import asyncio
import contextlib
import json
import signal
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx2
import pytest

from api.settings import Settings
from tests.support.auth_mode import McpTokens
from tests.support.inprocess import InProcessApp, settings_from, started_app
from tests.support.server import RunningServer, run_server
from tests.support.waiting import free_port
from tests.support.wire import PROTOCOL_VERSION, modern_request, post_async, response_message

# The cacheable results Coatcheck serves: it has no prompts or resources, so their list methods are
# -32601 (tests/api/test_advertised_capabilities.py); the conformance profile checks their hints.
CACHEABLE = ("server/discover", "tools/list")


@pytest.fixture
def http() -> Iterator[httpx2.Client]:
    with httpx2.Client(timeout=15.0) as client:
        yield client


@pytest.fixture
async def token(mcp_token: McpTokens, server: RunningServer) -> str:
    return await mcp_token(f"edge-{uuid.uuid4().hex[:8]}", resource=server.mcp_url)


@pytest.fixture
async def app_token(mcp_token: McpTokens, app: InProcessApp) -> str:
    return await mcp_token(f"edge-{uuid.uuid4().hex[:8]}", resource=app.mcp_url, transport=app.transport())


def _error(response: httpx2.Response) -> dict[str, Any]:
    body: dict[str, Any] = response.json()
    assert isinstance(body["error"], dict)
    return body


# --- a real domain behind a reverse proxy ----------------------------------------------------------

PUBLIC_HOST = "mcp.example.com"


@pytest.fixture(scope="module")
async def proxied_app(server_env: dict[str, str]) -> AsyncIterator[InProcessApp]:
    """An app whose PUBLIC_URL is a TLS domain; the proxy in front keeps the Host header.

    In-process: the Host and Origin checks are the app's, whatever server passes the header on.
    """
    env = {
        **server_env,
        "PUBLIC_URL": f"https://{PUBLIC_HOST}",
        "ALLOWED_HOSTS": "coatcheck.internal:8080",
        "ALLOWED_ORIGINS": "https://app.example.com",
    }
    async with started_app(settings_from(env)) as started:
        yield started


@pytest.fixture
async def proxied_http(proxied_app: InProcessApp) -> AsyncIterator[httpx2.AsyncClient]:
    async with proxied_app.http(timeout=15.0) as client:
        yield client


# No person can sign in at the TLS domain for a Coatcheck-issued token: the dev IdP's sign-in client lists only
# the session server's callback. The Host and Origin checks do not depend on the mode.
_PROXIED_RS_ONLY = "a token for the app at a TLS domain the dev IdP's sign-in client does not list"


@pytest.fixture
async def proxied_token(mcp_token: McpTokens) -> str:
    # What the IdP issues for the public resource https://mcp.example.com/mcp.
    return await mcp_token("edge-proxied", resource=f"https://{PUBLIC_HOST}/mcp")


@pytest.mark.resource_server_only(reason=_PROXIED_RS_ONLY)
@pytest.mark.parametrize("host", [PUBLIC_HOST, "coatcheck.internal:8080"])
async def test_requests_for_the_public_domain_or_an_extra_allowed_host_are_served(
    proxied_http: httpx2.AsyncClient, proxied_token: str, host: str
) -> None:
    response = await post_async(proxied_http, "/mcp", "tools/list", token=proxied_token, extra_headers={"Host": host})
    assert response.status_code == 200
    assert response_message(response)["result"]["tools"]


@pytest.mark.resource_server_only(reason=_PROXIED_RS_ONLY)
@pytest.mark.parametrize("host", ["127.0.0.1", "mcp.example.com.evil.test", "localhost:8000"])
async def test_any_other_host_is_refused_even_with_a_valid_token(
    proxied_http: httpx2.AsyncClient, proxied_token: str, host: str
) -> None:
    response = await post_async(proxied_http, "/mcp", "tools/list", token=proxied_token, extra_headers={"Host": host})
    assert response.status_code == 421


@pytest.mark.resource_server_only(reason=_PROXIED_RS_ONLY)
@pytest.mark.parametrize(
    ("origin", "status"),
    [(f"https://{PUBLIC_HOST}", 200), ("https://app.example.com", 200), ("https://evil.example", 403), ("null", 403)],
)
async def test_browser_origins_are_checked_against_the_public_url_and_allowed_origins(
    proxied_http: httpx2.AsyncClient, proxied_token: str, origin: str, status: int
) -> None:
    headers = {"Host": PUBLIC_HOST, "Origin": origin}
    response = await post_async(proxied_http, "/mcp", "tools/list", token=proxied_token, extra_headers=headers)
    assert response.status_code == status


async def test_the_auth_challenge_and_resource_metadata_name_the_public_url(proxied_http: httpx2.AsyncClient) -> None:
    challenge = await post_async(proxied_http, "/mcp", "tools/list", extra_headers={"Host": PUBLIC_HOST})
    assert challenge.status_code == 401
    expected = f'resource_metadata="https://{PUBLIC_HOST}/.well-known/oauth-protected-resource/mcp"'
    assert expected in challenge.headers["www-authenticate"]
    document = (await proxied_http.get("/.well-known/oauth-protected-resource/mcp")).json()
    assert document["resource"] == f"https://{PUBLIC_HOST}/mcp"


# --- server/discover and cache hints ---------------------------------------------------------------


async def test_discover_names_the_version_capabilities_and_server_with_cache_hints(
    app_http: httpx2.AsyncClient, app_token: str
) -> None:
    result = response_message(await post_async(app_http, "/mcp", "server/discover", token=app_token))["result"]
    assert result["resultType"] == "complete"
    assert result["supportedVersions"] == [PROTOCOL_VERSION]
    assert "tools" in result["capabilities"]
    assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "coatcheck"
    assert result["instructions"]


@pytest.mark.parametrize("method", CACHEABLE)
async def test_every_cacheable_result_carries_valid_private_cache_hints(
    app_http: httpx2.AsyncClient, app_token: str, method: str
) -> None:
    result = response_message(await post_async(app_http, "/mcp", method, token=app_token))["result"]
    assert isinstance(result["ttlMs"], int)
    assert result["ttlMs"] >= 0
    # Everything is behind per-user auth, so no shared cache may reuse an answer across users.
    assert result["cacheScope"] == "private"


# --- Mcp-Method / Mcp-Name / MCP-Protocol-Version validation ---------------------------------------


@pytest.mark.parametrize(
    ("method", "params", "header_changes"),
    [
        ("tools/list", None, {"Mcp-Method": "prompts/list"}),
        ("tools/list", None, {"Mcp-Method": "TOOLS/LIST"}),
        ("tools/list", None, {"Mcp-Method": None}),
        ("tools/call", {"name": "cart_create", "arguments": {}}, {"Mcp-Name": "cart_list"}),
        ("tools/call", {"name": "cart_create", "arguments": {}}, {"Mcp-Name": None}),
        ("tools/list", None, {"MCP-Protocol-Version": "2026-07-28", "_meta_version": "2099-01-01"}),
    ],
    ids=["method-mismatch", "method-case", "method-missing", "name-mismatch", "name-missing", "version-mismatch"],
)
async def test_routing_headers_that_disagree_with_the_body_get_400_header_mismatch(
    app_http: httpx2.AsyncClient,
    app_token: str,
    method: str,
    params: dict[str, Any] | None,
    header_changes: dict[str, str | None],
) -> None:
    headers, body = modern_request(method, params)
    headers["Authorization"] = f"Bearer {app_token}"
    changes = dict(header_changes)
    if "_meta_version" in changes:
        body["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = changes.pop("_meta_version")
    for name, value in changes.items():
        if value is None:
            headers.pop(name, None)
        else:
            headers[name] = value
    carts_before = await _cart_count(app_http, app_token)

    response = await app_http.post("/mcp", headers=headers, json=body)

    assert response.status_code == 400
    error = _error(response)
    assert error["error"]["code"] == -32020
    assert error["id"] == body["id"]
    assert await _cart_count(app_http, app_token) == carts_before  # the mismatched call did not run


async def _cart_count(app_http: httpx2.AsyncClient, app_token: str) -> int:
    response = await post_async(app_http, "/mcp", "tools/call", {"name": "cart_list"}, token=app_token)
    result = response_message(response)
    return len(result["result"]["structuredContent"]["carts"])


def test_a_routing_header_with_surrounding_whitespace_is_accepted(server: RunningServer, token: str) -> None:
    headers, body = modern_request("tools/call", {"name": "cart_list", "arguments": {}})
    headers.update({"Authorization": f"Bearer {token}", "Mcp-Name": "  cart_list\t"})
    # httpx2 will not send such a value, so this one goes over a plain socket.
    assert _raw_post_status(server.mcp_url, headers, json.dumps(body).encode()) == 200


def _raw_post_status(url: str, headers: dict[str, str], body: bytes) -> int:
    parts = urlsplit(url)
    lines = [
        f"POST {parts.path} HTTP/1.1",
        f"Host: {parts.netloc}",
        f"Content-Length: {len(body)}",
        "Connection: close",
    ]
    lines += [f"{name}:{value}" for name, value in headers.items()]
    with socket.create_connection((parts.hostname, parts.port), timeout=15.0) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        status_line = sock.makefile("rb").readline().decode("latin-1")
    return int(status_line.split()[1])


# --- request size limit ----------------------------------------------------------------------------


def test_the_default_request_body_limit_is_one_mebibyte() -> None:
    assert Settings.model_fields["max_request_body_bytes"].default == 1024 * 1024


SMALL_LIMIT = 4096


@pytest.fixture(scope="module")
def small_limit_server(server_env: dict[str, str]) -> Iterator[RunningServer]:
    port = free_port()
    env = {**server_env, "MAX_REQUEST_BODY_BYTES": str(SMALL_LIMIT)}
    with run_server(env, port=port, public_url=f"http://127.0.0.1:{port}") as running:
        yield running


@pytest.fixture
async def small_limit_token(mcp_token: McpTokens, small_limit_server: RunningServer) -> str:
    return await mcp_token("edge-limit", resource=small_limit_server.mcp_url)


def _padded_request(size: int) -> tuple[dict[str, str], bytes]:
    """A valid tools/list request whose JSON body is exactly ``size`` bytes (padding in an ignored param)."""
    headers, body = modern_request("tools/list")
    body["params"]["padding"] = ""
    overhead = len(json.dumps(body).encode())
    body["params"]["padding"] = "x" * (size - overhead)
    encoded = json.dumps(body).encode()
    assert len(encoded) == size
    return headers, encoded


@pytest.mark.parametrize("authenticated", [True, False])
def test_a_body_over_the_limit_is_refused_with_413_before_anything_else(
    http: httpx2.Client, small_limit_server: RunningServer, small_limit_token: str, authenticated: bool
) -> None:
    headers, content = _padded_request(SMALL_LIMIT + 1)
    if authenticated:
        headers["Authorization"] = f"Bearer {small_limit_token}"
    response = http.post(small_limit_server.mcp_url, headers=headers, content=content)
    assert response.status_code == 413
    assert str(SMALL_LIMIT) in _error(response)["error"]["message"]


def test_a_body_at_the_limit_is_served(
    http: httpx2.Client, small_limit_server: RunningServer, small_limit_token: str
) -> None:
    headers, content = _padded_request(SMALL_LIMIT)
    headers["Authorization"] = f"Bearer {small_limit_token}"
    response = http.post(small_limit_server.mcp_url, headers=headers, content=content)
    assert response.status_code == 200
    assert response_message(response)["result"]["tools"]


@pytest.mark.parametrize("protocol_version", [PROTOCOL_VERSION, "2025-11-25"])
def test_a_streamed_body_without_content_length_is_cut_off_at_the_limit(
    http: httpx2.Client, small_limit_server: RunningServer, small_limit_token: str, protocol_version: str
) -> None:
    headers, content = _padded_request(SMALL_LIMIT * 4)
    headers.update({"Authorization": f"Bearer {small_limit_token}", "MCP-Protocol-Version": protocol_version})

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(content), 1024):
            yield content[start : start + 1024]

    response = http.post(small_limit_server.mcp_url, headers=headers, content=chunks())
    assert "content-length" not in response.request.headers
    assert response.status_code == 413


# --- bounded shutdown ------------------------------------------------------------------------------

SHUTDOWN_TIMEOUT = 2
EXIT_MARGIN = 8.0  # process start-up noise on a loaded machine, not part of the contract


async def test_sigterm_with_a_request_in_flight_exits_within_the_shutdown_timeout(
    server_env: dict[str, str], mcp_token: McpTokens
) -> None:
    port = free_port()
    env = {**server_env, "SHUTDOWN_TIMEOUT_SECONDS": str(SHUTDOWN_TIMEOUT)}
    with run_server(env, port=port, public_url=f"http://127.0.0.1:{port}") as running:
        token = await mcp_token("edge-shutdown", resource=running.mcp_url)
        headers, body = modern_request("subscriptions/listen", {"notifications": {"toolsListChanged": True}})
        headers["Authorization"] = f"Bearer {token}"
        # A listen stream never finishes on its own: the slowest request there is.
        async with (
            httpx2.AsyncClient(timeout=httpx2.Timeout(30.0)) as http,
            http.stream("POST", running.mcp_url, headers=headers, json=body) as stream,
        ):
            assert stream.status_code == 200
            lines = stream.aiter_lines()
            async for line in lines:
                if "notifications/subscriptions/acknowledged" in line:
                    break

            started = time.monotonic()
            running.process.send_signal(signal.SIGTERM)
            # The server ends the stream when the grace period is over (abruptly: it is cancelled).
            with contextlib.suppress(httpx2.RemoteProtocolError, httpx2.ReadError):
                async for _ in lines:
                    pass
            exit_code = await asyncio.to_thread(running.process.wait, SHUTDOWN_TIMEOUT + EXIT_MARGIN)
            elapsed = time.monotonic() - started

    # The shutdown ran to its end (cancelling what outlived the grace period): a normal exit, not -15.
    assert exit_code == 0
    assert elapsed < SHUTDOWN_TIMEOUT + EXIT_MARGIN
    log = running.log_text()
    assert "Waiting for connections to close" in log
    assert "timeout graceful shutdown exceeded" in log
    assert "Waiting for application shutdown" in log
    assert "Finished server process" in log
