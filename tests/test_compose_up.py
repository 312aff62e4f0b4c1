"""`docker compose up` the way a new user runs it, on machines without a Docker engine.

tests/support/compose starts every service from what compose.yaml and the Dockerfiles say (command,
environment, user, working directory, named volumes, service hostnames, depends_on conditions), so a change
to either that would break `docker compose up` breaks these tests. Then the README's curl request and the
docs/connections.md walkthrough run against it, with the browser steps in headless Chromium.
"""

import asyncio
import json
import os
import pwd
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import pytest
from playwright.async_api import Browser, async_playwright
from sqlalchemy.engine import make_url

from tests.support.browser import CHROMIUM, CHROMIUM_ARGS, NAVIGATION_TIMEOUT_MS, BrowserUser
from tests.support.compose.project import load_project
from tests.support.compose.up import LOCAL_POSTGRES, ComposeUp, compose_up, unavailable_reason
from tests.support.markdown import fenced_block
from tests.support.prerequisites import missing
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[1]
ISSUER = "http://localhost:9400"
SCRIPT_TIMEOUT = 90.0


@pytest.fixture(scope="module")
def up(admin_database_url: str) -> Iterator[ComposeUp]:
    reason = unavailable_reason()
    if reason is not None:
        missing(reason)
    url = make_url(admin_database_url)
    if (url.host, url.port or 5432) not in ((LOCAL_POSTGRES[0], LOCAL_POSTGRES[1]), ("localhost", LOCAL_POSTGRES[1])):
        missing(f"the db service is played by the PostgreSQL on {LOCAL_POSTGRES}; TEST_DATABASE_URL is elsewhere")
    with compose_up(
        load_project(ROOT), admin_dsn=url.set(drivername="postgresql").render_as_string(hide_password=False)
    ) as running:
        yield running


@pytest.fixture(scope="module")
async def chromium() -> AsyncIterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: run .ci/system-packages (installs Debian's chromium package)")
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        await browser.close()


async def _person(browser: Browser, username: str) -> BrowserUser:
    """A person with their own browser window (a fresh cookie jar is a private window)."""
    context = await browser.new_context()
    context.set_default_navigation_timeout(NAVIGATION_TIMEOUT_MS)
    context.set_default_timeout(NAVIGATION_TIMEOUT_MS)
    return BrowserUser(context, username)


def _uid_of(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^Uid:\s+(\d+)", status, re.M)
    assert match is not None
    return int(match[1])


def test_compose_up_starts_each_service_only_after_the_conditions_it_depends_on(up: ComposeUp) -> None:
    events = up.events
    assert events.index("db healthy") < events.index("migrate started")
    assert events.index("migrate exited 0") < events.index("app started")
    assert events.index("idp healthy") < events.index("app started")
    assert "app healthy" in events
    assert "demo catalog loaded" in up.services["migrate"].log_text()


def test_each_service_runs_as_its_images_user_and_the_idp_keeps_its_keys_in_the_named_volume(up: ComposeUp) -> None:
    idp, app = up.services["idp"].process, up.services["app"].process
    assert idp is not None
    assert app is not None
    assert _uid_of(idp.pid) == 1000  # USER node (uid 1000 in the node image)
    assert _uid_of(app.pid) == pwd.getpwnam("coatcheck").pw_uid == 10001  # useradd --uid 10001 coatcheck
    keys = up.volumes["idpkeys"] / "jwks.json"
    assert keys.stat().st_uid == 1000
    assert keys.stat().st_mode & 0o777 == 0o600
    assert {key["alg"] for key in json.loads(keys.read_text())["keys"]} == {"RS256", "ES256"}


def _mcp_result(body: str) -> dict[str, object]:
    """The JSON-RPC message of a response that is either plain JSON or an SSE stream."""
    data = [line.removeprefix("data:").strip() for line in body.splitlines() if line.startswith("data:")]
    message = json.loads(data[-1] if data else body)
    assert isinstance(message, dict)
    return message


async def test_the_readme_curl_request_creates_a_cart_for_the_dev_token_user(up: ComposeUp) -> None:
    readme = (ROOT / "README.md").read_text()
    commands = fenced_block(readme, after="### A dev token for curl", language="bash")
    assert "cart_create" in commands
    done = await asyncio.to_thread(
        subprocess.run, ["bash", "-c", commands], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    message = _mcp_result(done.stdout)
    assert "error" not in message, (message, done.stderr)
    result = message["result"]
    assert isinstance(result, dict)
    assert result.get("isError") is not True, result
    cart_id = result["structuredContent"]["cart_id"]
    assert re.fullmatch(r"cart_[A-Za-z0-9_-]{32}", cart_id), cart_id
    conn = await asyncpg.connect(up.database_dsn)
    try:
        owner = await conn.fetchrow("SELECT principal_iss, principal_sub FROM cart WHERE handle = $1", cart_id)
    finally:
        await conn.close()
    assert owner is not None
    assert tuple(owner) == (ISSUER, "alice")


class _Walkthrough:
    """docs/connections.md's whoami.py, run as the docs say, with a BROWSER that hands links to the test."""

    def __init__(self, workdir: Path) -> None:
        docs = (ROOT / "docs" / "connections.md").read_text()
        self.script = workdir / "whoami.py"
        self.script.write_text(fenced_block(docs, after="save\n   this as `whoami.py`", language="python"))
        self.opened = workdir / "opened-links"
        self.opened.touch()
        browser = workdir / "browser"
        # Python's webbrowser runs $BROWSER with the URL; this "browser" only tells the test what to open.
        browser.write_text(f'#!/bin/sh\nprintf "%s\\n" "$1" >> {self.opened}\n')
        browser.chmod(0o755)
        self.env = {**os.environ, "BROWSER": str(browser)}

    def links(self) -> list[str]:
        return self.opened.read_text().split()

    async def start(self, *args: str) -> asyncio.subprocess.Process:
        # `.venv/bin/python whoami.py`: this run's virtualenv is the project's.
        return await asyncio.create_subprocess_exec(
            sys.executable, str(self.script), *args, env=self.env, cwd=self.script.parent,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip

    async def next_link(self, process: asyncio.subprocess.Process, seen: int) -> str:
        def opened_or_ended() -> bool:
            return len(self.links()) > seen or process.returncode is not None

        await asyncio.to_thread(wait_until, opened_or_ended, timeout=SCRIPT_TIMEOUT, what="whoami.py to open a link")
        if len(self.links()) <= seen:
            stdout, stderr = await process.communicate()
            pytest.fail(f"whoami.py ended (exit {process.returncode}) without opening a link:\n{stdout.decode()}"
                        f"\n{stderr.decode()}")  # fmt: skip
        return self.links()[seen]

    @staticmethod
    async def answer(process: asyncio.subprocess.Process, text: str, *, close: bool = False) -> None:
        assert process.stdin is not None
        process.stdin.write(text.encode())
        await process.stdin.drain()
        if close:
            process.stdin.close()

    @staticmethod
    async def finish(process: asyncio.subprocess.Process) -> str:
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=SCRIPT_TIMEOUT)
        assert process.returncode == 0, stderr.decode()
        return stdout.decode()

    async def run(self, *args: str) -> str:
        process = await self.start(*args)
        assert process.stdin is not None
        process.stdin.close()  # a prompt now would fail the script: these runs must not ask anything
        return await self.finish(process)


async def _connections_of(up: ComposeUp, username: str) -> int:
    conn = await asyncpg.connect(up.database_dsn)
    try:
        count = await conn.fetchval(
            "SELECT count(*) FROM provider_connection WHERE principal_iss = $1 AND principal_sub = $2",
            ISSUER,
            username,
        )
    finally:
        await conn.close()
    assert isinstance(count, int)
    return count


async def test_the_connections_walkthrough_connects_in_the_browser_disconnects_and_refuses_another_user(
    up: ComposeUp, chromium: Browser, tmp_path: Path
) -> None:
    walk = _Walkthrough(tmp_path)
    alice, mallory = await _person(chromium, "alice"), await _person(chromium, "mallory")

    # Steps 2-3: run whoami.py, answer y, sign in as alice in the browser the script opened.
    whoami = await walk.start()
    await walk.answer(whoami, "y\n" * 30, close=True)  # y to every "Open this link?" while the browser works
    link = await walk.next_link(whoami, 0)
    assert link.startswith("http://localhost:8000/connect/flow_"), link
    landing = await alice.open(link)
    assert landing.status == 200, landing.text
    assert "Connected" in landing.text
    assert alice.sign_ins == 1

    # Step 4: the profile; run again, it answers at once from the stored token (no link, no question).
    assert "'sub': 'alice'" in await walk.finish(whoami)
    links_so_far = len(walk.links())
    assert "'sub': 'alice'" in await walk.run()
    assert len(walk.links()) == links_so_far
    assert await _connections_of(up, "alice") == 1

    # Step 5: disconnect revokes the grant at the dev IdP and forgets the tokens.
    disconnected = await walk.run("connection_disconnect")
    assert "'was_connected': True" in disconnected
    assert "'upstream_revocation': 'revoked'" in disconnected
    assert await _connections_of(up, "alice") == 0

    # Step 6: a new link, opened in a private window by somebody else: 403, nothing stored; then N.
    phished = await walk.start()
    await walk.answer(phished, "y\n")
    second_link = await walk.next_link(phished, links_so_far)
    assert second_link != link
    refused = await mallory.open(second_link)
    assert mallory.sign_ins == 1
    assert refused.status == 403
    assert "This link belongs to someone else" in refused.text
    assert await _connections_of(up, "mallory") == 0
    assert await _connections_of(up, "alice") == 0
    await walk.answer(phished, "N\n", close=True)
    assert "Connection cancelled" in await walk.finish(phished)
    gone = await alice.open(second_link)
    assert gone.status == 404
    assert await _connections_of(up, "alice") == 0
    for person in (alice, mallory):
        await person.context.close()
