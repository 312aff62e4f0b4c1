"""The browser side of a connection: ``/connect/{flow}``, ``/oauth/login/callback``, ``/oauth/callback``.

``GET /connect/{flow}``
    Needs a live browser session (:mod:`api.oauth.browser_sessions`: its cookie opens and sign-out has not
    ended it); without one the browser is sent to sign in at ``OIDC_ISSUER`` first. Then the
    signed-in (issuer, subject) is compared with the flow's principal *before anything else is done with the
    flow*: a mismatch is a 403 page, an audit entry and nothing stored. Editing the URL cannot change whose
    flow it is, because the flow row names its principal and the session names the browser's user. On a
    match a fresh ``state`` + PKCE verifier (+ nonce) is attached to the flow and the browser goes to the
    provider.
``GET /oauth/login/callback``
    Finishes the sign-in: ``state`` must equal the one in the sealed login cookie of this browser; the code
    is redeemed with PKCE and the ID token verified (``api.oauth.login``). Records a new browser session, sets
    its cookie and goes back to ``/connect/{flow}``.
``GET /oauth/callback``
    The provider's redirect. ``state`` must name an open flow (unknown, reused or expired: 400), and the
    browser's user must be the flow's principal *before* the state is consumed: a replay of the callback URL
    without the owner's session cookie (or with someone else's) is a 403 that consumes nothing and leaves the
    owner's flow usable. Then ``state`` is consumed exactly once; provider errors settle the flow as denied or
    failed; otherwise the code is redeemed with the flow's verifier and the tokens are stored.

Every response is an inert page or a redirect with ``no-store`` and anti-framing headers (``pages``).
Error pages are 4xx. Nothing rendered or logged contains a token, code, state or verifier; the access log
drops every query string (:class:`api.logs.RedactQueryStrings`).
"""

import hmac
import logging
from typing import Annotated, Any

from litestar import Request, Response, get
from litestar.datastructures import Cookie
from litestar.handlers import HTTPRouteHandler
from litestar.params import PathParameter, QueryParameter

from api.oauth import pages
from api.oauth.browser_sessions import BrowserSessions
from api.oauth.client import OAuthFailure, new_code_verifier, new_secret, provider_error_code
from api.oauth.login import BrowserLogin, LoginFailed
from api.oauth.providers import ProviderUnavailable
from api.oauth.service import Connections
from api.oauth.session import LOGIN, SESSION, LoginInProgress
from store.errors import DecryptError, NotFound
from store.flows import FLOW_PREFIX
from store.handles import is_well_formed

logger = logging.getLogger(__name__)

LOGIN_CALLBACK_PATH = "/oauth/login/callback"
# ``state`` is a reserved handler argument in Litestar (the app state), so the query parameter is aliased.
StateParam = Annotated[str | None, QueryParameter(name="state")]
# Declared explicitly: Litestar deprecates inferring where a handler argument comes from.
QueryParam = Annotated[str | None, QueryParameter()]


def _clearing(response: Response[str], cookie: Cookie) -> Response[str]:
    """``response``, also clearing ``cookie`` (a login that ended, a session that must not be reused)."""
    response.set_cookie(cookie)
    return response


async def sign_in_first(login: BrowserLogin, sessions: BrowserSessions, return_to: str) -> Response[str]:
    """Send a browser without a session to sign in at ``login``, coming back to ``return_to`` afterwards.

    ``return_to`` is a connect flow's handle or a path of ours (``/oauth/…``), sealed in the login cookie.
    """
    state, nonce, verifier = new_secret(), new_secret(), new_code_verifier()
    try:
        url = await login.authorization_url(state=state, nonce=nonce, code_verifier=verifier)
    except LoginFailed as exc:
        logger.warning("cannot start the browser sign-in: %s", exc)
        return pages.login_failed()
    pending = LoginInProgress(state=state, nonce=nonce, code_verifier=verifier, flow=return_to)
    return pages.redirect(url, cookies=[sessions.jar.login_cookie(pending)])


def browser_routes(connections: Connections, login: BrowserLogin, sessions: BrowserSessions) -> list[HTTPRouteHandler]:
    """The three browser routes, closed over the instance's services (no globals)."""
    registry = connections.registry
    jar = sessions.jar

    @get("/connect/{flow:str}", include_in_schema=False)
    async def connect(request: Request[Any, Any, Any], flow: Annotated[str, PathParameter()]) -> Response[str]:
        if len(flow) > 100 or not is_well_formed(flow, FLOW_PREFIX):
            return pages.not_found()
        session = await sessions.current(request.cookies)
        if session is None or session.issuer != login.issuer:
            return await sign_in_first(login, sessions, flow)
        browser_user = session.principal
        found = await connections.flow_for_browser(flow)
        if found is None:
            return pages.not_found()
        # The phishing defence: whoever opened the link must be the user who asked for it.
        if found.principal != browser_user:
            await connections.record_mismatch(found, browser_user, "connect_page")
            logger.warning("connect link opened by another user than its owner; refused")
            await sessions.end(session)  # so the rightful user can sign in here
            return _clearing(pages.wrong_user(), jar.clear(SESSION))
        provider = registry.get(found.provider)
        if found.status != "pending" or provider is None:
            return pages.not_found()
        try:
            url = await connections.authorization_redirect(found, provider)
        except NotFound:
            return pages.not_found()
        except ProviderUnavailable as exc:
            logger.warning("cannot send the browser to provider %s: %s", provider.name, exc)
            return pages.failed(provider.label)
        return pages.redirect(url)

    @get(LOGIN_CALLBACK_PATH, include_in_schema=False)
    async def login_callback(
        request: Request[Any, Any, Any],
        oauth_state: StateParam = None,
        code: QueryParam = None,
        error: QueryParam = None,
        iss: QueryParam = None,
    ) -> Response[str]:
        pending = jar.read_login(request.cookies)
        if pending is None or not oauth_state or not hmac.compare_digest(oauth_state.encode(), pending.state.encode()):
            return _clearing(
                pages.bad_callback(
                    "This sign-in response does not belong to a sign-in started in this browser, or it expired."
                ),
                jar.clear(LOGIN),
            )
        if error or not code or (iss is not None and iss != login.issuer):
            reason = provider_error_code(error) if error else "no code or bad iss"
            logger.info("browser sign-in did not complete: %s", reason)
            return _clearing(pages.login_failed(cancelled=reason == "access_denied"), jar.clear(LOGIN))
        try:
            person = await login.complete(code=code, code_verifier=pending.code_verifier, nonce=pending.nonce)
        except LoginFailed as exc:
            logger.info("browser sign-in failed: %s", exc)
            return _clearing(pages.login_failed(), jar.clear(LOGIN))
        # A sign-in started by the authorization server's pages returns to that page (a path of ours,
        # sealed in the login cookie); otherwise to the connect link.
        back_to = pending.flow if pending.flow.startswith("/oauth/") else f"/connect/{pending.flow}"
        return pages.redirect(
            f"{connections.public_url}{back_to}",
            cookies=[await sessions.start(person), jar.clear(LOGIN)],
        )

    @get("/oauth/callback", include_in_schema=False)
    async def provider_callback(
        request: Request[Any, Any, Any],
        oauth_state: StateParam = None,
        code: QueryParam = None,
        error: QueryParam = None,
        iss: QueryParam = None,
    ) -> Response[str]:
        if not oauth_state:
            return pages.bad_callback("The response carries no state, so it cannot be matched to a connection.")
        unusable = "It does not match an open connection request: it is unknown, expired, or was already used."
        pending = await connections.flow_for_state(oauth_state)
        if pending is None:
            return pages.bad_callback(unusable)
        # Whose browser this is, before anything is used up: a replay of the callback URL from another
        # browser (or from none) is refused and leaves the state, and so the owner's flow, as it was.
        session = await sessions.current(request.cookies)
        browser_user = session.principal if session else None
        if browser_user != pending.principal:
            logger.warning("provider callback from a browser that is not the flow owner's; refused, state kept")
            if browser_user is None:
                return pages.wrong_user()
            await connections.record_mismatch(pending, browser_user, "callback")
            if session is not None:
                await sessions.end(session)  # so the rightful user can sign in here
            return _clearing(pages.wrong_user(), jar.clear(SESSION))
        try:
            consumed = await connections.consume(oauth_state)
        except DecryptError:
            logger.error("a flow's sealed secrets did not open; check TOKEN_ENCRYPTION_KEYS")
            consumed = None
        if consumed is None:
            return pages.bad_callback(unusable)  # used up meanwhile by a concurrent callback from the owner
        flow = consumed.flow
        provider = registry.get(flow.provider)
        if provider is None:
            await connections.fail(flow, "failed", "unknown_provider")
            return pages.failed(flow.provider)
        if error:
            code_ = provider_error_code(error)
            if code_ == "access_denied":
                await connections.fail(flow, "denied", code_)
                return pages.denied(provider.label)
            await connections.fail(flow, "failed", code_)
            return pages.failed(provider.label)
        if iss is not None and provider.issuer is not None and iss.rstrip("/") != provider.issuer:
            # RFC 9207: the response came from another authorization server (mix-up attack).
            await connections.fail(flow, "failed", "issuer_mismatch")
            return pages.failed(provider.label)
        if not code:
            await connections.fail(flow, "failed", "missing_code")
            return pages.failed(provider.label)
        try:
            await connections.complete(consumed, provider, code)
        except (OAuthFailure, ProviderUnavailable) as exc:
            reason = exc.error if isinstance(exc, OAuthFailure) else "provider_unavailable"
            logger.info("connecting %s failed: %s", provider.name, reason)
            await connections.fail(flow, "failed", reason)
            return pages.failed(provider.label)
        logger.info("connection to %s completed", provider.name)
        return pages.connected(provider.label)

    return [connect, login_callback, provider_callback]
