"""SIGTERM first takes the replica out of a balancer's rotation (/readyz 503), then stops it."""

import asyncio
import signal
import time

import httpx2

from tests.support.auth_mode import McpTokens
from tests.support.server import run_server
from tests.support.waiting import free_port, wait_until
from tests.support.wire import post, response_message

DRAIN_SECONDS = 4.0


def _status(url: str) -> int | None:
    try:
        return httpx2.get(url, timeout=2).status_code
    except httpx2.HTTPError:
        return None


def test_after_sigterm_readyz_answers_503_while_requests_are_still_served_until_the_drain_ends(
    server_env: dict[str, str], mcp_token: McpTokens
) -> None:
    port = free_port()
    env = {**server_env, "SHUTDOWN_DRAIN_SECONDS": str(DRAIN_SECONDS)}
    with run_server(env, port=port, public_url=f"http://127.0.0.1:{port}") as running:
        token = asyncio.run(mcp_token("drain-user", resource=running.mcp_url))
        assert _status(f"{running.base_url}/readyz") == 200

        signalled = time.monotonic()
        running.process.send_signal(signal.SIGTERM)
        wait_until(lambda: _status(f"{running.base_url}/readyz") == 503, timeout=3, what="/readyz to turn 503")
        readyz = httpx2.get(f"{running.base_url}/readyz", timeout=2)
        # Still listening and still serving: the balancer stops sending new work, nothing in flight is refused.
        with httpx2.Client(timeout=10) as http:
            created = post(http, running.mcp_url, "tools/call", {"name": "cart_create", "arguments": {}}, token=token)
        during_drain = time.monotonic() - signalled
        assert _status(f"{running.base_url}/healthz") == 200

        exit_code = running.process.wait(DRAIN_SECONDS + 15)
        stopped_after = time.monotonic() - signalled

    assert readyz.json() == {"status": "shutting down"}
    assert created.status_code == 200
    assert response_message(created)["result"]["structuredContent"]["cart_id"].startswith("cart_")
    assert during_drain < DRAIN_SECONDS, "the checks above ran after the drain; the test proves nothing"
    assert stopped_after >= DRAIN_SECONDS  # the listener stayed open for the whole drain period
    assert exit_code == 0  # a clean shutdown after the drain
    assert "Shutting down" in running.log_text()
