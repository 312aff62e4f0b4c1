"""A person at a browser: headless Debian Chromium driven by Playwright, with its own cookie jar.

Never ``playwright install``: the browser is the system package (``.ci/system-packages`` installs it).
"""

from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from playwright.async_api import BrowserContext, Page

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
NAVIGATION_TIMEOUT_MS = 20_000
LOGIN_FIELD = "form[action*='/interaction/'] input[name=username]"


@dataclass
class Landing:
    """Where a navigation ended: the final URL, its HTTP status, headers and the page."""

    url: str
    status: int
    headers: dict[str, str]
    html: str
    text: str
    page: Page
    visited: list[str] = field(default_factory=list)

    def visited_path(self, path: str) -> list[str]:
        """Every URL of this navigation (redirect hops included) whose path is ``path``."""
        return [url for url in self.visited if urlsplit(url).path == path]


class BrowserUser:
    """Opens links like a person would, and signs in at the dev IdP's login page as ``username`` when asked."""

    def __init__(self, context: BrowserContext, username: str) -> None:
        self.context = context
        self.username = username
        self.sign_ins = 0

    async def open(self, url: str) -> Landing:
        page = await self.context.new_page()
        visited: list[str] = []
        page.on("request", lambda request: visited.append(request.url) if request.is_navigation_request() else None)
        response = await page.goto(url)
        if await page.locator(LOGIN_FIELD).count():
            self.sign_ins += 1
            await page.fill(LOGIN_FIELD, self.username)
            async with page.expect_navigation() as navigation:
                await page.click("button[type=submit]")
            response = await navigation.value
        assert response is not None, f"no response for {url}"
        return Landing(
            url=page.url,
            status=response.status,
            headers=await response.all_headers(),
            html=await page.content(),
            text=await page.inner_text("body"),
            page=page,
            visited=visited,
        )
