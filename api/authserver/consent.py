"""The consent page (``GET``/``POST /oauth/consent``) and the page where users revoke what they authorised
(``GET``/``POST /oauth/grants``).

An authorization request arrives here sealed (:meth:`PostgresProvider.authorize`). Without a browser
session the browser first signs in at the upstream provider with the existing ``/connect`` login
(:mod:`api.oauth.login`; the login cookie remembers to come back here), so the principal is the same
(upstream issuer, subject) pair as in resource-server mode. Then, per (principal, client):

* a consent remembered in PostgreSQL for the requested scopes issues the code at once;
* otherwise the page names the client, where its identity comes from, the redirect URI and the scopes, and
  asks. The form is CSRF-protected twice: its ``Origin`` must be this server's, and it carries a MAC of this
  browser's session cookie *and* the sealed request, so a token for one request approves no other.

Every answer to the client's redirect URI carries ``state`` and RFC 9207 ``iss``. Pages have
``frame-ancestors 'none'``, ``X-Frame-Options: DENY`` and ``no-store`` (:data:`api.oauth.pages.SECURITY_HEADERS`).
"""

import hashlib
import hmac
import logging
from html import escape
from typing import Annotated, Any
from urllib.parse import urlencode

from litestar import Request, Response, get, post
from litestar.enums import MediaType
from litestar.handlers import HTTPRouteHandler
from litestar.params import QueryParameter
from mcp.server.auth.provider import construct_redirect_uri

from api.authserver.provider import CONSENT_PATH, PendingAuthorization, PostgresProvider
from api.oauth import pages
from api.oauth.browser_sessions import BrowserSessions
from api.oauth.login import BrowserLogin, web_origin
from api.oauth.routes import sign_in_first
from api.oauth.session import SESSION
from store import authserver as store
from store.audit import AuditRepository
from store.crypto import derive_key
from store.db import Database
from store.principal import Principal

logger = logging.getLogger(__name__)

GRANTS_PATH = "/oauth/grants"
_CSRF_INFO = b"coatcheck/as-consent/v1/hmac-sha256"
RequestParam = Annotated[str | None, QueryParameter(name="request")]


def _html(title: str, body: str, *, status: int, form_target: str | None = None) -> Response[str]:
    headers = dict(pages.SECURITY_HEADERS)
    if form_target is not None:
        headers["Content-Security-Policy"] = headers["Content-Security-Policy"].replace(
            "form-action 'none'", f"form-action 'self' {form_target}"
        )
        headers["Referrer-Policy"] = "same-origin"  # so the form's POST carries a checkable Origin
    document = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)} · Coatcheck</title><style>"
        "body{font-family:system-ui,sans-serif;line-height:1.5;background:#f6f6f4;margin:0}"
        "main{max-width:36rem;margin:4rem auto;padding:2rem;background:#fff;border-radius:10px}"
        "dt{font-weight:600}dd{margin:0 0 .6rem}button{font:inherit;padding:.45rem 1.1rem;margin:.6rem .4rem 0 0}"
        f"</style></head><body><main><h1>{escape(title)}</h1>{body}</main></body></html>"
    )
    return Response(document, status_code=status, media_type=MediaType.HTML, headers=headers)


def _problem(title: str, reason: str, status: int = 400) -> Response[str]:
    return _html(title, f"<p>{escape(reason)}</p><p>Go back to your application and start again.</p>", status=status)


def consent_routes(
    provider: PostgresProvider,
    database: Database,
    login: BrowserLogin,
    sessions: BrowserSessions,
    *,
    public_url: str,
    csrf_key: bytes,
) -> list[HTTPRouteHandler]:
    """The consent and grants pages, closed over the instance's services."""
    own_origin = web_origin(public_url)
    jar = sessions.jar
    csrf = derive_key(csrf_key, _CSRF_INFO)

    def form_token(sealed_session: str, bound_to: str) -> str:
        return hmac.new(csrf, f"{sealed_session}\x00{bound_to}".encode(), hashlib.sha256).hexdigest()

    def form_token_matches(request: Request[Any, Any, Any], bound_to: str, token: object) -> bool:
        sealed = request.cookies.get(jar.name(SESSION))
        if sealed is None or not isinstance(token, str):
            return False
        return hmac.compare_digest(form_token(sealed, bound_to).encode(), token.encode("utf-8", "replace"))

    async def signed_in(request: Request[Any, Any, Any]) -> Principal | None:
        # The server-side record too: a cookie copied before sign-out opens nothing here either.
        session = await sessions.current(request.cookies)
        if session is None or session.issuer != login.issuer:
            return None
        return Principal(issuer=session.issuer, subject=session.subject)

    def back_to_client(pending: PendingAuthorization, **params: str | None) -> Response[str]:
        location = construct_redirect_uri(pending.redirect_uri, **params, state=pending.state, iss=provider.issuer)
        return pages.redirect(location)

    @get(CONSENT_PATH, include_in_schema=False)
    async def consent_page(request: Request[Any, Any, Any], sealed: RequestParam = None) -> Response[str]:
        pending = provider.open_request(sealed)
        if pending is None or sealed is None:
            return _problem("This authorization request cannot be used", "It is malformed or has expired.")
        principal = await signed_in(request)
        if principal is None:
            return await sign_in_first(login, sessions, f"{CONSENT_PATH}?{urlencode({'request': sealed})}")
        client = await provider.get_client(pending.client_id)
        if client is None:
            return _problem("Unknown application", "The application that asked is no longer registered.")
        async with database.one_statement() as conn:
            remembered = await store.consented_scopes(conn, principal, pending.client_id)
        if remembered is not None and set(pending.scopes) <= set(remembered):
            code = await provider.issue_code(principal, pending, remember=False)
            return back_to_client(pending, code=code)
        session_cookie = request.cookies.get(jar.name(SESSION)) or ""
        name = client.client_name or client.client_id
        body = (
            f"<p><strong>{escape(name)}</strong> asks to use Coatcheck as you "
            f"(<code>{escape(principal.subject)}</code> at {escape(principal.issuer)}).</p><dl>"
            f"<dt>Application</dt><dd>{escape(name)} — {escape(provider.identity_source(client))}; "
            f"client id <code>{escape(client.client_id)}</code></dd>"
            f"<dt>Returns you to</dt><dd><code>{escape(pending.redirect_uri)}</code></dd>"
            f"<dt>Access</dt><dd>{escape(' '.join(pending.scopes))}: your carts, orders and connected accounts "
            "at Coatcheck</dd></dl>"
            f'<form method="post" action="{CONSENT_PATH}">'
            f'<input type="hidden" name="request" value="{escape(sealed)}">'
            f'<input type="hidden" name="token" value="{form_token(session_cookie, sealed)}">'
            '<button type="submit" name="decision" value="allow">Allow</button>'
            '<button type="submit" name="decision" value="deny">Deny</button></form>'
            "<p>Only allow applications you started yourself. You can revoke access later at "
            f'<a href="{GRANTS_PATH}">{escape(public_url)}{GRANTS_PATH}</a>.</p>'
        )
        return _html(f"Allow {name}?", body, status=200, form_target=web_origin(pending.redirect_uri))

    @post(CONSENT_PATH, include_in_schema=False, status_code=200)
    async def consent_answer(request: Request[Any, Any, Any]) -> Response[str]:
        if request.headers.get("origin") != own_origin:
            logger.warning("consent refused: the form did not come from this server's page")
            return _problem("Request refused", "This answer did not come from Coatcheck's consent page.", 403)
        form = await request.form()
        sealed = form.get("request")
        pending = provider.open_request(sealed if isinstance(sealed, str) else None)
        principal = await signed_in(request)
        if pending is None or principal is None or not form_token_matches(request, str(sealed), form.get("token")):
            return _problem(
                "This consent cannot be used", "It expired, or this browser signed in as someone else.", 403
            )
        if form.get("decision") != "allow":
            async with database.one_statement() as conn:
                await AuditRepository(conn).record(
                    principal, "as_consent", provider=None, outcome="denied", detail=f"client {pending.client_id}"
                )
            return back_to_client(pending, error="access_denied", error_description="the user denied access")
        code = await provider.issue_code(principal, pending, remember=True)
        return back_to_client(pending, code=code)

    @get(GRANTS_PATH, include_in_schema=False)
    async def grants_page(request: Request[Any, Any, Any]) -> Response[str]:
        principal = await signed_in(request)
        if principal is None:
            return await sign_in_first(login, sessions, GRANTS_PATH)
        async with database.one_statement() as conn:
            grants = await store.grants_of(conn, principal)
        live: dict[str, int] = {}
        for grant in grants:
            if grant.revoked_at is None:
                live[grant.client_id] = live.get(grant.client_id, 0) + 1
        session_cookie = request.cookies.get(jar.name(SESSION)) or ""
        rows = "".join(
            f"<li>{escape(client_id)} ({count} active) "
            f'<form method="post" action="{GRANTS_PATH}" style="display:inline">'
            f'<input type="hidden" name="client_id" value="{escape(client_id)}">'
            f'<input type="hidden" name="token" value="{form_token(session_cookie, client_id)}">'
            '<button type="submit">Revoke</button></form></li>'
            for client_id, count in sorted(live.items())
        )
        body = f"<ul>{rows}</ul>" if rows else "<p>No application has access as you.</p>"
        return _html("Applications with access", body, status=200, form_target=own_origin)

    @post(GRANTS_PATH, include_in_schema=False, status_code=200)
    async def grants_revoke(request: Request[Any, Any, Any]) -> Response[str]:
        form = await request.form()
        client_id = form.get("client_id")
        principal = await signed_in(request)
        if (
            request.headers.get("origin") != own_origin
            or principal is None
            or not isinstance(client_id, str)
            or not form_token_matches(request, client_id, form.get("token"))
        ):
            return _problem("Request refused", "This did not come from Coatcheck's page for this browser.", 403)
        async with database.transaction() as conn:
            revoked = await store.revoke_grants_of(conn, principal, client_id=client_id, reason="user_revoked")
            await store.forget_consent(conn, principal, client_id)
            await AuditRepository(conn).record(
                principal, "as_revoke", provider=None, outcome="revoked", detail=f"client {client_id} by the user"
            )
        logger.info("a user revoked %d grants", len(revoked))
        return pages.redirect(f"{public_url}{GRANTS_PATH}")

    return [consent_page, consent_answer, grants_page, grants_revoke]
