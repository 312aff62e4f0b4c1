"""Signing out of /connect in headless Chromium: the button ends the session at Coatcheck and at the dev IdP
(RP-initiated logout, confirmed on the IdP's page like a person would); forged requests change nothing; and a
copy of the session cookie taken before sign-out opens nothing afterwards, on any replica."""

import uuid
from urllib.parse import urlsplit

import httpx2
from mcp.client import ClientRequestContext
from mcp.types import ElicitRequest, ElicitRequestParams, ElicitRequestURLParams, ElicitResult, InputRequiredResult

from tests.support.browser import BrowserUser, BrowserUserFactory
from tests.support.devidp import DEMO_CLIENT_ID, LOGIN_CLIENT_ID, DevIdP
from tests.support.mcp_client import McpClientFactory
from tests.support.mrtr import another_instance
from tests.support.server import RunningServer

SESSION_COOKIE = "coatcheck-session"  # http PUBLIC_URL: no __Host- prefix


async def _session_cookie(person: BrowserUser) -> str | None:
    return next((c["value"] for c in await person.context.cookies() if c["name"] == SESSION_COOKIE), None)


async def _idp_session_cookie(person: BrowserUser, issuer: str) -> str | None:
    cookies = await person.context.cookies(issuer)
    return next((c["value"] for c in cookies if c["name"] == "_session"), None)


async def _no_elicitation(_context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
    raise AssertionError(f"unexpected elicitation {params!r}")


async def _connect_link(wire_mcp_client: McpClientFactory, username: str) -> str:
    """A fresh connect link for ``username`` (round 1 of connection_whoami; the client declares URL mode)."""
    async with wire_mcp_client(username, elicitation_callback=_no_elicitation) as client:
        await client.call_tool("connection_disconnect", {"provider": "demo"})  # so there is something to connect
        first = await client.session.call_tool("connection_whoami", {"provider": "demo"}, allow_input_required=True)
    assert isinstance(first, InputRequiredResult), first
    assert first.input_requests is not None
    request = first.input_requests["connect_demo"]
    assert isinstance(request, ElicitRequest)
    assert isinstance(request.params, ElicitRequestURLParams)
    return request.params.url


async def test_the_sign_out_button_ends_the_session_at_coatcheck_and_at_the_idp_and_forged_sign_outs_are_refused(
    wire_mcp_client: McpClientFactory, browser_user: BrowserUserFactory, server: RunningServer, devidp: DevIdP
) -> None:
    username = f"leaver-{uuid.uuid4().hex[:8]}"
    person = await browser_user(username)
    connected = await person.open(await _connect_link(wire_mcp_client, username))
    assert connected.status == 200, connected.text
    sealed = await _session_cookie(person)
    assert sealed is not None

    signout_url = f"{server.base_url}/connect/signout"
    form_page = await person.open(signout_url)
    assert form_page.status == 200
    assert f"signed in to Coatcheck as {username}" in form_page.text
    # The form's answer redirects to the IdP's end-session endpoint, which form-action must allow.
    assert f"form-action 'self' {devidp.issuer};" in form_page.headers["content-security-policy"]
    assert f"then takes you to {devidp.issuer} to sign out there as well" in form_page.text

    # Another site's page posting to the sign-out URL: the browser sends a foreign Origin (and, SameSite=Lax,
    # no cookie). Refused, the session stays.
    attacker = await person.context.new_page()
    await attacker.set_content(
        f'<form method="post" action="{signout_url}"><input name="token" value="guess"><button>go</button></form>'
    )
    async with attacker.expect_navigation() as forged_navigation:
        await attacker.click("button")
    forged = await forged_navigation.value
    assert forged is not None
    assert forged.status == 403
    assert "Sign-out refused" in await attacker.inner_text("body")
    # The right Origin with the victim's cookie but without the page's token is refused too.
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(10.0)) as http:
        no_token = await http.post(
            signout_url, headers={"Origin": server.base_url, "Cookie": f"{SESSION_COOKIE}={sealed}"}, data={}
        )
        wrong_token = await http.post(
            signout_url,
            headers={"Origin": server.base_url, "Cookie": f"{SESSION_COOKIE}={sealed}"},
            data={"token": "A" * 43},
        )
        non_ascii_token = await http.post(
            signout_url,
            headers={"Origin": server.base_url, "Cookie": f"{SESSION_COOKIE}={sealed}"},
            data={"token": "\u00e9" * 43},
        )
    assert no_token.status_code == 403
    assert wrong_token.status_code == 403
    assert non_ascii_token.status_code == 403
    assert "set-cookie" not in no_token.headers
    assert await _session_cookie(person) == sealed
    still_in = await person.open(signout_url)
    assert f"signed in to Coatcheck as {username}" in still_in.text

    # The real button: Coatcheck's cookie goes, then the IdP asks to confirm its own sign-out.
    assert await _idp_session_cookie(person, devidp.issuer) is not None
    signed_in_before = person.sign_ins
    async with still_in.page.expect_navigation() as navigation:
        await still_in.page.click("button[type=submit]")
    at_idp = await navigation.value
    assert at_idp is not None
    assert at_idp.status == 200
    assert still_in.page.url.startswith(f"{devidp.issuer}/session/end?")
    logout_request = httpx2.URL(still_in.page.url).params
    assert dict(logout_request) == {"client_id": LOGIN_CLIENT_ID, "post_logout_redirect_uri": signout_url}
    assert await _session_cookie(person) is None
    async with still_in.page.expect_navigation() as navigation:
        await still_in.page.click("button[name=logout][value=yes]")
    done = await navigation.value
    assert done is not None
    assert done.status == 200
    assert still_in.page.url == signout_url
    assert "no longer signed in" in await still_in.page.inner_text("body")
    assert await _session_cookie(person) is None
    assert await _idp_session_cookie(person, devidp.issuer) is None
    # The next connect link starts with a sign-in at the identity provider again, with its login form: the
    # next person at this browser cannot carry on as the previous one.
    again = await person.open(await _connect_link(wire_mcp_client, username))
    assert again.status == 200, again.text
    assert again.visited_path("/oauth/login/callback")
    assert person.sign_ins == signed_in_before + 1


async def _where_the_link_sends(base_url: str, link: str, sealed: str) -> str:
    """The ``client_id`` of the authorization request a connect link redirects to with session cookie ``sealed``:
    the provider's (the session is live) or Coatcheck's own sign-in (it is not)."""
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(10.0), cookies={SESSION_COOKIE: sealed}) as http:
        response = await http.get(f"{base_url}{urlsplit(link).path}")
    assert response.status_code in {302, 303}, response.text
    return httpx2.URL(response.headers["location"]).params["client_id"]


async def test_a_session_cookie_copied_before_sign_out_opens_nothing_afterwards_on_any_replica(
    wire_mcp_client: McpClientFactory,
    browser_user: BrowserUserFactory,
    server: RunningServer,
    server_env: dict[str, str],
    public_url: str,
) -> None:
    username = f"copied-{uuid.uuid4().hex[:8]}"
    person = await browser_user(username)
    connected = await person.open(await _connect_link(wire_mcp_client, username))
    assert connected.status == 200, connected.text
    copied = await _session_cookie(person)  # what malware or a shared machine's next user takes along
    assert copied is not None
    with another_instance(server_env, public_url=public_url) as replica:
        link = await _connect_link(wire_mcp_client, username)
        # Before sign-out the copy works, on this server and on the other replica alike.
        for base_url in (server.base_url, replica.base_url):
            assert await _where_the_link_sends(base_url, link, copied) == DEMO_CLIENT_ID

        form_page = await person.open(f"{server.base_url}/connect/signout")
        assert f"signed in to Coatcheck as {username}" in form_page.text
        async with form_page.page.expect_navigation():
            await form_page.page.click("button[type=submit]")
        assert await _session_cookie(person) is None

        # After it, the copy is refused everywhere: the link starts a sign-in, and sign-out sees no session.
        for base_url in (server.base_url, replica.base_url):
            assert await _where_the_link_sends(base_url, link, copied) == LOGIN_CLIENT_ID
            async with httpx2.AsyncClient(timeout=httpx2.Timeout(10.0), cookies={SESSION_COOKIE: copied}) as http:
                page = await http.get(f"{base_url}/connect/signout")
            assert page.status_code == 200
            assert "signed in to Coatcheck as" not in page.text
