"""Run a Coatcheck process behind the test-only token proxy (``token_proxy.py`` beside this module).

Two profiles: ``CONFORMANCE_PROFILE`` (``serve_profile``: the production app factory plus the fixture
tools the suite calls by name, served exactly like ``coatcheck serve``) and ``PRODUCTION_PROFILE``
(``coatcheck serve`` itself). The proxy adds a real dev-IdP access token to every request and changes
nothing else. The proxy's address is the server's ``PUBLIC_URL``, as it would be behind a real reverse
proxy, so the Host/Origin allow-list the server derives from it is the one the suite's DNS-rebinding
probes hit.
"""

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.auth_mode import McpTokens
from tests.support.processes import answers_ok, stop_process
from tests.support.waiting import free_port, wait_until

REPO_ROOT = Path(__file__).resolve().parents[3]
STARTUP_TIMEOUT = 30.0
STOP_TIMEOUT = 15.0

CONFORMANCE_PROFILE = (sys.executable, "-m", "tests.support.conformance.serve_profile")
PRODUCTION_PROFILE = (sys.executable, "-m", "api.cli", "serve")


@dataclass(frozen=True)
class ProxiedServer:
    """A Coatcheck process behind the token proxy."""

    public_url: str  # the proxy: what clients (and the suite) talk to; also the server's PUBLIC_URL
    upstream_url: str  # the Coatcheck process itself
    token_file: Path  # what the proxy adds as the bearer token (read at every request)
    exchange_log: Path
    server_log: Path

    @property
    def mcp_url(self) -> str:
        return f"{self.public_url}/mcp"

    def exchanges(self) -> list[dict[str, Any]]:
        """What the server answered to each request the proxy forwarded, oldest first."""
        if not self.exchange_log.exists():
            return []
        return [json.loads(line) for line in self.exchange_log.read_text().splitlines() if line.strip()]

    def server_log_text(self) -> str:
        return self.server_log.read_text(errors="replace")

    def set_token(self, token: str) -> None:
        """From now on the proxy adds ``token`` to every request."""
        self.token_file.write_text(token)


@contextlib.contextmanager
def run_behind_token_proxy(
    server_command: Sequence[str], server_env: dict[str, str], *, proxy_port: int, workdir: Path
) -> Iterator[ProxiedServer]:
    """Start the server command on a free port and the token proxy on ``proxy_port`` in front of it.

    The proxy adds no token until :meth:`ProxiedServer.set_token`.
    """
    upstream_port = free_port()
    public_url = f"http://127.0.0.1:{proxy_port}"
    token_file = workdir / "bearer-token"
    token_file.write_text("")
    server_log = workdir / "server.log"
    exchange_log = workdir / "exchanges.jsonl"
    with server_log.open("wb") as server_out, (workdir / "proxy.log").open("wb") as proxy_out:
        server = subprocess.Popen(
            [*server_command, "--host", "127.0.0.1", "--port", str(upstream_port)],
            env={**os.environ, **server_env, "PUBLIC_URL": public_url},
            stdout=server_out,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
        )
        proxy = subprocess.Popen(
            [sys.executable, "-m", "tests.support.conformance.token_proxy", "--port", str(proxy_port)],
            env={
                **os.environ,
                "PROXY_UPSTREAM": f"http://127.0.0.1:{upstream_port}",
                "PROXY_BEARER_TOKEN_FILE": str(token_file),
                "PROXY_EXCHANGE_LOG": str(exchange_log),
            },
            stdout=proxy_out,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
        )
        running = ProxiedServer(public_url, f"http://127.0.0.1:{upstream_port}", token_file, exchange_log, server_log)
        try:
            try:
                wait_until(
                    lambda: answers_ok(f"{public_url}/healthz", server, proxy),
                    timeout=STARTUP_TIMEOUT,
                    what=f"{server_command!r} behind the token proxy",
                )
            except (RuntimeError, TimeoutError) as exc:
                raise RuntimeError(f"{exc}\n--- server log ---\n{running.server_log_text()}") from None
            exchange_log.unlink(missing_ok=True)  # keep only what the tests send
            yield running
        finally:
            stop_process(proxy, timeout=STOP_TIMEOUT)
            stop_process(server, timeout=STOP_TIMEOUT)


@contextlib.asynccontextmanager
async def proxied_profile(
    profile: Sequence[str], server_env: dict[str, str], mcp_token: McpTokens, workdir: Path
) -> AsyncIterator[ProxiedServer]:
    """``profile`` (``CONFORMANCE_PROFILE`` or ``PRODUCTION_PROFILE``) behind the token proxy on a free port.

    The proxy's token is for the MCP resource as clients see it, the proxy's URL, and is obtained in the run's
    auth mode (:mod:`tests.support.auth_mode`; in authorization-server mode, through the proxy from the
    server itself) before the suite starts.
    """
    with run_behind_token_proxy(profile, server_env, proxy_port=free_port(), workdir=workdir) as running:
        running.set_token(await mcp_token("conformance-suite", resource=running.mcp_url))
        exchange_log = running.exchange_log
        exchange_log.unlink(missing_ok=True)  # keep only what the tests send
        yield running
