"""The development identity provider behaves like the OAuth 2.1 / OIDC provider an MCP client expects.

Everything runs over plain HTTP against a real ``node devidp/server.mjs`` process; the browser is an HTTP
client that fills the login form. Nothing listens on the redirect URIs: the tests read the ``Location``
header that would reach them.
"""

import json
import re
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urljoin, urlsplit

import httpx2
import pytest
from joserfc import jws
from joserfc.errors import ExpiredTokenError, InvalidClaimError, JoseError
from joserfc.jwk import KeySet
from mcp.client.auth import AuthorizationCodeResult, OAuthClientProvider
from mcp.shared.auth import OAuthClientMetadata

from tests.support.devidp import DevIdP, DevIdPError, start_devidp
from tests.support.jose import verify_jwt
from tests.support.oauth import LOGIN_FORM, MemoryTokenStorage, Pkce, sign_in, token_request
from tests.support.waiting import free_port

RESOURCE = "http://localhost:8123/mcp"
OTHER_RESOURCE = "http://localhost:8124/other"
CONFIDENTIAL_ID = "demo-upstream"
CONFIDENTIAL_SECRET = "demo-upstream-secret-not-for-production"
CONFIDENTIAL_REDIRECT = "http://127.0.0.1:8123/oauth/callback"
CONFIDENTIAL_CLIENT: dict[str, object] = {
    "client_id": CONFIDENTIAL_ID,
    "client_secret": CONFIDENTIAL_SECRET,
    "redirect_uris": [CONFIDENTIAL_REDIRECT],
    "grant_types": ["authorization_code", "refresh_token"],
    "response_types": ["code"],
    "scope": "openid profile email offline_access",
    "token_endpoint_auth_method": "client_secret_basic",
}


@pytest.fixture(scope="module")
def stub_base_url() -> str:
    """Where the stub protected resource (for the MCP SDK test) will listen."""
    return f"http://127.0.0.1:{free_port()}"


@pytest.fixture(scope="module")
def idp(stub_base_url: str) -> Iterator[DevIdP]:
    resources = [RESOURCE, OTHER_RESOURCE, f"{stub_base_url}/mcp"]
    with start_devidp(port=free_port(), resources=resources, clients=[CONFIDENTIAL_CLIENT]) as running:
        yield running


@pytest.fixture
def browser() -> Iterator[httpx2.Client]:
    """A cookie-keeping HTTP client that does not follow redirects on its own."""
    with httpx2.Client(follow_redirects=False, timeout=10.0) as client:
        yield client


def register_public_client(idp: DevIdP, *redirect_uris: str, scope: str | None = None) -> dict[str, Any]:
    """Dynamic client registration the way Claude Code does it: a public client with loopback redirects."""
    metadata: dict[str, Any] = {
        "client_name": "Test MCP client",
        "redirect_uris": list(redirect_uris),
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": "none",
    }
    if scope is not None:
        metadata["scope"] = scope
    response = httpx2.post(f"{idp.issuer}/reg", json=metadata, timeout=10.0)
    assert response.status_code == 201, response.text
    client = response.json()
    assert isinstance(client, dict)
    return client


def jwks(idp: DevIdP) -> KeySet:
    response = httpx2.get(f"{idp.base_url}/jwks", timeout=10.0)
    assert response.status_code == 200
    return KeySet.import_key_set(response.json())


def verify(idp: DevIdP, token: str, *, audience: str) -> dict[str, Any]:
    """Verify a JWT the way a resource server does: signature by kid, then iss, aud, sub, exp, nbf and iat."""
    return verify_jwt(token, jwks(idp), issuer=idp.issuer, audience=audience).claims


def unique_user() -> str:
    return f"dev-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class CodeExchange:
    """One authorization-code flow: what the redirect carried, the PKCE verifier, and the token endpoint's answer."""

    returned: dict[str, str]
    verifier: str
    response: httpx2.Response


def exchange_code(
    idp: DevIdP,
    browser: httpx2.Client,
    *,
    client_id: str,
    redirect_uri: str,
    username: str,
    scope: str,
    resource: str | None,
    client_secret: str | None = None,
    extra: dict[str, str] | None = None,
    code_verifier: str | None = None,
) -> CodeExchange:
    """Sign ``username`` in with PKCE and exchange the code, sending ``resource`` (if any) both times.

    A public client names itself in the body; with ``client_secret`` the client authenticates with HTTP Basic.
    ``code_verifier`` is sent instead of the right verifier.
    """
    pkce = Pkce.new()
    returned = sign_in(
        idp,
        browser,
        client_id=client_id,
        redirect_uri=redirect_uri,
        username=username,
        scope=scope,
        pkce=pkce,
        resource=resource,
        extra=extra,
    )
    data = {
        "grant_type": "authorization_code",
        "code": returned["code"],
        "redirect_uri": redirect_uri,
        "code_verifier": pkce.verifier if code_verifier is None else code_verifier,
    }
    if resource is not None:
        data["resource"] = resource
    if client_secret is None:
        response = token_request(idp, {**data, "client_id": client_id})
    else:
        response = token_request(idp, data, auth=(client_id, client_secret))
    return CodeExchange(returned, pkce.verifier, response)


def authorize(
    idp: DevIdP, browser: httpx2.Client, *, client_id: str, redirect_uri: str, resource: str, pkce: Pkce | None
) -> httpx2.Response:
    """The authorization request a client's browser sends first (``pkce=None``: without a code challenge)."""
    params = {
        "response_type": "code",
        "client_id": client_id,
        "redirect_uri": redirect_uri,
        "scope": "mcp:tools",
        "state": "s",
        "resource": resource,
    }
    if pkce is not None:
        params |= {"code_challenge": pkce.challenge, "code_challenge_method": "S256"}
    return browser.get(f"{idp.issuer}/auth", params=params)


def test_both_discovery_documents_list_the_endpoints_an_mcp_client_needs(idp: DevIdP) -> None:
    documents = [
        httpx2.get(f"{idp.issuer}{path}", timeout=10.0)
        for path in ("/.well-known/openid-configuration", "/.well-known/oauth-authorization-server")
    ]
    for response in documents:
        assert response.status_code == 200
        metadata = response.json()
        assert metadata["issuer"] == idp.issuer
        for endpoint, path in {
            "authorization_endpoint": "/auth",
            "token_endpoint": "/token",
            "registration_endpoint": "/reg",
            "revocation_endpoint": "/token/revocation",
            "userinfo_endpoint": "/me",
            "jwks_uri": "/jwks",
            "end_session_endpoint": "/session/end",
        }.items():
            assert metadata[endpoint] == f"{idp.issuer}{path}"
        assert metadata["code_challenge_methods_supported"] == ["S256"]
        assert metadata["response_types_supported"] == ["code"]
        assert "none" in metadata["token_endpoint_auth_methods_supported"]
        assert {"authorization_code", "refresh_token"} <= set(metadata["grant_types_supported"])
        assert metadata["authorization_response_iss_parameter_supported"] is True
    assert documents[0].json() == documents[1].json()


def test_jwks_publishes_an_rs256_and_an_es256_key_with_distinct_kids(idp: DevIdP) -> None:
    keys = httpx2.get(f"{idp.issuer}/jwks", timeout=10.0).json()["keys"]
    by_alg = {key["alg"]: key for key in keys}
    assert by_alg["RS256"]["kty"] == "RSA"
    assert by_alg["ES256"]["kty"] == "EC"
    assert by_alg["ES256"]["crv"] == "P-256"
    assert by_alg["RS256"]["kid"] != by_alg["ES256"]["kid"]
    assert all("d" not in key for key in keys)


@pytest.mark.parametrize("alg", ["RS256", "ES256"])
async def test_minted_token_verifies_against_published_jwks(idp: DevIdP, alg: str) -> None:
    token = await idp.token("alice", resource=RESOURCE, scope="openid mcp:tools", alg=alg)

    header = jws.extract_compact(token.encode()).headers()
    claims = verify(idp, token, audience=RESOURCE)

    assert header["alg"] == alg
    assert header["typ"] == "at+jwt"
    assert claims["sub"] == "alice"
    assert claims["aud"] == RESOURCE
    assert claims["iss"] == idp.issuer
    assert claims["scope"] == "openid mcp:tools"
    assert claims["client_id"]
    assert claims["exp"] > claims["iat"]


async def test_minted_token_with_negative_lifetime_is_already_expired(idp: DevIdP) -> None:
    token = await idp.token("alice", resource=RESOURCE, expires_in=-60)

    with pytest.raises(ExpiredTokenError):
        verify(idp, token, audience=RESOURCE)


async def test_minted_token_with_future_not_before_is_not_yet_valid(idp: DevIdP) -> None:
    token = await idp.token("alice", resource=RESOURCE, not_before_in=600)

    with pytest.raises(InvalidClaimError, match="not yet valid"):
        verify(idp, token, audience=RESOURCE)


async def test_minting_refuses_unlisted_resources_but_audience_override_mints_foreign_tokens(idp: DevIdP) -> None:
    with pytest.raises(DevIdPError, match="invalid_target"):
        await idp.token("alice", resource="http://localhost:9999/not-listed")

    token = await idp.token("alice", resource=RESOURCE, audience="https://somewhere-else.example/api")

    assert verify(idp, token, audience="https://somewhere-else.example/api")["sub"] == "alice"
    with pytest.raises(InvalidClaimError) as refused:
        verify(idp, token, audience=RESOURCE)
    assert refused.value.claim == "aud"


def test_public_client_registered_dynamically_gets_resource_jwt_and_refresh_token_via_pkce(
    idp: DevIdP, browser: httpx2.Client
) -> None:
    redirect_uri = "http://localhost:34567/callback"
    client = register_public_client(
        idp, redirect_uri, "http://127.0.0.1:34567/callback", scope="mcp:tools offline_access"
    )
    assert client["token_endpoint_auth_method"] == "none"
    assert "client_secret" not in client
    username = unique_user()

    response = exchange_code(
        idp,
        browser,
        client_id=client["client_id"],
        redirect_uri=redirect_uri,
        username=username,
        scope="mcp:tools offline_access",
        resource=RESOURCE,
    ).response

    assert response.status_code == 200, response.text
    tokens = response.json()
    assert tokens["token_type"].lower() == "bearer"
    assert tokens["refresh_token"]
    claims = verify(idp, tokens["access_token"], audience=RESOURCE)
    assert claims["sub"] == username
    assert claims["client_id"] == client["client_id"]
    # oidc-provider drops offline_access unless prompt=consent (OIDC Core); the refresh token comes anyway.
    assert claims["scope"] == "mcp:tools"

    refreshed = token_request(
        idp,
        {
            "grant_type": "refresh_token",
            "refresh_token": tokens["refresh_token"],
            "client_id": client["client_id"],
            "resource": RESOURCE,
        },
    )

    assert refreshed.status_code == 200, refreshed.text
    new_tokens = refreshed.json()
    assert new_tokens["refresh_token"] != tokens["refresh_token"]  # public clients rotate
    assert verify(idp, new_tokens["access_token"], audience=RESOURCE)["sub"] == username


def test_sdk_style_offline_access_with_prompt_consent_is_granted_without_a_consent_screen(
    idp: DevIdP, browser: httpx2.Client
) -> None:
    # The MCP Python SDK adds prompt=consent when the client metadata scope has offline_access.
    redirect_uri = "http://127.0.0.1:40000/callback"
    client = register_public_client(idp, redirect_uri, scope="mcp:tools offline_access")
    username = unique_user()

    response = exchange_code(
        idp,
        browser,
        client_id=client["client_id"],
        redirect_uri=redirect_uri,
        username=username,
        scope="mcp:tools offline_access",
        resource=RESOURCE,
        extra={"prompt": "consent"},
    ).response

    assert response.status_code == 200, response.text
    assert response.json()["refresh_token"]
    claims = verify(idp, response.json()["access_token"], audience=RESOURCE)
    assert set(claims["scope"].split()) == {"mcp:tools", "offline_access"}
    assert claims["sub"] == username


def test_code_exchange_without_the_pkce_verifier_is_rejected(idp: DevIdP, browser: httpx2.Client) -> None:
    redirect_uri = "http://127.0.0.1:40001/callback"
    client = register_public_client(idp, redirect_uri)

    response = exchange_code(
        idp,
        browser,
        client_id=client["client_id"],
        redirect_uri=redirect_uri,
        username=unique_user(),
        scope="mcp:tools",
        resource=RESOURCE,
        code_verifier=Pkce.new().verifier,
    ).response

    assert response.status_code == 400
    assert response.json()["error"] == "invalid_grant"


def test_authorization_without_pkce_is_refused(idp: DevIdP, browser: httpx2.Client) -> None:
    redirect_uri = "http://127.0.0.1:40002/callback"
    client = register_public_client(idp, redirect_uri)

    response = authorize(
        idp, browser, client_id=client["client_id"], redirect_uri=redirect_uri, resource=RESOURCE, pkce=None
    )

    assert response.status_code == 303
    error = parse_qs(urlsplit(response.headers["location"]).query)
    assert error["error"] == ["invalid_request"]


def test_client_that_forgets_the_resource_gets_a_token_for_the_default_resource(
    idp: DevIdP, browser: httpx2.Client
) -> None:
    redirect_uri = "http://localhost:40003/callback"
    client = register_public_client(idp, redirect_uri)
    username = unique_user()

    response = exchange_code(
        idp,
        browser,
        client_id=client["client_id"],
        redirect_uri=redirect_uri,
        username=username,
        scope="mcp:tools",
        resource=None,
    ).response

    assert response.status_code == 200, response.text
    assert verify(idp, response.json()["access_token"], audience=RESOURCE)["sub"] == username


def test_token_for_the_second_listed_resource_carries_that_audience(idp: DevIdP, browser: httpx2.Client) -> None:
    redirect_uri = "http://localhost:40004/callback"
    client = register_public_client(idp, redirect_uri)

    response = exchange_code(
        idp,
        browser,
        client_id=client["client_id"],
        redirect_uri=redirect_uri,
        username=unique_user(),
        scope="other:read",
        resource=OTHER_RESOURCE,
    ).response

    assert response.status_code == 200, response.text
    assert verify(idp, response.json()["access_token"], audience=OTHER_RESOURCE)["scope"] == "other:read"


def test_unlisted_resource_is_refused_at_authorization(idp: DevIdP, browser: httpx2.Client) -> None:
    redirect_uri = "http://localhost:40005/callback"
    client = register_public_client(idp, redirect_uri)

    response = authorize(
        idp,
        browser,
        client_id=client["client_id"],
        redirect_uri=redirect_uri,
        resource="http://localhost:9999/unknown",
        pkce=Pkce.new(),
    )

    assert response.status_code == 303
    assert parse_qs(urlsplit(response.headers["location"]).query)["error"] == ["invalid_target"]


def sign_in_confidential(idp: DevIdP, browser: httpx2.Client, username: str) -> dict[str, Any]:
    """The static confidential client (like an upstream-provider client) signs a user in; no resource."""
    response = exchange_code(
        idp,
        browser,
        client_id=CONFIDENTIAL_ID,
        redirect_uri=CONFIDENTIAL_REDIRECT,
        username=username,
        scope="openid profile email offline_access",
        resource=None,
        client_secret=CONFIDENTIAL_SECRET,
    ).response
    assert response.status_code == 200, response.text
    tokens = response.json()
    assert isinstance(tokens, dict)
    return tokens


def test_userinfo_returns_claims_derived_from_the_typed_username(idp: DevIdP, browser: httpx2.Client) -> None:
    username = unique_user()
    tokens = sign_in_confidential(idp, browser, username)

    response = httpx2.get(
        f"{idp.issuer}/me", headers={"Authorization": f"Bearer {tokens['access_token']}"}, timeout=10.0
    )

    assert response.status_code == 200, response.text
    assert response.json() == {
        "sub": username,
        "name": username,
        "preferred_username": username,
        "email": f"{username}@example.com",
        "email_verified": True,
    }
    id_token = verify(idp, tokens["id_token"], audience=CONFIDENTIAL_ID)
    assert id_token["sub"] == username
    assert tokens["refresh_token"]


async def test_revoking_a_refresh_token_stops_refreshes_and_is_counted(idp: DevIdP, browser: httpx2.Client) -> None:
    tokens = sign_in_confidential(idp, browser, unique_user())
    auth = (CONFIDENTIAL_ID, CONFIDENTIAL_SECRET)
    before = await idp.stats()

    revoked = httpx2.post(
        f"{idp.issuer}/token/revocation",
        data={"token": tokens["refresh_token"], "token_type_hint": "refresh_token"},
        auth=auth,
        timeout=10.0,
    )
    refresh = token_request(idp, {"grant_type": "refresh_token", "refresh_token": tokens["refresh_token"]}, auth=auth)

    assert revoked.status_code == 200
    assert refresh.status_code == 400
    assert refresh.json()["error"] == "invalid_grant"
    after = await idp.stats()
    assert after["revocations"] == before["revocations"] + 1
    assert after["refresh_requests"] == before["refresh_requests"] + 1
    assert after["token_requests"] == before["token_requests"] + 1


async def test_token_endpoint_fault_answers_invalid_grant_until_reset(idp: DevIdP, browser: httpx2.Client) -> None:
    tokens = sign_in_confidential(idp, browser, unique_user())
    auth = (CONFIDENTIAL_ID, CONFIDENTIAL_SECRET)
    refresh = {"grant_type": "refresh_token", "refresh_token": tokens["refresh_token"]}
    before = await idp.stats()

    await idp.set_fault("error")
    try:
        failed = token_request(idp, refresh, auth=auth)
    finally:
        await idp.set_fault("ok")
    recovered = token_request(idp, refresh, auth=auth)

    assert failed.status_code == 400
    assert failed.json()["error"] == "invalid_grant"
    assert recovered.status_code == 200, recovered.text  # the faulted request never consumed the token
    after = await idp.stats()
    assert after["refresh_requests"] == before["refresh_requests"] + 2


async def test_stats_can_be_reset(idp: DevIdP) -> None:
    token_request(idp, {"grant_type": "refresh_token", "refresh_token": "nonsense"})
    assert (await idp.stats())["refresh_requests"] >= 1

    await idp.reset_stats()

    assert set((await idp.stats()).values()) == {0}


def test_login_form_rejects_an_empty_username(idp: DevIdP, browser: httpx2.Client) -> None:
    redirect_uri = "http://localhost:40006/callback"
    client = register_public_client(idp, redirect_uri)
    response = authorize(
        idp, browser, client_id=client["client_id"], redirect_uri=redirect_uri, resource=RESOURCE, pkce=Pkce.new()
    )
    login_page = browser.get(urljoin(idp.issuer, response.headers["location"]))
    form = LOGIN_FORM.search(login_page.text)
    assert form is not None

    response = browser.post(urljoin(idp.issuer, form["action"]), data={"username": "   "})

    assert response.status_code == 400
    assert LOGIN_FORM.search(response.text) is not None


def test_rp_initiated_logout_asks_to_confirm_returns_only_to_a_registered_uri_and_ends_the_session(
    idp: DevIdP, browser: httpx2.Client
) -> None:
    redirect_uri, after_logout = "http://localhost:40007/callback", "http://localhost:40007/signed-out"
    metadata = {
        "client_name": "Test RP",
        "redirect_uris": [redirect_uri],
        "post_logout_redirect_uris": [after_logout],
        "token_endpoint_auth_method": "none",
    }
    registered = httpx2.post(f"{idp.issuer}/reg", json=metadata, timeout=10.0)
    assert registered.status_code == 201, registered.text
    client_id = registered.json()["client_id"]
    username = unique_user()
    sign_in(
        idp,
        browser,
        client_id=client_id,
        redirect_uri=redirect_uri,
        username=username,
        scope="openid",
        pkce=Pkce.new(),
        resource=None,
    )

    elsewhere = browser.get(
        f"{idp.issuer}/session/end", params={"client_id": client_id, "post_logout_redirect_uri": "https://evil.test/"}
    )
    assert elsewhere.status_code == 400
    assert "post_logout_redirect_uri not registered" in elsewhere.text

    confirm = browser.get(
        f"{idp.issuer}/session/end", params={"client_id": client_id, "post_logout_redirect_uri": after_logout}
    )
    assert confirm.status_code == 200
    assert "Development identity provider — not for production" in confirm.text
    assert "Test RP" in confirm.text
    form = re.search(
        r'<form id="op.logoutForm" method="post" action="([^"]+)">.*?name="xsrf" value="([^"]+)"', confirm.text
    )
    assert form is not None, confirm.text
    assert '<button autofocus type="submit" form="op.logoutForm" value="yes" name="logout">' in confirm.text
    done = browser.post(urljoin(idp.issuer, form[1]), data={"xsrf": form[2], "logout": "yes"})
    assert done.status_code == 303
    assert done.headers["location"] == after_logout

    # The session is gone: the next authorization shows the login form again.
    again = browser.get(
        f"{idp.issuer}/auth",
        params={
            "response_type": "code",
            "client_id": client_id,
            "redirect_uri": redirect_uri,
            "scope": "openid",
            "state": "s",
            "code_challenge": Pkce.new().challenge,
            "code_challenge_method": "S256",
        },
    )
    assert again.status_code == 303
    login_page = browser.get(urljoin(idp.issuer, again.headers["location"]))
    assert LOGIN_FORM.search(login_page.text) is not None, login_page.text


def test_rp_initiated_logout_is_absent_from_discovery_when_disabled() -> None:
    with start_devidp(port=free_port(), resources=[RESOURCE], env={"DEVIDP_RP_LOGOUT": "0"}) as idp:
        metadata = httpx2.get(f"{idp.issuer}/.well-known/openid-configuration", timeout=10.0).json()
        end_session = httpx2.get(f"{idp.issuer}/session/end", timeout=10.0)

    assert "end_session_endpoint" not in metadata
    assert end_session.status_code == 404


def test_dev_token_endpoint_is_absent_when_disabled() -> None:
    with start_devidp(port=free_port(), resources=[RESOURCE], env={"DEVIDP_DEV_TOKENS": "0"}) as idp:
        response = httpx2.post(f"{idp.issuer}/dev/token", json={"username": "a", "resource": RESOURCE}, timeout=10.0)
        health = httpx2.get(f"{idp.issuer}/dev/health", timeout=10.0)

    assert response.status_code == 404
    assert health.status_code == 200


def test_registration_is_absent_from_discovery_when_disabled() -> None:
    with start_devidp(port=free_port(), resources=[RESOURCE], env={"DEVIDP_REGISTRATION": "0"}) as idp:
        metadata = httpx2.get(f"{idp.issuer}/.well-known/openid-configuration", timeout=10.0).json()
        registration = httpx2.post(f"{idp.issuer}/reg", json={"redirect_uris": [CONFIDENTIAL_REDIRECT]}, timeout=10.0)

    assert "registration_endpoint" not in metadata
    assert registration.status_code == 404


async def test_a_trailing_slash_issuer_is_kept_in_discovery_tokens_and_health() -> None:
    port = free_port()
    issuer = f"http://127.0.0.1:{port}/"
    with start_devidp(port=port, resources=[RESOURCE], env={"DEVIDP_ISSUER": issuer}) as idp:
        metadata = httpx2.get(f"{idp.base_url}/.well-known/oauth-authorization-server", timeout=10.0).json()
        health = httpx2.get(f"{idp.base_url}/dev/health", timeout=10.0).json()
        claims = verify(idp, await idp.token("slash", resource=RESOURCE), audience=RESOURCE)

    assert (idp.issuer, metadata["issuer"], health["issuer"], claims["iss"]) == (issuer, issuer, issuer, issuer)
    assert metadata["token_endpoint"] == f"{idp.base_url}/token"


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("DEVIDP_ACCESS_TOKEN_FORMAT", "paseto", 'DEVIDP_ACCESS_TOKEN_FORMAT must be "jwt" or "opaque"'),
        ("DEVIDP_SUBJECT_TYPE", "random", 'DEVIDP_SUBJECT_TYPE must be "public" or "pairwise"'),
    ],
)
def test_an_unknown_shape_value_stops_start_up_naming_the_variable(variable: str, value: str, message: str) -> None:
    with (
        pytest.raises(DevIdPError, match=message),
        start_devidp(port=free_port(), resources=[RESOURCE], env={variable: value}),
    ):
        pass  # pragma: no cover


def test_start_devidp_reports_the_process_output_when_it_dies() -> None:
    with (
        pytest.raises(DevIdPError, match="DEVIDP_CLIENTS is not valid JSON"),
        start_devidp(port=free_port(), resources=[RESOURCE], env={"DEVIDP_CLIENTS": "{not json"}),
    ):
        pass  # pragma: no cover


async def test_log_never_contains_tokens_codes_or_client_secrets(idp: DevIdP, browser: httpx2.Client) -> None:
    exchange = exchange_code(
        idp,
        browser,
        client_id=CONFIDENTIAL_ID,
        redirect_uri=CONFIDENTIAL_REDIRECT,
        username=unique_user(),
        scope="openid profile email",
        resource=RESOURCE,
        client_secret=CONFIDENTIAL_SECRET,
    )
    tokens = exchange.response.json()
    minted = await idp.token("alice", resource=RESOURCE)
    refreshed = token_request(
        idp,
        {"grant_type": "refresh_token", "refresh_token": tokens["refresh_token"]},
        auth=(CONFIDENTIAL_ID, CONFIDENTIAL_SECRET),
    )
    assert refreshed.status_code == 200, refreshed.text
    log = idp.log_text()

    assert "POST /token" in log
    secrets_seen = [
        CONFIDENTIAL_SECRET,
        exchange.returned["code"],
        exchange.verifier,
        tokens["access_token"],
        tokens["refresh_token"],
        tokens["id_token"],
        refreshed.json()["access_token"],
        minted,
    ]
    for secret in secrets_seen:
        assert secret not in log


@dataclass(frozen=True)
class StubResourceServer:
    """A protected resource that publishes RFC 9728 metadata naming the dev IdP and checks JWT audiences."""

    base_url: str

    @property
    def resource(self) -> str:
        return f"{self.base_url}/mcp"


@pytest.fixture(scope="module")
def stub_resource_server(idp: DevIdP, stub_base_url: str) -> Iterator[StubResourceServer]:
    base_url = stub_base_url
    port = int(urlsplit(base_url).port or 0)
    resource = f"{base_url}/mcp"
    keys = jwks(idp)
    metadata = json.dumps(
        {"resource": resource, "authorization_servers": [idp.issuer], "scopes_supported": ["mcp:tools"]}
    ).encode()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path.startswith("/.well-known/oauth-protected-resource"):
                self._send(200, metadata)
            else:
                self._send(404, b"{}")

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            token = self.headers.get("Authorization", "").removeprefix("Bearer ")
            try:
                claims = verify_jwt(token, keys, issuer=idp.issuer, audience=resource).claims
            except JoseError:
                challenge = (
                    f'Bearer resource_metadata="{base_url}/.well-known/oauth-protected-resource/mcp", scope="mcp:tools"'
                )
                self._send(401, b'{"error":"invalid_token"}', {"WWW-Authenticate": challenge})
                return
            self._send(200, json.dumps({"sub": claims["sub"], "scope": claims.get("scope")}).encode())

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield StubResourceServer(base_url)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


async def browse_to_redirect(authorization_url: str, *, username: str, redirect_uri: str) -> str:
    """What a person does in a browser: open the URL, type a username, submit; return the final redirect."""
    async with httpx2.AsyncClient(follow_redirects=False, timeout=10.0) as browser:
        response = await browser.get(authorization_url)
        for _ in range(5):
            if response.status_code == 200:
                break
            location = urljoin(authorization_url, response.headers["location"])
            if location.startswith(redirect_uri):
                return location  # an error response, before any login
            response = await browser.get(location)
        form = LOGIN_FORM.search(response.text)
        assert form is not None, response.text
        response = await browser.post(urljoin(authorization_url, form["action"]), data={"username": username})
        for _ in range(5):
            location = urljoin(authorization_url, response.headers["location"])
            if location.startswith(redirect_uri):
                return location
            response = await browser.get(location)
    raise AssertionError("the provider never redirected back to the client")


@pytest.mark.parametrize("auth_method", ["none", "client_secret_basic"])
async def test_mcp_sdk_oauth_client_discovers_registers_and_signs_in(
    idp: DevIdP, stub_resource_server: StubResourceServer, auth_method: str
) -> None:
    redirect_uri = f"http://localhost:{free_port()}/callback"
    username = unique_user()
    redirected: list[str] = []

    async def redirect_handler(authorization_url: str) -> None:
        redirected.append(await browse_to_redirect(authorization_url, username=username, redirect_uri=redirect_uri))

    async def callback_handler() -> AuthorizationCodeResult:
        query = {key: values[0] for key, values in parse_qs(urlsplit(redirected[-1]).query).items()}
        assert "code" in query, redirected[-1]
        return AuthorizationCodeResult(code=query["code"], state=query.get("state"), iss=query.get("iss"))

    storage = MemoryTokenStorage()
    oauth = OAuthClientProvider(
        server_url=stub_resource_server.resource,
        client_metadata=OAuthClientMetadata(
            client_name="MCP SDK test client",
            redirect_uris=[redirect_uri],  # type: ignore[list-item]
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            token_endpoint_auth_method=auth_method,  # type: ignore[arg-type]
        ),
        storage=storage,
        redirect_handler=redirect_handler,
        callback_handler=callback_handler,
    )

    async with httpx2.AsyncClient(auth=oauth, timeout=30.0) as http:
        response = await http.post(stub_resource_server.resource, json={})

    assert response.status_code == 200, response.text
    assert response.json()["sub"] == username
    assert storage.tokens is not None
    assert storage.tokens.refresh_token
    assert storage.client_info is not None
    assert storage.client_info.token_endpoint_auth_method == auth_method
