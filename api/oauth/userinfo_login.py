"""Sign the browser in at a plain OAuth 2.0 provider (GitHub-shaped): no discovery, no ID token; the subject
comes from the provider's user-info endpoint.

Authorization-server mode only (``UPSTREAM_KIND=oauth2``): Coatcheck issues the MCP tokens itself, so the
upstream only has to tell who signed in. Authorization code + PKCE S256 + ``state`` as the confidential client
``OIDC_CLIENT_ID`` (through :class:`api.oauth.client.OAuthClient`, i.e. authlib), redirect URI
``<PUBLIC_URL>/oauth/login/callback`` exactly, the client secret sent in the form body (GitHub documents
that, not HTTP Basic). authlib asks the token endpoint for JSON (``Accept: application/json``), which GitHub
answers with instead of its form-encoded default, and reads an ``error`` in a 200 answer (GitHub's
``bad_verification_code``) as the refusal it is.

The access token is used once, for ``GET`` of the user-info URL with it in the ``Authorization`` header,
and then dropped: it is never stored, logged or shown. The principal is (``UPSTREAM_ISSUER``, the answer's
``UPSTREAM_SUBJECT_CLAIM``): a fixed issuer string of the operator's choosing, because the provider has none,
and GitHub's numeric ``id`` written as a decimal string (its ``login`` can be renamed, the ``id`` cannot).
"""

import logging
from typing import Any

import httpx2

from api.oauth.client import OAuthClient, OAuthFailure, Unauthorized, fetch_userinfo
from api.oauth.login import LoginFailed
from store.principal import Principal

logger = logging.getLogger(__name__)

_MAX_SUBJECT_CHARS = 255


def subject_of(profile: dict[str, Any], claim: str) -> str:
    """The subject named by ``claim`` in a user-info answer: a non-negative integer (GitHub's ``id``) as its
    decimal string, or a non-empty string as written.

    Raises:
        LoginFailed: the claim is missing or of another kind (a boolean, a float, an object, an empty string).
    """
    value = profile.get(claim)
    if isinstance(value, bool):
        raise LoginFailed(f"the user-info answer's {claim!r} is not an identifier")
    if isinstance(value, int) and value >= 0:
        return str(value)
    if isinstance(value, str) and value.strip() and len(value) <= _MAX_SUBJECT_CHARS and value == value.strip():
        return value
    if value is None:
        raise LoginFailed(f"the user-info answer has no {claim!r}")
    raise LoginFailed(f"the user-info answer's {claim!r} is not an identifier")


class UserinfoLogin:
    """Coatcheck's OAuth 2.0 client for the browser at a provider without OpenID Connect.

    Offers what :class:`api.oauth.login.OidcLogin` offers to the browser routes (``issuer``,
    ``redirect_uri``, ``authorization_url``, ``complete``, ``end_session_url``).
    """

    def __init__(
        self,
        *,
        issuer: str,
        authorization_url: str,
        token_url: str,
        userinfo_url: str,
        subject_claim: str,
        scope: str,
        client: OAuthClient,
        http: httpx2.AsyncClient,
        redirect_uri: str,
    ) -> None:
        self.issuer = issuer
        self._authorization_endpoint = authorization_url
        self._token_endpoint = token_url
        self._userinfo_endpoint = userinfo_url
        self._subject_claim = subject_claim
        self._scope = scope
        self._client = client
        self._http = http
        self.redirect_uri = redirect_uri

    async def authorization_url(self, *, state: str, nonce: str, code_verifier: str) -> str:
        """Where to send a browser that has no session yet (``nonce`` is OpenID's; it is not sent)."""
        return self._client.authorization_url(
            self._authorization_endpoint,
            redirect_uri=self.redirect_uri,
            scope=self._scope,
            state=state,
            code_verifier=code_verifier,
            nonce=None,
        )

    async def complete(self, *, code: str, code_verifier: str, nonce: str) -> Principal:
        """Redeem the code, ask the user-info endpoint who it is for, and return that principal.

        Raises:
            LoginFailed: the exchange was refused or failed, or the user-info endpoint did not name a user.
        """
        try:
            tokens = await self._client.exchange_code(
                self._token_endpoint, code=code, code_verifier=code_verifier, redirect_uri=self.redirect_uri
            )
        except OAuthFailure as exc:
            raise LoginFailed(f"code exchange failed ({exc.error})") from None
        try:
            profile = await fetch_userinfo(self._http, self._userinfo_endpoint, tokens.access_token)
        except Unauthorized:
            raise LoginFailed("the user-info endpoint refused the new access token (HTTP 401)") from None
        except OAuthFailure as exc:
            raise LoginFailed(f"the user-info endpoint did not answer ({exc.error})") from None
        return Principal(issuer=self.issuer, subject=subject_of(profile, self._subject_claim))

    async def end_session_url(self, *, post_logout_redirect_uri: str) -> str | None:
        """``None``: a plain OAuth 2.0 provider has no sign-out endpoint for its clients; Coatcheck signs out
        locally only."""
        return None
