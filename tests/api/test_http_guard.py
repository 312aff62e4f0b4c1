"""The server's own limits against slow or greedy clients, proven on real sockets against ``coatcheck serve``:
header and body read deadlines (slowloris), a header size cap, a connection cap, forwarded headers from
trusted proxies only, and a clean exit after SIGTERM."""

import signal
import socket
import threading
import time
from collections.abc import Iterator

import httpx2
import pytest

from tests.support.auth_mode import McpTokens
from tests.support.server import RunningServer, run_server
from tests.support.waiting import free_port, wait_until

HEADER_TIMEOUT = 1.0
BODY_TIMEOUT = 1.5
MARGIN = 6.0  # scheduling noise on a loaded machine; the deadline itself is asserted from below
PROXY_CLIENT = "203.0.113.7"
CONNECTION_CAP = 3


@pytest.fixture(scope="module")
def guarded(server_env: dict[str, str]) -> Iterator[RunningServer]:
    """A server with short read deadlines that believes forwarded headers from 127.0.0.1 (the test's proxy)."""
    port = free_port()
    env = {
        **server_env,
        "HEADER_READ_TIMEOUT_SECONDS": str(HEADER_TIMEOUT),
        "BODY_READ_TIMEOUT_SECONDS": str(BODY_TIMEOUT),
        "FORWARDED_ALLOW_IPS": "127.0.0.1",
    }
    with run_server(env, port=port, public_url=f"http://127.0.0.1:{port}") as running:
        yield running


def _connect(server: RunningServer) -> socket.socket:
    host, port = server.base_url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=5.0)
    sock.settimeout(0.2)
    return sock


def _trickle_until_closed(sock: socket.socket, chunks: Iterator[bytes], *, give_up_after: float) -> tuple[bytes, float]:
    """Send one chunk at a time, each after waiting up to 0.2 s for the server to answer or close.

    Returns what the server sent and when (seconds since the start) it closed the connection.
    """
    started = time.monotonic()
    received = b""
    while time.monotonic() - started < give_up_after:
        try:
            data = sock.recv(4096)
        except TimeoutError:
            try:
                sock.sendall(next(chunks))
            except (BrokenPipeError, ConnectionResetError):
                return received, time.monotonic() - started
            continue
        except ConnectionResetError:
            return received, time.monotonic() - started
        if not data:
            return received, time.monotonic() - started
        received += data
    raise AssertionError(f"the server kept a trickling connection open for {give_up_after}s")


def _forever(byte: bytes) -> Iterator[bytes]:
    while True:
        yield byte


def test_headers_that_trickle_in_are_cut_off_with_408_at_the_header_deadline(guarded: RunningServer) -> None:
    with _connect(guarded) as sock:
        sock.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        received, closed_after = _trickle_until_closed(sock, _forever(b"a"), give_up_after=HEADER_TIMEOUT + MARGIN)
    assert received.startswith(b"HTTP/1.1 408 ")
    assert HEADER_TIMEOUT - 0.1 <= closed_after < HEADER_TIMEOUT + MARGIN


def test_a_connection_that_sends_nothing_is_closed_at_the_header_deadline(guarded: RunningServer) -> None:
    with _connect(guarded) as sock:
        received, closed_after = _trickle_until_closed(sock, _forever(b""), give_up_after=HEADER_TIMEOUT + MARGIN)
    assert received == b""
    assert closed_after < HEADER_TIMEOUT + MARGIN


def _slow_post(server: RunningServer, token: str) -> bytes:
    host = server.base_url.removeprefix("http://").encode()
    return (
        b"POST /mcp HTTP/1.1\r\nHost: " + host + b"\r\nContent-Type: application/json\r\n"
        b"Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\n"
        b"Mcp-Method: tools/list\r\nAuthorization: Bearer " + token.encode() + b"\r\n"
        b"Content-Length: 100000\r\n\r\n{"
    )


async def test_a_body_that_trickles_in_is_cut_off_with_408_at_the_body_deadline(
    guarded: RunningServer, mcp_token: McpTokens
) -> None:
    token = await mcp_token("slow-body", resource=guarded.mcp_url)
    with _connect(guarded) as sock:
        sock.sendall(_slow_post(guarded, token))
        received, closed_after = _trickle_until_closed(sock, _forever(b" "), give_up_after=BODY_TIMEOUT + MARGIN)
    assert received.startswith(b"HTTP/1.1 408 ")
    assert BODY_TIMEOUT - 0.1 <= closed_after < BODY_TIMEOUT + MARGIN
    wait_until(lambda: "request body did not arrive in time" in guarded.log_text(), timeout=5, what="the log line")


def test_a_body_still_trickling_after_an_early_answer_is_cut_off_at_the_body_deadline(guarded: RunningServer) -> None:
    with _connect(guarded) as sock:
        sock.sendall(_slow_post(guarded, "not-a-valid-token"))  # answered 401 before the body is read
        received, closed_after = _trickle_until_closed(sock, _forever(b" "), give_up_after=BODY_TIMEOUT + MARGIN)
    assert received.startswith(b"HTTP/1.1 401 ")
    assert b"HTTP/1.1 408" not in received  # one answer only
    assert BODY_TIMEOUT - 0.1 <= closed_after < BODY_TIMEOUT + MARGIN


def _pipelined(server: RunningServer, second_request: bytes) -> bytes:
    """A GET and, on the same write, a second request queued behind it (HTTP/1.1 pipelining)."""
    host = server.base_url.removeprefix("http://").encode()
    return b"GET /healthz HTTP/1.1\r\nHost: " + host + b"\r\n\r\n" + second_request


def _queued_slow_post(server: RunningServer) -> bytes:
    host = server.base_url.removeprefix("http://").encode()
    return _pipelined(server, b"POST /healthz HTTP/1.1\r\nHost: " + host + b"\r\nContent-Length: 100000\r\n\r\nx")


def test_a_pipelined_body_that_trickles_in_after_its_answer_is_cut_off_at_the_body_deadline(
    guarded: RunningServer,
) -> None:
    # The reproduction: POST /healthz is answered (405) without reading its body, and every
    # trickled byte would reset the keep-alive timer; only the body deadline ends the connection.
    with _connect(guarded) as sock:
        sock.sendall(_queued_slow_post(guarded))
        received, closed_after = _trickle_until_closed(sock, _forever(b"x"), give_up_after=BODY_TIMEOUT + MARGIN)
    assert received.startswith(b"HTTP/1.1 200 ")  # the GET in front was served
    assert b"HTTP/1.1 408" not in received  # the POST had its answer already; no second one
    assert BODY_TIMEOUT - 0.1 <= closed_after < BODY_TIMEOUT + MARGIN


async def test_a_pipelined_body_the_app_waits_for_is_cut_off_with_408_at_the_body_deadline(
    guarded: RunningServer, mcp_token: McpTokens
) -> None:
    token = await mcp_token("slow-pipelined-body", resource=guarded.mcp_url)
    with _connect(guarded) as sock:
        sock.sendall(_pipelined(guarded, _slow_post(guarded, token)))
        received, closed_after = _trickle_until_closed(sock, _forever(b" "), give_up_after=BODY_TIMEOUT + MARGIN)
    assert received.startswith(b"HTTP/1.1 200 ")
    assert b"HTTP/1.1 408 " in received
    assert BODY_TIMEOUT - 0.1 <= closed_after < BODY_TIMEOUT + MARGIN


class _Tricklers:
    """Sockets that each pipeline a GET and a slow POST, then send one body byte every 0.2 s until closed.

    They connect one after another, each once the one before was served, as a client filling the
    server's connections would (connections opened at once would all be over the cap and get 503).
    """

    def __init__(self, server: RunningServer, count: int) -> None:
        self.sockets: list[socket.socket] = []
        for _ in range(count):
            sock = _connect(server)
            sock.sendall(_queued_slow_post(server))
            self.sockets.append(sock)
            _wait_for_answer(sock)
        self.closed_after: dict[int, float] = {}
        self._stop = threading.Event()
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._trickle, daemon=True)
        self._thread.start()

    def _trickle(self) -> None:
        while not self._stop.wait(0.2) and len(self.closed_after) < len(self.sockets):
            for index, sock in enumerate(self.sockets):
                if index not in self.closed_after and not self._still_open(sock):
                    self.closed_after[index] = time.monotonic() - self._started

    @staticmethod
    def _still_open(sock: socket.socket) -> bool:
        try:
            while sock.recv(4096):  # drain the answers; b"" is the server's close
                pass
            return False
        except TimeoutError:
            pass
        except OSError:
            return False
        try:
            sock.sendall(b"x")
        except OSError:
            return False
        return True

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for sock in self.sockets:
            sock.close()


def _wait_for_answer(sock: socket.socket) -> None:
    def answered() -> bool:
        try:
            return sock.recv(4096).startswith(b"HTTP/1.1 200 ")
        except TimeoutError:
            return False

    wait_until(answered, timeout=10, what="the pipelined GET's answer")


def test_pipelined_tricklers_cannot_hold_the_connection_cap_beyond_the_body_deadline(
    server_env: dict[str, str],
) -> None:
    body_timeout = 3.0  # room to see the cap held before the deadline frees it, on a loaded machine
    port = free_port()
    env = {**server_env, "MAX_CONNECTIONS": str(CONNECTION_CAP), "BODY_READ_TIMEOUT_SECONDS": str(body_timeout)}
    with run_server(env, port=port, public_url=f"http://127.0.0.1:{port}") as running:
        # uvicorn counts the connection being served against the cap: CAP - 1 others hold it full.
        tricklers = _Tricklers(running, CONNECTION_CAP - 1)
        try:
            while_held = httpx2.get(f"{running.base_url}/healthz", timeout=10.0)
            wait_until(
                lambda: len(tricklers.closed_after) == len(tricklers.sockets),
                timeout=body_timeout + MARGIN,
                what="the server to close every trickling connection",
            )
            fresh = httpx2.get(f"{running.base_url}/healthz", timeout=10.0)
        finally:
            tricklers.close()
    assert while_held.status_code == 503  # the tricklers did hold every connection
    assert fresh.status_code == 200
    assert max(tricklers.closed_after.values()) < body_timeout + MARGIN


def test_oversized_headers_are_refused_with_431(guarded: RunningServer) -> None:
    with _connect(guarded) as sock:
        sock.settimeout(5.0)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"b" * (70 * 1024) + b"\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 431 ")


def _access_lines(server: RunningServer, marker: str) -> list[str]:
    return [line for line in server.log_text().splitlines() if "coatcheck.access" in line and marker in line]


def _access_line_of(server: RunningServer, request_id: str) -> str:
    """The access line of the request sent with ``X-Request-Id: request_id``, once it is written."""
    marker = f"[{request_id}]"
    wait_until(lambda: bool(_access_lines(server, marker)), timeout=5, what="the request's access line")
    [line] = _access_lines(server, marker)
    return line


def test_behind_a_trusted_proxy_the_access_log_shows_the_forwarded_client(guarded: RunningServer) -> None:
    request_id = f"trusted-{time.monotonic_ns()}"
    headers = {"X-Forwarded-For": PROXY_CLIENT, "X-Request-Id": request_id}
    httpx2.get(f"{guarded.base_url}/healthz", headers=headers, timeout=10.0)
    line = _access_line_of(guarded, request_id)
    assert f"{PROXY_CLIENT}:" in line, line


def test_without_trusted_proxies_forwarded_headers_are_ignored(server: RunningServer) -> None:
    spoofed = "198.51.100.23"
    request_id = f"spoofed-{time.monotonic_ns()}"
    httpx2.get(
        f"{server.base_url}/healthz", headers={"X-Forwarded-For": spoofed, "X-Request-Id": request_id}, timeout=10.0
    )
    line = _access_line_of(server, request_id)
    assert spoofed not in server.log_text()
    assert "127.0.0.1:" in line, line


def test_requests_beyond_the_connection_cap_get_503_until_connections_close(server_env: dict[str, str]) -> None:
    port = free_port()
    env = {**server_env, "MAX_CONNECTIONS": str(CONNECTION_CAP)}
    with run_server(env, port=port, public_url=f"http://127.0.0.1:{port}") as running:
        holders = [_connect(running) for _ in range(CONNECTION_CAP)]
        try:
            for holder in holders:
                holder.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # headers never finished
            refused = httpx2.get(f"{running.base_url}/healthz", timeout=10.0)
        finally:
            for holder in holders:
                holder.close()

        def served() -> bool:
            return httpx2.get(f"{running.base_url}/healthz", timeout=10.0).status_code == 200

        wait_until(served, timeout=15, what="the server to accept requests again")
    assert refused.status_code == 503


def test_a_clean_sigterm_shutdown_exits_0(server_env: dict[str, str]) -> None:
    port = free_port()
    with run_server(server_env, port=port, public_url=f"http://127.0.0.1:{port}") as running:
        assert httpx2.get(f"{running.base_url}/readyz", timeout=10.0).status_code == 200
        running.process.send_signal(signal.SIGTERM)
        exit_code = running.process.wait(timeout=30)
    assert exit_code == 0
    log = running.log_text()
    assert "Application shutdown complete" in log
    assert "Finished server process" in log
