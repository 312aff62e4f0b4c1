"""Build the connection service and the browser routes from the settings (called by ``create_app``)."""

from collections.abc import Callable
from datetime import timedelta
from urllib.parse import urlsplit

import httpx2
from litestar.handlers import HTTPRouteHandler

from api.jose import IssuerMetadata, JwksCache
from api.oauth.browser_sessions import BrowserSessions
from api.oauth.client import ClientCredentials, OAuthClient
from api.oauth.login import BrowserLogin, OidcLogin
from api.oauth.providers import ProviderRegistry
from api.oauth.routes import LOGIN_CALLBACK_PATH, browser_routes
from api.oauth.service import Connections
from api.oauth.session import CookieJar
from api.oauth.signout import signout_routes
from api.oauth.userinfo_login import UserinfoLogin
from api.settings import Settings
from store.crypto import TokenCipher
from store.db import Database

LOGIN_COOKIE_SECONDS = 600


def build_connections(
    settings: Settings,
    database: Database,
    http: httpx2.AsyncClient,
    *,
    record_refresh: Callable[[str], None] | None = None,
) -> Connections:
    """The token vault's cipher, the provider registry and the service over them.

    ``record_refresh`` is told the outcome of every token refresh (the metrics, when they are on).
    The providers (client secrets resolved) come from ``settings``, which read them at start-up.
    """
    return Connections(
        database=database,
        cipher=TokenCipher(settings.token_key_ring),
        registry=ProviderRegistry(
            providers=settings.provider_configs,
            http=http,
            leeway=settings.jwt_leeway_seconds,
            jwks_ttl=settings.jwks_cache_seconds,
        ),
        http=http,
        public_url=settings.public_url,
        flow_ttl=timedelta(seconds=settings.connect_flow_ttl_seconds),
        wait_seconds=settings.connect_wait_seconds,
        refresh_skew=timedelta(seconds=settings.token_refresh_skew_seconds),
        record_refresh=record_refresh,
    )


def browser_login(
    settings: Settings, issuer: IssuerMetadata, jwks: JwksCache, http: httpx2.AsyncClient
) -> BrowserLogin:
    """The browser sign-in: Coatcheck's OpenID Connect client at ``OIDC_ISSUER``, or with
    ``UPSTREAM_KIND=oauth2`` its OAuth 2.0 client at the ``UPSTREAM_*`` URLs (subject from user-info)."""
    if settings.upstream_kind == "oauth2":
        return userinfo_login(settings, http)
    return OidcLogin(
        issuer=issuer,
        client_id=settings.oidc_client_id,
        client=OAuthClient(
            ClientCredentials(
                client_id=settings.oidc_client_id, client_secret=settings.oidc_client_secret.get_secret_value()
            )
        ),
        jwks=jwks,
        redirect_uri=f"{settings.public_url}{LOGIN_CALLBACK_PATH}",
        leeway=settings.jwt_leeway_seconds,
    )


def userinfo_login(settings: Settings, http: httpx2.AsyncClient) -> UserinfoLogin:
    """The plain OAuth 2.0 sign-in (``UPSTREAM_KIND=oauth2``); the settings checked that every URL is set."""
    if (
        settings.upstream_issuer is None
        or settings.upstream_authorization_url is None
        or settings.upstream_token_url is None
        or settings.upstream_userinfo_url is None
    ):
        raise ValueError("UPSTREAM_KIND=oauth2 without its URLs: settings were built without validation")
    return UserinfoLogin(
        issuer=settings.upstream_issuer,
        authorization_url=settings.upstream_authorization_url,
        token_url=settings.upstream_token_url,
        userinfo_url=settings.upstream_userinfo_url,
        subject_claim=settings.upstream_subject_claim,
        scope=settings.upstream_scopes,
        client=OAuthClient(
            ClientCredentials(
                client_id=settings.oidc_client_id,
                client_secret=settings.oidc_client_secret.get_secret_value(),
                # GitHub documents the secret in the form body; HTTP Basic is not among its documented ways.
                auth_method="client_secret_post",
            )
        ),
        http=http,
        redirect_uri=f"{settings.public_url}{LOGIN_CALLBACK_PATH}",
    )


def cookie_jar(settings: Settings) -> CookieJar:
    """The sealed browser cookies (session, sign-in in progress)."""
    return CookieJar(
        # The cookie key is derived (HKDF, own label) from the newest token key: no extra secret.
        settings.token_key_ring,
        secure=urlsplit(settings.public_url).scheme == "https",
        session_seconds=settings.browser_session_seconds,
        login_seconds=LOGIN_COOKIE_SECONDS,
    )


def build_browser_routes(settings: Settings, connections: Connections, login: BrowserLogin) -> list[HTTPRouteHandler]:
    """``/connect/{flow}``, the two OAuth callbacks and ``/connect/signout``, with the browser login (the one
    the consent pages use too, so both compare the same (issuer, subject)) and the cookie jar."""
    sessions = BrowserSessions(cookie_jar(settings), connections.database)
    return [*browser_routes(connections, login, sessions), *signout_routes(sessions, login, settings.public_url)]
