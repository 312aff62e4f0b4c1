"""Opaque access tokens, checked by OAuth 2.0 Token Introspection (RFC 7662) at ``OIDC_ISSUER``.

Some identity providers (oidc-provider without a JWT resource format, Okta's and Keycloak's options, many
OAuth servers) hand MCP clients opaque access tokens. Coatcheck asks the issuer's introspection endpoint
about each one, as the confidential client ``OIDC_INTROSPECTION_CLIENT_ID`` (HTTP Basic, RFC 6749 §2.3.1),
and accepts it only if the answer is ``active: true`` with ``iss`` equal to ``OIDC_ISSUER`` (when the answer
names one: the endpoint is the issuer's own), an ``aud`` naming this server (the MCP URL or one of
``OIDC_EXTRA_AUDIENCES``; a token for the IdP's userinfo endpoint has none and is refused), a future ``exp``,
a non-empty ``sub``, no ``nbf`` in the future, a ``token_type`` of Bearer when one is named, and no ``cnf``
(a sender-constrained token, whose proof this server does not check).

Answers are remembered per token for ``OIDC_INTROSPECTION_CACHE_SECONDS`` and never past the token's
``exp``, in a bounded LRU keyed by the token's SHA-256 digest; the cache holds the answer without the
token. Concurrent requests with the same uncached token share one introspection call. A negative answer is
not cached (a guessed token costs the guesser a round trip each time, not the next honest user).

An endpoint that cannot answer (unreachable, slow, 5xx, refusing Coatcheck's credentials, not JSON) raises
:class:`VerifierUnavailable`, which the MCP endpoint answers with 503 ``temporarily_unavailable``
(:mod:`api.mcp.auth_errors`): the client should retry, not throw its token away. Tokens never reach a log.
"""

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote_plus

import httpx2
from mcp.server.auth.provider import AccessToken
from starlette.authentication import AuthenticationError

from api.auth import Audiences
from api.jose import IssuerMetadata, IssuerUnavailable

logger = logging.getLogger(__name__)

DEFAULT_CACHE_SIZE = 4096


class VerifierUnavailable(AuthenticationError):  # noqa: N818 - reads as a state, like IssuerUnavailable
    """The token could not be checked right now; the message says why for the client, never the token."""


@dataclass(frozen=True)
class _Answer:
    """What an accepted introspection answer says, kept without the token itself."""

    client_id: str
    scopes: tuple[str, ...]
    expires_at: int
    subject: str
    issuer: str
    fresh_until: float

    def access_token(self, token: str, resource: str) -> AccessToken:
        return AccessToken(
            token=token,
            client_id=self.client_id,
            scopes=list(self.scopes),
            expires_at=self.expires_at,
            resource=resource,
            subject=self.subject,
            claims={"iss": self.issuer},
        )


class TokenIntrospection:
    """An ``mcp`` ``TokenVerifier`` that asks the issuer's RFC 7662 endpoint about opaque tokens."""

    def __init__(
        self,
        *,
        issuer: IssuerMetadata,
        http: httpx2.AsyncClient,
        client_id: str,
        client_secret: str,
        audiences: Audiences,
        leeway: int,
        cache_seconds: int,
        timeout: float,
        endpoint: str | None = None,
        cache_size: int = DEFAULT_CACHE_SIZE,
    ) -> None:
        self._issuer = issuer
        self._http = http
        # RFC 6749 §2.3.1: the client ID and secret are form-encoded before they go into the Basic header.
        self._auth = (quote_plus(client_id), quote_plus(client_secret))
        self._audiences = audiences
        self._leeway = leeway
        self._cache_seconds = cache_seconds
        self._timeout = timeout
        self._endpoint = endpoint
        self._cache: OrderedDict[bytes, _Answer] = OrderedDict()
        self._cache_size = cache_size
        self._pending: dict[bytes, asyncio.Task[_Answer | None]] = {}

    async def verify_token(self, token: str) -> AccessToken | None:
        """The verified token, or ``None`` for one that is not active and ours (a 401).

        Raises:
            VerifierUnavailable: the introspection endpoint could not answer.
        """
        digest = hashlib.sha256(token.encode()).digest()
        cached = self._cache.get(digest)
        if cached is not None:
            if time.time() < cached.fresh_until:
                self._cache.move_to_end(digest)
                return cached.access_token(token, self._audiences.resource)
            del self._cache[digest]
        task = self._pending.get(digest)
        if task is None:
            task = asyncio.create_task(self._introspect(token))
            self._pending[digest] = task
            task.add_done_callback(lambda done: self._settled(digest, done))
        # Shielded: a client that goes away does not cancel the answer the others are waiting for.
        answer = await asyncio.shield(task)
        return None if answer is None else answer.access_token(token, self._audiences.resource)

    def _settled(self, digest: bytes, task: "asyncio.Task[_Answer | None]") -> None:
        self._pending.pop(digest, None)
        if task.cancelled() or task.exception() is not None:  # retrieved, so asyncio does not log it again
            return
        answer = task.result()
        if answer is not None and answer.fresh_until > time.time():
            self._cache[digest] = answer
            self._cache.move_to_end(digest)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)

    async def _introspection_endpoint(self) -> str:
        if self._endpoint is not None:
            return self._endpoint
        try:
            metadata = await self._issuer.document()
        except IssuerUnavailable as exc:
            logger.warning("token introspection unavailable: %s", exc)
            raise VerifierUnavailable("the identity provider's metadata is unavailable; retry later") from None
        endpoint = metadata.get("introspection_endpoint")
        if not isinstance(endpoint, str):
            logger.error("OIDC_ISSUER's metadata names no introspection_endpoint: set OIDC_INTROSPECTION_URL")
            raise VerifierUnavailable("this server cannot check opaque access tokens (no introspection endpoint)")
        self._endpoint = self._issuer.server_facing(endpoint)
        return self._endpoint

    async def _introspect(self, token: str) -> _Answer | None:
        endpoint = await self._introspection_endpoint()
        try:
            response = await self._http.post(
                endpoint,
                data={"token": token, "token_type_hint": "access_token"},
                auth=self._auth,
                headers={"Accept": "application/json"},
                timeout=self._timeout,
            )
        except httpx2.HTTPError as exc:
            logger.warning("token introspection failed: %s", type(exc).__name__)
            raise VerifierUnavailable(
                "the identity provider's token introspection endpoint is unreachable; retry later"
            ) from None
        if response.status_code in (400, 401, 403):
            # Not the client's fault: the IdP refuses Coatcheck's own credentials (or request).
            logger.error(
                "the introspection endpoint refused Coatcheck (HTTP %d): check OIDC_INTROSPECTION_CLIENT_ID "
                "and OIDC_INTROSPECTION_CLIENT_SECRET",
                response.status_code,
            )
            raise VerifierUnavailable("the identity provider refused this server's token introspection request")
        if response.status_code != 200:
            logger.warning("token introspection failed: HTTP %d", response.status_code)
            raise VerifierUnavailable(
                f"the identity provider's token introspection endpoint answered HTTP {response.status_code}; "
                "retry later"
            )
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            logger.warning("token introspection failed: the answer is not a JSON object")
            raise VerifierUnavailable("the identity provider's token introspection answer is unusable")
        return self._accept(body)

    def _accept(self, body: dict[str, Any]) -> _Answer | None:
        reason = self._refusal(body)
        if reason is not None:
            logger.info("rejected bearer token: introspection: %s", reason)
            return None
        now = time.time()
        exp = int(body["exp"])
        scope = body.get("scope")
        client_id = body.get("client_id")
        return _Answer(
            client_id=client_id if isinstance(client_id, str) else "",
            scopes=tuple(scope.split()) if isinstance(scope, str) else (),
            expires_at=exp + self._leeway,
            subject=body["sub"],
            issuer=self._issuer.issuer,
            # Never past the token's own expiry, whatever the cache setting.
            fresh_until=min(float(exp), now + self._cache_seconds),
        )

    def _refusal(self, body: dict[str, Any]) -> str | None:
        """Why this introspection answer does not make the token valid here, or ``None`` when it does."""
        now = time.time()
        if body.get("active") is not True:
            return "not active"
        if "iss" in body and body["iss"] != self._issuer.issuer:
            return "issued by another issuer"
        if "aud" not in body:
            return "no audience (not a token for a resource server)"
        if not self._audiences.accepts(body["aud"]):
            return "audience is not this server"
        exp = body.get("exp")
        if not isinstance(exp, int | float) or isinstance(exp, bool):
            return "no exp"
        if exp + self._leeway < now:
            return "expired"
        nbf = body.get("nbf")
        if isinstance(nbf, int | float) and not isinstance(nbf, bool) and nbf - self._leeway > now:
            return "not yet valid"
        subject = body.get("sub")
        if not isinstance(subject, str) or not subject:
            return "no sub"
        token_type = body.get("token_type")
        if token_type is not None and (not isinstance(token_type, str) or token_type.lower() != "bearer"):
            return "not a bearer access token"
        if "cnf" in body:
            return "sender-constrained (DPoP or mTLS), which this server does not verify"
        return None
