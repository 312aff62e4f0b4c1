"""The verifier follows the issuer's key rotation: unknown kids trigger a (rate-limited) JWKS refetch.

A real HTTP server plays the issuer's metadata and JWKS endpoints, so the cache is exercised over the wire.
"""

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx2
import pytest
from joserfc.jwk import ECKey, RSAKey

from api.auth import JwtVerifier
from api.jose import DEFAULT_REFETCH_INTERVAL, IssuerMetadata, JwksCache
from tests.support.jose import public_jwk, sign_jwt, signing_key
from tests.support.json_server import serve_json

pytestmark = pytest.mark.resource_server_only(reason="the JWKS cache of an upstream's keys")


RESOURCE = "https://coatcheck.test/mcp"


@dataclass
class FakeIssuer:
    """Serves discovery and a JWKS that a test can swap; counts JWKS fetches."""

    url: str
    keys: list[dict[str, Any]] = field(default_factory=list)
    jwks_fetches: int = 0


@pytest.fixture
def issuer() -> Iterator[FakeIssuer]:
    state = FakeIssuer(url="")

    def answer(base: str, path: str) -> dict[str, Any] | None:
        if path == "/.well-known/openid-configuration":
            return {"issuer": base, "jwks_uri": f"{base}/jwks"}
        if path == "/jwks":
            state.jwks_fetches += 1
            return {"keys": state.keys}
        return None

    with serve_json(answer) as base:
        state.url = base
        yield state


def _key(kid: str, alg: str) -> tuple[RSAKey | ECKey, dict[str, Any]]:
    private = signing_key(kid, alg)
    return private, public_jwk(private)


def _token(private: RSAKey | ECKey, kid: str, issuer: str, **claims: Any) -> str:
    """A token signed with ``private`` under its own alg, its header naming ``kid``."""
    now = int(time.time())
    payload = {"iss": issuer, "sub": "alice", "aud": RESOURCE, "exp": now + 300, "iat": now, **claims}
    return sign_jwt(payload, private, kid=kid)


def _verifier(
    issuer: FakeIssuer, http: httpx2.AsyncClient, refetch_interval: float = DEFAULT_REFETCH_INTERVAL
) -> JwtVerifier:
    """A verifier for ``issuer`` without leeway, its JWKS cached for an hour."""
    jwks = JwksCache(IssuerMetadata(issuer.url, http), http, ttl=3600, refetch_interval=refetch_interval)
    return JwtVerifier(issuer=issuer.url, resource=RESOURCE, jwks=jwks, leeway=0)


async def test_a_token_signed_with_a_newly_published_key_is_accepted_after_one_refetch(issuer: FakeIssuer) -> None:
    old_private, old_public = _key("k1", "RS256")
    new_private, new_public = _key("k2", "ES256")
    issuer.keys = [old_public]
    async with httpx2.AsyncClient() as http:
        verifier = _verifier(issuer, http, refetch_interval=0.0)
        assert await verifier.verify_token(_token(old_private, "k1", issuer.url)) is not None
        assert issuer.jwks_fetches == 1

        issuer.keys = [old_public, new_public]  # the issuer rotates in a new key
        accepted = await verifier.verify_token(_token(new_private, "k2", issuer.url))
        assert accepted is not None
        assert accepted.subject == "alice"
        assert issuer.jwks_fetches == 2


async def test_a_flood_of_unknown_kids_fetches_the_jwks_at_most_once_per_interval(issuer: FakeIssuer) -> None:
    private, public = _key("k1", "RS256")
    issuer.keys = [public]
    async with httpx2.AsyncClient() as http:
        verifier = _verifier(issuer, http, refetch_interval=3600)
        assert await verifier.verify_token(_token(private, "k1", issuer.url)) is not None
        for n in range(20):
            assert await verifier.verify_token(_token(private, f"unknown-{n}", issuer.url)) is None
    assert issuer.jwks_fetches == 1


async def test_tokens_from_another_issuer_or_for_another_audience_are_rejected(issuer: FakeIssuer) -> None:
    private, public = _key("k1", "RS256")
    issuer.keys = [public]
    async with httpx2.AsyncClient() as http:
        verifier = _verifier(issuer, http)
        assert await verifier.verify_token(_token(private, "k1", "https://other.test")) is None
        assert await verifier.verify_token(_token(private, "k1", issuer.url, aud="https://x.test/mcp")) is None
        assert await verifier.verify_token(_token(private, "k1", issuer.url, sub="")) is None
        # RFC 8707 resource comparison ignores the case of scheme and host and a trailing slash.
        same = _token(private, "k1", issuer.url, aud=["https://other.test", "HTTPS://Coatcheck.TEST/mcp/"])
        assert await verifier.verify_token(same) is not None
