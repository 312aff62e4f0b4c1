"""MCP Inspector's CLI (pinned in tests/support/npm/clients/package.json) with ``--protocol-era modern`` and a
bearer token: it lists the tools, creates a cart and views it by the handle it got back."""

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

from tests.support.auth_mode import McpTokens
from tests.support.node import NodeClients, pinned_client_version
from tests.support.server import RunningServer

TIMEOUT = 120


def _run_inspector(
    clients: NodeClients, home: Path, url: str, token: str, *args: str
) -> subprocess.CompletedProcess[str]:
    command = [str(clients.node), str(clients.inspector), "--cli", url, "--protocol-era", "modern"]
    command += ["--header", f"Authorization: Bearer {token}", "--format", "json", *args]
    return subprocess.run(
        command, env=clients.env(home), cwd=home, capture_output=True, text=True, timeout=TIMEOUT, check=False
    )


def _inspect(clients: NodeClients, home: Path, url: str, token: str, *args: str) -> dict[str, Any]:
    result = _run_inspector(clients, home, url, token, *args)
    assert result.returncode == 0, f"inspector {args} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    answer: dict[str, Any] = json.loads(result.stdout)
    assert "result" in answer, answer
    return dict(answer["result"])


def test_the_inspector_is_the_pinned_version(clients: NodeClients, tmp_path: Path) -> None:
    result = subprocess.run(
        [str(clients.node), str(clients.inspector), "--version"],
        env=clients.env(tmp_path),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert pinned_client_version("@modelcontextprotocol/inspector") in result.stdout + result.stderr


async def test_the_inspector_cli_lists_tools_creates_a_cart_and_views_it_by_its_handle(
    clients: NodeClients, server: RunningServer, mcp_token: McpTokens, tmp_path: Path
) -> None:
    token = await mcp_token(f"inspector-{uuid.uuid4().hex[:8]}", resource=server.mcp_url)
    listed = _inspect(clients, tmp_path, server.mcp_url, token, "--method", "tools/list")
    names = {tool["name"] for tool in listed["tools"]}
    assert {"catalog_search", "cart_create", "cart_view", "cart_checkout"} <= names

    created = _inspect(clients, tmp_path, server.mcp_url, token, "--method", "tools/call", "--tool-name", "cart_create")
    assert created["isError"] is False, created
    cart_id = created["structuredContent"]["cart_id"]
    assert cart_id.startswith("cart_")

    viewed = _inspect(
        clients,
        tmp_path,
        server.mcp_url,
        token,
        "--method",
        "tools/call",
        "--tool-name",
        "cart_view",
        "--tool-arg",
        f"cart_id={cart_id}",
    )
    assert viewed["isError"] is False, viewed
    assert viewed["structuredContent"]["cart_id"] == cart_id
    assert viewed["structuredContent"]["items"] == []
    assert viewed["structuredContent"]["status"] == "open"


async def test_checkout_through_the_inspector_cli_is_refused_because_it_declares_no_elicitation(
    clients: NodeClients, server: RunningServer, mcp_token: McpTokens, tmp_path: Path
) -> None:
    token = await mcp_token(f"inspector-{uuid.uuid4().hex[:8]}", resource=server.mcp_url)
    created = _inspect(clients, tmp_path, server.mcp_url, token, "--method", "tools/call", "--tool-name", "cart_create")
    cart_id = created["structuredContent"]["cart_id"]
    checkout = ["--method", "tools/call", "--tool-name", "cart_checkout", "--tool-arg", f"cart_id={cart_id}"]
    result = _run_inspector(clients, tmp_path, server.mcp_url, token, *checkout)
    assert result.returncode != 0
    assert "form elicitation capability" in result.stdout + result.stderr
