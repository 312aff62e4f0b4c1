"""OAuth 2.0 client operations, through authlib's httpx2 client rather than hand-written token requests.

One small class serves both of Coatcheck's roles as an OAuth client: signing the browser in at
``OIDC_ISSUER`` and connecting third-party providers. Each operation opens a short-lived
``AsyncOAuth2Client`` (they are cheap and hold per-token state we do not want shared); nothing here logs a
token, code, verifier or secret, and failures surface as :class:`OAuthFailure` carrying only the OAuth
error code. A provider's error string is outside text: it becomes that code only when it looks like one
(:func:`provider_error_code`), so whatever a broken or hostile provider sends cannot reach a log line, a
stored flow or a tool result as it is.
"""

import logging
import re
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx2
from authlib.integrations.base_client import OAuthError  # type: ignore[import-untyped]
from authlib.integrations.httpx_client import AsyncOAuth2Client  # type: ignore[import-untyped]

from api.escaping import escape_controls

logger = logging.getLogger(__name__)

TIMEOUT = httpx2.Timeout(10.0)
# RFC 6749 §4.1.2.1 / §5.2 codes and the registered extensions are short snake_case words.
_ERROR_CODE = re.compile(r"[a-z_]{1,40}")
_UNRECOGNISED = "provider_error"
_SHOWN_CHARS = 80  # of an unrecognised error string, in the log line that reports it


def provider_error_code(value: object) -> str:
    """The OAuth error code a provider (or its redirect) sent, or ``provider_error`` if it is not one."""
    return value if isinstance(value, str) and _ERROR_CODE.fullmatch(value) else _UNRECOGNISED


def _shown(value: object) -> str:
    """An unrecognised error string for a log line: escaped and cut short (it is outside text)."""
    text = str(value)
    cut = text[:_SHOWN_CHARS] + ("..." if len(text) > _SHOWN_CHARS else "")
    return escape_controls(cut)


class OAuthFailure(Exception):  # noqa: N818 - a verdict, like store.errors
    """The provider refused or could not be reached. ``error`` is an OAuth code or a transport class name."""

    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.error = error

    @property
    def invalid_grant(self) -> bool:
        return self.error == "invalid_grant"


class Unauthorized(Exception):  # noqa: N818 - the HTTP status it stands for
    """A resource endpoint (userinfo) rejected the access token."""


def new_secret() -> str:
    """A random value for ``state``, ``nonce`` (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def new_code_verifier() -> str:
    """A PKCE verifier (RFC 7636: 43-128 characters of the unreserved set)."""
    return secrets.token_urlsafe(64)


@dataclass(frozen=True, slots=True)
class ClientCredentials:
    client_id: str
    client_secret: str | None
    auth_method: str = "client_secret_basic"


@dataclass(frozen=True, slots=True)
class TokenResponse:
    """The fields of a token endpoint answer that Coatcheck uses."""

    access_token: str
    refresh_token: str | None
    expires_at: datetime | None
    scope: str | None
    token_type: str
    id_token: str | None

    @classmethod
    def parse(cls, token: dict[str, Any]) -> "TokenResponse":
        access = token.get("access_token")
        if not isinstance(access, str) or not access:
            raise OAuthFailure("invalid_token_response")
        expires_at: datetime | None = None
        if isinstance(token.get("expires_at"), int | float):
            expires_at = datetime.fromtimestamp(float(token["expires_at"]), UTC)
        elif isinstance(token.get("expires_in"), int | float):
            expires_at = datetime.fromtimestamp(time.time() + float(token["expires_in"]), UTC)
        refresh = token.get("refresh_token")
        scope = token.get("scope")
        id_token = token.get("id_token")
        return cls(
            access_token=access,
            refresh_token=refresh if isinstance(refresh, str) and refresh else None,
            expires_at=expires_at,
            scope=scope if isinstance(scope, str) else None,
            token_type=str(token.get("token_type") or "Bearer"),
            id_token=id_token if isinstance(id_token, str) else None,
        )


class OAuthClient:
    """Authorization-code + PKCE, refresh and revocation for one client registration."""

    def __init__(self, credentials: ClientCredentials, *, transport: httpx2.AsyncBaseTransport | None = None) -> None:
        self._credentials = credentials
        self._transport = transport

    def _session(self, redirect_uri: str | None = None) -> Any:
        c = self._credentials
        options: dict[str, Any] = {"timeout": TIMEOUT, "follow_redirects": False, "trust_env": False}
        if self._transport is not None:
            options["transport"] = self._transport
        return AsyncOAuth2Client(
            client_id=c.client_id,
            client_secret=c.client_secret,
            token_endpoint_auth_method=c.auth_method,
            revocation_endpoint_auth_method=c.auth_method,
            code_challenge_method="S256",
            redirect_uri=redirect_uri,
            **options,
        )

    def authorization_url(
        self,
        endpoint: str,
        *,
        redirect_uri: str,
        scope: str,
        state: str,
        code_verifier: str,
        nonce: str | None,
        extra: dict[str, str] | None = None,
    ) -> str:
        """The URL to send the browser to (S256 code challenge, ``state`` and, for OIDC, ``nonce``)."""
        params: dict[str, str] = dict(extra or {})
        if nonce is not None:
            params["nonce"] = nonce
        if scope:
            params["scope"] = scope
        session = self._session(redirect_uri)
        url, _ = session.create_authorization_url(endpoint, state=state, code_verifier=code_verifier, **params)
        return str(url)

    async def exchange_code(self, endpoint: str, *, code: str, code_verifier: str, redirect_uri: str) -> TokenResponse:
        """Redeem an authorization code with its PKCE verifier.

        Raises:
            OAuthFailure: the provider answered an OAuth error, or could not be reached.
        """
        async with self._session(redirect_uri) as session:
            token = await self._call(
                session.fetch_token(endpoint, grant_type="authorization_code", code=code, code_verifier=code_verifier),
                "code exchange",
            )
        return TokenResponse.parse(dict(token))

    async def refresh(self, endpoint: str, refresh_token: str) -> TokenResponse:
        """Trade a refresh token for new tokens (RFC 6749 §6).

        Raises:
            OAuthFailure: ``invalid_grant`` when the refresh token is no longer valid.
        """
        async with self._session() as session:
            token = await self._call(session.refresh_token(endpoint, refresh_token=refresh_token), "refresh")
        return TokenResponse.parse(dict(token))

    async def revoke(self, endpoint: str, token: str, *, hint: str) -> None:
        """Revoke ``token`` (RFC 7009). A 200 is success; an unknown token is a 200 too.

        Raises:
            OAuthFailure: the endpoint refused or could not be reached.
        """
        async with self._session() as session:
            response = await self._call(session.revoke_token(endpoint, token=token, token_type_hint=hint), "revoke")
        if response.status_code != 200:
            error = "revocation_failed"
            try:
                body = response.json()
                if isinstance(body, dict) and body.get("error"):
                    error = provider_error_code(body["error"])
            except ValueError:
                pass
            logger.warning("token revocation answered HTTP %s (%s)", response.status_code, error)
            raise OAuthFailure(error)

    @staticmethod
    async def _call(awaitable: Any, what: str) -> Any:
        try:
            return await awaitable
        except OAuthError as exc:
            sent = getattr(exc, "error", None)
            error = provider_error_code(sent) if sent else "oauth_error"
            if error == _UNRECOGNISED:
                logger.info("%s refused by the provider with an unrecognised error: %s", what, _shown(sent))
            else:
                logger.info("%s refused by the provider: %s", what, error)
            raise OAuthFailure(error) from None
        except httpx2.HTTPStatusError as exc:
            logger.warning("%s failed: HTTP %s", what, exc.response.status_code)
            raise OAuthFailure("temporarily_unavailable") from None
        except (httpx2.HTTPError, ValueError) as exc:
            logger.warning("%s failed: %s", what, type(exc).__name__)
            raise OAuthFailure("network_error") from None


async def fetch_userinfo(http: httpx2.AsyncClient, endpoint: str, access_token: str) -> dict[str, Any]:
    """GET the profile with the access token in the ``Authorization`` header (never in the URL).

    Raises:
        Unauthorized: the token was rejected (HTTP 401).
        OAuthFailure: any other failure.
    """
    try:
        response = await http.get(
            endpoint, headers={"Authorization": f"Bearer {access_token}", "Accept": "application/json"}
        )
    except httpx2.HTTPError as exc:
        logger.warning("profile request failed: %s", type(exc).__name__)
        raise OAuthFailure("network_error") from None
    if response.status_code == 401:
        raise Unauthorized
    if response.status_code != 200:
        logger.warning("profile request answered HTTP %s", response.status_code)
        raise OAuthFailure("profile_unavailable")
    try:
        profile = response.json()
    except ValueError:
        raise OAuthFailure("profile_unavailable") from None
    if not isinstance(profile, dict):
        raise OAuthFailure("profile_unavailable")
    return profile
