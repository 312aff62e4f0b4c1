"""The connection tools and browser routes where no browser is needed: the SDK client, raw JSON-RPC, plain HTTP,
all against the app in-process (``create_app``; no behaviour here depends on the socket).

The flows a person completes in a browser are in tests/browser/test_connect_flow.py.
"""

import re
import uuid
from typing import Any

import httpx2
import pytest
from mcp.client import ClientRequestContext
from mcp.types import (
    ElicitRequest,
    ElicitRequestParams,
    ElicitRequestURLParams,
    ElicitResult,
    InputRequiredResult,
)
from sqlalchemy import select

from api.oauth.browser_sessions import BrowserSessions
from api.oauth.session import CookieJar
from store.db import Database
from store.models import OAuthFlow, table_of
from store.principal import Principal
from tests.support.auth_mode import McpTokens
from tests.support.devidp import DevIdP, devidp_clients, start_devidp
from tests.support.inprocess import InProcessApp, settings_from, started_app
from tests.support.mcp_client import McpClientFactory, text_of
from tests.support.waiting import free_port
from tests.support.wire import post_async, response_message

WHOAMI = {"provider": "demo"}
KEY = "connect_demo"
SECURITY_HEADERS = {
    "cache-control": "no-store",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "x-content-type-options": "nosniff",
}

_flows = table_of(OAuthFlow)


def _user() -> str:
    return f"conn-{uuid.uuid4().hex[:8]}"


async def _accepts_without_opening(_context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
    raise AssertionError(f"unexpected elicitation {params!r}")


class Answers:
    """An elicitation callback that records the URL it was shown and answers ``action`` without opening it."""

    def __init__(self, action: str) -> None:
        self.action = action
        self.urls: list[str] = []

    async def __call__(self, _context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        assert isinstance(params, ElicitRequestURLParams)
        self.urls.append(params.url)
        return ElicitResult(action=self.action)  # type: ignore[arg-type]


def _assert_page(response: httpx2.Response, status: int) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("text/html")
    for name, value in SECURITY_HEADERS.items():
        assert response.headers[name] == value, name
    assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
    assert "Traceback" not in response.text


async def test_an_unknown_provider_is_a_tool_error_naming_the_configured_ones(mcp_client: McpClientFactory) -> None:
    async with mcp_client(elicitation_callback=_accepts_without_opening) as client:
        for tool in ("connection_whoami", "connection_disconnect"):
            result = await client.call_tool(tool, {"provider": "nope"})
            assert result.is_error, tool
            assert "Unknown provider 'nope'" in text_of(result)
            assert "the configured providers are: demo" in text_of(result)


async def test_connection_list_names_every_configured_provider_and_never_a_token(mcp_client: McpClientFactory) -> None:
    async with mcp_client() as client:
        result = await client.call_tool("connection_list", {})
    assert not result.is_error, text_of(result)
    assert result.structured_content == {
        "connections": [
            {"provider": "demo", "status": "not_connected", "scopes": [], "connected_at": None, "expires_at": None}
        ]
    }


async def test_whoami_without_a_connection_asks_for_a_url_and_a_repeated_call_reuses_the_same_flow(
    mcp_client: McpClientFactory, app: InProcessApp, database: Database
) -> None:
    username = _user()
    async with mcp_client(username, elicitation_callback=_accepts_without_opening) as client:
        first = await client.session.call_tool("connection_whoami", WHOAMI, allow_input_required=True)
        second = await client.session.call_tool("connection_whoami", WHOAMI, allow_input_required=True)

    urls = []
    for result in (first, second):
        assert isinstance(result, InputRequiredResult), result
        assert result.input_requests is not None
        assert set(result.input_requests) == {KEY}
        request = result.input_requests[KEY]
        assert isinstance(request, ElicitRequest)
        assert isinstance(request.params, ElicitRequestURLParams)
        assert request.params.mode == "url"
        assert "Connect your Demo provider account" in request.params.message
        urls.append(request.params.url)
        # The SDK sealed the plaintext state: nothing readable about the flow travels to the client.
        assert result.request_state is not None
        assert result.request_state.startswith("v1.")
        assert "flow_" not in result.request_state
    assert urls[0] == urls[1]
    assert urls[0].startswith(f"{app.base_url}/connect/flow_")
    async with database.one_statement() as conn:
        rows = (await conn.execute(select(_flows.c.status).where(_flows.c.principal_sub == username))).all()
    assert [row.status for row in rows] == ["pending"]


@pytest.mark.parametrize(
    "capabilities", [{}, {"elicitation": {}}, {"elicitation": {"form": {}}}], ids=["none", "bare", "form-only"]
)
async def test_a_client_without_url_elicitation_gets_missing_capability_32021(
    app: InProcessApp, app_http: httpx2.AsyncClient, mcp_token: McpTokens, capabilities: dict[str, Any]
) -> None:
    token = await mcp_token(_user(), resource=app.mcp_url, transport=app.transport())
    params = {"name": "connection_whoami", "arguments": WHOAMI}
    response = await post_async(app_http, app.mcp_url, "tools/call", params, token=token, capabilities=capabilities)
    message = response_message(response)
    assert "result" not in message, message
    assert message["error"]["code"] == -32021
    assert message["error"]["data"]["requiredCapabilities"] == {"elicitation": {"url": {}}}


async def test_a_legacy_client_is_told_that_connecting_needs_a_2026_client(mcp_client: McpClientFactory) -> None:
    async with mcp_client(mode="legacy") as client:
        result = await client.call_tool("connection_whoami", WHOAMI)
        listed = await client.call_tool("connection_list", {})
    assert result.is_error
    assert "2026-07-28" in text_of(result)
    assert not listed.is_error  # what needs no elicitation still works


async def test_declining_in_the_client_cancels_the_connection_and_retires_the_link(
    mcp_client: McpClientFactory, database: Database
) -> None:
    username = _user()
    answers = Answers("decline")
    async with mcp_client(username, elicitation_callback=answers) as client:
        result = await client.call_tool("connection_whoami", WHOAMI)
    assert result.is_error
    assert "Connection cancelled" in text_of(result)
    (url,) = answers.urls
    async with database.one_statement() as conn:
        row = (await conn.execute(select(_flows).where(_flows.c.handle == url.rsplit("/", 1)[-1]))).mappings().one()
    assert (row["status"], row["error"]) == ("failed", "cancelled")


async def test_a_new_call_after_a_cancelled_one_gets_a_fresh_link(mcp_client: McpClientFactory) -> None:
    username = _user()
    cancel, ask = Answers("cancel"), Answers("cancel")
    async with mcp_client(username, elicitation_callback=cancel) as client:
        first = await client.call_tool("connection_whoami", WHOAMI)
    async with mcp_client(username, elicitation_callback=ask) as client:
        second = await client.call_tool("connection_whoami", WHOAMI)
    assert first.is_error
    assert second.is_error
    assert cancel.urls[0] != ask.urls[0]


async def test_a_callback_without_a_state_or_with_an_unknown_one_is_a_400_page(app_http: httpx2.AsyncClient) -> None:
    missing = await app_http.get("/oauth/callback", params={"code": "abc"})
    _assert_page(missing, 400)
    assert "carries no state" in missing.text
    unknown = await app_http.get("/oauth/callback", params={"code": "abc", "state": "made-up-state"})
    _assert_page(unknown, 400)
    assert "unknown, expired, or was already used" in unknown.text
    denied_unknown = await app_http.get("/oauth/callback", params={"error": "access_denied", "state": "x"})
    _assert_page(denied_unknown, 400)
    for response in (missing, unknown):
        assert "abc" not in response.text
        assert "made-up-state" not in response.text


async def test_a_login_callback_that_this_browser_did_not_start_is_a_400_page(app_http: httpx2.AsyncClient) -> None:
    response = await app_http.get("/oauth/login/callback", params={"code": "abc", "state": "forged"})
    _assert_page(response, 400)


async def test_a_malformed_or_unknown_connect_link_is_a_404_page_or_a_sign_in(
    app: InProcessApp, app_http: httpx2.AsyncClient, devidp: DevIdP
) -> None:
    _assert_page(await app_http.get("/connect/not-a-flow"), 404)
    _assert_page(await app_http.get(f"/connect/cart_{'A' * 32}"), 404)
    # A well-formed handle first needs a signed-in browser: the link itself proves nothing.
    response = await app_http.get(f"/connect/flow_{'A' * 32}")
    assert response.status_code == 303
    location = httpx2.URL(response.headers["location"])
    assert str(location).startswith(f"{devidp.issuer}/auth?")
    assert location.params["client_id"] == "coatcheck-login"
    assert location.params["redirect_uri"] == f"{app.base_url}/oauth/login/callback"
    assert location.params["code_challenge_method"] == "S256"
    assert location.params["scope"] == "openid"
    assert location.params["state"]
    assert location.params["nonce"]
    assert response.headers["cache-control"] == "no-store"
    assert response.headers["referrer-policy"] == "no-referrer"
    cookie = response.headers["set-cookie"]
    # Over plain http a __Host- cookie would be refused by browsers, so the plain name is used, not Secure.
    assert cookie.startswith("coatcheck-login=")
    assert "HttpOnly" in cookie
    assert "SameSite=Lax" in cookie or "samesite=lax" in cookie.lower()
    assert "Secure" not in cookie
    assert location.params["state"] not in cookie  # the cookie is sealed, not a readable copy


async def test_signing_out_where_the_issuer_has_no_end_session_endpoint_is_local_and_says_the_idp_may_remember(
    server_env: dict[str, str], oauth_client_secrets: dict[str, str], database: Database
) -> None:
    port = free_port()
    clients = devidp_clients(server_env["PUBLIC_URL"], oauth_client_secrets)
    with start_devidp(port=port, resources=[], clients=clients, env={"DEVIDP_RP_LOGOUT": "0"}) as idp:
        async with httpx2.AsyncClient(timeout=10.0) as http:
            discovery = (await http.get(f"{idp.issuer}/.well-known/openid-configuration")).json()
        assert "end_session_endpoint" not in discovery
        settings = settings_from({**server_env, "OIDC_ISSUER": idp.issuer})
        jar = CookieJar(settings.token_key_ring, secure=False, session_seconds=600, login_seconds=600)
        cookie = await BrowserSessions(jar, database).start(Principal(issuer=idp.issuer, subject=_user()))
        async with (
            started_app(settings) as app,
            app.http(timeout=15.0, cookies={cookie.key: cookie.value or ""}) as http,
        ):
            form_page = await http.get("/connect/signout")
            assert form_page.status_code == 200, form_page.text
            assert f"your account at {idp.issuer} stays signed in there" in form_page.text
            # Nothing but this server may be the form's target, and its answer does not leave it.
            assert "form-action 'self';" in form_page.headers["content-security-policy"]
            token = re.search(r'name="token" value="([^"]+)"', form_page.text)
            assert token is not None
            signed_out = await http.post(
                "/connect/signout", headers={"Origin": app.base_url}, data={"token": token.group(1)}
            )
    _assert_page(signed_out, 200)
    assert "location" not in signed_out.headers
    assert f"You are signed out of Coatcheck; your account at {idp.issuer} may still be signed in." in signed_out.text
    cleared = signed_out.headers.get_list("set-cookie")
    assert any(c.startswith(f"{cookie.key}=") and "Max-Age=0" in c for c in cleared), cleared
