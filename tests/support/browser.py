"""A person at a browser: headless Debian Chromium driven by Playwright, with its own cookie jar.

``LinkOpener`` is that person's side of URL-mode elicitation, as an SDK client's elicitation callback.

The ``chromium`` and ``browser_user`` fixtures are registered for the whole suite by tests/conftest.py
(``pytest_plugins``), so the browser and deploy tests share one browser per run.

Never ``playwright install``: the browser is the system package (``.ci/system-packages`` installs it).
"""

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from mcp.client import ClientRequestContext
from mcp.types import ElicitRequestParams, ElicitRequestURLParams, ElicitResult
from playwright.async_api import Browser, BrowserContext, Page, async_playwright

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
    """Opens links like a person would, and signs in at the dev IdP's login page as ``username`` when asked
    (or at another login page whose username field is ``login_field``)."""

    def __init__(self, context: BrowserContext, username: str, *, login_field: str = LOGIN_FIELD) -> None:
        self.context = context
        self.username = username
        self.login_field = login_field
        self.sign_ins = 0

    async def open(self, url: str) -> Landing:
        page = await self.context.new_page()
        visited: list[str] = []
        page.on("request", lambda request: visited.append(request.url) if request.is_navigation_request() else None)
        response = await page.goto(url)
        if await page.locator(self.login_field).count():
            self.sign_ins += 1
            await page.fill(self.login_field, self.username)
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


# What the ``browser_user`` fixture yields: ``await browser_user(username)``.
BrowserUserFactory = Callable[[str], Awaitable["BrowserUser"]]


class LinkOpener:
    """The user's side of URL-mode elicitation: consent, then open the link in this person's browser (once)."""

    def __init__(self, person: BrowserUser | None, answer: str = "accept") -> None:
        self.person = person
        self.answer = answer
        self.urls: list[str] = []
        self._landing: asyncio.Task[Landing] | None = None

    async def __call__(self, _context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        assert isinstance(params, ElicitRequestURLParams), f"expected URL mode, got {params!r}"
        self.urls.append(params.url)
        if self.person is not None and self.answer == "accept" and self._landing is None:
            self._landing = asyncio.create_task(self.person.open(params.url))
        return ElicitResult(action=self.answer)  # type: ignore[arg-type]

    async def landing(self) -> Landing:
        assert self._landing is not None, "the link was never opened"
        return await self._landing


def _require_chromium() -> None:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: run .ci/system-packages (installs Debian's chromium package)")


@pytest.fixture(scope="session")
async def chromium() -> AsyncIterator[Browser]:
    """One headless Chromium for the run."""
    _require_chromium()
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        await browser.close()


@pytest.fixture
async def browser_user(chromium: Browser) -> AsyncIterator[BrowserUserFactory]:
    """Make a person with their own browser profile (cookies), who signs in as the given username."""
    contexts = []

    async def make(username: str) -> BrowserUser:
        context = await chromium.new_context()
        context.set_default_navigation_timeout(NAVIGATION_TIMEOUT_MS)
        context.set_default_timeout(NAVIGATION_TIMEOUT_MS)
        contexts.append(context)
        return BrowserUser(context, username)

    yield make
    for context in contexts:
        await context.close()
