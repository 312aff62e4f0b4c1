"""Bearer-token verification as an OAuth 2.1 resource server.

Access tokens are JWTs (RS256 or ES256) from ``OIDC_ISSUER``, checked against the
issuer's JWKS (cached; refetched when an unknown ``kid`` appears, at most once per
``refetch_interval``), with ``iss`` equal to the issuer, an audience containing the
MCP resource URL (RFC 8707), and ``exp``/``nbf`` within a small leeway. The principal
is (issuer, subject); nothing else in the token or the request is identity.
"""

import hashlib
import logging
import time
from collections import OrderedDict
from urllib.parse import urlsplit, urlunsplit

from joserfc.errors import ClaimError
from joserfc.jwt import JWTClaimsRegistry
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken

from api.jose import JwksCache, JwtRejected, claim_failure, verify_signature
from store.principal import Principal

logger = logging.getLogger(__name__)


def canonical_resource(url: str) -> str:
    """Compare resource URIs case-insensitively in scheme and host, ignoring a trailing slash."""
    parts = urlsplit(url.strip())
    netloc = parts.netloc.lower()
    return urlunsplit((parts.scheme.lower(), netloc, parts.path.rstrip("/"), parts.query, ""))


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
        # The audience is compared below as a canonical resource URI (RFC 8707), not as a plain string.
        self._claims = JWTClaimsRegistry(
            leeway=leeway,
            iss={"essential": True, "value": issuer},
            sub={"essential": True},
            aud={"essential": True},
            exp={"essential": True},
        )

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
            _, claims = await verify_signature(token, self._jwks)
            self._claims.validate(claims)
        except JwtRejected as exc:
            logger.info("rejected bearer token: %s", exc)
            return None
        except ClaimError as exc:
            logger.info("rejected bearer token: %s", claim_failure(exc))
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
