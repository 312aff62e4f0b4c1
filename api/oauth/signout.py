"""Signing the browser out of ``/connect``: ``GET /connect/signout`` (a page with a button), ``POST`` (ends it).

Only the session cookie of ``/connect`` (and a sign-in in progress) is cleared; the identity provider's own
session is not touched. The POST is refused (403, nothing changed) unless it comes from Coatcheck's own page:
its ``Origin`` must be ``PUBLIC_URL``'s, and while a session exists its form must carry the token the page
was rendered with, a MAC of that session cookie (:meth:`CookieJar.signout_token`). The cookies themselves are
``SameSite=Lax`` and ``HttpOnly``, so another site can neither send nor read them.
"""

import logging
from typing import Any
from urllib.parse import urlsplit

from litestar import Request, Response, get, post
from litestar.handlers import HTTPRouteHandler

from api.oauth import pages
from api.oauth.session import LOGIN, SESSION, CookieJar

logger = logging.getLogger(__name__)

SIGNOUT_PATH = "/connect/signout"


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def signout_routes(jar: CookieJar, public_url: str) -> list[HTTPRouteHandler]:
    """The sign-out page and its form target."""
    own_origin = _origin(public_url)

    @get(SIGNOUT_PATH, include_in_schema=False)
    async def signout_page(request: Request[Any, Any, Any]) -> Response[str]:
        sealed = request.cookies.get(jar.name(SESSION))
        session = jar.read_session(request.cookies)
        if sealed is None or session is None:
            return pages.signed_out([jar.clear(SESSION), jar.clear(LOGIN)])
        return pages.signout_form(session.subject, SIGNOUT_PATH, jar.signout_token(sealed))

    @post(SIGNOUT_PATH, include_in_schema=False, status_code=200)
    async def signout(request: Request[Any, Any, Any]) -> Response[str]:
        if request.headers.get("origin") != own_origin:
            logger.warning("sign-out refused: the request did not come from this server's page")
            return pages.signout_refused()
        sealed = request.cookies.get(jar.name(SESSION))
        if sealed is not None and jar.read_session(request.cookies) is not None:
            form = await request.form()
            token = form.get("token")
            if not isinstance(token, str) or not jar.signout_token_matches(sealed, token):
                logger.warning("sign-out refused: missing or wrong form token")
                return pages.signout_refused()
        return pages.signed_out([jar.clear(SESSION), jar.clear(LOGIN)])

    return [signout_page, signout]
