"""Claude Code (pinned in tests/support/npm/clients/package.json) adds Coatcheck as an HTTP MCP server and
health-checks it with ``claude mcp list``: connected with a bearer token header, "needs authentication" without
one; and ``claude mcp login`` runs the whole OAuth flow in a pseudo-terminal, with a person signing in in
headless Chromium, after which Claude Code holds a real access token and lists the server connected. No model
is involved; HOME (its config and stored tokens) is a temporary directory."""

import json
import re
import shlex
import stat
import subprocess
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from store.db import Database
from tests.support.auth_mode import McpTokens
from tests.support.browser import BrowserUserFactory
from tests.support.mcp_client import call_ok, connect
from tests.support.node import NodeClients, pinned_client_version
from tests.support.server import RunningServer
from tests.support.sign_in import SignInSite, cart_owners
from tests.support.terminal import PseudoTerminal
from tests.support.waiting import wait_until

TIMEOUT = 120
# The whole login, from the command's start to its exit (a person signing in takes a few seconds here).
LOGIN_TIMEOUT = 45.0
# What `claude mcp login` prints under "If the browser didn't open, visit:".
AUTHORIZATION_URL = re.compile(r"visit:\s*(https?://\S+)")
# Nothing but the MCP health check: no update checks, no telemetry, no model traffic.
QUIET = {
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
}


def _claude(clients: NodeClients, home: Path, *args: str) -> str:
    project = home / "project"
    project.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [str(clients.claude), *args],
        env=_claude_env(clients, home),
        cwd=project,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, f"claude {args[:3]} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


def _claude_env(clients: NodeClients, home: Path, **extra: str) -> dict[str, str]:
    return {
        key: value for key, value in clients.env(home, **QUIET, **extra).items() if not key.startswith("ANTHROPIC_")
    }


def _status_line(listing: str, name: str) -> str:
    lines = [line for line in listing.splitlines() if line.startswith(f"{name}: ")]
    assert len(lines) == 1, listing
    return lines[0]


def test_claude_code_is_the_pinned_version(clients: NodeClients, tmp_path: Path) -> None:
    assert _claude(clients, tmp_path, "--version").startswith(pinned_client_version("@anthropic-ai/claude-code"))


async def test_claude_code_connects_with_a_bearer_header_and_needs_authentication_without(
    clients: NodeClients, server: RunningServer, mcp_token: McpTokens, tmp_path: Path
) -> None:
    token = await mcp_token(f"claude-{uuid.uuid4().hex[:8]}", resource=server.mcp_url)
    added = _claude(
        clients,
        tmp_path,
        "mcp",
        "add",
        "--transport",
        "http",
        "coatcheck",
        server.mcp_url,
        "--header",
        f"Authorization: Bearer {token}",
    )
    assert token not in added, "claude printed the bearer token"
    _claude(clients, tmp_path, "mcp", "add", "--transport", "http", "coatcheck-anonymous", server.mcp_url)

    listing = _claude(clients, tmp_path, "mcp", "list")
    connected = _status_line(listing, "coatcheck")
    assert server.mcp_url in connected
    assert re.search(r"\bConnected\b", connected), connected
    anonymous = _status_line(listing, "coatcheck-anonymous")
    assert "needs authentication" in anonymous.lower(), anonymous


def _recording_browser(directory: Path) -> tuple[Path, Path]:
    """A ``BROWSER`` program that opens nothing and appends the URL it is given to a file: (program, file)."""
    opened = directory / "opened-urls.txt"
    program = directory / "record-url"
    program.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$1\" >> {shlex.quote(str(opened))}\n")
    program.chmod(0o700)
    return program, opened


def _stored_oauth_entry(home: Path, name: str, url: str) -> dict[str, Any]:
    """Claude Code's OAuth record for the server ``name`` at ``url`` (``~/.claude/.credentials.json``, the
    store it uses on Linux), after checking that only the user can read the file."""
    credentials = home / ".claude" / ".credentials.json"
    assert credentials.exists(), f"claude stored no credentials under {home}"
    mode = stat.S_IMODE(credentials.stat().st_mode)
    assert mode == 0o600, f"{credentials} has mode {mode:o}, readable by others"
    entries = json.loads(credentials.read_text())["mcpOAuth"].values()
    matching = [entry for entry in entries if entry.get("serverName") == name and entry.get("serverUrl") == url]
    assert len(matching) == 1, f"{len(matching)} stored OAuth records for {name} at {url}"
    return dict(matching[0])


async def test_claude_mcp_login_signs_in_through_the_browser_and_claude_mcp_list_then_shows_connected(
    clients: NodeClients,
    sign_in_site: SignInSite,
    browser_user: BrowserUserFactory,
    database: Database,
    tmp_path: Path,
) -> None:
    username = f"claude-login-{uuid.uuid4().hex[:8]}"
    home = tmp_path / "home"
    browser, opened = _recording_browser(tmp_path)
    _claude(clients, home, "mcp", "add", "--transport", "http", "coatcheck", sign_in_site.mcp_url)
    before = _status_line(_claude(clients, home, "mcp", "list"), "coatcheck")
    assert "needs authentication" in before.lower(), before

    login = [str(clients.claude), "mcp", "login", "coatcheck"]
    with PseudoTerminal(login, env=_claude_env(clients, home, BROWSER=str(browser)), cwd=home / "project") as terminal:
        printed = (await terminal.appears(AUTHORIZATION_URL, within=LOGIN_TIMEOUT, what="the URL")).group(1)
        # Claude Code hands the same URL to $BROWSER (here a recorder), so no real browser is started.
        wait_until(lambda: opened.exists() and bool(opened.read_text()), timeout=10, what="claude to run $BROWSER")
        assert opened.read_text().split() == [printed]

        url = urlsplit(printed)
        query = {key: values[0] for key, values in parse_qs(url.query).items()}
        assert printed.startswith(sign_in_site.authorization_server.rstrip("/") + "/"), printed
        assert query["resource"] == sign_in_site.mcp_url  # RFC 8707: the token is asked for Coatcheck's MCP URL
        assert query["code_challenge_method"] == "S256"
        redirect = urlsplit(query["redirect_uri"])
        assert (redirect.scheme, redirect.hostname, redirect.path) == ("http", "localhost", "/callback"), redirect

        person = await browser_user(username)
        page = await person.context.new_page()
        await page.goto(printed)
        await sign_in_site.sign_in(page, username)
        await page.wait_for_url(lambda landed: landed.startswith(query["redirect_uri"]))
        assert "Authentication successful" in await page.inner_text("body")
        code = await terminal.exits(within=LOGIN_TIMEOUT)
        assert code == 0, f"claude mcp login exited {code}:\n{terminal.text()}"

        shown = terminal.text()

    listing = _claude(clients, home, "mcp", "list")
    after = _status_line(listing, "coatcheck")
    assert "✔ Connected" in after, after

    stored = _stored_oauth_entry(home, "coatcheck", sign_in_site.mcp_url)
    assert stored["discoveryState"]["authorizationServerUrl"] == sign_in_site.authorization_server.rstrip("/")
    assert stored["refreshToken"], "no refresh token stored"
    # A bare bool, so a failure cannot print the token it found.
    showed_a_token = any(
        secret in text for secret in (stored["accessToken"], stored["refreshToken"]) for text in (shown, listing)
    )
    assert not showed_a_token, "claude mcp login or claude mcp list showed a stored token"
    # The stored access token is the authorization server's, for Coatcheck's MCP URL, unexpired ...
    claims = (await sign_in_site.verify_access_token(stored["accessToken"])).claims
    assert claims["client_id"] == stored["clientId"], "the token belongs to another client"
    # ... and Coatcheck serves it as the person who signed in: what it creates belongs to them alone.
    async with connect(sign_in_site.mcp_url, stored["accessToken"]) as client:
        cart_id = str((await call_ok(client, "cart_create"))["cart_id"])
    someone_else = sign_in_site.principal(f"{username}-other")
    assert await cart_owners(database, cart_id, sign_in_site.principal(username), someone_else) == [
        sign_in_site.principal(username)
    ]
