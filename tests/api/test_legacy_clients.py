"""2025-11-25 clients (initialize handshake) on the same /mcp, and the operator switch that refuses them.

Decided behaviour, ``LEGACY_CLIENTS=serve`` (default): the handshake-era lane is served statelessly.
Every tool that needs no question to the user works (catalog and cart tools); ``cart_checkout``
needs a multi-round-trip (2026-07-28) client and answers with a tool error naming that version,
since a stateless legacy request has no channel for the confirmation question. No session id is
ever minted and nothing waits on a channel that does not exist.

``LEGACY_CLIENTS=reject``: every handshake-era request gets HTTP 400 with a JSON-RPC error naming
the supported version; 2026-07-28 clients are unaffected.

Which lane a request takes, and what it is answered, is the app's decision, so every test here talks to
the app built in-process by ``create_app`` (raw requests through ``app_http``, SDK clients through the same
ASGI transport); the reject mode is a second in-process app built from the same settings plus
``LEGACY_CLIENTS=reject``.
"""

import contextlib
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client, MCPError

from tests.support.auth_mode import McpTokens
from tests.support.inprocess import InProcessApp, settings_from, started_app
from tests.support.mcp_client import cart_with_first_product, text_of
from tests.support.wire import PROTOCOL_VERSION, modern_request, post_async, response_message

LEGACY_VERSION = "2025-11-25"
CALL_BOUND = 15.0  # every legacy exchange must finish well within this


def _initialize(request_id: int = 1) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "initialize",
        "params": {
            "protocolVersion": LEGACY_VERSION,
            "capabilities": {"elicitation": {}},
            "clientInfo": {"name": "legacy-wire-test", "version": "0"},
        },
    }


def _legacy_headers(token: str | None, *, version: str | None = LEGACY_VERSION) -> dict[str, str]:
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    if version is not None:
        headers["MCP-Protocol-Version"] = version
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return headers


@asynccontextmanager
async def _legacy_client(app: InProcessApp, token: str, **options: Any) -> AsyncIterator[Client]:
    """The official SDK client in its handshake-era (2025-11-25) mode, to ``app``."""
    async with app.mcp_client(token, mode="legacy", **options) as client:
        yield client


async def _token(mcp_token: McpTokens, app: InProcessApp) -> str:
    return await mcp_token(f"legacy-{uuid.uuid4().hex[:8]}", resource=app.mcp_url, transport=app.transport())


@pytest.fixture
async def token(mcp_token: McpTokens, app: InProcessApp) -> str:
    return await _token(mcp_token, app)


async def test_a_2025_11_25_client_uses_every_cart_tool_on_the_same_endpoint(
    app: InProcessApp, mcp_token: McpTokens
) -> None:
    token = await _token(mcp_token, app)
    with anyio.fail_after(60):
        async with _legacy_client(app, token) as client:
            assert client.protocol_version == LEGACY_VERSION
            names = {tool.name for tool in (await client.list_tools()).tools}
            assert {"catalog_search", "cart_create", "cart_set_item", "cart_view", "cart_list", "cart_delete"} <= names
            cart_id, _ = await cart_with_first_product(client, quantity=2)
            viewed = await client.call_tool("cart_view", {"cart_id": cart_id})
            assert viewed.structured_content is not None
            assert viewed.structured_content["items"][0]["quantity"] == 2
            listed = await client.call_tool("cart_list", {})
            assert listed.structured_content is not None
            assert cart_id in {cart["cart_id"] for cart in listed.structured_content["carts"]}
            deleted = await client.call_tool("cart_delete", {"cart_id": cart_id})
            assert not deleted.is_error, text_of(deleted)


async def test_checkout_tells_a_2025_11_25_client_it_needs_2026_07_28_and_changes_nothing(
    app: InProcessApp, mcp_token: McpTokens
) -> None:
    token = await _token(mcp_token, app)
    with anyio.fail_after(60):
        async with _legacy_client(app, token) as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            assert "cart_checkout" in names, sorted(names)
            cart_id, _ = await cart_with_first_product(client, quantity=1)

            result = await client.call_tool("cart_checkout", {"cart_id": cart_id})

            assert result.is_error
            assert "2026-07-28" in text_of(result)
            viewed = await client.call_tool("cart_view", {"cart_id": cart_id})
            assert viewed.structured_content is not None
            assert viewed.structured_content["status"] == "open"


async def test_the_legacy_handshake_mints_no_session_and_each_request_stands_alone(
    app_http: httpx2.AsyncClient, app: InProcessApp, token: str
) -> None:
    initialized = await app_http.post(app.mcp_url, headers=_legacy_headers(token, version=None), json=_initialize())
    assert initialized.status_code == 200
    assert "mcp-session-id" not in initialized.headers
    result = response_message(initialized)["result"]
    assert result["protocolVersion"] == LEGACY_VERSION
    assert result["serverInfo"]["name"] == "coatcheck"

    # No session to join: the next request works on its own, with or without a made-up session id.
    notification = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert (await app_http.post(app.mcp_url, headers=_legacy_headers(token), json=notification)).status_code == 202
    for extra in ({}, {"Mcp-Session-Id": "made-up"}):
        listed = await app_http.post(
            app.mcp_url,
            headers={**_legacy_headers(token), **extra},
            json={"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}},
        )
        assert listed.status_code == 200
        assert "mcp-session-id" not in listed.headers
        assert response_message(listed)["result"]["tools"]


async def test_legacy_requests_still_need_a_valid_token_when_served(
    app_http: httpx2.AsyncClient, app: InProcessApp
) -> None:
    response = await app_http.post(app.mcp_url, headers=_legacy_headers(None, version=None), json=_initialize())
    assert response.status_code == 401
    assert "resource_metadata=" in response.headers["www-authenticate"]


# --- LEGACY_CLIENTS=reject -------------------------------------------------------------------------


@pytest.fixture(scope="module")
async def rejecting_app(server_env: dict[str, str]) -> AsyncIterator[InProcessApp]:
    async with started_app(settings_from({**server_env, "LEGACY_CLIENTS": "reject"})) as started:
        yield started


@pytest.fixture
async def rejecting_http(rejecting_app: InProcessApp) -> AsyncIterator[httpx2.AsyncClient]:
    async with rejecting_app.http(timeout=CALL_BOUND) as client:
        yield client


@pytest.fixture
async def rejecting_token(mcp_token: McpTokens, rejecting_app: InProcessApp) -> str:
    return await mcp_token("legacy-refused", resource=rejecting_app.mcp_url, transport=rejecting_app.transport())


def _assert_refused(response: httpx2.Response, request_id: object, requested: str | None) -> None:
    assert response.status_code == 400
    assert response.headers["content-type"].startswith("application/json")
    assert "mcp-session-id" not in response.headers
    body = response.json()
    assert body["id"] == request_id
    assert body["error"]["code"] == -32022
    assert "2026-07-28" in body["error"]["message"]
    assert body["error"]["data"]["supported"] == ["2026-07-28"]
    if requested is not None:
        assert body["error"]["data"]["requested"] == requested


async def test_reject_mode_answers_initialize_with_400_naming_the_supported_version(
    rejecting_http: httpx2.AsyncClient, rejecting_app: InProcessApp, rejecting_token: str
) -> None:
    headers = _legacy_headers(rejecting_token, version=None)
    response = await rejecting_http.post(rejecting_app.mcp_url, headers=headers, json=_initialize(7))
    _assert_refused(response, 7, LEGACY_VERSION)


@pytest.mark.parametrize("version", ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"])
async def test_reject_mode_refuses_every_request_of_a_handshake_era_version(
    rejecting_http: httpx2.AsyncClient, rejecting_app: InProcessApp, rejecting_token: str, version: str
) -> None:
    headers = _legacy_headers(rejecting_token, version=version)
    call = {"jsonrpc": "2.0", "id": "c-1", "method": "tools/call", "params": {"name": "cart_create", "arguments": {}}}
    _assert_refused(await rejecting_http.post(rejecting_app.mcp_url, headers=headers, json=call), "c-1", version)
    notification = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    _assert_refused(await rejecting_http.post(rejecting_app.mcp_url, headers=headers, json=notification), None, version)


async def test_reject_mode_refuses_before_authentication(
    rejecting_http: httpx2.AsyncClient, rejecting_app: InProcessApp
) -> None:
    headers = _legacy_headers(None, version=None)
    response = await rejecting_http.post(rejecting_app.mcp_url, headers=headers, json=_initialize(3))
    _assert_refused(response, 3, LEGACY_VERSION)


async def test_reject_mode_answers_a_modern_request_without_its_version_header_with_header_mismatch(
    rejecting_http: httpx2.AsyncClient, rejecting_app: InProcessApp, rejecting_token: str
) -> None:
    headers, body = _modern_request_without_version_header()
    headers["Authorization"] = f"Bearer {rejecting_token}"
    response = await rejecting_http.post(rejecting_app.mcp_url, headers=headers, json=body)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == -32020
    assert response.json()["id"] == body["id"]


def _modern_request_without_version_header() -> tuple[dict[str, str], dict[str, Any]]:
    headers, body = modern_request("tools/list")
    del headers["MCP-Protocol-Version"]
    return headers, body


async def test_reject_mode_still_answers_2026_07_28_requests(
    rejecting_http: httpx2.AsyncClient, rejecting_app: InProcessApp, rejecting_token: str
) -> None:
    response = await post_async(rejecting_http, rejecting_app.mcp_url, "server/discover", token=rejecting_token)
    assert response.status_code == 200
    assert response_message(response)["result"]["supportedVersions"] == [PROTOCOL_VERSION]


async def test_reject_mode_still_serves_the_2026_07_28_sdk_client(
    rejecting_app: InProcessApp, rejecting_token: str
) -> None:
    with anyio.fail_after(30):
        async with rejecting_app.mcp_client(rejecting_token) as client:
            assert client.protocol_version == PROTOCOL_VERSION
            created = await client.call_tool("cart_create", {})
            assert not created.is_error


async def test_a_legacy_sdk_client_fails_fast_with_the_supported_version_in_reject_mode(
    rejecting_app: InProcessApp, rejecting_token: str
) -> None:
    with anyio.fail_after(CALL_BOUND), pytest.raises((MCPError, BaseExceptionGroup)) as raised:
        async with _legacy_client(rejecting_app, rejecting_token):
            pass
    refused = _mcp_error(raised.value)
    assert refused.code == -32022
    assert "2026-07-28" in refused.message


def _mcp_error(exc: BaseException) -> MCPError:
    """The MCPError inside what the client raised (its task groups wrap errors in groups)."""
    if isinstance(exc, MCPError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            with contextlib.suppress(LookupError):
                return _mcp_error(inner)
    raise LookupError(f"no MCPError in {exc!r}")
