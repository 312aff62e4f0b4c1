"""The parts of connections that need no server: provider configuration, sealed cookies, ID-token checks,
access-log redaction."""

import json
import logging
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from joserfc.jwk import JWKRegistry, Key

from api.jose import IssuerMetadata, JwtRejected
from api.logs import RedactQueryStrings
from api.oauth.client import ClientCredentials, OAuthClient
from api.oauth.login import LoginFailed, OidcLogin
from api.oauth.providers import ProviderRegistry
from api.oauth.session import COOKIE_PURPOSE, LOGIN, SESSION, BrowserSession, CookieJar, LoginInProgress
from api.provider_config import ProviderConfig, ProviderConfigError, load_providers, parse_providers
from api.settings import Settings, SettingsError
from store.crypto import DecryptError, TokenCipher
from store.principal import Principal
from tests.support.jose import public_jwk, sign_jwt, signing_key, unsigned_jwt
from tests.support.json_server import serve_json

DEMO_TOML = """
[demo]
display_name = "Demo provider"
authorization_endpoint = "http://localhost:9400/auth"
token_endpoint = "http://idp:9400/token"
userinfo_endpoint = "http://idp:9400/me"
revocation_endpoint = "http://idp:9400/token/revocation"
client_id = "coatcheck-demo"
client_secret_env = "DEMO_CLIENT_SECRET"
scopes = ["openid", "profile"]
"""


# -- providers ----------------------------------------------------------------------------------------------


def test_a_toml_provider_file_is_read_and_its_secret_comes_from_the_named_variable(tmp_path: Path) -> None:
    path = tmp_path / "providers.toml"
    path.write_text(DEMO_TOML)
    (demo,) = load_providers(
        providers_file=str(path), providers_json=None, environ={"DEMO_CLIENT_SECRET": "s3cr3t-value"}
    )
    assert demo.name == "demo"
    assert demo.label == "Demo provider"
    assert demo.authorization_endpoint == "http://localhost:9400/auth"
    assert demo.token_endpoint == "http://idp:9400/token"
    assert demo.scopes == ("openid", "profile")
    assert demo.client_secret is not None
    assert demo.client_secret.get_secret_value() == "s3cr3t-value"
    assert "s3cr3t-value" not in repr(demo)


def test_providers_json_with_an_issuer_is_enough_and_no_configuration_means_no_providers() -> None:
    document = {"demo": {"issuer": "http://localhost:9400/", "client_id": "c", "client_secret_env": "X"}}
    (demo,) = load_providers(providers_file=None, providers_json=json.dumps(document), environ={"X": "y"})
    assert demo.issuer == "http://localhost:9400"
    assert load_providers(providers_file=None, providers_json=None, environ={}) == ()


@pytest.mark.parametrize(
    ("document", "complaint"),
    [
        ({"demo": {"issuer": "http://i", "client_id": "c", "client_secret_env": "MISSING"}}, "MISSING"),
        ({"demo": {"issuer": "http://i", "client_id": "c", "client_secret": "inline"}}, "client_secret_env"),
        ({"demo": {"client_id": "c", "client_secret_env": "X"}}, "set issuer"),
        ({"Bad Name": {"issuer": "http://i", "client_id": "c", "client_secret_env": "X"}}, "provider name"),
        ({"demo": {"issuer": "ftp://i", "client_id": "c", "client_secret_env": "X"}}, "http(s) URL"),
        ({"demo": {"issuer": "http://i", "client_id": "c", "client_secret_env": "X", "colour": 1}}, "colour"),
        ({"demo": {"issuer": "http://i", "client_id": "c", "authorization_params": {"state": "x"}}}, "state"),
    ],
)
def test_an_unusable_provider_configuration_is_refused_naming_the_problem_not_a_secret(
    document: dict[str, Any], complaint: str
) -> None:
    with pytest.raises(ProviderConfigError) as caught:
        load_providers(providers_file=None, providers_json=json.dumps(document), environ={"X": "secret-value-xyz"})
    assert complaint in str(caught.value)
    assert "secret-value-xyz" not in str(caught.value)
    assert "inline" not in str(caught.value)


def test_start_up_fails_naming_providers_when_a_provider_secret_is_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)  # no stray .env file
    monkeypatch.delenv("DEMO_CLIENT_SECRET", raising=False)
    required = {
        "database_url": "postgresql://u@db/c",
        "public_url": "http://localhost:8000",
        "oidc_issuer": "http://localhost:9400",
        "request_state_keys": secrets.token_urlsafe(32),
        "token_encryption_keys": secrets.token_urlsafe(32),
        "oidc_client_id": "coatcheck-login",
        "oidc_client_secret": "x",
    }
    for name in [*required, "providers", "providers_file"]:
        monkeypatch.delenv(name.upper(), raising=False)
    path = tmp_path / "providers.toml"
    path.write_text(DEMO_TOML)
    with pytest.raises(SettingsError) as caught:
        Settings.from_env(**required, providers_file=str(path))
    assert "PROVIDERS_FILE" in str(caught.value)
    assert "DEMO_CLIENT_SECRET" in str(caught.value)


def test_a_weak_token_encryption_key_stops_start_up_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SettingsError, match="TOKEN_ENCRYPTION_KEYS: key #1 is shorter than 32 bytes"):
        Settings.from_env(
            database_url="postgresql://u@db/c",
            public_url="http://localhost:8000",
            oidc_issuer="http://localhost:9400",
            request_state_keys=secrets.token_urlsafe(32),
            token_encryption_keys="short",
            oidc_client_id="c",
            oidc_client_secret="s",
        )


# -- cookies -------------------------------------------------------------------------------------------------


def _jar(*keys: bytes, secure: bool = False, seconds: int = 60) -> CookieJar:
    return CookieJar(list(keys), secure=secure, session_seconds=seconds, login_seconds=seconds)


def test_a_session_cookie_round_trips_and_cannot_be_read_or_altered() -> None:
    key = secrets.token_bytes(32)
    jar = _jar(key)
    cookie = jar.session_cookie(BrowserSession(issuer="https://idp", subject="alice", session_id="s-1"))
    assert cookie.value is not None
    assert "alice" not in cookie.value
    assert jar.read_session({cookie.key: cookie.value}) == BrowserSession(
        issuer="https://idp", subject="alice", session_id="s-1"
    )
    flipped = cookie.value[:-3] + ("A" if cookie.value[-3] != "A" else "B") + cookie.value[-2:]
    assert jar.read_session({cookie.key: flipped}) is None
    assert _jar(secrets.token_bytes(32)).read_session({cookie.key: cookie.value}) is None


def test_a_session_cookie_is_sealed_by_the_vault_primitive_under_its_own_label() -> None:
    ring = [secrets.token_bytes(32)]
    cookie = _jar(*ring).session_cookie(BrowserSession("https://idp", "alice", "s-1"))
    assert cookie.value is not None
    assert cookie.value.startswith(TokenCipher(ring, purpose=COOKIE_PURPOSE).current_prefix)
    with pytest.raises(DecryptError):
        TokenCipher(ring).decrypt(cookie.value, aad=cookie.key.encode())


def test_a_login_cookie_is_not_a_session_cookie_and_both_expire() -> None:
    jar = _jar(secrets.token_bytes(32))
    login = jar.login_cookie(LoginInProgress(state="s", nonce="n", code_verifier="v", flow="flow_x"))
    assert login.value is not None
    assert jar.read_session({jar.name(SESSION): login.value}) is None
    assert jar.read_login({jar.name(LOGIN): login.value}) == LoginInProgress("s", "n", "v", "flow_x")
    expired = _jar(b"k" * 32, seconds=-1)
    stale = expired.session_cookie(BrowserSession("https://idp", "alice", "s-1"))
    assert stale.value is not None
    assert expired.read_session({stale.key: stale.value}) is None


def test_cookies_sealed_under_an_older_ring_key_still_open_after_rotation() -> None:
    old, new = secrets.token_bytes(32), secrets.token_bytes(32)
    cookie = _jar(old).session_cookie(BrowserSession("https://idp", "alice", "s-1"))
    assert cookie.value is not None
    assert _jar(new, old).read_session({cookie.key: cookie.value}) == BrowserSession("https://idp", "alice", "s-1")


def test_on_https_cookies_are_host_prefixed_and_secure() -> None:
    cookie = _jar(secrets.token_bytes(32), secure=True).session_cookie(BrowserSession("https://idp", "alice", "s-1"))
    assert cookie.key == "__Host-coatcheck-session"
    assert cookie.secure
    assert cookie.httponly
    assert cookie.samesite == "lax"
    assert cookie.path == "/"
    assert cookie.domain is None


# -- ID token ------------------------------------------------------------------------------------------------


class _Keys:
    def __init__(self) -> None:
        self.private = signing_key("k1", "RS256")
        self.jwk = JWKRegistry.import_key(public_jwk(self.private))

    async def key(self, kid: str) -> Key | None:
        return self.jwk if kid == "k1" else None

    def sign(self, claims: dict[str, Any], kid: str = "k1") -> str:
        return sign_jwt(claims, self.private, kid=kid)


def _login(keys: _Keys) -> OidcLogin:
    return OidcLogin(
        issuer=IssuerMetadata("https://idp.test", http=None),  # type: ignore[arg-type]  # never fetched here
        client_id="coatcheck-login",
        client=OAuthClient(ClientCredentials("coatcheck-login", "x")),
        jwks=keys,  # type: ignore[arg-type]
        redirect_uri="https://coatcheck.test/oauth/login/callback",
        leeway=0,
    )


def _claims(**overrides: Any) -> dict[str, Any]:
    now = int(time.time())
    claims = {"iss": "https://idp.test", "sub": "alice", "aud": "coatcheck-login", "iat": now, "exp": now + 60}
    return {**claims, "nonce": "n-1", **overrides}


async def test_a_valid_id_token_names_the_issuer_and_subject() -> None:
    keys = _Keys()
    session = await _login(keys).verify_id_token(keys.sign(_claims()), nonce="n-1")
    assert session == Principal(issuer="https://idp.test", subject="alice")


@pytest.mark.parametrize(
    ("overrides", "kid", "reason"),
    [
        ({"nonce": "n-2"}, "k1", "nonce"),
        ({"aud": "someone-else"}, "k1", r"rejected \(invalid aud\)"),
        ({"iss": "https://evil.test"}, "k1", r"rejected \(invalid iss\)"),
        ({"exp": int(time.time()) - 10}, "k1", r"rejected \(expired\)"),
        ({"sub": ""}, "k1", r"rejected \(invalid sub\)"),
        ({"aud": ["coatcheck-login", "other"], "azp": "other"}, "k1", "authorized party"),
        ({}, "unknown", "unknown key"),
    ],
)
async def test_an_id_token_for_another_login_client_or_issuer_is_refused(
    overrides: dict[str, Any], kid: str, reason: str
) -> None:
    keys = _Keys()
    with pytest.raises(LoginFailed, match=reason):
        await _login(keys).verify_id_token(keys.sign(_claims(**overrides), kid=kid), nonce="n-1")


async def test_an_unsigned_id_token_is_refused() -> None:
    unsigned = unsigned_jwt(_claims(), kid="k1")
    with pytest.raises(LoginFailed, match="unexpected algorithm"):
        await _login(_Keys()).verify_id_token(unsigned, nonce="n-1")


# -- provider ID tokens -------------------------------------------------------------------------------------


@pytest.fixture
def jwks_server() -> Iterator[tuple[str, _Keys]]:
    """A real HTTP server publishing one provider signing key at /jwks."""
    keys = _Keys()
    published = {"keys": [keys.jwk.as_dict(private=False)]}
    with serve_json(lambda _, path: published if path == "/jwks" else None) as base:
        yield f"{base}/jwks", keys


def _provider(**extra: Any) -> ProviderConfig:
    (provider,) = parse_providers(
        {
            "demo": {
                "issuer": "https://idp.test",
                "authorization_endpoint": "https://idp.test/auth",
                "token_endpoint": "https://idp.test/token",
                "userinfo_endpoint": "https://idp.test/me",
                "client_id": "coatcheck-login",
                "token_endpoint_auth_method": "none",
                "scopes": ["openid"],
                **extra,
            }
        },
        environ={},
    )
    return provider


async def test_a_provider_id_token_signed_by_its_published_key_is_accepted(jwks_server: tuple[str, _Keys]) -> None:
    uri, keys = jwks_server
    async with httpx2.AsyncClient() as http:
        registry = ProviderRegistry(providers=(), http=http, leeway=0)
        claims = await registry.verify_id_token(
            _provider(jwks_uri=uri), keys.sign(_claims()), nonce="n-1", access_token=None
        )
    assert claims["sub"] == "alice"


async def test_a_provider_id_token_with_a_bad_signature_is_refused(jwks_server: tuple[str, _Keys]) -> None:
    uri, _ = jwks_server
    forger = _Keys()  # another private key, claiming the published kid
    async with httpx2.AsyncClient() as http:
        registry = ProviderRegistry(providers=(), http=http, leeway=0)
        with pytest.raises(JwtRejected, match="bad_signature") as refused:
            await registry.verify_id_token(
                _provider(jwks_uri=uri), forger.sign(_claims()), nonce="n-1", access_token=None
            )
    assert refused.value.claim is None


@pytest.mark.parametrize(
    ("overrides", "claim"),
    [({"nonce": "n-2"}, "nonce"), ({"aud": "someone-else"}, "aud"), ({"iss": "https://evil.test"}, "iss")],
)
async def test_a_provider_id_token_for_another_request_is_refused_even_without_a_jwks(
    overrides: dict[str, Any], claim: str
) -> None:
    async with httpx2.AsyncClient() as http:
        registry = ProviderRegistry(providers=(), http=http, leeway=0)
        with pytest.raises(JwtRejected) as refused:
            await registry.verify_id_token(
                _provider(), _Keys().sign(_claims(**overrides)), nonce="n-1", access_token=None
            )
    assert refused.value.claim == claim


async def test_a_provider_id_token_whose_alg_is_not_a_name_is_refused_as_malformed_without_a_jwks() -> None:
    # Without a JWKS nothing checks the signature, but authlib's at_hash rule reads the alg as a string.
    token = unsigned_jwt({**_claims(), "at_hash": "not-checked"}, alg=5)
    async with httpx2.AsyncClient() as http:
        registry = ProviderRegistry(providers=(), http=http, leeway=0)
        with pytest.raises(JwtRejected, match="malformed"):
            await registry.verify_id_token(_provider(), token, nonce="n-1", access_token="an-access-token")


# -- logs ----------------------------------------------------------------------------------------------------


def test_access_log_lines_lose_their_query_whatever_the_path() -> None:
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:1", "GET", "/oauth/callback?code=SECRET&state=S", "1.1", 200),
        None,
    )
    assert RedactQueryStrings().filter(record)
    assert "SECRET" not in record.getMessage()
    assert "/oauth/callback?[redacted]" in record.getMessage()
    other = logging.LogRecord(
        "uvicorn.access", logging.INFO, __file__, 1, "%s %s %s", ("a", "GET", "/healthz?access_token=T"), None
    )
    RedactQueryStrings().filter(other)
    assert other.getMessage() == "a GET /healthz?[redacted]"
