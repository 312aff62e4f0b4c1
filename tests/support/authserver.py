"""Driving Coatcheck in authorization-server mode: a person's browser through sign-in and consent, and the
settings of such a server (with the dev IdP as its OpenID upstream, or a GitHub-shaped OAuth 2.0 one)."""

import asyncio
import secrets
from dataclasses import dataclass, field

from playwright.async_api import BrowserContext, Page, Request
from playwright.async_api import Error as PlaywrightError

from tests.support.browser import LOGIN_FIELD
from tests.support.devidp import DevIdP, server_environment
from tests.support.github_like import GithubLike

ALLOW = "button[name=decision][value=allow]"
DENY = "button[name=decision][value=deny]"
# The upstream issuer a GitHub-shaped sign-in is configured with (UPSTREAM_ISSUER): GitHub's own site.
GITHUB_ISSUER = "https://github.com"


def authorization_server_env(base: dict[str, str]) -> dict[str, str]:
    """``base`` (a resource-server environment) switched to authorization-server mode with a fresh key ring."""
    return {
        **base,
        "AUTH_MODE": "authorization-server",
        "AS_SIGNING_KEYS": ",".join(secrets.token_urlsafe(32) for _ in range(2)),
    }


def _base_environment(database_url: str, public_url: str, idp: DevIdP, idp_secrets: dict[str, str]) -> dict[str, str]:
    return server_environment(
        database_url=database_url,
        public_url=public_url,
        idp=idp,
        client_secrets=idp_secrets,
        request_state_keys=",".join(secrets.token_urlsafe(32) for _ in range(2)),
        token_encryption_keys=",".join(secrets.token_urlsafe(32) for _ in range(2)),
    )


def dev_idp_upstream_env(
    *, database_url: str, public_url: str, upstream: DevIdP, upstream_secrets: dict[str, str]
) -> dict[str, str]:
    """Authorization-server mode at ``public_url`` signing people in at ``upstream`` (the dev IdP, found by
    OpenID discovery), which is also the "demo" provider /connect links connect. ``upstream`` needs
    ``devidp_clients(public_url, upstream_secrets)``."""
    return authorization_server_env(_base_environment(database_url, public_url, upstream, upstream_secrets))


def github_upstream_env(
    *, database_url: str, public_url: str, github: GithubLike, demo_idp: DevIdP, demo_secrets: dict[str, str]
) -> dict[str, str]:
    """Authorization-server mode at ``public_url`` signing people in at the GitHub-shaped ``github``
    (``UPSTREAM_KIND=oauth2``: no OpenID issuer at all, the subject is ``GET /user``'s numeric id), with
    ``demo_idp`` only as the "demo" provider /connect links connect. ``github`` must be serving
    ``<public_url>/oauth/login/callback``."""
    base = _base_environment(database_url, public_url, demo_idp, demo_secrets)
    del base["OIDC_ISSUER"]
    return {
        **authorization_server_env(base),
        "UPSTREAM_KIND": "oauth2",
        "UPSTREAM_ISSUER": GITHUB_ISSUER,
        "UPSTREAM_AUTHORIZATION_URL": github.authorization_url,
        "UPSTREAM_TOKEN_URL": github.token_url,
        "UPSTREAM_USERINFO_URL": github.userinfo_url,
        "OIDC_CLIENT_ID": github.client_id,
        "OIDC_CLIENT_SECRET": github.client_secret,
    }


@dataclass
class Authorization:
    """What a person saw while authorizing: the consent page (if any) and where the browser was sent."""

    redirected_to: str
    consent_text: str | None = None
    consent_headers: dict[str, str] = field(default_factory=dict)


async def authorize_in_browser(
    context: BrowserContext,
    url: str,
    *,
    username: str,
    redirect_uri: str,
    decision: str = "allow",
    login_field: str = LOGIN_FIELD,
) -> Authorization:
    """Open ``url`` as a person would: sign in upstream if asked, answer the consent page with ``decision``,
    and return where the browser was finally sent (the client's ``redirect_uri``; nothing listens there, so
    the browser's request to it is read off the page's request events and the navigation then fails).
    ``login_field`` is the upstream login page's username field (the dev IdP's by default)."""
    page: Page = await context.new_page()
    caught: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def catch(request: Request) -> None:
        if request.url.startswith(redirect_uri) and not caught.done():
            caught.set_result(request.url)

    page.on("request", catch)
    seen = Authorization(redirected_to="")
    response = None
    try:
        response = await page.goto(url)
    except PlaywrightError:
        if not caught.done():  # only the last hop, to the client's redirect URI, may fail
            raise
    if not caught.done() and await page.locator(login_field).count():
        await page.fill(login_field, username)
        async with page.expect_navigation() as navigation:
            await page.click("button[type=submit]")
        response = await navigation.value
    if not caught.done() and await page.locator(ALLOW).count():
        seen.consent_text = await page.inner_text("body")
        seen.consent_headers = await response.all_headers() if response is not None else {}
        await page.click(ALLOW if decision == "allow" else DENY)
    seen.redirected_to = await asyncio.wait_for(caught, timeout=20)
    await page.close()
    return seen
