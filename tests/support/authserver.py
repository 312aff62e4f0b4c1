"""Driving Coatcheck in authorization-server mode: a person's browser through sign-in and consent, and the
settings of such a server."""

import asyncio
import secrets
from dataclasses import dataclass, field

from playwright.async_api import BrowserContext, Page, Request
from playwright.async_api import Error as PlaywrightError

from tests.support.browser import LOGIN_FIELD

ALLOW = "button[name=decision][value=allow]"
DENY = "button[name=decision][value=deny]"


def authorization_server_env(base: dict[str, str]) -> dict[str, str]:
    """``base`` (a resource-server environment) switched to authorization-server mode with a fresh key ring."""
    return {
        **base,
        "AUTH_MODE": "authorization-server",
        "AS_SIGNING_KEYS": ",".join(secrets.token_urlsafe(32) for _ in range(2)),
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
