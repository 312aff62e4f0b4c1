"""OpenID/OAuth discovery and JWT verification, on one JOSE library: joserfc (which authlib is built on).

Everything that reads an issuer's metadata or checks a signed token goes through here: the MCP access-token
verifier (:mod:`api.auth`), the /connect browser login (:mod:`api.oauth.login`) and the third-party providers
(:mod:`api.oauth.providers`). The pieces:

* :class:`IssuerMetadata` fetches an issuer's metadata once (OpenID discovery, else RFC 8414) and refuses a
  document that names another issuer.
* :class:`JwksCache` holds the issuer's signing keys, refetched when stale or when an unknown ``kid`` appears
  (at most once per ``refetch_interval``, so a flood of bad kids cannot hammer the issuer).
* :func:`verify_signature` does the header checks (``alg`` in :data:`ALGORITHMS`, a ``kid``) and the
  signature check against that cache; callers validate the claims they care about.
* :func:`verify_id_token` is authlib's OpenID Connect ID-token validation (``CodeIDToken``: essential claims,
  ``iss``, ``aud``, ``azp``, ``nonce``, ``at_hash``, lifetime) over a verified signature.

Failures raise :class:`JwtRejected` whose message is a short reason (which check failed), never the token.
"""

import asyncio
import base64
import json
import logging
import math
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import httpx2
from authlib.oidc.core import CodeIDToken  # type: ignore[import-untyped]
from joserfc import jwt
from joserfc.errors import ClaimError, ExpiredTokenError, JoseError, MissingClaimError
from joserfc.jwk import JWKRegistry, Key
from joserfc.jws import JWSRegistry, extract_compact

logger = logging.getLogger(__name__)

ALGORITHMS = ("RS256", "ES256")
DEFAULT_REFETCH_INTERVAL = 10.0
# Unregistered header parameters are tolerated, as authlib does for ID tokens: providers add their own.
_REGISTRY = JWSRegistry(algorithms=list(ALGORITHMS), strict_check_header=False)


class IssuerUnavailable(Exception):  # noqa: N818 - reads as a state
    """The issuer's metadata could not be fetched or names another issuer; the message is a short reason.

    ``unreachable`` tells a network failure (worth retrying) from a server that answered with nothing usable.
    """

    def __init__(self, reason: str, *, unreachable: bool = False) -> None:
        super().__init__(reason)
        self.unreachable = unreachable


def metadata_urls(issuer: str) -> tuple[str, str]:
    """Where an issuer's metadata lives: OpenID discovery first, then RFC 8414.

    OpenID Connect Discovery §4 appends ``/.well-known/openid-configuration`` to the issuer with any trailing
    slash removed; RFC 8414 §3.1 inserts ``/.well-known/oauth-authorization-server`` between the host and the
    issuer's path (its terminating slash removed). So ``https://tenant.auth0.com/`` and
    ``https://tenant.auth0.com`` share both documents, and ``https://sso.example.com/realms/x`` has them at
    ``…/realms/x/.well-known/openid-configuration`` and ``…/.well-known/oauth-authorization-server/realms/x``.
    """
    parts = urlsplit(issuer)
    path = parts.path.rstrip("/")
    origin = f"{parts.scheme}://{parts.netloc}"
    return (
        f"{origin}{path}/.well-known/openid-configuration",
        f"{origin}/.well-known/oauth-authorization-server{path}",
    )


class IssuerMetadata:
    """An authorization server's metadata as this process reaches it.

    Its metadata is fetched once (a failure is not cached). The document's ``issuer`` must equal ``issuer``
    exactly (RFC 8414 §3.3, OIDC Discovery §4.3), a trailing slash included, unless ``slash_insensitive`` (the
    third-party providers' configuration, which drops it, asks for that).

    URLs are mapped between the public base, which browsers and token claims use, and an optional internal
    base for server-to-server calls (containers that cannot reach the public URL). An IdP that builds its
    metadata from the request's Host names the internal base when asked through it, so browser-facing URLs
    are mapped back.
    """

    def __init__(
        self, issuer: str, http: httpx2.AsyncClient, internal_url: str | None = None, *, slash_insensitive: bool = False
    ) -> None:
        self.issuer = issuer
        # URL mapping works on the bases without a trailing slash: "https://t.auth0.com/" maps like its origin.
        self._public = issuer.rstrip("/")
        self._base = (internal_url or issuer).rstrip("/")
        self._fetch_from = internal_url or issuer
        self._http = http
        self._slash_insensitive = slash_insensitive
        self._document: dict[str, Any] | None = None
        self._lock = asyncio.Lock()

    def server_facing(self, url: str) -> str:
        """``url`` with the public base swapped for the internal one."""
        return self._base + url[len(self._public) :] if url.startswith(self._public + "/") else url

    def browser_facing(self, url: str) -> str:
        """``url`` with the internal base swapped for the public one."""
        return self._public + url[len(self._base) :] if url.startswith(self._base + "/") else url

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

    def _names_this_issuer(self, named: str) -> bool:
        if self._slash_insensitive:
            return named.rstrip("/") == self.issuer.rstrip("/")
        return named == self.issuer

    async def _fetch(self) -> dict[str, Any]:
        for url in metadata_urls(self._fetch_from):
            try:
                response = await self._http.get(url)
            except httpx2.HTTPError as exc:
                raise IssuerUnavailable(
                    f"issuer metadata unavailable ({type(exc).__name__})", unreachable=True
                ) from None
            if response.status_code != 200:
                continue
            try:
                document = response.json()
            except ValueError:
                continue
            if isinstance(document, dict):
                named = str(document.get("issuer", ""))
                if not self._names_this_issuer(named):
                    if named.rstrip("/") == self.issuer.rstrip("/"):
                        # The commonest mistake, worth its own message: the slash is part of the issuer.
                        raise IssuerUnavailable(
                            f"issuer metadata names the issuer {named!r}, not {self.issuer!r}: issuers compare "
                            "exactly, so write the trailing slash as the identity provider does"
                        )
                    raise IssuerUnavailable("issuer metadata names another issuer")
                return document
        raise IssuerUnavailable("issuer metadata not found")


class JwksCache:
    """An issuer's signing keys, from ``jwks_uri`` (else the one its metadata names), cached in memory."""

    def __init__(
        self,
        issuer: IssuerMetadata | None,
        http: httpx2.AsyncClient,
        ttl: float,
        refetch_interval: float = DEFAULT_REFETCH_INTERVAL,
        jwks_uri: str | None = None,
    ) -> None:
        if issuer is None and jwks_uri is None:
            raise ValueError("a JWKS cache needs an issuer to discover its keys from, or a jwks_uri")
        self._issuer = issuer
        self._refetch_interval = refetch_interval
        self._http = http
        self._ttl = ttl
        self._keys: dict[str, Key] = {}
        self._fetched_at = -math.inf  # never fetched
        self._jwks_uri = jwks_uri
        self._lock = asyncio.Lock()

    async def key(self, kid: str) -> Key | None:
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
                if self._jwks_uri is None and self._issuer is not None:
                    self._jwks_uri = self._issuer.server_facing(str((await self._issuer.document())["jwks_uri"]))
                response = await self._http.get(str(self._jwks_uri))
                response.raise_for_status()
                keys: dict[str, Key] = {}
                for jwk in response.json().get("keys", []):
                    if jwk.get("use", "sig") != "sig" or not isinstance(jwk.get("kid"), str):
                        continue
                    try:
                        keys[jwk["kid"]] = JWKRegistry.import_key(jwk)
                    except (JoseError, ValueError, TypeError):
                        continue  # a key type we do not use
                self._keys = keys
            except IssuerUnavailable as exc:  # its message is a reason worth reading (no secrets in it)
                logger.warning("could not fetch the issuer's JWKS: %s", exc)
            except (httpx2.HTTPError, ValueError, KeyError, AttributeError) as exc:
                logger.warning("could not fetch the issuer's JWKS: %s", type(exc).__name__)
            finally:
                # Even a failed fetch counts, so a flood of bad kids cannot hammer the issuer.
                self._fetched_at = time.monotonic()


class JwtRejected(Exception):  # noqa: N818 - a verdict
    """A token failed a check; the message names the check (for logs and login errors), never the token.

    ``claim`` names the claim that failed, or is ``None`` when the token itself (format, key, signature) did.
    """

    def __init__(self, reason: str, *, claim: str | None = None) -> None:
        super().__init__(reason)
        self.claim = claim


def is_compact_jws(token: str) -> bool:
    """Whether ``token`` has the shape of a compact JWS (three base64url parts, a JSON object header).

    Tells a JWT access token (verified here) from an opaque one (introspected); says nothing of its validity.
    """
    if token.count(".") != 2:
        return False
    try:
        header = json.loads(base64.urlsafe_b64decode(token.split(".", 1)[0] + "=="))
    except (ValueError, TypeError):
        return False
    return isinstance(header, dict) and "alg" in header


def _unverified(token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The header and claims of a compact JWS, unverified.

    Anyone can send a token, so its JSON may be hostile: nesting deeper than the parser's recursion limit
    raises ``RecursionError`` (in the header or the payload), which is a malformed token like any other.
    """
    try:
        compact = extract_compact(token.encode())
        claims = json.loads(compact.payload)
    except (JoseError, ValueError, TypeError, RecursionError):
        raise JwtRejected("malformed") from None
    if not isinstance(claims, dict):
        raise JwtRejected("malformed")
    return dict(compact.headers()), claims


async def verify_signature(token: str, jwks: JwksCache) -> tuple[dict[str, Any], dict[str, Any]]:
    """Check the header (``alg`` in :data:`ALGORITHMS`, a ``kid``) and the signature; return header and claims.

    Raises:
        JwtRejected: malformed, an unexpected algorithm, an unknown key or a bad signature.
    """
    header, _ = _unverified(token)
    kid = header.get("kid")
    if header.get("alg") not in ALGORITHMS or not isinstance(kid, str):
        raise JwtRejected("signed with an unexpected algorithm")
    key = await jwks.key(kid)
    if key is None:
        raise JwtRejected("signed by an unknown key")
    try:
        verified = jwt.decode(token, key, registry=_REGISTRY)
    except JoseError as exc:
        raise JwtRejected(f"rejected ({exc.error})") from None
    except (ValueError, TypeError):  # a key of another type than the header's algorithm
        raise JwtRejected("rejected (key does not match the algorithm)") from None
    return dict(verified.header), dict(verified.claims)


def claim_failure(exc: ClaimError) -> str:
    """A short reason for a failed claim check: ``expired``, ``missing sub``, ``invalid aud``…"""
    if isinstance(exc, ExpiredTokenError):
        return "rejected (expired)"
    return f"rejected ({'missing' if isinstance(exc, MissingClaimError) else 'invalid'} {exc.claim})"


async def verify_id_token(
    id_token: str,
    *,
    jwks: JwksCache | None,
    issuers: Sequence[str] | None,
    client_id: str,
    nonce: str,
    leeway: int,
    access_token: str | None = None,
) -> dict[str, Any]:
    """Validate an ID token from a token endpoint (OIDC Core §3.1.3.7) with authlib's ``CodeIDToken``.

    The signature is checked against ``jwks`` when the issuer publishes one; without (a provider configured
    with explicit endpoints and no ``jwks_uri``), the token came straight from the token endpoint over the
    server's own TLS connection, which §3.1.3.7 lets stand in for it. ``issuers`` are the accepted ``iss``
    values (``None``: not checked, for a provider configured without an issuer).

    Raises:
        JwtRejected: naming the check that failed (``nonce`` and ``azp`` get their own wording).
    """
    if jwks is not None:
        header, claims = await verify_signature(id_token, jwks)
    else:
        header, claims = _unverified(id_token)
        if not isinstance(header.get("alg"), str):  # authlib's at_hash rule would index a non-string
            raise JwtRejected("malformed")
    options: dict[str, dict[str, Any]] = {"aud": {"essential": True, "value": client_id}, "sub": {"essential": True}}
    if issuers is not None:
        options["iss"] = {"essential": True, "values": list(issuers)}
    params: dict[str, Any] = {"nonce": nonce, "client_id": client_id}
    if access_token is not None:
        params["access_token"] = access_token
    try:
        CodeIDToken(claims, header, options, params).validate(leeway=leeway)
    except ClaimError as exc:
        if exc.claim == "nonce":
            raise JwtRejected("nonce does not match this login", claim=exc.claim) from None
        if exc.claim == "azp":
            raise JwtRejected("has several audiences and another authorized party", claim=exc.claim) from None
        raise JwtRejected(claim_failure(exc), claim=exc.claim) from None
    return claims
