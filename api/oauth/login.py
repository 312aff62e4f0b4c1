"""Sign the browser in with OpenID Connect at ``OIDC_ISSUER``, the same server that issues MCP tokens.

Authorization code + PKCE as the confidential client ``OIDC_CLIENT_ID``. The ID token is verified in full
by authlib's OIDC validation (:func:`api.jose.verify_id_token`, shared with the providers' ID tokens):
signature against the issuer's JWKS (the same cache the MCP token verifier uses), ``iss`` equal to
``OIDC_ISSUER`` exactly as configured (a trailing slash is part of it, as in the MCP tokens), ``aud``
containing ``OIDC_CLIENT_ID`` (and ``azp`` equal to it when there are several audiences), ``exp``/``iat``,
``at_hash`` when present, and ``nonce`` equal to the one this browser was sent with. The result is the
(issuer, subject) pair, which is exactly how an MCP principal is named, so /connect can compare them.

The authorization endpoint is the public one from the issuer's metadata (the browser goes there); the
token endpoint is reached through ``OIDC_ISSUER_INTERNAL_URL`` when set, like the JWKS.

Signing out at the issuer too (OpenID RP-Initiated Logout 1.0) uses the ``end_session_endpoint`` from the
same metadata, with ``client_id`` and a registered ``post_logout_redirect_uri`` only: no ``id_token_hint``,
because the ID token is not kept after sign-in (the session cookie holds the issuer, the subject and a session id).
"""

import logging
import re
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from api.jose import IssuerMetadata, IssuerUnavailable, JwksCache, JwtRejected, verify_id_token
from api.oauth.client import OAuthClient, OAuthFailure
from store.principal import Principal

logger = logging.getLogger(__name__)

LOGIN_SCOPE = "openid"
# A host that is safe to name in a CSP header (the sign-out form's form-action) as well as in a URL.
_PLAIN_HOST = re.compile(r"[A-Za-z0-9.-]+")


class LoginFailed(Exception):  # noqa: N818 - a verdict
    """The login could not be completed; the message is a short reason for the log, never a secret."""


class BrowserLogin(Protocol):
    """What the browser routes (``/connect``, consent, sign-out) need from the upstream sign-in: an OpenID
    provider (:class:`OidcLogin`) or, in authorization-server mode, a plain OAuth 2.0 provider with a
    user-info endpoint (:class:`api.oauth.userinfo_login.UserinfoLogin`)."""

    @property
    def issuer(self) -> str:
        """The issuer half of every principal this sign-in produces."""
        ...

    @property
    def redirect_uri(self) -> str:
        """``<PUBLIC_URL>/oauth/login/callback``, exactly as registered at the provider."""
        ...

    async def authorization_url(self, *, state: str, nonce: str, code_verifier: str) -> str:
        """Where to send a browser that has no session yet."""
        ...

    async def complete(self, *, code: str, code_verifier: str, nonce: str) -> Principal:
        """Redeem the code and return who signed in (raises :class:`LoginFailed`)."""
        ...

    async def end_session_url(self, *, post_logout_redirect_uri: str) -> str | None:
        """Where to end the provider's session too, or ``None``."""
        ...


class OidcLogin:
    """Coatcheck's own OpenID Connect client for the browser."""

    def __init__(
        self,
        *,
        issuer: IssuerMetadata,
        client_id: str,
        client: OAuthClient,
        jwks: JwksCache,
        redirect_uri: str,
        leeway: int,
    ) -> None:
        self._issuer = issuer
        self.issuer = issuer.issuer
        self._client_id = client_id
        self._client = client
        self._jwks = jwks
        self.redirect_uri = redirect_uri
        self._leeway = leeway

    async def _discover(self) -> dict[str, Any]:
        try:
            metadata = await self._issuer.document()
        except IssuerUnavailable as exc:
            raise LoginFailed(str(exc)) from None
        if not isinstance(metadata.get("authorization_endpoint"), str) or not isinstance(
            metadata.get("token_endpoint"), str
        ):
            raise LoginFailed("issuer metadata lacks the authorization or token endpoint")
        return metadata

    async def authorization_url(self, *, state: str, nonce: str, code_verifier: str) -> str:
        """Where to send a browser that has no session yet.

        Raises:
            LoginFailed: the issuer's metadata is unavailable.
        """
        metadata = await self._discover()
        return self._client.authorization_url(
            self._issuer.browser_facing(str(metadata["authorization_endpoint"])),
            redirect_uri=self.redirect_uri,
            scope=LOGIN_SCOPE,
            state=state,
            code_verifier=code_verifier,
            nonce=nonce,
        )

    async def complete(self, *, code: str, code_verifier: str, nonce: str) -> Principal:
        """Redeem the code and verify the ID token; return who signed in.

        Raises:
            LoginFailed: the exchange failed or the ID token is not valid for this login.
        """
        metadata = await self._discover()
        try:
            tokens = await self._client.exchange_code(
                self._issuer.server_facing(str(metadata["token_endpoint"])),
                code=code,
                code_verifier=code_verifier,
                redirect_uri=self.redirect_uri,
            )
        except OAuthFailure as exc:
            raise LoginFailed(f"code exchange failed ({exc.error})") from None
        if tokens.id_token is None:
            raise LoginFailed("the token response has no ID token")
        return await self.verify_id_token(tokens.id_token, nonce=nonce, access_token=tokens.access_token)

    async def verify_id_token(self, id_token: str, *, nonce: str, access_token: str | None = None) -> Principal:
        """Check signature, issuer, audience, lifetime and nonce (OIDC Core §3.1.3.7).

        Raises:
            LoginFailed: naming the check that failed.
        """
        try:
            claims = await verify_id_token(
                id_token,
                jwks=self._jwks,
                issuers=[self.issuer],
                client_id=self._client_id,
                nonce=nonce,
                leeway=self._leeway,
                access_token=access_token,
            )
        except JwtRejected as exc:
            raise LoginFailed(f"ID token {exc}") from None
        try:
            return Principal(issuer=self.issuer, subject=str(claims["sub"]))
        except ValueError:
            raise LoginFailed("ID token has an empty subject") from None

    async def end_session_url(self, *, post_logout_redirect_uri: str) -> str | None:
        """Where to send a signed-out browser to end its session at the issuer too, or ``None`` when the
        issuer advertises no usable ``end_session_endpoint`` (or its metadata is unavailable right now).

        Built from discovery and configuration only, never from a request; it carries nothing secret.
        """
        try:
            metadata = await self._issuer.document()
        except IssuerUnavailable as exc:
            logger.warning("issuer sign-out unavailable: %s", exc)
            return None
        endpoint = metadata.get("end_session_endpoint")
        if not isinstance(endpoint, str):
            return None
        endpoint = self._issuer.browser_facing(endpoint)
        if not _plain_web_url(endpoint):
            logger.warning("issuer metadata has an unusable end_session_endpoint; signing out locally only")
            return None
        parts = urlsplit(endpoint)
        # The spec lets the endpoint carry a query of its own, which must be kept.
        query = [
            *parse_qsl(parts.query, keep_blank_values=True),
            ("client_id", self._client_id),
            ("post_logout_redirect_uri", post_logout_redirect_uri),
        ]
        return urlunsplit((parts.scheme, _host_port(endpoint), parts.path, urlencode(query), ""))


def web_origin(url: str) -> str:
    """``scheme://host[:port]`` of ``url``, as a CSP source or an ``Origin`` header names it."""
    return f"{urlsplit(url).scheme}://{_host_port(url)}"


def _host_port(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    return host if parts.port is None else f"{host}:{parts.port}"


def _plain_web_url(url: str) -> bool:
    """An http(s) URL with a plain host name, a valid port, no user info and no fragment: safe to redirect to
    and to name (its origin) in a CSP header."""
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError:
        return False
    return (
        parts.scheme in ("http", "https")
        and parts.hostname is not None
        and _PLAIN_HOST.fullmatch(parts.hostname) is not None
        and "@" not in parts.netloc
        and not parts.fragment
    )
