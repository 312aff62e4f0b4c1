"""The MCP Inspector's web UI (pinned in tests/support/npm/clients/package.json) in headless Chromium, used as a
person would: add Coatcheck as a Streamable HTTP server, pick the modern protocol era (2026-07-28), connect;
the Inspector runs OAuth itself (protected-resource discovery, dynamic client registration, the redirect to
the authorization server), the person signs in, and back in the Inspector lists the tools and runs
``cart_create``, whose cart then belongs to that person.

Selectors are the UI's own labels (read from the package's bundle, clients/web/dist): the "Add Servers" menu,
the "Server ID", "Transport", "URL" and "Protocol Era" fields, the switch labelled
``Connect or disconnect "<id>"``, the Servers/Tools segmented control and the "Execute Tool" button.
"""

import re
import uuid
from pathlib import Path
from urllib.parse import urlsplit

from playwright.async_api import Locator, Page, Route

from store.db import Database
from tests.support.browser import BrowserUserFactory
from tests.support.inspector_web import InspectorWeb, inspector_web
from tests.support.node import NodeClients
from tests.support.sign_in import SignInSite, cart_owners

SERVER_ID = "coatcheck"
MODERN_ERA = re.compile(r"^Modern \(2026-07-28")
STRUCTURED_CART = re.compile(r'"cart_id":\s*"(cart_[A-Za-z0-9_-]+)"')
LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}


async def _offline(route: Route) -> None:
    # The UI asks Google for web fonts; nothing here may need the internet (CI has none to rely on).
    await route.abort()


async def _add_server(page: Page, mcp_url: str) -> Locator:
    """Add Coatcheck by hand (Streamable HTTP, its URL) and return its card."""
    await page.get_by_role("button", name="Add Servers").click()
    await page.get_by_role("menuitem", name="Add manually").click()
    dialog = page.get_by_role("dialog")
    await dialog.get_by_label("Server ID").fill(SERVER_ID)
    await dialog.get_by_label("Transport").click()
    await page.get_by_role("option", name="streamable-http").click()
    await dialog.get_by_label("URL").fill(mcp_url)
    await dialog.get_by_role("button", name="Add").click()
    await dialog.wait_for(state="hidden")
    switch = page.get_by_role("switch", name=f'Connect or disconnect "{SERVER_ID}"')
    return page.locator(".mantine-Card-root").filter(has=switch)


async def _choose_the_modern_era(page: Page, card: Locator) -> None:
    await card.get_by_role("button", name="Settings").click()
    settings = page.get_by_role("dialog")
    await settings.get_by_label("Protocol Era").click()
    await page.get_by_role("option", name=MODERN_ERA).click()
    await settings.get_by_role("button", name="Close").first.click()
    await settings.wait_for(state="hidden")


async def test_the_inspector_web_ui_signs_in_with_oauth_and_creates_a_cart_for_the_person_who_signed_in(
    clients: NodeClients,
    sign_in_site: SignInSite,
    browser_user: BrowserUserFactory,
    database: Database,
    tmp_path: Path,
) -> None:
    username = f"inspector-web-{uuid.uuid4().hex[:8]}"
    person = await browser_user(username)
    await person.context.route(lambda url: urlsplit(url).hostname not in LOOPBACK, _offline)
    page = await person.context.new_page()
    visited: list[str] = []
    page.on("framenavigated", lambda frame: visited.append(frame.url) if frame == page.main_frame else None)

    inspector: InspectorWeb
    with inspector_web(clients, tmp_path / "inspector") as inspector:
        await page.goto(inspector.open_url)
        card = await _add_server(page, sign_in_site.mcp_url)
        await _choose_the_modern_era(page, card)
        await card.locator(".mantine-Switch-track").click()

        await sign_in_site.sign_in(page, username)
        await card.get_by_text("Connected", exact=True).wait_for()
        assert "MCP 2026-07-28" in await card.inner_text()
        authorization_server = sign_in_site.authorization_server.rstrip("/") + "/"
        authorization_pages = [url for url in visited if url.startswith(authorization_server)]
        assert authorization_pages, f"the Inspector never sent the browser to the authorization server: {visited}"
        assert any(url.startswith(f"{inspector.base_url}/oauth/callback?code=") for url in visited), visited

        await page.locator(".mantine-SegmentedControl-root label", has_text="Tools").click()
        await page.get_by_text(re.compile(r"^Tools \(\d+\)$")).wait_for()
        for tool in ("catalog_search", "cart_create", "cart_view", "cart_checkout"):
            await page.get_by_text(tool, exact=True).wait_for()
        await page.get_by_text("cart_create", exact=True).click()
        await page.get_by_role("button", name="Execute Tool").click()
        await page.get_by_text("Structured Output", exact=True).wait_for()
        shown = STRUCTURED_CART.search(await page.inner_text("body"))
        assert shown is not None, "no cart handle in the Inspector's result"

    someone_else = sign_in_site.principal(f"{username}-other")
    assert await cart_owners(database, shown.group(1), sign_in_site.principal(username), someone_else) == [
        sign_in_site.principal(username)
    ]
