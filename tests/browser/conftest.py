"""Headless Chromium for the browser tests: one browser per run, a fresh context (cookie jar) per user."""

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from playwright.async_api import Browser, async_playwright

from tests.browser.harness import CHROMIUM, CHROMIUM_ARGS, NAVIGATION_TIMEOUT_MS, BrowserUser

BrowserUserFactory = Callable[[str], Awaitable[BrowserUser]]


@pytest.fixture(scope="session")
async def chromium() -> AsyncIterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: run .ci/system-packages (installs Debian's chromium package)")
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
