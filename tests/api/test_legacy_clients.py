"""2025-11-25 clients (initialize handshake) on the same /mcp, and the operator switch that refuses them.

Decided behaviour, ``LEGACY_CLIENTS=serve`` (default): the handshake-era lane is served statelessly.
Every tool that needs no question to the user works (catalog and cart tools); ``cart_checkout``
needs a multi-round-trip (2026-07-28) client and answers with a tool error naming that version,
since a stateless legacy request has no channel for the confirmation question. No session id is
ever minted and nothing waits on a channel that does not exist.

``LEGACY_CLIENTS=reject``: every handshake-era request gets HTTP 400 with a JSON-RPC error naming
the supported version; 2026-07-28 clients are unaffected.
"""

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client

from tests.support.devidp import DevIdP
from tests.support.mcp_client import text_of
from tests.support.server import RunningServer, run_server
from tests.support.waiting import free_port
from tests.support.wire import PROTOCOL_VERSION, modern_request, post, response_message

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
async def _legacy_client(url: str, token: str, **options: Any) -> AsyncIterator[Client]:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(CALL_BOUND))
    async with http, Client(streamable_http_client(url, http_client=http), mode="legacy", **options) as client:
        yield client


@pytest.fixture
def http() -> Iterator[httpx2.Client]:
    with httpx2.Client(timeout=CALL_BOUND) as client:
        yield client


async def _token(devidp: DevIdP, server: RunningServer) -> str:
    return await devidp.token(f"legacy-{uuid.uuid4().hex[:8]}", resource=server.mcp_url)


@pytest.fixture
async def token(devidp: DevIdP, server: RunningServer) -> str:
    return await _token(devidp, server)


async def test_a_2025_11_25_client_uses_every_cart_tool_on_the_same_endpoint(
    server: RunningServer, devidp: DevIdP
) -> None:
    token = await _token(devidp, server)
    with anyio.fail_after(60):
        async with _legacy_client(server.mcp_url, token) as client:
            assert client.protocol_version == LEGACY_VERSION
            names = {tool.name for tool in (await client.list_tools()).tools}
            assert {"catalog_search", "cart_create", "cart_set_item", "cart_view", "cart_list", "cart_delete"} <= names
            found = await client.call_tool("catalog_search", {"limit": 1})
            assert not found.is_error
            assert found.structured_content is not None
            sku = found.structured_content["products"][0]["sku"]
            created = await client.call_tool("cart_create", {})
            assert created.structured_content is not None
            cart_id = created.structured_content["cart_id"]
            updated = await client.call_tool("cart_set_item", {"cart_id": cart_id, "sku": sku, "quantity": 2})
            assert not updated.is_error, text_of(updated)
            viewed = await client.call_tool("cart_view", {"cart_id": cart_id})
            assert viewed.structured_content is not None
            assert viewed.structured_content["items"][0]["quantity"] == 2
            listed = await client.call_tool("cart_list", {})
            assert listed.structured_content is not None
            assert cart_id in {cart["cart_id"] for cart in listed.structured_content["carts"]}
            deleted = await client.call_tool("cart_delete", {"cart_id": cart_id})
            assert not deleted.is_error, text_of(deleted)


async def test_checkout_tells_a_2025_11_25_client_it_needs_2026_07_28_and_changes_nothing(
    server: RunningServer, devidp: DevIdP
) -> None:
    token = await _token(devidp, server)
    with anyio.fail_after(60):
        async with _legacy_client(server.mcp_url, token) as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            assert "cart_checkout" in names, sorted(names)
            found = await client.call_tool("catalog_search", {"limit": 1})
            assert found.structured_content is not None
            created = await client.call_tool("cart_create", {})
            assert created.structured_content is not None
            cart_id = created.structured_content["cart_id"]
            sku = found.structured_content["products"][0]["sku"]
            await client.call_tool("cart_set_item", {"cart_id": cart_id, "sku": sku, "quantity": 1})

            result = await client.call_tool("cart_checkout", {"cart_id": cart_id})

            assert result.is_error
            assert "2026-07-28" in text_of(result)
            viewed = await client.call_tool("cart_view", {"cart_id": cart_id})
            assert viewed.structured_content is not None
            assert viewed.structured_content["status"] == "open"


def test_the_legacy_handshake_mints_no_session_and_each_request_stands_alone(
    http: httpx2.Client, server: RunningServer, token: str
) -> None:
    initialized = http.post(server.mcp_url, headers=_legacy_headers(token, version=None), json=_initialize())
    assert initialized.status_code == 200
    assert "mcp-session-id" not in initialized.headers
    result = response_message(initialized)["result"]
    assert result["protocolVersion"] == LEGACY_VERSION
    assert result["serverInfo"]["name"] == "coatcheck"

    # No session to join: the next request works on its own, with or without a made-up session id.
    notification = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert http.post(server.mcp_url, headers=_legacy_headers(token), json=notification).status_code == 202
    for extra in ({}, {"Mcp-Session-Id": "made-up"}):
        listed = http.post(
            server.mcp_url,
            headers={**_legacy_headers(token), **extra},
            json={"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}},
        )
        assert listed.status_code == 200
        assert "mcp-session-id" not in listed.headers
        assert response_message(listed)["result"]["tools"]


def test_legacy_requests_still_need_a_valid_token_when_served(http: httpx2.Client, server: RunningServer) -> None:
    response = http.post(server.mcp_url, headers=_legacy_headers(None, version=None), json=_initialize())
    assert response.status_code == 401
    assert "resource_metadata=" in response.headers["www-authenticate"]


# --- LEGACY_CLIENTS=reject -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rejecting_server(server_env: dict[str, str]) -> Iterator[RunningServer]:
    port = free_port()
    env = {**server_env, "LEGACY_CLIENTS": "reject"}
    with run_server(env, port=port, public_url=f"http://127.0.0.1:{port}") as running:
        yield running


@pytest.fixture
async def rejecting_token(devidp: DevIdP, rejecting_server: RunningServer) -> str:
    # Signed by the dev IdP for this server's own resource URL.
    return await devidp.token("legacy-refused", resource=devidp.resources[0], audience=rejecting_server.mcp_url)


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


def test_reject_mode_answers_initialize_with_400_naming_the_supported_version(
    http: httpx2.Client, rejecting_server: RunningServer, rejecting_token: str
) -> None:
    token = rejecting_token
    response = http.post(rejecting_server.mcp_url, headers=_legacy_headers(token, version=None), json=_initialize(7))
    _assert_refused(response, 7, LEGACY_VERSION)


@pytest.mark.parametrize("version", ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"])
def test_reject_mode_refuses_every_request_of_a_handshake_era_version(
    http: httpx2.Client, rejecting_server: RunningServer, rejecting_token: str, version: str
) -> None:
    token = rejecting_token
    call = {"jsonrpc": "2.0", "id": "c-1", "method": "tools/call", "params": {"name": "cart_create", "arguments": {}}}
    _assert_refused(
        http.post(rejecting_server.mcp_url, headers=_legacy_headers(token, version=version), json=call), "c-1", version
    )
    notification = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    _assert_refused(
        http.post(rejecting_server.mcp_url, headers=_legacy_headers(token, version=version), json=notification),
        None,
        version,
    )


def test_reject_mode_refuses_before_authentication(http: httpx2.Client, rejecting_server: RunningServer) -> None:
    response = http.post(rejecting_server.mcp_url, headers=_legacy_headers(None, version=None), json=_initialize(3))
    _assert_refused(response, 3, LEGACY_VERSION)


def test_reject_mode_answers_a_modern_request_without_its_version_header_with_header_mismatch(
    http: httpx2.Client, rejecting_server: RunningServer, rejecting_token: str
) -> None:
    token = rejecting_token
    headers, body = _modern_request_without_version_header()
    response = http.post(rejecting_server.mcp_url, headers={**headers, "Authorization": f"Bearer {token}"}, json=body)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == -32020
    assert response.json()["id"] == body["id"]


def _modern_request_without_version_header() -> tuple[dict[str, str], dict[str, Any]]:
    headers, body = modern_request("tools/list")
    del headers["MCP-Protocol-Version"]
    return headers, body


def test_reject_mode_still_answers_2026_07_28_requests(
    http: httpx2.Client, rejecting_server: RunningServer, rejecting_token: str
) -> None:
    response = post(http, rejecting_server.mcp_url, "server/discover", token=rejecting_token)
    assert response.status_code == 200
    assert response_message(response)["result"]["supportedVersions"] == [PROTOCOL_VERSION]


async def test_reject_mode_still_serves_the_2026_07_28_sdk_client(
    rejecting_server: RunningServer, rejecting_token: str
) -> None:
    token = rejecting_token
    http2 = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(CALL_BOUND))
    with anyio.fail_after(30):
        async with http2, Client(streamable_http_client(rejecting_server.mcp_url, http_client=http2)) as client:
            assert client.protocol_version == PROTOCOL_VERSION
            created = await client.call_tool("cart_create", {})
            assert not created.is_error


async def test_a_legacy_sdk_client_fails_fast_with_the_supported_version_in_reject_mode(
    rejecting_server: RunningServer, rejecting_token: str
) -> None:
    with anyio.fail_after(CALL_BOUND), pytest.raises((MCPError, BaseExceptionGroup)) as raised:
        async with _legacy_client(rejecting_server.mcp_url, rejecting_token):
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
