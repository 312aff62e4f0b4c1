"""Signing the browser out of ``/connect``: ``GET /connect/signout`` (a page with a button), ``POST`` (ends it).

The POST ends the browser session server-side (its record in PostgreSQL is deleted, so a copy of the
session cookie taken before sign-out opens nothing any more, on any replica: :mod:`api.oauth.browser_sessions`)
and clears the session cookie of ``/connect`` (and a sign-in in progress). When the issuer's metadata
advertises an ``end_session_endpoint``, it then sends the browser there (OpenID RP-Initiated Logout 1.0, with
``client_id`` and ``post_logout_redirect_uri`` = this page, no ``id_token_hint`` because none is kept), so
the identity provider's own session ends too and the next person at this browser must sign in again. The
issuer may ask the person to confirm; either way it returns to ``GET /connect/signout``, which then says
"signed out". The redirect target is built from the issuer's metadata and configuration only, never from
the request. An issuer without that endpoint (or with its metadata unreachable) gets today's local sign-out,
and the page says that the account at the issuer may still be signed in.

The POST is refused (403, nothing changed, no redirect) unless it comes from Coatcheck's own page: its
``Origin`` must be ``PUBLIC_URL``'s, and while a session exists its form must carry the token the page was
rendered with, a MAC of that session cookie (:meth:`CookieJar.signout_token`). The cookies themselves are
``SameSite=Lax`` and ``HttpOnly``, so another site can neither send nor read them. The form page's CSP
allows ``form-action`` to the end-session endpoint's origin as well, since browsers check the redirect.
"""

import logging
from typing import Any

from litestar import Request, Response, get, post
from litestar.handlers import HTTPRouteHandler

from api.oauth import pages
from api.oauth.browser_sessions import BrowserSessions
from api.oauth.login import BrowserLogin, web_origin
from api.oauth.session import LOGIN, SESSION

logger = logging.getLogger(__name__)

SIGNOUT_PATH = "/connect/signout"


def signout_routes(sessions: BrowserSessions, login: BrowserLogin, public_url: str) -> list[HTTPRouteHandler]:
    """The sign-out page and its form target."""
    jar = sessions.jar
    own_origin = web_origin(public_url)  # as a browser's Origin header spells it (host in lower case)
    # Registered at the issuer as the client's post_logout_redirect_uri.
    after_issuer_signout = f"{public_url}{SIGNOUT_PATH}"

    async def issuer_signout() -> str | None:
        return await login.end_session_url(post_logout_redirect_uri=after_issuer_signout)

    @get(SIGNOUT_PATH, include_in_schema=False)
    async def signout_page(request: Request[Any, Any, Any]) -> Response[str]:
        sealed = request.cookies.get(jar.name(SESSION))
        session = await sessions.current(request.cookies)
        end_session = await issuer_signout()
        if sealed is None or session is None:
            return pages.signed_out(
                [jar.clear(SESSION), jar.clear(LOGIN)], issuer=login.issuer, issuer_signout=end_session is not None
            )
        return pages.signout_form(
            session.subject,
            SIGNOUT_PATH,
            jar.signout_token(sealed),
            issuer=login.issuer,
            issuer_signout=None if end_session is None else web_origin(end_session),
        )

    @post(SIGNOUT_PATH, include_in_schema=False, status_code=200)
    async def signout(request: Request[Any, Any, Any]) -> Response[str]:
        if request.headers.get("origin") != own_origin:
            logger.warning("sign-out refused: the request did not come from this server's page")
            return pages.signout_refused()
        sealed = request.cookies.get(jar.name(SESSION))
        session = await sessions.current(request.cookies)
        if sealed is not None and session is not None:
            form = await request.form()
            token = form.get("token")
            if not isinstance(token, str) or not jar.signout_token_matches(sealed, token):
                logger.warning("sign-out refused: missing or wrong form token")
                return pages.signout_refused()
            await sessions.end(session)  # every copy of this cookie stops working here, on every replica
        cleared = [jar.clear(SESSION), jar.clear(LOGIN)]
        end_session = await issuer_signout()
        if end_session is not None:
            return pages.redirect(end_session, cookies=cleared)
        return pages.signed_out(cleared, issuer=login.issuer, issuer_signout=False)

    return [signout_page, signout]
