"""Honest discovery, on the wire: ``server/discover`` and the legacy ``initialize`` advertise only what
Coatcheck has (tools), and the methods of capabilities it lacks are ``-32601 Method not found``."""

import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.support.devidp import DevIdP
from tests.support.server import RunningServer
from tests.support.wire import post, response_message

METHOD_NOT_FOUND = -32601


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30) as client:
        yield client


@pytest.fixture
async def token(devidp: DevIdP, server: RunningServer) -> str:
    return await devidp.token(f"caps-{uuid.uuid4().hex[:8]}", resource=server.mcp_url)


def test_server_discover_advertises_tools_and_no_prompts_or_resources(
    http: httpx.Client, server: RunningServer, token: str
) -> None:
    response = post(http, server.mcp_url, "server/discover", token=token)
    assert response.status_code == 200, response.text
    capabilities = response_message(response)["result"]["capabilities"]
    assert "tools" in capabilities
    assert "prompts" not in capabilities
    assert "resources" not in capabilities
    assert "completions" not in capabilities


def test_the_legacy_initialize_advertises_tools_and_no_prompts_or_resources(
    http: httpx.Client, server: RunningServer, token: str
) -> None:
    response = http.post(
        server.mcp_url,
        headers={
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
            "Authorization": f"Bearer {token}",
        },
        json={
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "capabilities-test", "version": "0"},
            },
        },
    )
    assert response.status_code == 200, response.text
    result = response_message(response)["result"]
    assert result["protocolVersion"] == "2025-11-25"
    assert "tools" in result["capabilities"]
    assert "prompts" not in result["capabilities"]
    assert "resources" not in result["capabilities"]


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("prompts/list", {}),
        ("resources/list", {}),
        ("resources/templates/list", {}),
        ("resources/read", {"uri": "x:y"}),
    ],
)
def test_methods_of_capabilities_not_advertised_are_not_found(
    http: httpx.Client, server: RunningServer, token: str, method: str, params: dict[str, str]
) -> None:
    # resources/read routes on its uri (Mcp-Name), like tools/call on the tool name.
    headers = {"Mcp-Name": params["uri"]} if "uri" in params else None
    response = post(http, server.mcp_url, method, params, token=token, extra_headers=headers)
    error = response_message(response)["error"]
    assert error["code"] == METHOD_NOT_FOUND, error
