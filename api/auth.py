"""Bearer-token verification as an OAuth 2.1 resource server.

JWT access tokens from ``OIDC_ISSUER`` are checked here against the issuer's JWKS (cached;
refetched when an unknown ``kid`` appears, at most once per ``refetch_interval``), with
``iss`` equal to the issuer exactly as configured (a trailing slash is part of it), an
audience containing the MCP resource URL (RFC 8707) or one of ``OIDC_EXTRA_AUDIENCES``,
and ``exp``/``nbf`` within a small leeway. Opaque tokens go to RFC 7662 introspection
(:mod:`api.introspection`) when it is configured. Either way the principal is (issuer,
subject); nothing else in the token or the request is identity.
"""

import hashlib
import logging
import time
from collections import OrderedDict
from urllib.parse import urlsplit, urlunsplit

from joserfc.errors import ClaimError
from joserfc.jwt import JWTClaimsRegistry
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken, TokenVerifier

from api.jose import JwksCache, JwtRejected, claim_failure, is_compact_jws, verify_signature
from store.principal import Principal

logger = logging.getLogger(__name__)


def canonical_resource(url: str) -> str:
    """Compare resource URIs case-insensitively in scheme and host, ignoring a trailing slash."""
    parts = urlsplit(url.strip())
    netloc = parts.netloc.lower()
    return urlunsplit((parts.scheme.lower(), netloc, parts.path.rstrip("/"), parts.query, ""))


class Audiences:
    """Which ``aud`` values make a token ours: the MCP resource URL, compared as an RFC 8707 resource URI
    (case of scheme and host, a trailing slash), or one of the extra audiences, compared exactly.

    An extra audience (Entra v2 puts the API's client ID in ``aud``) is not unique to this server: every
    resource that accepts the same value accepts the same tokens (see docs/identity.md).
    """

    def __init__(self, resource: str, extra: tuple[str, ...] = ()) -> None:
        self.resource = canonical_resource(resource)
        self._extra = frozenset(extra)

    def accepts(self, aud: object) -> bool:
        """Whether the ``aud`` claim (a string or a list of them) names this server."""
        values = aud if isinstance(aud, list) else [aud]
        return any(isinstance(value, str) and self._names_us(value) for value in values)

    def _names_us(self, value: str) -> bool:
        if value in self._extra:
            return True
        try:
            return canonical_resource(value) == self.resource
        except ValueError:  # not a URL at all (urlsplit refuses e.g. "http://["): not ours
            return False


class JwtVerifier:
    """An ``mcp`` ``TokenVerifier`` for JWT access tokens issued for this server.

    A client sends the same token on every call for up to an hour, so verified tokens are kept in a
    small in-memory cache keyed by their SHA-256 digest; a hit still honours ``exp`` and ``nbf``.
    """

    def __init__(
        self,
        *,
        issuer: str,
        resource: str,
        jwks: JwksCache,
        leeway: int,
        extra_audiences: tuple[str, ...] = (),
        cache_size: int = 4096,
    ) -> None:
        self._issuer = issuer
        self._audiences = Audiences(resource, extra_audiences)
        self._resource = self._audiences.resource
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
        if not self._audiences.accepts(claims["aud"]):
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


class BearerVerifier:
    """The server's ``TokenVerifier``: JWTs are verified locally, anything else by introspection when configured.

    Without introspection an opaque token is simply not valid here (``None``: 401).
    """

    def __init__(self, jwt: JwtVerifier, introspection: TokenVerifier | None = None) -> None:
        self._jwt = jwt
        self._introspection = introspection

    async def verify_token(self, token: str) -> AccessToken | None:
        """Return the verified token, or ``None``; introspection may raise when it cannot answer (a 503)."""
        if self._introspection is not None and not is_compact_jws(token):
            return await self._introspection.verify_token(token)
        return await self._jwt.verify_token(token)


def current_principal() -> Principal:
    """The principal of the request being handled (set by the SDK's auth middleware).

    Raises:
        LookupError: outside an authenticated request, which is a wiring bug.
    """
    token = get_access_token()
    if token is None or not token.subject or not token.claims or "iss" not in token.claims:
        raise LookupError("no authenticated principal for this request")
    return Principal(issuer=str(token.claims["iss"]), subject=token.subject)
