"""Bearer-token verification as an OAuth 2.1 resource server.

Access tokens are JWTs (RS256 or ES256) from ``OIDC_ISSUER``, checked against the
issuer's JWKS (cached; refetched when an unknown ``kid`` appears, at most once per
``refetch_interval``), with ``iss`` equal to the issuer, an audience containing the
MCP resource URL (RFC 8707), and ``exp``/``nbf`` within a small leeway. The principal
is (issuer, subject); nothing else in the token or the request is identity.
"""

import asyncio
import hashlib
import logging
import math
import time
from collections import OrderedDict
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx2
import jwt
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken

from store.principal import Principal

logger = logging.getLogger(__name__)

ALGORITHMS = ("RS256", "ES256")
DEFAULT_REFETCH_INTERVAL = 10.0


def canonical_resource(url: str) -> str:
    """Compare resource URIs case-insensitively in scheme and host, ignoring a trailing slash."""
    parts = urlsplit(url.strip())
    netloc = parts.netloc.lower()
    return urlunsplit((parts.scheme.lower(), netloc, parts.path.rstrip("/"), parts.query, ""))


class IssuerUnavailable(Exception):  # noqa: N818 - reads as a state
    """The issuer's metadata could not be fetched or names another issuer; the message is a short reason."""


class IssuerMetadata:
    """The authorization server at ``OIDC_ISSUER`` as this process reaches it.

    Its metadata is fetched once (a failure is not cached). URLs are mapped between the public base, which
    browsers and token claims use, and an optional internal base for server-to-server calls (containers that
    cannot reach the public URL). An IdP that builds its metadata from the request's Host names the internal
    base when asked through it, so browser-facing URLs are mapped back.
    """

    def __init__(self, issuer: str, http: httpx2.AsyncClient, internal_url: str | None = None) -> None:
        self.issuer = issuer
        self._base = internal_url or issuer
        self._http = http
        self._document: dict[str, Any] | None = None
        self._lock = asyncio.Lock()

    def server_facing(self, url: str) -> str:
        """``url`` with the public base swapped for the internal one."""
        return self._base + url[len(self.issuer) :] if url.startswith(self.issuer + "/") else url

    def browser_facing(self, url: str) -> str:
        """``url`` with the internal base swapped for the public one."""
        return self.issuer + url[len(self._base) :] if url.startswith(self._base + "/") else url

    async def document(self) -> dict[str, Any]:
        """The issuer's metadata (OpenID discovery, else RFC 8414).

        Raises:
            IssuerUnavailable: it could not be fetched, or it names another issuer.
        """
        if self._document is not None:
            return self._document
        async with self._lock:
            if self._document is None:
                self._document = await self._fetch()
        return self._document

    async def _fetch(self) -> dict[str, Any]:
        for suffix in ("/.well-known/openid-configuration", "/.well-known/oauth-authorization-server"):
            try:
                response = await self._http.get(self._base + suffix)
                document = response.json() if response.status_code == 200 else None
            except (httpx2.HTTPError, ValueError) as exc:
                raise IssuerUnavailable(f"issuer metadata unavailable ({type(exc).__name__})") from None
            if isinstance(document, dict):
                if document.get("issuer") != self.issuer:
                    raise IssuerUnavailable("issuer metadata names another issuer")
                return document
        raise IssuerUnavailable("issuer metadata not found")


class JwksCache:
    """The issuer's signing keys, discovered through its metadata and cached in memory."""

    def __init__(
        self,
        issuer: IssuerMetadata,
        http: httpx2.AsyncClient,
        ttl: float,
        refetch_interval: float = DEFAULT_REFETCH_INTERVAL,
    ) -> None:
        self._issuer = issuer
        self._refetch_interval = refetch_interval
        self._http = http
        self._ttl = ttl
        self._keys: dict[str, jwt.PyJWK] = {}
        self._fetched_at = -math.inf  # never fetched
        self._jwks_uri: str | None = None
        self._lock = asyncio.Lock()

    async def key(self, kid: str) -> jwt.PyJWK | None:
        """The key with ``kid``, refreshing the cache when stale or when the kid is new."""
        now = time.monotonic()
        stale = now - self._fetched_at > self._ttl
        if stale or (kid not in self._keys and now - self._fetched_at > self._refetch_interval):
            await self._refresh(since=now)
        return self._keys.get(kid)

    async def _refresh(self, since: float) -> None:
        async with self._lock:
            if self._fetched_at > since:
                return  # another task refreshed while we waited for the lock
            try:
                if self._jwks_uri is None:
                    self._jwks_uri = self._issuer.server_facing(str((await self._issuer.document())["jwks_uri"]))
                response = await self._http.get(self._jwks_uri)
                response.raise_for_status()
                keys: dict[str, jwt.PyJWK] = {}
                for jwk in response.json().get("keys", []):
                    if jwk.get("use", "sig") != "sig" or "kid" not in jwk:
                        continue
                    try:
                        keys[jwk["kid"]] = jwt.PyJWK(jwk)
                    except jwt.PyJWKError:
                        continue  # an algorithm we do not use
                self._keys = keys
            except (httpx2.HTTPError, ValueError, KeyError, IssuerUnavailable) as exc:
                logger.warning("could not fetch the issuer's JWKS: %s", type(exc).__name__)
            finally:
                # Even a failed fetch counts, so a flood of bad kids cannot hammer the issuer.
                self._fetched_at = time.monotonic()


class JwtVerifier:
    """An ``mcp`` ``TokenVerifier`` for JWT access tokens issued for this server.

    A client sends the same token on every call for up to an hour, so verified tokens are kept in a
    small in-memory cache keyed by their SHA-256 digest; a hit still honours ``exp`` and ``nbf``.
    """

    def __init__(self, *, issuer: str, resource: str, jwks: JwksCache, leeway: int, cache_size: int = 4096) -> None:
        self._issuer = issuer
        self._resource = canonical_resource(resource)
        self._jwks = jwks
        self._leeway = leeway
        self._cache: OrderedDict[bytes, tuple[AccessToken, float]] = OrderedDict()
        self._cache_size = cache_size

    async def verify_token(self, token: str) -> AccessToken | None:
        """Return the verified token, or ``None`` for anything that is not a valid token for us."""
        digest = hashlib.sha256(token.encode()).digest()
        cached = self._cache.get(digest)
        if cached is not None:
            verified, not_before = cached
            if time.time() >= not_before and (verified.expires_at or 0) >= time.time():
                self._cache.move_to_end(digest)
                return verified
            del self._cache[digest]
        verified_now = await self._verify(token)
        if verified_now is not None:
            access, not_before = verified_now
            self._cache[digest] = verified_now
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
            if time.time() >= not_before:
                return access
        return None

    async def _verify(self, token: str) -> tuple[AccessToken, float] | None:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            return None
        kid = header.get("kid")
        if header.get("alg") not in ALGORITHMS or not isinstance(kid, str):
            return None
        key = await self._jwks.key(kid)
        if key is None:
            return None
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key=key,
                algorithms=list(ALGORITHMS),
                issuer=self._issuer,
                leeway=self._leeway,
                options={"require": ["exp", "iss", "sub", "aud"], "verify_aud": False},
            )
        except jwt.InvalidTokenError as exc:
            logger.info("rejected bearer token: %s", type(exc).__name__)
            return None
        audiences = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
        if not any(isinstance(a, str) and canonical_resource(a) == self._resource for a in audiences):
            logger.info("rejected bearer token: audience is not this server")
            return None
        subject = claims["sub"]
        if not isinstance(subject, str) or not subject:
            return None
        scope = claims.get("scope", "")
        not_before = float(claims.get("nbf", 0)) - self._leeway
        access = AccessToken(
            token=token,
            client_id=str(claims.get("client_id") or claims.get("azp") or ""),
            scopes=scope.split() if isinstance(scope, str) else [],
            expires_at=int(claims["exp"]) + self._leeway,
            resource=self._resource,
            subject=subject,
            claims={"iss": claims["iss"]},
        )
        return access, not_before


def current_principal() -> Principal:
    """The principal of the request being handled (set by the SDK's auth middleware).

    Raises:
        LookupError: outside an authenticated request, which is a wiring bug.
    """
    token = get_access_token()
    if token is None or not token.subject or not token.claims or "iss" not in token.claims:
        raise LookupError("no authenticated principal for this request")
    return Principal(issuer=str(token.claims["iss"]), subject=token.subject)
