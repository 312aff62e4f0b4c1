"""Run the MCP Inspector's web UI (pinned in tests/support/npm/clients/package.json) for a browser test.

``inspector_web`` starts ``mcp-inspector --web`` on a free port with a fresh API token (the Inspector's own
guard against other local pages driving it; ``DANGEROUSLY_OMIT_AUTH`` is never set), an empty writable server
catalog, OAuth secrets in memory only, no browser auto-open, and the MCP Apps sandbox and app origin on
OS-assigned ports. It yields where to open the UI, and stops the process afterwards.
"""

import contextlib
import json
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.node import NodeClients
from tests.support.processes import answers_ok, stop_process
from tests.support.waiting import free_port, wait_until

STARTUP_TIMEOUT = 30.0
# Variables that would turn the Inspector's API token off or set it from outside; never inherited.
_NOT_INHERITED = ("DANGEROUSLY_OMIT_AUTH", "MCP_PROXY_AUTH_TOKEN", "MCP_INSPECTOR_API_TOKEN", "CLIENT_PORT")


@dataclass(frozen=True)
class InspectorWeb:
    """A running Inspector web UI: its origin, the URL a person opens (with the API token) and its log."""

    base_url: str
    open_url: str
    log_path: Path

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextlib.contextmanager
def inspector_web(clients: NodeClients, directory: Path) -> Iterator[InspectorWeb]:
    """Start the Inspector's web UI with its HOME, catalog and storage under ``directory``; stop it afterwards."""
    port = free_port()
    token = secrets.token_urlsafe(24)
    catalog = directory / "mcp.json"
    directory.mkdir(parents=True, exist_ok=True)
    catalog.write_text(json.dumps({"mcpServers": {}}))
    env = {key: value for key, value in clients.env(directory / "home").items() if key not in _NOT_INHERITED} | {
        "CLIENT_PORT": str(port),
        "MCP_SANDBOX_PORT": "0",
        "MCP_APP_ORIGIN_PORT": "0",
        "MCP_AUTO_OPEN_ENABLED": "false",
        "MCP_INSPECTOR_API_TOKEN": token,
        "MCP_INSPECTOR_SECRET_STORE": "memory",
        "MCP_STORAGE_DIR": str(directory / "storage"),
    }
    base_url = f"http://127.0.0.1:{port}"
    log_path = directory / "inspector-web.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [str(clients.node), str(clients.inspector), "--web", "--catalog", str(catalog)],
            env=env,
            cwd=directory,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        open_url = f"{base_url}/?MCP_INSPECTOR_API_TOKEN={token}"
        web = InspectorWeb(base_url=base_url, open_url=open_url, log_path=log_path)
        try:
            try:
                wait_until(
                    lambda: answers_ok(f"{base_url}/", process), timeout=STARTUP_TIMEOUT, what="the Inspector web UI"
                )
            except (RuntimeError, TimeoutError) as exc:
                raise RuntimeError(f"{exc}\n--- inspector output ---\n{web.log_text()}") from None
            yield web
        finally:
            stop_process(process)
