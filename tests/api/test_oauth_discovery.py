"""A real MCP client finds its way in from nothing but the server URL, the way Claude Code does.

The official SDK client with its OAuth support starts from a 401 on /mcp, reads the protected-resource
metadata, discovers the dev IdP's authorization-server metadata, registers itself dynamically, sends the
user through the login page (filled here over plain HTTP) with PKCE and a resource indicator, exchanges the
code for a JWT access token, and lists the tools.

Coatcheck's part (the 401 and its challenge, the protected-resource metadata, the tools) is the app's, so
the client's requests to Coatcheck's origin go to the app built in-process by ``create_app``; its requests
to the dev IdP, and the login, go over real HTTP to the dev IdP process.
"""

from urllib.parse import parse_qs, urlsplit

import httpx2
import pytest
from joserfc.jwk import KeySet
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientMetadata

from tests.support.devidp import DevIdP
from tests.support.inprocess import InProcessApp
from tests.support.jose import verify_jwt
from tests.support.oauth import REDIRECT_URI, FormFillingUser, MemoryTokenStorage

pytestmark = pytest.mark.resource_server_only(reason="discovery and registration at the dev IdP")


async def test_sdk_client_discovers_registers_logs_in_and_lists_tools_starting_from_a_401(
    app: InProcessApp, devidp: DevIdP
) -> None:
    user = FormFillingUser("discovery-dora")
    storage = MemoryTokenStorage()
    auth = OAuthClientProvider(
        server_url=app.mcp_url,
        client_metadata=OAuthClientMetadata(
            client_name="coatcheck discovery test",
            redirect_uris=[REDIRECT_URI],  # type: ignore[list-item]
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            token_endpoint_auth_method="none",
        ),
        storage=storage,
        redirect_handler=user.open,
        callback_handler=user.callback,
    )
    answered_by_app: list[tuple[str, str, int]] = []

    async def note(response: httpx2.Response) -> None:
        if str(response.url).startswith(app.base_url):
            answered_by_app.append((response.request.method, response.url.path, response.status_code))

    # Only Coatcheck's origin is routed to the app; the dev IdP is reached over the network as usual.
    to_app = app.transport()
    async with (
        httpx2.AsyncClient(
            auth=auth, timeout=httpx2.Timeout(30.0), mounts={app.base_url: to_app}, event_hooks={"response": [note]}
        ) as http,
        Client(streamable_http_client(app.mcp_url, http_client=http)) as client,
    ):
        tools = {tool.name for tool in (await client.list_tools()).tools}
        created = await client.call_tool("cart_create", {})

    assert {"cart_create", "cart_view", "cart_list"} <= tools
    assert not created.is_error
    # It started from nothing: a 401 on /mcp, then the metadata that 401 pointed at.
    assert answered_by_app[0] == ("POST", "/mcp", 401), answered_by_app
    assert ("GET", "/.well-known/oauth-protected-resource/mcp", 200) in answered_by_app
    # The client was registered dynamically and sent the user to the dev IdP with PKCE and our resource.
    assert storage.client_info is not None
    assert storage.client_info.client_id
    assert user.authorization_url is not None
    query = parse_qs(urlsplit(user.authorization_url).query)
    assert user.authorization_url.startswith(devidp.issuer)
    assert query["code_challenge_method"] == ["S256"]
    assert query["resource"] == [app.mcp_url]
    # The token it obtained is a JWT the dev IdP signed for this server, naming the typed username.
    assert storage.tokens is not None
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(10.0)) as http:
        published = await http.get(f"{devidp.issuer}/jwks")
    token = verify_jwt(
        storage.tokens.access_token,
        KeySet.import_key_set(published.raise_for_status().json()),
        issuer=devidp.issuer,
        audience=app.mcp_url,
    )
    assert token.claims["aud"] == app.mcp_url
    assert token.claims["sub"] == "discovery-dora"
    assert token.claims["iss"] == devidp.issuer
