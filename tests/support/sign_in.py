"""Where a real MCP client's user signs in: a running Coatcheck and what a person does at its authorization page.

Client tests that drive a real OAuth flow (``claude mcp login``, the Inspector's web UI) take a
:class:`SignInSite` from the ``sign_in_site`` fixture (tests/clients/conftest.py), so the same test runs
against every way Coatcheck can be deployed: in resource-server mode the authorization page is the dev
IdP's; in authorization-server mode it is Coatcheck's own, with the upstream sign-in and a consent page.
"""

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx2
from joserfc.jwk import KeySet
from joserfc.jwt import Token
from playwright.async_api import Page

from store.carts import CartRepository
from store.db import Database
from store.errors import NotFound
from store.principal import Principal
from tests.support.authserver import ALLOW
from tests.support.browser import LOGIN_FIELD
from tests.support.github_like import GITHUB_LOGIN_FIELD
from tests.support.jose import verify_jwt

# What a site's ``sign_in`` does: on a page that has just been sent to the authorization server, sign in as
# the username and consent, leaving the browser on its way back to the client's redirect URI.
SignIn = Callable[[Page, str], Awaitable[None]]


@dataclass(frozen=True)
class SignInSite:
    """A running Coatcheck and how a person signs in at its authorization page in Chromium.

    ``authorization_server`` is the issuer of the access tokens clients get (as it writes it);
    ``principal(username)`` is whom Coatcheck then serves; ``sign_in`` is the person's part in the browser.
    """

    mode: str
    mcp_url: str
    authorization_server: str
    principal: Callable[[str], Principal]
    sign_in: SignIn

    async def verify_access_token(self, token: str) -> Token:
        """Check ``token`` as a resource server would: signed by a key the authorization server publishes,
        issued by it, for the MCP URL, not expired (raises a ``joserfc`` error otherwise)."""
        base = self.authorization_server.rstrip("/")
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(10.0)) as http:
            metadata = (await http.get(f"{base}/.well-known/oauth-authorization-server")).raise_for_status().json()
            jwks = (await http.get(metadata["jwks_uri"])).raise_for_status().json()
        return verify_jwt(token, KeySet.import_key_set(jwks), issuer=self.authorization_server, audience=self.mcp_url)


async def sign_in_at_the_dev_idp(page: Page, username: str) -> None:
    """The dev IdP's login form: any username, no password; it grants consent itself."""
    await page.locator(LOGIN_FIELD).fill(username)
    await page.locator("form[action*='/interaction/'] button[type=submit]").click()


async def sign_in_at_the_dev_idp_and_allow(page: Page, username: str) -> None:
    """Authorization-server mode with the dev IdP upstream: Coatcheck sends the browser to the dev IdP's login
    form, then back to its own consent page, where the person allows the client."""
    await sign_in_at_the_dev_idp(page, username)
    await page.locator(ALLOW).click()


async def sign_in_at_github_like_and_allow(page: Page, username: str) -> None:
    """Authorization-server mode with the GitHub-shaped upstream: its login form (a username, as GitHub's is
    named ``login``), then Coatcheck's consent page."""
    await page.locator(GITHUB_LOGIN_FIELD).fill(username)
    await page.locator("form[action='/session'] button[type=submit]").click()
    await page.locator(ALLOW).click()


async def cart_owners(database: Database, cart_id: str, *candidates: Principal) -> list[Principal]:
    """Which of ``candidates`` can see the cart: the store scopes every read to (issuer, subject)."""
    owners = []
    for principal in candidates:
        async with database.transactional_connection() as conn:
            try:
                await CartRepository(conn).view(principal, cart_id)
            except NotFound:
                continue
        owners.append(principal)
    return owners
