"""The MCP endpoint's token verifier in authorization-server mode: Coatcheck's own access tokens only.

A token is accepted when one of ``AS_SIGNING_KEYS`` signed it (ES256, ``typ: at+jwt``), ``iss`` is
``PUBLIC_URL``, ``aud`` is the MCP URL, it has not expired, and its grant (``gid``) is not revoked
(:class:`api.authserver.revocation.RevokedGrants`). The principal is the upstream pair the token carries:
``sub`` is the upstream subject and ``upstream_iss`` the upstream issuer, exactly the (issuer, subject)
that resource-server mode takes from the upstream's own tokens, so data keeps its owner across modes.
"""

import logging

from joserfc.errors import ClaimError
from joserfc.jwt import JWTClaimsRegistry
from mcp.server.auth.provider import AccessToken

from api.authserver.keys import SigningKeys
from api.authserver.revocation import RevokedGrants
from api.jose import claim_failure

logger = logging.getLogger(__name__)

UPSTREAM_ISSUER_CLAIM = "upstream_iss"
GRANT_CLAIM = "gid"


class AuthorizationServerTokenVerifier:
    """An ``mcp`` ``TokenVerifier`` for the access tokens this server issued."""

    def __init__(self, keys: SigningKeys, *, issuer: str, resource: str, revoked: RevokedGrants, leeway: int) -> None:
        self._keys = keys
        self._resource = resource
        self._revoked = revoked
        self._leeway = leeway
        self._claims = JWTClaimsRegistry(
            leeway=leeway,
            iss={"essential": True, "value": issuer},
            aud={"essential": True, "value": resource},
            sub={"essential": True},
            exp={"essential": True},
            client_id={"essential": True},
            gid={"essential": True},
            upstream_iss={"essential": True},
        )

    async def verify_token(self, token: str) -> AccessToken | None:
        """The verified token, or ``None`` (bad signature, wrong issuer or audience, expired, revoked)."""
        claims = self._keys.verify(token)
        if claims is None:
            logger.info("rejected bearer token: not signed by this authorization server")
            return None
        try:
            self._claims.validate(claims)
        except ClaimError as exc:
            logger.info("rejected bearer token: %s", claim_failure(exc))
            return None
        grant_id, upstream, subject = claims[GRANT_CLAIM], claims[UPSTREAM_ISSUER_CLAIM], claims["sub"]
        if not all(isinstance(value, str) and value for value in (grant_id, upstream, subject)):
            return None
        if await self._revoked.is_revoked(grant_id):
            logger.info("rejected bearer token: its grant was revoked")
            return None
        scope = claims.get("scope", "")
        return AccessToken(
            token=token,
            client_id=str(claims["client_id"]),
            scopes=scope.split() if isinstance(scope, str) else [],
            expires_at=int(claims["exp"]) + self._leeway,
            resource=self._resource,
            subject=subject,
            claims={"iss": upstream, GRANT_CLAIM: grant_id},
        )
