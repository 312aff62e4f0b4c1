"""Authorization-server mode end to end: Coatcheck is the MCP clients' authorization server and signs people
in at the real dev IdP (upstream). Real ``coatcheck serve`` processes, real PostgreSQL, headless Chromium for
the sign-in and the consent page, and the official SDK client's OAuth support (discovery, DCR, PKCE)."""

import asyncio
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx2
import pytest
from joserfc.jwk import KeySet
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientMetadata
from playwright.async_api import Browser, BrowserContext
from sqlalchemy import select

from store.db import Database
from store.models import AsGrant, AuditEvent, Cart, table_of
from tests.support import figures
from tests.support.authserver import Authorization, authorize_in_browser, dev_idp_upstream_env
from tests.support.browser import BrowserUser, LinkOpener
from tests.support.cimd_server import serve_documents
from tests.support.devidp import (
    DEMO_CLIENT_ID,
    LOGIN_CLIENT_ID,
    DevIdP,
    devidp_clients,
    start_devidp,
)
from tests.support.jose import verify_jwt
from tests.support.oauth import MemoryTokenStorage, Pkce
from tests.support.server import RunningServer, run_server
from tests.support.waiting import free_port

pytestmark = pytest.mark.sets_own_auth_mode

_audit = table_of(AuditEvent)
_grants = table_of(AsGrant)
_carts = table_of(Cart)


@pytest.fixture(scope="module")
def as_public_url() -> str:
    return f"http://127.0.0.1:{free_port()}"


@pytest.fixture(scope="module")
def upstream_secrets() -> dict[str, str]:
    return {LOGIN_CLIENT_ID: secrets.token_urlsafe(32), DEMO_CLIENT_ID: secrets.token_urlsafe(32)}


@pytest.fixture(scope="module")
def upstream(as_public_url: str, upstream_secrets: dict[str, str]) -> Iterator[DevIdP]:
    """The dev IdP as the upstream provider, with Coatcheck's sign-in client."""
    clients = devidp_clients(as_public_url, upstream_secrets)
    with start_devidp(port=free_port(), resources=[f"{as_public_url}/mcp"], clients=clients) as idp:
        yield idp


@pytest.fixture(scope="module")
def as_env(database_url: str, upstream: DevIdP, upstream_secrets: dict[str, str], as_public_url: str) -> dict[str, str]:
    base = dev_idp_upstream_env(
        database_url=database_url, public_url=as_public_url, upstream=upstream, upstream_secrets=upstream_secrets
    )
    # Development setting: the test's client metadata documents are served from loopback.
    return {**base, "AS_CIMD_ALLOW_LOOPBACK": "true"}


@pytest.fixture(scope="module")
def as_server(as_env: dict[str, str], as_public_url: str) -> Iterator[RunningServer]:
    with run_server(as_env, port=int(urlsplit(as_public_url).port or 0)) as running:
        yield running


@pytest.fixture
async def person(chromium: Browser) -> AsyncIterator[BrowserContext]:
    context = await chromium.new_context()
    context.set_default_timeout(20_000)
    yield context
    await context.close()


def _user() -> str:
    return f"as-user-{uuid.uuid4().hex[:8]}"


async def _register(server: RunningServer, redirect_uri: str, **extra: Any) -> dict[str, Any]:
    async with httpx2.AsyncClient(timeout=10) as http:
        response = await http.post(
            f"{server.base_url}/register",
            json={
                "client_name": "Test client",
                "redirect_uris": [redirect_uri],
                "token_endpoint_auth_method": "none",
                **extra,
            },
        )
    assert response.status_code == 201, response.text
    return dict(response.json())


def _authorize_url(server: RunningServer, client_id: str, redirect_uri: str, pkce: Pkce, **extra: str) -> str:
    params = {
        "response_type": "code",
        "client_id": client_id,
        "redirect_uri": redirect_uri,
        "code_challenge": pkce.challenge,
        "code_challenge_method": "S256",
        "state": "state-" + secrets.token_urlsafe(8),
        "resource": server.mcp_url,
        **extra,
    }
    return str(httpx2.URL(f"{server.base_url}/authorize", params=params))


def _query(url: str) -> dict[str, str]:
    return {key: values[0] for key, values in parse_qs(urlsplit(url).query).items()}


async def _code(
    server: RunningServer, person: BrowserContext, username: str
) -> tuple[dict[str, Any], str, Pkce, Authorization]:
    redirect_uri = f"http://127.0.0.1:{free_port()}/callback"
    client = await _register(server, redirect_uri)
    pkce = Pkce.new()
    seen = await authorize_in_browser(
        person,
        _authorize_url(server, client["client_id"], redirect_uri, pkce),
        username=username,
        redirect_uri=redirect_uri,
    )
    return client, redirect_uri, pkce, seen


async def _redeem(server: RunningServer, client_id: str, code: str, redirect_uri: str, pkce: Pkce) -> httpx2.Response:
    async with httpx2.AsyncClient(timeout=10) as http:
        return await http.post(
            f"{server.base_url}/token",
            data={
                "grant_type": "authorization_code",
                "client_id": client_id,
                "code": code,
                "redirect_uri": redirect_uri,
                "code_verifier": pkce.verifier,
            },
        )


async def _refresh(server: RunningServer, client_id: str, refresh_token: str) -> httpx2.Response:
    async with httpx2.AsyncClient(timeout=10) as http:
        return await http.post(
            f"{server.base_url}/token",
            data={"grant_type": "refresh_token", "client_id": client_id, "refresh_token": refresh_token},
        )


async def _mcp_status(base_url: str, access_token: str) -> int:
    """The HTTP status of a ``server/discover`` call to ``/mcp`` with ``access_token`` (401: refused)."""
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


@dataclass
class SdkSignIn:
    """An SDK client's OAuth state after signing in: what the person saw, and what the client stored."""

    redirect_uri: str
    storage: MemoryTokenStorage
    authorizations: list[Authorization]


@asynccontextmanager
async def _sdk_client(
    server: RunningServer, person: BrowserContext, username: str, **client_options: Any
) -> AsyncIterator[tuple[Client, SdkSignIn]]:
    """The official SDK client, starting from nothing but the MCP URL: it discovers Coatcheck, registers,
    and sends ``person`` through the upstream sign-in and consent in Chromium."""
    seen = SdkSignIn(f"http://127.0.0.1:{free_port()}/callback", MemoryTokenStorage(), [])

    async def open_in_browser(url: str) -> None:
        seen.authorizations.append(
            await authorize_in_browser(person, url, username=username, redirect_uri=seen.redirect_uri)
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


async def test_an_sdk_client_signs_in_through_discovery_registration_upstream_sign_in_and_consent_then_calls_tools(
    as_server: RunningServer, upstream: DevIdP, person: BrowserContext, database: Database
) -> None:
    username = _user()
    async with _sdk_client(as_server, person, username) as (client, seen):
        created = await client.call_tool("cart_create", {})
    redirect_uri, storage, authorizations = seen.redirect_uri, seen.storage, seen.authorizations
    assert not created.is_error, created
    assert created.structured_content is not None
    cart_id = created.structured_content["cart_id"]

    # The consent page named the client, where its identity comes from, the redirect URI and the scope,
    # and may not be framed.
    (first,) = authorizations
    assert first.consent_text is not None
    assert "SDK test client" in first.consent_text
    assert "registered dynamically, unverified" in first.consent_text
    assert redirect_uri in first.consent_text
    assert "mcp" in first.consent_text
    assert "frame-ancestors 'none'" in first.consent_headers["content-security-policy"]
    # RFC 9207: the authorization response names Coatcheck as its issuer; state came back (the SDK checks it).
    assert _query(first.redirected_to)["iss"] == as_server.base_url

    # The access token is Coatcheck's own ES256 JWT for the MCP URL, carrying the upstream principal.
    assert storage.tokens is not None
    assert storage.tokens.refresh_token
    async with httpx2.AsyncClient(timeout=10) as http:
        jwks = (await http.get(f"{as_server.base_url}/.well-known/jwks.json")).raise_for_status().json()
    token = verify_jwt(
        storage.tokens.access_token, KeySet.import_key_set(jwks), issuer=as_server.base_url, audience=as_server.mcp_url
    )
    assert token.header["alg"] == "ES256"
    assert token.claims["sub"] == username
    assert token.claims["upstream_iss"] == upstream.issuer
    # Data is owned by the upstream (issuer, subject): the same owner as in resource-server mode.
    async with database.one_statement() as conn:
        owner = (
            await conn.execute(select(_carts.c.principal_iss, _carts.c.principal_sub).where(_carts.c.handle == cart_id))
        ).one()
    assert tuple(owner) == (upstream.issuer, username)

    # The consent is remembered per (user, client): the next authorization of this client asks nothing.
    assert storage.client_info is not None
    pkce = Pkce.new()
    again = await authorize_in_browser(
        person,
        _authorize_url(as_server, storage.client_info.client_id, redirect_uri, pkce),
        username=username,
        redirect_uri=redirect_uri,
    )
    assert again.consent_text is None
    assert "code" in _query(again.redirected_to)


async def test_a_client_asking_for_openid_and_offline_access_is_granted_mcp_with_a_refresh_token_and_told_so(
    as_server: RunningServer, person: BrowserContext
) -> None:
    # OpenID-minded clients register and ask for these out of habit; Coatcheck accepts them and grants its
    # one scope, saying so in the token response (RFC 6749 §3.3), and every grant has a refresh token.
    redirect_uri = f"http://localhost:{free_port()}/callback"
    client = await _register(as_server, redirect_uri, scope="openid offline_access")
    pkce = Pkce.new()
    url = _authorize_url(
        as_server, client["client_id"], redirect_uri, pkce, scope="openid offline_access", prompt="consent"
    )
    seen = await authorize_in_browser(person, url, username=_user(), redirect_uri=redirect_uri)
    assert seen.consent_text is not None
    assert "mcp" in seen.consent_text
    tokens = await _redeem(as_server, client["client_id"], _query(seen.redirected_to)["code"], redirect_uri, pkce)
    assert tokens.status_code == 200, tokens.text
    assert tokens.json()["scope"] == "mcp"
    assert tokens.json()["refresh_token"]
    async with httpx2.AsyncClient(timeout=10) as http:
        jwks = (await http.get(f"{as_server.base_url}/.well-known/jwks.json")).raise_for_status().json()
    claims = verify_jwt(
        tokens.json()["access_token"],
        KeySet.import_key_set(jwks),
        issuer=as_server.base_url,
        audience=as_server.mcp_url,
    ).claims
    assert claims["scope"] == "mcp"
    assert claims["client_id"] == client["client_id"]
    assert isinstance(claims["iat"], int)
    refreshed = await _refresh(as_server, client["client_id"], tokens.json()["refresh_token"])
    assert refreshed.status_code == 200, refreshed.text
    assert refreshed.json()["scope"] == "mcp"


async def test_a_native_client_registered_at_one_loopback_port_signs_in_from_another_and_redeems_its_code(
    as_server: RunningServer, person: BrowserContext
) -> None:
    # RFC 8252 §7.3: a loopback redirect URI matches at any port; the code is then bound to the URI used.
    client = await _register(as_server, f"http://localhost:{free_port()}/callback")
    redirect_uri = f"http://localhost:{free_port()}/callback"
    pkce = Pkce.new()
    url = _authorize_url(as_server, client["client_id"], redirect_uri, pkce)
    seen = await authorize_in_browser(person, url, username=_user(), redirect_uri=redirect_uri)
    code = _query(seen.redirected_to)["code"]
    registered_uri = client["redirect_uris"][0]
    elsewhere = await _redeem(as_server, client["client_id"], code, registered_uri, pkce)
    assert elsewhere.status_code == 400
    assert elsewhere.json()["error"] == "invalid_request"
    tokens = await _redeem(as_server, client["client_id"], code, redirect_uri, pkce)
    assert tokens.status_code == 200, tokens.text
    assert await _mcp_status(as_server.base_url, tokens.json()["access_token"]) == 200


async def test_two_concurrent_redemptions_of_one_code_give_exactly_one_token_set(
    as_server: RunningServer, person: BrowserContext
) -> None:
    client, redirect_uri, pkce, seen = await _code(as_server, person, _user())
    code = _query(seen.redirected_to)["code"]

    responses = await asyncio.gather(
        *(_redeem(as_server, client["client_id"], code, redirect_uri, pkce) for _ in range(2))
    )

    statuses = sorted(response.status_code for response in responses)
    assert statuses == [200, 400], [response.text for response in responses]
    winner = next(response for response in responses if response.status_code == 200).json()
    loser = next(response for response in responses if response.status_code == 400).json()
    assert winner["access_token"]
    assert loser["error"] == "invalid_grant"
    assert "already used" in loser["error_description"]
    # RFC 6749 §4.1.2: a code used twice revokes what was issued for it, so not even the winner keeps access.
    assert await _mcp_status(as_server.base_url, winner["access_token"]) == 401


async def test_a_replayed_refresh_token_revokes_its_whole_family_and_is_audited(
    as_server: RunningServer, person: BrowserContext, database: Database
) -> None:
    client, redirect_uri, pkce, seen = await _code(as_server, person, _user())
    first = (
        await _redeem(as_server, client["client_id"], _query(seen.redirected_to)["code"], redirect_uri, pkce)
    ).json()
    rotated = await _refresh(as_server, client["client_id"], first["refresh_token"])
    assert rotated.status_code == 200, rotated.text
    second = rotated.json()
    assert second["refresh_token"] != first["refresh_token"]
    assert await _mcp_status(as_server.base_url, second["access_token"]) == 200

    replay = await _refresh(as_server, client["client_id"], first["refresh_token"])

    assert replay.status_code == 400
    assert replay.json()["error"] == "invalid_grant"
    assert "already used" in replay.json()["error_description"]
    # The whole family is revoked: the newest refresh token and the access tokens of the grant too.
    after = await _refresh(as_server, client["client_id"], second["refresh_token"])
    assert after.status_code == 400
    assert after.json()["error"] == "invalid_grant"
    assert await _mcp_status(as_server.base_url, second["access_token"]) == 401
    async with database.one_statement() as conn:
        reasons = (
            (
                await conn.execute(
                    select(_audit.c.outcome)
                    .where(_audit.c.action == "as_refresh_reuse")
                    .where(_audit.c.detail == f"client {client['client_id']}")
                )
            )
            .scalars()
            .all()
        )
    assert reasons == ["revoked"]


async def test_a_revoked_grants_access_token_is_refused_by_another_server_process_within_a_second(
    as_server: RunningServer, as_env: dict[str, str], as_public_url: str, person: BrowserContext
) -> None:
    client, redirect_uri, pkce, seen = await _code(as_server, person, _user())
    tokens = (
        await _redeem(as_server, client["client_id"], _query(seen.redirected_to)["code"], redirect_uri, pkce)
    ).json()
    port = free_port()  # a second replica of the same deployment: same PUBLIC_URL, keys and database
    with run_server({**as_env, "ALLOWED_HOSTS": f"127.0.0.1:{port}"}, port=port, public_url=as_public_url) as replica:
        assert await _mcp_status(replica.base_url, tokens["access_token"]) == 200
        async with httpx2.AsyncClient(timeout=10) as http:
            revoked = await http.post(
                f"{as_server.base_url}/revoke",
                data={"token": tokens["access_token"], "client_id": client["client_id"]},
            )
        assert revoked.status_code == 200, revoked.text
        started = time.monotonic()
        while await _mcp_status(replica.base_url, tokens["access_token"]) != 401:
            assert time.monotonic() - started < 1.0, "the other replica still accepts the revoked grant's token"
        took = time.monotonic() - started
    figures.note("authorization-server mode", f"revoked grant refused by a second replica after {took * 1000:.0f} ms")
    assert took < 1.0
    assert await _mcp_status(as_server.base_url, tokens["access_token"]) == 401


async def test_bad_authorization_and_token_requests_get_the_rfc_errors_with_descriptions_and_no_stack_trace(
    as_server: RunningServer,
) -> None:
    redirect_uri = f"http://127.0.0.1:{free_port()}/callback"
    client = await _register(as_server, redirect_uri)
    pkce = Pkce.new()
    async with httpx2.AsyncClient(timeout=10, follow_redirects=False) as http:
        # RFC 8707: another resource than Coatcheck's MCP URL.
        wrong_resource = await http.get(
            _authorize_url(as_server, client["client_id"], redirect_uri, pkce, resource="https://elsewhere.example/mcp")
        )
        # PKCE S256 only.
        plain = await http.get(
            _authorize_url(as_server, client["client_id"], redirect_uri, pkce, code_challenge_method="plain")
        )
        # An unregistered redirect URI is never redirected to.
        foreign = await http.get(_authorize_url(as_server, client["client_id"], "http://127.0.0.1:1/elsewhere", pkce))
        unknown_client = await http.get(_authorize_url(as_server, "no-such-client", redirect_uri, pkce))
        bad_code = await http.post(
            f"{as_server.base_url}/token",
            data={
                "grant_type": "authorization_code",
                "client_id": client["client_id"],
                "code": "not-a-code",
                "redirect_uri": redirect_uri,
                "code_verifier": pkce.verifier,
            },
        )
        http_redirect = await http.post(
            f"{as_server.base_url}/register", json={"redirect_uris": ["http://evil.example/cb"]}
        )
        too_many = await http.post(
            f"{as_server.base_url}/register",
            json={"redirect_uris": [f"https://app.example/cb{n}" for n in range(11)]},
        )
        wrong_target = await http.post(
            f"{as_server.base_url}/token",
            data={
                "grant_type": "authorization_code",
                "client_id": client["client_id"],
                "code": "not-a-code",
                "redirect_uri": redirect_uri,
                "code_verifier": pkce.verifier,
                "resource": "https://elsewhere.example/mcp",
            },
        )
        long_name = await http.post(
            f"{as_server.base_url}/register",
            json={"redirect_uris": ["https://app.example/cb"], "client_name": "n" * 5000},
        )
        consent_from_elsewhere = await http.post(
            f"{as_server.base_url}/oauth/consent", data={"request": "x", "decision": "allow"}
        )

    assert wrong_resource.status_code == 302
    answer = _query(wrong_resource.headers["location"])
    assert answer["error"] == "invalid_target"
    assert as_server.mcp_url in answer["error_description"]
    assert answer["state"].startswith("state-")
    assert answer["iss"] == as_server.base_url
    assert _query(plain.headers["location"])["error"] == "invalid_request"
    assert foreign.status_code == 400
    assert foreign.json()["error"] == "invalid_request"
    assert unknown_client.status_code == 400
    assert unknown_client.json()["error"] == "invalid_request"
    assert bad_code.status_code == 400
    assert bad_code.json()["error"] == "invalid_grant"
    assert bad_code.json()["error_description"]
    assert http_redirect.status_code == 400
    assert http_redirect.json()["error"] == "invalid_redirect_uri"
    assert "loopback" in http_redirect.json()["error_description"]
    assert too_many.status_code == 400
    assert too_many.json()["error"] == "invalid_client_metadata"
    assert wrong_target.status_code == 400
    assert wrong_target.json()["error"] == "invalid_target"
    assert long_name.status_code == 400
    assert long_name.json()["error"] == "invalid_client_metadata"
    assert "client_name is longer than" in long_name.json()["error_description"]
    assert consent_from_elsewhere.status_code == 403
    responses = (wrong_resource, plain, foreign, unknown_client, bad_code, http_redirect, too_many, wrong_target)
    for response in (*responses, long_name):
        assert "Traceback" not in response.text
    assert "Traceback" not in as_server.log_text()


async def test_a_denied_consent_sends_access_denied_with_state_and_issuer_and_grants_nothing(
    as_server: RunningServer, person: BrowserContext, database: Database
) -> None:
    redirect_uri = f"http://127.0.0.1:{free_port()}/callback"
    client = await _register(as_server, redirect_uri)
    seen = await authorize_in_browser(
        person,
        _authorize_url(as_server, client["client_id"], redirect_uri, Pkce.new()),
        username=_user(),
        redirect_uri=redirect_uri,
        decision="deny",
    )
    answer = _query(seen.redirected_to)
    assert answer["error"] == "access_denied"
    assert answer["iss"] == as_server.base_url
    assert answer["state"].startswith("state-")
    assert "code" not in answer
    async with database.one_statement() as conn:
        granted = (await conn.execute(select(_grants.c.id).where(_grants.c.client_id == client["client_id"]))).all()
    assert granted == []


async def test_a_client_identified_by_its_metadata_document_signs_in_without_registering(
    as_server: RunningServer, person: BrowserContext
) -> None:
    redirect_uri = f"http://127.0.0.1:{free_port()}/callback"
    with serve_documents() as documents:
        documents.documents["/client.json"] = {"client_name": "Doc-described client", "redirect_uris": [redirect_uri]}
        client_id = documents.url("/client.json")
        async with httpx2.AsyncClient(timeout=10) as http:
            metadata = (await http.get(f"{as_server.base_url}/.well-known/oauth-authorization-server")).json()
        pkce = Pkce.new()
        seen = await authorize_in_browser(
            person,
            _authorize_url(as_server, client_id, redirect_uri, pkce),
            username=_user(),
            redirect_uri=redirect_uri,
        )
        tokens = await _redeem(as_server, client_id, _query(seen.redirected_to)["code"], redirect_uri, pkce)

    assert metadata["client_id_metadata_document_supported"] is True
    assert seen.consent_text is not None
    assert "Doc-described client" in seen.consent_text
    assert f"described by its metadata document at {urlsplit(client_id).netloc}" in seen.consent_text
    assert tokens.status_code == 200, tokens.text
    assert await _mcp_status(as_server.base_url, tokens.json()["access_token"]) == 200


async def test_a_metadata_document_url_that_redirects_is_refused_at_authorize_saying_why(
    as_server: RunningServer,
) -> None:
    redirect_uri = f"http://127.0.0.1:{free_port()}/callback"
    with serve_documents() as documents:
        async with httpx2.AsyncClient(timeout=10, follow_redirects=False) as http:
            refused = await http.get(_authorize_url(as_server, documents.url("/redirect"), redirect_uri, Pkce.new()))
    assert refused.status_code == 400
    assert refused.json()["error"] == "invalid_request"
    assert "redirects are refused" in refused.json()["error_description"]


async def test_a_connect_link_opened_by_the_same_upstream_user_connects_a_provider_in_this_mode_too(
    as_server: RunningServer, person: BrowserContext
) -> None:
    username = _user()
    opener = LinkOpener(BrowserUser(person, username))
    async with _sdk_client(as_server, person, username, elicitation_callback=opener) as (client, _):
        result = await client.call_tool("connection_whoami", {"provider": "demo"})
    landing = await opener.landing()

    # /connect compared the browser's upstream (issuer, subject) with the principal of Coatcheck's token.
    assert "Connected" in landing.text, landing.text
    assert not result.is_error, result
    assert result.structured_content is not None
    assert result.structured_content["profile"]["sub"] == username


async def test_a_user_sees_the_applications_they_authorised_and_revoking_one_ends_its_tokens_and_consent(
    as_server: RunningServer, person: BrowserContext, database: Database
) -> None:
    username = _user()
    client, redirect_uri, pkce, seen = await _code(as_server, person, username)
    tokens = (
        await _redeem(as_server, client["client_id"], _query(seen.redirected_to)["code"], redirect_uri, pkce)
    ).json()
    assert await _mcp_status(as_server.base_url, tokens["access_token"]) == 200

    page = await person.new_page()
    listed = await page.goto(f"{as_server.base_url}/oauth/grants")
    assert listed is not None
    assert "frame-ancestors 'none'" in (await listed.all_headers())["content-security-policy"]
    row = page.locator("li", has_text=client["client_id"])
    assert await row.count() == 1
    async with page.expect_navigation():
        await row.locator("button", has_text="Revoke").click()
    after = await page.inner_text("body")
    await page.close()

    assert client["client_id"] not in after
    assert await _mcp_status(as_server.base_url, tokens["access_token"]) == 401
    refreshed = await _refresh(as_server, client["client_id"], tokens["refresh_token"])
    assert refreshed.json()["error"] == "invalid_grant"
    # The consent is forgotten too: the next authorization of that client asks again.
    again = await authorize_in_browser(
        person,
        _authorize_url(as_server, client["client_id"], redirect_uri, Pkce.new()),
        username=username,
        redirect_uri=redirect_uri,
    )
    assert again.consent_text is not None


async def test_the_grants_page_refuses_a_revocation_posted_from_elsewhere(as_server: RunningServer) -> None:
    async with httpx2.AsyncClient(timeout=10) as http:
        forged = await http.post(
            f"{as_server.base_url}/oauth/grants",
            data={"client_id": "anything", "token": "x"},
            headers={"Origin": "https://evil.example"},
        )
    assert forged.status_code == 403
