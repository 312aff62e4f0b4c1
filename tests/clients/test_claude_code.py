"""Claude Code (pinned in tests/support/npm/clients/package.json) adds Coatcheck as an HTTP MCP server and
health-checks it with ``claude mcp list``: connected with a bearer token header, "needs authentication" without
one. No model is involved; HOME (its config) is a temporary directory."""

import re
import subprocess
import uuid
from pathlib import Path

from tests.support.auth_mode import McpTokens
from tests.support.node import NodeClients, pinned_client_version
from tests.support.server import RunningServer

TIMEOUT = 120
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
        env={key: value for key, value in clients.env(home, **QUIET).items() if not key.startswith("ANTHROPIC_")},
        cwd=project,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, f"claude {args[:3]} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


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
