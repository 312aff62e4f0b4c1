"""``coatcheck serve --workers N``: N processes serve one port, and a SIGTERM shuts them all down cleanly."""

import os
import re
import signal
import socket
from collections.abc import Iterator

import httpx2
import pytest

from tests.support.auth_mode import McpTokens
from tests.support.server import RunningServer, run_server
from tests.support.waiting import free_port, wait_until
from tests.support.wire import post, response_message

WORKERS = 2


@pytest.fixture
def workers(server_env: dict[str, str]) -> Iterator[RunningServer]:
    port = free_port()
    env = {**server_env, "DB_POOL_SIZE": "2"}
    with run_server(env, port=port, public_url=f"http://127.0.0.1:{port}", extra_args=["--workers", str(WORKERS)]) as s:
        yield s


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(child) for child in f.read().split()]


def _established_on(port: int) -> set[int]:
    """Socket inodes of established TCP connections whose local port is ``port``."""
    inodes = set()
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":  # 01: ESTABLISHED
                inodes.add(int(fields[9]))
    return inodes


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        target = os.readlink(f"/proc/{pid}/fd/{fd}") if os.path.exists(f"/proc/{pid}/fd/{fd}") else ""
        if match := re.fullmatch(r"socket:\[(\d+)\]", target):
            inodes.add(int(match[1]))
    return inodes


async def test_every_worker_accepts_connections_on_the_one_port_and_serves_tool_calls(
    workers: RunningServer, mcp_token: McpTokens
) -> None:
    port = int(workers.base_url.rsplit(":", 1)[1])
    children = _children(workers.process.pid)
    assert len(children) == WORKERS
    token = await mcp_token("worker-user", resource=workers.mcp_url)
    held: list[socket.socket] = []
    try:

        def both_serving() -> bool:
            # Hold connections open until each worker has accepted one (the kernel picks the worker).
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 200 ")
            held.append(sock)
            established = _established_on(port)
            return all(_socket_inodes(child) & established for child in children)

        wait_until(both_serving, timeout=20, what="a connection accepted by each worker")
    finally:
        for sock in held:
            sock.close()
    with httpx2.Client(timeout=15.0) as http:
        created = post(http, workers.mcp_url, "tools/call", {"name": "cart_create", "arguments": {}}, token=token)
    assert response_message(created)["result"]["structuredContent"]["cart_id"].startswith("cart_")


def test_a_sigterm_to_the_supervisor_shuts_every_worker_down_cleanly_and_exits_0(workers: RunningServer) -> None:
    children = _children(workers.process.pid)
    assert len(children) == WORKERS
    started = "Application startup complete."
    wait_until(lambda: workers.log_text().count(started) == WORKERS, timeout=20, what="every worker started")
    workers.process.send_signal(signal.SIGTERM)
    assert workers.process.wait(timeout=30) == 0
    log = workers.log_text()
    for child in children:
        assert f"Finished server process [{child}]" in log, log[-2000:]
        assert not os.path.exists(f"/proc/{child}")
    assert "with 2 workers" in log


def test_a_worker_that_fails_to_start_stops_the_supervisor_with_its_status(server_env: dict[str, str]) -> None:
    port = free_port()
    # The supervisor binds the port, so a taken port never reaches a worker; a tracing misconfiguration
    # fails in each worker as it starts (status 2, as a single `coatcheck serve` exits with).
    env = {**server_env, "OTEL_TRACES_EXPORTER": "no-such-exporter"}
    with (
        pytest.raises(RuntimeError, match="exited with 2"),
        run_server(env, port=port, public_url=f"http://127.0.0.1:{port}", extra_args=["--workers", "2"]),
    ):
        pass
