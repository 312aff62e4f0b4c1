"""Honest discovery: ``server/discover`` and the legacy ``initialize`` advertise only what Coatcheck has
(tools), and the methods of capabilities it lacks are ``-32601 Method not found``.

Raw JSON-RPC requests, so nothing the SDK client would fill in or hide stands between the test and the
answer; they go to the app built in-process by ``create_app``, which is what decides the answer.
"""

import uuid

import httpx2
import pytest

from tests.support.auth_mode import McpTokens
from tests.support.inprocess import InProcessApp
from tests.support.wire import post_async, response_message

METHOD_NOT_FOUND = -32601


@pytest.fixture
async def token(mcp_token: McpTokens, app: InProcessApp) -> str:
    return await mcp_token(f"caps-{uuid.uuid4().hex[:8]}", resource=app.mcp_url, transport=app.transport())


async def test_server_discover_advertises_tools_and_no_prompts_or_resources(
    app_http: httpx2.AsyncClient, app: InProcessApp, token: str
) -> None:
    response = await post_async(app_http, app.mcp_url, "server/discover", token=token)
    assert response.status_code == 200, response.text
    capabilities = response_message(response)["result"]["capabilities"]
    assert "tools" in capabilities
    assert "prompts" not in capabilities
    assert "resources" not in capabilities
    assert "completions" not in capabilities


async def test_the_legacy_initialize_advertises_tools_and_no_prompts_or_resources(
    app_http: httpx2.AsyncClient, app: InProcessApp, token: str
) -> None:
    response = await app_http.post(
        app.mcp_url,
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
async def test_methods_of_capabilities_not_advertised_are_not_found(
    app_http: httpx2.AsyncClient, app: InProcessApp, token: str, method: str, params: dict[str, str]
) -> None:
    # resources/read routes on its uri (Mcp-Name), like tools/call on the tool name.
    headers = {"Mcp-Name": params["uri"]} if "uri" in params else None
    response = await post_async(app_http, app.mcp_url, method, params, token=token, extra_headers=headers)
    error = response_message(response)["error"]
    assert error["code"] == METHOD_NOT_FOUND, error
