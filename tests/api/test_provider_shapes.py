"""Resource-server mode against identity providers shaped like the real ones, end to end.

Each test starts its own dev IdP process (panva oidc-provider) in one provider shape and a Coatcheck app built
by ``create_app`` for it, then signs a user in with the official SDK client's OAuth support exactly as an MCP
client does (protected-resource metadata, authorization-server discovery, registration or a pre-registered
client, the login form, PKCE, the code exchange) and calls a tool. The principal that owns what the tool
created must be (issuer, subject) exactly as the IdP wrote them.

Shapes: Auth0's trailing-slash issuer with no dynamic client registration; opaque access tokens checked by
RFC 7662 introspection; pairwise subjects; Entra v2's API client ID as ``aud``.
"""

import asyncio
import hashlib
import logging
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx2
import pytest
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata

from api.jose import is_compact_jws, metadata_urls
from store.carts import CartRepository
from store.db import Database
from store.errors import NotFound
from store.principal import Principal
from tests.support.devidp import LOGIN_CLIENT_ID, DevIdP, devidp_clients, start_devidp
from tests.support.inprocess import InProcessApp, settings_from, started_app
from tests.support.mcp_client import call_ok
from tests.support.oauth import REDIRECT_URI, FormFillingUser, MemoryTokenStorage, Pkce, sign_in, token_request
from tests.support.waiting import eventually, free_port
from tests.support.wire import modern_request

pytestmark = pytest.mark.resource_server_only(reason="upstream tokens in each provider shape")


PREREGISTERED_CLIENT_ID = "claude-code-preregistered"
INTROSPECTION_CLIENT_ID = "coatcheck-introspection"
# A client's sector (OIDC Core §8.1) is the host of its first redirect URI; oidc-provider takes it with the port.
LOOPBACK_SECTOR = urlsplit(REDIRECT_URI).netloc


def _user() -> str:
    return f"shape-{uuid.uuid4().hex[:8]}"


def _preregistered_client() -> dict[str, object]:
    """A public MCP client registered by an administrator, as Entra, Google and Auth0 without DCR need."""
    return {
        "client_id": PREREGISTERED_CLIENT_ID,
        "client_name": "An MCP client registered by hand",
        "token_endpoint_auth_method": "none",
        "redirect_uris": [REDIRECT_URI],
        "grant_types": ["authorization_code", "refresh_token"],
        "scope": "openid offline_access",  # the SDK client asks for offline_access (refresh tokens)
    }


def _introspection_client(secret: str) -> dict[str, object]:
    """Coatcheck's confidential client for the introspection endpoint: no flows of its own."""
    return {
        "client_id": INTROSPECTION_CLIENT_ID,
        "client_secret": secret,
        "redirect_uris": [],
        "response_types": [],
        "grant_types": [],
    }


@dataclass(frozen=True)
class Shape:
    """A dev IdP in one shape and how to build Coatcheck apps for it."""

    idp: DevIdP
    server_env: Mapping[str, str]

    @asynccontextmanager
    async def app(self, **settings: str) -> AsyncIterator[InProcessApp]:
        """A Coatcheck app whose ``OIDC_ISSUER`` is this IdP exactly as it writes its issuer (plus ``settings``)."""
        env = {**self.server_env, "OIDC_ISSUER": self.idp.issuer, **settings}
        async with started_app(settings_from(env)) as app:
            yield app


@pytest.fixture
def shape(server_env: dict[str, str], public_url: str, oauth_client_secrets: dict[str, str]) -> Callable[..., Any]:
    """``with shape(DEVIDP_…=…) as s``: a dev IdP in that shape, with Coatcheck's and the test's clients."""

    @contextmanager
    def start(
        *, trailing_slash: bool = False, extra_clients: tuple[dict[str, object], ...] = (), **env: str
    ) -> Iterator[Shape]:
        port = free_port()
        if trailing_slash:
            env["DEVIDP_ISSUER"] = f"http://127.0.0.1:{port}/"
        clients = [*devidp_clients(public_url, oauth_client_secrets), _preregistered_client(), *extra_clients]
        with start_devidp(port=port, resources=[f"{public_url}/mcp"], clients=clients, env=env) as idp:
            yield Shape(idp=idp, server_env=server_env)

    return start


@dataclass
class SignedIn:
    """What an SDK client's sign-in left behind: its token storage and the tool results."""

    storage: MemoryTokenStorage
    user: FormFillingUser
    cart_id: str

    @property
    def access_token(self) -> str:
        assert self.storage.tokens is not None
        return self.storage.tokens.access_token


async def sdk_sign_in_and_create_a_cart(
    app: InProcessApp, username: str, *, preregistered: DevIdP | None = None
) -> SignedIn:
    """The official SDK client from nothing but the MCP URL: OAuth discovery, sign-in, ``cart_create``.

    With ``preregistered`` the client already holds the hand-registered client ID for that IdP (no DCR).
    """
    user = FormFillingUser(username)
    storage = MemoryTokenStorage()
    if preregistered is not None:
        storage.client_info = OAuthClientInformationFull(
            client_id=PREREGISTERED_CLIENT_ID,
            redirect_uris=[REDIRECT_URI],  # type: ignore[list-item]
            token_endpoint_auth_method="none",
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
        )
    auth = OAuthClientProvider(
        server_url=app.mcp_url,
        client_metadata=OAuthClientMetadata(
            client_name="coatcheck provider-shape test",
            redirect_uris=[REDIRECT_URI],  # type: ignore[list-item]
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            token_endpoint_auth_method="none",
        ),
        storage=storage,
        redirect_handler=user.open,
        callback_handler=user.callback,
    )
    # Coatcheck's origin goes to the in-process app; the dev IdP is reached over the network.
    async with (
        httpx2.AsyncClient(auth=auth, timeout=httpx2.Timeout(30.0), mounts={app.base_url: app.transport()}) as http,
        Client(streamable_http_client(app.mcp_url, http_client=http)) as client,
    ):
        cart_id = str((await call_ok(client, "cart_create"))["cart_id"])
    return SignedIn(storage=storage, user=user, cart_id=cart_id)


async def owner_of(database: Database, cart_id: str, *candidates: Principal) -> list[Principal]:
    """Which of ``candidates`` can see the cart: the store scopes every read to (issuer, subject)."""
    owners = []
    for principal in candidates:
        async with database.transactional_connection() as conn:
            try:
                await CartRepository(conn).view(principal, cart_id)
            except NotFound:
                continue
        owners.append(principal)
    return owners


async def post_tools_list(app: InProcessApp, token: str) -> httpx2.Response:
    """One raw ``tools/list`` with ``token``, to read the status and challenge the SDK client would see."""
    headers, body = modern_request("tools/list")
    async with app.http(timeout=30.0) as http:
        return await http.post("/mcp", json=body, headers={**headers, "Authorization": f"Bearer {token}"})


# --- discovery URLs -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("issuer", "expected"),
    [
        (
            "https://tenant.auth0.com/",
            (
                "https://tenant.auth0.com/.well-known/openid-configuration",
                "https://tenant.auth0.com/.well-known/oauth-authorization-server",
            ),
        ),
        (
            "https://tenant.auth0.com",
            (
                "https://tenant.auth0.com/.well-known/openid-configuration",
                "https://tenant.auth0.com/.well-known/oauth-authorization-server",
            ),
        ),
        (
            "https://sso.example.com/realms/coatcheck",
            (
                "https://sso.example.com/realms/coatcheck/.well-known/openid-configuration",
                "https://sso.example.com/.well-known/oauth-authorization-server/realms/coatcheck",
            ),
        ),
        (
            "https://login.microsoftonline.com/tenant-id/v2.0/",
            (
                "https://login.microsoftonline.com/tenant-id/v2.0/.well-known/openid-configuration",
                "https://login.microsoftonline.com/.well-known/oauth-authorization-server/tenant-id/v2.0",
            ),
        ),
    ],
)
def test_metadata_urls_follow_openid_discovery_and_rfc_8414_with_and_without_a_trailing_slash(
    issuer: str, expected: tuple[str, str]
) -> None:
    assert metadata_urls(issuer) == expected


# --- Auth0's shape: trailing-slash issuer, no DCR -----------------------------------------------------------


async def test_a_trailing_slash_issuer_without_dcr_signs_the_sdk_client_in_and_owns_its_cart_as_written(
    shape: Callable[..., Any], database: Database
) -> None:
    username = _user()
    with shape(trailing_slash=True, DEVIDP_REGISTRATION="0") as s:
        idp: DevIdP = s.idp
        assert idp.issuer.endswith("/")
        async with httpx2.AsyncClient(timeout=10.0) as http:
            discovery = (await http.get(f"{idp.base_url}/.well-known/openid-configuration")).json()
        assert discovery["issuer"] == idp.issuer
        assert "registration_endpoint" not in discovery
        async with s.app() as app, app.http() as http:
            metadata = (await http.get("/.well-known/oauth-protected-resource/mcp")).json()
            signed_in = await sdk_sign_in_and_create_a_cart(app, username, preregistered=idp)
        stats = await idp.stats()

    # The resource metadata names the issuer exactly as the IdP writes it, slash and all.
    assert metadata["authorization_servers"] == [idp.issuer]
    # No registration happened: the hand-registered client ID was used, and the IdP saw no /reg call.
    assert stats["registrations"] == 0
    assert signed_in.user.authorization_url is not None
    assert f"client_id={PREREGISTERED_CLIENT_ID}" in signed_in.user.authorization_url
    assert signed_in.user.result is not None
    assert signed_in.user.result.iss == idp.issuer
    assert is_compact_jws(signed_in.access_token)
    written = Principal(issuer=idp.issuer, subject=username)
    stripped = Principal(issuer=idp.issuer.rstrip("/"), subject=username)
    assert await owner_of(database, signed_in.cart_id, written, stripped) == [written]


async def test_an_issuer_configured_without_the_slash_its_idp_writes_is_refused_and_the_log_names_the_slash(
    shape: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    with shape(trailing_slash=True) as s:
        idp: DevIdP = s.idp
        token = await idp.token(_user(), resource=idp.resources[0])
        async with s.app(OIDC_ISSUER=idp.base_url) as app:
            response = await post_tools_list(app, token)
    # The metadata (and the token's iss) name the issuer with its slash: not the configured one.
    assert response.status_code == 401
    assert 'error="invalid_token"' in response.headers["www-authenticate"]
    assert f"names the issuer '{idp.issuer}', not '{idp.base_url}'" in caplog.text
    assert "write the trailing slash as the identity provider does" in caplog.text


# --- opaque access tokens, RFC 7662 introspection -------------------------------------------------------


@pytest.fixture
def introspection_secret() -> str:
    return secrets.token_urlsafe(32)


@pytest.fixture
def opaque_shape(shape: Callable[..., Any], introspection_secret: str) -> Iterator[Shape]:
    with shape(DEVIDP_ACCESS_TOKEN_FORMAT="opaque", extra_clients=(_introspection_client(introspection_secret),)) as s:
        yield s


def _introspecting(secret: str, **more: str) -> dict[str, str]:
    return {"OIDC_INTROSPECTION_CLIENT_ID": INTROSPECTION_CLIENT_ID, "OIDC_INTROSPECTION_CLIENT_SECRET": secret, **more}


async def test_an_opaque_access_token_is_introspected_and_its_sub_owns_the_cart(
    opaque_shape: Shape, introspection_secret: str, database: Database, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    username = _user()
    idp = opaque_shape.idp
    async with opaque_shape.app(**_introspecting(introspection_secret)) as app:
        await idp.reset_stats()
        signed_in = await sdk_sign_in_and_create_a_cart(app, username)
        token = signed_in.access_token
        # The same token again and again: one introspection answers all of them while it is cached.
        for _ in range(5):
            assert (await post_tools_list(app, token)).status_code == 200
        introspections = (await idp.stats())["introspection_requests"]

    assert not is_compact_jws(token)
    assert introspections == 1  # the SDK client's own calls and the five more
    written = Principal(issuer=idp.issuer, subject=username)
    assert await owner_of(database, signed_in.cart_id, written) == [written]
    assert token not in caplog.text


async def test_introspection_is_asked_once_for_concurrent_requests_and_again_after_the_cache_window(
    opaque_shape: Shape, introspection_secret: str
) -> None:
    idp = opaque_shape.idp
    async with opaque_shape.app(**_introspecting(introspection_secret, OIDC_INTROSPECTION_CACHE_SECONDS="0")) as app:
        signed_in = await sdk_sign_in_and_create_a_cart(app, _user())
        await idp.reset_stats()
        uncached = [await post_tools_list(app, signed_in.access_token) for _ in range(3)]
        uncached_count = (await idp.stats())["introspection_requests"]
    async with opaque_shape.app(**_introspecting(introspection_secret)) as app:
        await idp.reset_stats()
        concurrent = await asyncio.gather(*(post_tools_list(app, signed_in.access_token) for _ in range(8)))
        concurrent_count = (await idp.stats())["introspection_requests"]

    assert [r.status_code for r in uncached] == [200] * 3
    assert uncached_count == 3  # OIDC_INTROSPECTION_CACHE_SECONDS=0: every request asks
    assert [r.status_code for r in concurrent] == [200] * 8
    assert concurrent_count == 1  # eight requests at once share one introspection call


async def test_a_revoked_opaque_token_is_inactive_and_refused_with_401(
    opaque_shape: Shape, introspection_secret: str
) -> None:
    idp = opaque_shape.idp
    async with opaque_shape.app(**_introspecting(introspection_secret, OIDC_INTROSPECTION_CACHE_SECONDS="0")) as app:
        signed_in = await sdk_sign_in_and_create_a_cart(app, _user())
        before = await post_tools_list(app, signed_in.access_token)
        assert signed_in.storage.client_info is not None
        client_id = signed_in.storage.client_info.client_id
        revoked = await asyncio.to_thread(
            httpx2.post,
            f"{idp.base_url}/token/revocation",
            data={"token": signed_in.access_token, "client_id": client_id},
            timeout=10.0,
        )
        async with httpx2.AsyncClient(timeout=10.0) as http:
            answer = (
                await http.post(
                    f"{idp.base_url}/token/introspection",
                    data={"token": signed_in.access_token},
                    auth=(INTROSPECTION_CLIENT_ID, introspection_secret),
                )
            ).json()
        after = await post_tools_list(app, signed_in.access_token)

    assert before.status_code == 200
    assert revoked.status_code == 200, revoked.text
    assert answer == {"active": False}  # what the IdP says now
    assert after.status_code == 401
    assert 'error="invalid_token"' in after.headers["www-authenticate"]


async def test_an_introspection_endpoint_that_is_down_answers_503_retry_later_never_401_or_500(
    opaque_shape: Shape, introspection_secret: str
) -> None:
    idp = opaque_shape.idp
    nobody = f"http://127.0.0.1:{free_port()}/token/introspection"
    async with opaque_shape.app(**_introspecting(introspection_secret, OIDC_INTROSPECTION_CACHE_SECONDS="0")) as app:
        signed_in = await sdk_sign_in_and_create_a_cart(app, _user())
        await idp.set_introspection_fault("unavailable")
        try:
            failing = await post_tools_list(app, signed_in.access_token)
        finally:
            await idp.set_introspection_fault("ok")
        recovered = await post_tools_list(app, signed_in.access_token)
    async with opaque_shape.app(**_introspecting(introspection_secret, OIDC_INTROSPECTION_URL=nobody)) as app:
        unreachable = await post_tools_list(app, signed_in.access_token)

    for response in (failing, unreachable):
        assert response.status_code == 503, response.text
        assert response.json()["error"] == "temporarily_unavailable"
        assert response.headers["retry-after"] == "5"
        assert signed_in.access_token not in response.text
    assert "answered HTTP 503" in failing.json()["error_description"]
    assert "unreachable" in unreachable.json()["error_description"]
    assert recovered.status_code == 200


async def test_wrong_introspection_credentials_are_a_503_naming_the_server_side_problem(
    opaque_shape: Shape, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = secrets.token_urlsafe(32)
    async with opaque_shape.app(**_introspecting(wrong)) as app:
        response = await post_tools_list(app, "a" * 43)
    assert response.status_code == 503
    assert "refused this server's token introspection request" in response.json()["error_description"]
    assert "OIDC_INTROSPECTION_CLIENT_SECRET" in caplog.text
    assert wrong not in caplog.text


async def test_an_opaque_token_for_the_userinfo_endpoint_has_no_audience_and_is_refused(
    opaque_shape: Shape, introspection_secret: str, public_url: str, oauth_client_secrets: dict[str, str]
) -> None:
    idp = opaque_shape.idp
    # Coatcheck's own sign-in client asks for openid without a resource: an opaque token for /me only.
    redirect_uri = f"{public_url}/oauth/login/callback"
    pkce = Pkce.new()

    def sign_in_for_userinfo() -> str:
        with httpx2.Client(follow_redirects=False, timeout=10.0) as browser:
            returned = sign_in(
                idp,
                browser,
                client_id=LOGIN_CLIENT_ID,
                redirect_uri=redirect_uri,
                username=_user(),
                scope="openid",
                pkce=pkce,
                resource=None,
            )
        data = {"grant_type": "authorization_code", "code": returned["code"], "redirect_uri": redirect_uri}
        answer = token_request(
            idp, {**data, "code_verifier": pkce.verifier}, auth=(LOGIN_CLIENT_ID, oauth_client_secrets[LOGIN_CLIENT_ID])
        )
        assert answer.status_code == 200, answer.text
        return str(answer.json()["access_token"])

    userinfo_token = await asyncio.to_thread(sign_in_for_userinfo)
    async with httpx2.AsyncClient(timeout=10.0) as http:
        introspected = (
            await http.post(
                f"{idp.base_url}/token/introspection",
                data={"token": userinfo_token},
                auth=(INTROSPECTION_CLIENT_ID, introspection_secret),
            )
        ).json()
    async with opaque_shape.app(**_introspecting(introspection_secret)) as app:
        response = await post_tools_list(app, userinfo_token)

    assert introspected["active"] is True
    assert "aud" not in introspected
    assert response.status_code == 401


# --- pairwise subjects ----------------------------------------------------------------------------------


async def test_pairwise_subjects_name_the_principal_as_the_idp_wrote_them_not_the_username(
    shape: Callable[..., Any], database: Database
) -> None:
    username, salt = _user(), secrets.token_urlsafe(16)
    with shape(DEVIDP_SUBJECT_TYPE="pairwise", DEVIDP_PAIRWISE_SALT=salt) as s:
        async with s.app() as app:
            signed_in = await sdk_sign_in_and_create_a_cart(app, username)
        idp: DevIdP = s.idp

    pairwise = hashlib.sha256(f"{LOOPBACK_SECTOR}{username}{salt}".encode()).hexdigest()
    as_written = Principal(issuer=idp.issuer, subject=pairwise)
    by_username = Principal(issuer=idp.issuer, subject=username)
    assert await owner_of(database, signed_in.cart_id, as_written, by_username) == [as_written]


async def test_pairwise_subjects_through_introspection_name_the_same_principal(
    shape: Callable[..., Any], introspection_secret: str, database: Database
) -> None:
    username, salt = _user(), secrets.token_urlsafe(16)
    with shape(
        DEVIDP_SUBJECT_TYPE="pairwise",
        DEVIDP_PAIRWISE_SALT=salt,
        DEVIDP_ACCESS_TOKEN_FORMAT="opaque",
        extra_clients=(_introspection_client(introspection_secret),),
    ) as s:
        async with s.app(**_introspecting(introspection_secret)) as app:
            signed_in = await sdk_sign_in_and_create_a_cart(app, username)
        idp: DevIdP = s.idp

    assert not is_compact_jws(signed_in.access_token)
    # The introspection answer carries the subject of the token's client, not of the introspecting client.
    pairwise = hashlib.sha256(f"{LOOPBACK_SECTOR}{username}{salt}".encode()).hexdigest()
    as_written = Principal(issuer=idp.issuer, subject=pairwise)
    assert await owner_of(database, signed_in.cart_id, as_written) == [as_written]


# --- Entra v2's shape: the API's client ID as aud -------------------------------------------------------


async def test_an_extra_audience_admits_tokens_for_the_api_client_id_and_nothing_else(
    shape: Callable[..., Any],
) -> None:
    api_client_id = str(uuid.uuid4())
    with shape() as s:
        idp: DevIdP = s.idp
        for_api = await idp.token(_user(), resource=idp.resources[0], audience=api_client_id)
        for_other = await idp.token(_user(), resource=idp.resources[0], audience=str(uuid.uuid4()))
        async with s.app() as app:
            without_setting = await post_tools_list(app, for_api)
        entra_like = {"OIDC_EXTRA_AUDIENCES": f"{api_client_id}, api://coatcheck", "MCP_SCOPES": "api://coatcheck/mcp"}
        async with s.app(**entra_like) as app, app.http() as http:
            with_setting = await post_tools_list(app, for_api)
            other = await post_tools_list(app, for_other)
            metadata = (await http.get("/.well-known/oauth-protected-resource/mcp")).json()

    # Entra v2 issues a token for the API only when the client asks for the API's scope: the metadata says which.
    assert metadata["scopes_supported"] == ["api://coatcheck/mcp"]
    assert without_setting.status_code == 401
    assert with_setting.status_code == 200, with_setting.text
    assert other.status_code == 401


async def test_an_expired_opaque_token_stops_working_when_it_expires_even_inside_the_cache_window(
    shape: Callable[..., Any], introspection_secret: str
) -> None:
    with shape(
        DEVIDP_ACCESS_TOKEN_FORMAT="opaque",
        DEVIDP_ACCESS_TOKEN_TTL="3",
        extra_clients=(_introspection_client(introspection_secret),),
    ) as s:
        async with s.app(**_introspecting(introspection_secret), JWT_LEEWAY_SECONDS="0") as app:
            signed_in = await sdk_sign_in_and_create_a_cart(app, _user())
            fresh = await post_tools_list(app, signed_in.access_token)
            assert signed_in.storage.tokens is not None
            assert signed_in.storage.tokens.expires_in is not None
            expires_at = time.time() + signed_in.storage.tokens.expires_in

            async def token_has_expired() -> bool:
                return time.time() > expires_at + 1

            await eventually(token_has_expired, within=10, what="the opaque token's exp")
            expired = await post_tools_list(app, signed_in.access_token)

    assert fresh.status_code == 200

    assert expired.status_code == 401
