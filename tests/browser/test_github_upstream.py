"""Authorization-server mode with a GitHub-shaped plain OAuth 2.0 upstream (``UPSTREAM_KIND=oauth2``): no
discovery, no ID token, the subject from ``GET /user``'s numeric ``id``. Real ``coatcheck serve`` processes, real
PostgreSQL, the GitHub-shaped server of tests/support/github_like.py over real HTTP, headless Chromium for the
person at its login form and Coatcheck's consent page, the official SDK client's OAuth support, and the dev
IdP as the third-party "demo" provider that a /connect link connects."""

import secrets
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx2
import pytest
from joserfc.jwk import KeySet
from mcp import Client, InputRequiredRoundsExceededError
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientMetadata
from playwright.async_api import Browser, BrowserContext
from sqlalchemy import select

from store.db import Database
from store.models import Cart, table_of
from tests.support.authserver import GITHUB_ISSUER, Authorization, authorize_in_browser, github_upstream_env
from tests.support.browser import BrowserUser, LinkOpener
from tests.support.devidp import (
    DEMO_CLIENT_ID,
    LOGIN_CLIENT_ID,
    DevIdP,
    devidp_clients,
    start_devidp,
)
from tests.support.github_like import CANCEL_LINK, GITHUB_LOGIN_FIELD, GithubLike, serve_github_like
from tests.support.jose import verify_jwt
from tests.support.oauth import MemoryTokenStorage, Pkce
from tests.support.server import RunningServer, run_server
from tests.support.waiting import free_port

_carts = table_of(Cart)


@pytest.fixture(scope="module")
def as_public_url() -> str:
    return f"http://127.0.0.1:{free_port()}"


@pytest.fixture(scope="module")
def github(as_public_url: str) -> Iterator[GithubLike]:
    with serve_github_like(redirect_uri=f"{as_public_url}/oauth/login/callback") as hub:
        yield hub


@pytest.fixture(scope="module")
def demo_secrets() -> dict[str, str]:
    return {LOGIN_CLIENT_ID: secrets.token_urlsafe(32), DEMO_CLIENT_ID: secrets.token_urlsafe(32)}


@pytest.fixture(scope="module")
def demo_idp(as_public_url: str, demo_secrets: dict[str, str]) -> Iterator[DevIdP]:
    """The dev IdP, here only the third-party "demo" provider that /connect links connect."""
    clients = devidp_clients(as_public_url, demo_secrets)
    with start_devidp(port=free_port(), resources=[f"{as_public_url}/mcp"], clients=clients) as idp:
        yield idp


@pytest.fixture(scope="module")
def github_env(
    database_url: str, demo_idp: DevIdP, demo_secrets: dict[str, str], github: GithubLike, as_public_url: str
) -> dict[str, str]:
    base = github_upstream_env(
        database_url=database_url,
        public_url=as_public_url,
        github=github,
        demo_idp=demo_idp,
        demo_secrets=demo_secrets,
    )
    return {**base, "LOG_LEVEL": "DEBUG"}  # the most the server ever writes: no token may be in it


@pytest.fixture(scope="module")
def as_server(github_env: dict[str, str], as_public_url: str) -> Iterator[RunningServer]:
    with run_server(github_env, port=int(urlsplit(as_public_url).port or 0)) as running:
        yield running


@pytest.fixture
async def person(chromium: Browser) -> AsyncIterator[BrowserContext]:
    context = await chromium.new_context()
    context.set_default_timeout(20_000)
    yield context
    await context.close()


@pytest.fixture
def github_modes(github: GithubLike) -> Iterator[GithubLike]:
    """The GitHub-shaped server, put back to behaving after the test switched an error mode on."""
    yield github
    github.refuse_codes = False
    github.user_down = False


def _user() -> str:
    return f"octo-{uuid.uuid4().hex[:8]}"


def _query(url: str) -> dict[str, str]:
    return {key: values[0] for key, values in parse_qs(urlsplit(url).query).items()}


@dataclass
class SdkSignIn:
    redirect_uri: str
    storage: MemoryTokenStorage
    authorizations: list[Authorization]


@asynccontextmanager
async def _sdk_client(
    server: RunningServer, person: BrowserContext, username: str, **client_options: Any
) -> AsyncIterator[tuple[Client, SdkSignIn]]:
    """The official SDK client from nothing but the MCP URL: discovery, DCR, then ``person`` signs in at the
    GitHub-shaped upstream's login form and consents in Chromium."""
    seen = SdkSignIn(f"http://127.0.0.1:{free_port()}/callback", MemoryTokenStorage(), [])

    async def open_in_browser(url: str) -> None:
        seen.authorizations.append(
            await authorize_in_browser(
                person, url, username=username, redirect_uri=seen.redirect_uri, login_field=GITHUB_LOGIN_FIELD
            )
        )

    async def callback() -> AuthorizationCodeResult:
        query = _query(seen.authorizations[-1].redirected_to)
        return AuthorizationCodeResult(code=query["code"], state=query.get("state"), iss=query.get("iss"))

    auth = OAuthClientProvider(
        server_url=server.mcp_url,
        client_metadata=OAuthClientMetadata(
            client_name="SDK test client",
            redirect_uris=[seen.redirect_uri],  # type: ignore[list-item]
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            token_endpoint_auth_method="none",
        ),
        storage=seen.storage,
        redirect_handler=open_in_browser,
        callback_handler=callback,
    )
    async with (
        httpx2.AsyncClient(auth=auth, timeout=httpx2.Timeout(30.0)) as http,
        Client(streamable_http_client(server.mcp_url, http_client=http), **client_options) as client,
    ):
        yield client, seen


async def _mcp_status(base_url: str, access_token: str) -> int:
    async with httpx2.AsyncClient(timeout=10) as http:
        response = await http.post(
            f"{base_url}/mcp",
            headers={
                "Authorization": f"Bearer {access_token}",
                "Accept": "application/json, text/event-stream",
                "MCP-Protocol-Version": "2025-11-25",
            },
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
        )
    return response.status_code


async def _sign_in_attempt(server: RunningServer, person: BrowserContext, *, cancel: bool = False) -> tuple[int, str]:
    """A person starts an authorization at Coatcheck, reaches the GitHub-shaped login form, and signs in (or
    cancels there); returns the status and text of the page the browser ends on."""
    redirect_uri = f"http://127.0.0.1:{free_port()}/callback"
    async with httpx2.AsyncClient(timeout=10) as http:
        registered = await http.post(
            f"{server.base_url}/register",
            json={"client_name": "Test client", "redirect_uris": [redirect_uri], "token_endpoint_auth_method": "none"},
        )
    assert registered.status_code == 201, registered.text
    params = {
        "response_type": "code",
        "client_id": registered.json()["client_id"],
        "redirect_uri": redirect_uri,
        "code_challenge": Pkce.new().challenge,
        "code_challenge_method": "S256",
        "state": "s-" + secrets.token_urlsafe(8),
        "resource": server.mcp_url,
    }
    page = await person.new_page()
    await page.goto(str(httpx2.URL(f"{server.base_url}/authorize", params=params)))
    async with page.expect_navigation() as navigation:
        if cancel:
            await page.click(CANCEL_LINK)
        else:
            await page.fill(GITHUB_LOGIN_FIELD, _user())
            await page.click("button[type=submit]")
    response = await navigation.value
    assert response is not None
    text = await page.inner_text("body")
    await page.close()
    return response.status, text


async def test_an_sdk_client_signs_in_at_a_github_shaped_upstream_and_the_cart_belongs_to_its_numeric_id(
    as_server: RunningServer, github: GithubLike, person: BrowserContext, database: Database
) -> None:
    username = _user()
    async with _sdk_client(as_server, person, username) as (client, seen):
        created = await client.call_tool("cart_create", {})
    assert not created.is_error, created
    assert created.structured_content is not None
    cart_id = created.structured_content["cart_id"]
    numeric_id = github.users[username]

    # The consent page named the person as the upstream names them: the numeric id at the fixed issuer.
    (first,) = seen.authorizations
    assert first.consent_text is not None
    assert f"{numeric_id} at {GITHUB_ISSUER}" in first.consent_text
    # Coatcheck's own access token carries the GitHub-shaped principal.
    storage = seen.storage
    assert storage.tokens is not None
    async with httpx2.AsyncClient(timeout=10) as http:
        jwks = (await http.get(f"{as_server.base_url}/.well-known/jwks.json")).raise_for_status().json()
    token = verify_jwt(
        storage.tokens.access_token, KeySet.import_key_set(jwks), issuer=as_server.base_url, audience=as_server.mcp_url
    )
    assert token.claims["sub"] == str(numeric_id)
    assert token.claims["upstream_iss"] == GITHUB_ISSUER
    # The cart is owned by (issuer, "<numeric id>"), not by the renamable login.
    async with database.one_statement() as conn:
        owner = (
            await conn.execute(select(_carts.c.principal_iss, _carts.c.principal_sub).where(_carts.c.handle == cart_id))
        ).one()
    assert tuple(owner) == (GITHUB_ISSUER, str(numeric_id))

    # What the upstream was sent: state and PKCE S256 with the exact redirect URI; the token asked for as JSON
    # with the secret in the form body; /user with the access token in the Authorization header.
    authorize = github.authorization_requests[-1].params
    assert authorize["redirect_uri"] == f"{as_server.base_url}/oauth/login/callback"
    assert authorize["code_challenge_method"] == "S256"
    assert authorize["code_challenge"]
    assert authorize["state"]
    assert "nonce" not in authorize
    exchange = github.token_requests[-1]
    assert "application/json" in exchange.accept
    assert exchange.had_code_verifier
    assert exchange.had_client_secret
    assert not exchange.had_basic_auth
    assert github.user_authorization_schemes[-1] == "Bearer"

    # A refresh at Coatcheck works (the upstream is not asked: its token was used once and dropped).
    assert storage.tokens.refresh_token
    assert storage.client_info is not None
    async with httpx2.AsyncClient(timeout=10) as http:
        refreshed = await http.post(
            f"{as_server.base_url}/token",
            data={
                "grant_type": "refresh_token",
                "client_id": storage.client_info.client_id,
                "refresh_token": storage.tokens.refresh_token,
            },
        )
    assert refreshed.status_code == 200, refreshed.text
    assert await _mcp_status(as_server.base_url, refreshed.json()["access_token"]) == 200
    again = verify_jwt(
        refreshed.json()["access_token"],
        KeySet.import_key_set(jwks),
        issuer=as_server.base_url,
        audience=as_server.mcp_url,
    )
    assert (again.claims["upstream_iss"], again.claims["sub"]) == (GITHUB_ISSUER, str(numeric_id))

    # Neither the upstream's codes and tokens nor Coatcheck's own reach the log, even at DEBUG.
    log = as_server.log_text()
    for secret in [*github.issued_codes, *github.issued_tokens, github.client_secret]:
        assert secret not in log
    assert storage.tokens.access_token not in log
    assert storage.tokens.refresh_token not in log


async def test_a_connect_link_in_this_mode_connects_the_demo_provider_as_the_same_github_shaped_user(
    as_server: RunningServer, github: GithubLike, person: BrowserContext, database: Database
) -> None:
    username = _user()
    opener = LinkOpener(BrowserUser(person, username))
    async with _sdk_client(as_server, person, username, elicitation_callback=opener) as (client, _):
        result = await client.call_tool("connection_whoami", {"provider": "demo"})
    landing = await opener.landing()

    # /connect compared the browser's (GitHub-shaped issuer, numeric id) with the MCP token's principal.
    assert "Connected" in landing.text, landing.text
    assert not result.is_error, result
    assert result.structured_content is not None
    assert result.structured_content["profile"]["sub"] == username  # the demo provider's own account
    # The browser was signed in once, at the GitHub-shaped upstream; /connect did not send it there again.
    assert not landing.visited_path("/login/oauth/authorize")


async def test_a_connect_link_opened_by_another_github_shaped_user_is_refused_and_connects_nothing(
    as_server: RunningServer, chromium: Browser, person: BrowserContext
) -> None:
    someone_else = await chromium.new_context()
    try:
        # The link reaches another person, who signs in at the same upstream as themselves.
        opener = LinkOpener(BrowserUser(someone_else, _user(), login_field=GITHUB_LOGIN_FIELD))
        # One round: the tool asks for the connection; it cannot complete, so the client then gives up.
        rounds = {"elicitation_callback": opener, "input_required_max_rounds": 1}
        async with _sdk_client(as_server, person, _user(), **rounds) as (client, _):
            with pytest.raises(InputRequiredRoundsExceededError):
                await client.call_tool("connection_whoami", {"provider": "demo"})
        landing = await opener.landing()
    finally:
        await someone_else.close()

    # Same issuer, another numeric id: /connect refuses before anything is done with the flow.
    assert landing.status == 403
    assert "This link belongs to someone else" in landing.text
    assert landing.visited_path("/login/oauth/authorize")  # that person did sign in, at the GitHub-shaped upstream
    assert 'coatcheck-session=""; HttpOnly; Max-Age=0' in landing.headers["set-cookie"]  # and is signed out again


async def test_a_person_who_cancels_at_the_upstream_gets_a_page_saying_so_not_an_error(
    as_server: RunningServer, person: BrowserContext
) -> None:
    status, text = await _sign_in_attempt(as_server, person, cancel=True)
    assert status == 400
    assert "You cancelled the sign-in at the identity provider" in text


async def test_a_code_the_upstream_refuses_gives_the_sign_in_failed_page_not_a_500(
    as_server: RunningServer, github_modes: GithubLike, person: BrowserContext
) -> None:
    github_modes.refuse_codes = True
    status, text = await _sign_in_attempt(as_server, person)
    assert status == 400
    assert "Coatcheck could not confirm who you are" in text
    assert "code exchange failed (bad_verification_code)" in as_server.log_text()


async def test_a_user_endpoint_that_is_down_gives_the_sign_in_failed_page_not_a_500(
    as_server: RunningServer, github_modes: GithubLike, person: BrowserContext
) -> None:
    github_modes.user_down = True
    status, text = await _sign_in_attempt(as_server, person)
    assert status == 400
    assert "Coatcheck could not confirm who you are" in text
    assert "the user-info endpoint did not answer (profile_unavailable)" in as_server.log_text()
    for token in github_modes.issued_tokens:
        assert token not in as_server.log_text()
