"""Unauthenticated hostile requests against a real ``coatcheck serve``: each gets its plain answer and at most
one quiet log line, never a traceback (log volume an attacker could buy per request)."""

import base64
import json
import socket
from collections.abc import Iterator

import httpx2
import pytest

from tests.support.auth_mode import McpTokens
from tests.support.server import RunningServer, run_server
from tests.support.waiting import free_port, wait_until
from tests.support.wire import PROTOCOL_VERSION, modern_request

BODY_TIMEOUT = 1.0


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unsigned_token(payload: str, header: str = '{"alg":"RS256","kid":"k1","typ":"JWT"}') -> str:
    return f"{_b64(header.encode())}.{_b64(payload.encode())}.{_b64(b'not-a-signature')}"


def _deep(depth: int) -> str:
    return '{"sub":' + "[" * depth + "]" * depth + "}"


class _LogTail:
    """What a server logged from a point on (the session's server is shared with other tests)."""

    def __init__(self, server: RunningServer) -> None:
        self._server = server
        self._start = len(server.log_text())

    def text(self) -> str:
        return self._server.log_text()[self._start :]


def _mark(server: RunningServer, log: _LogTail) -> None:
    """Wait until the log holds everything written so far: a request after it shows up in the access log."""
    httpx2.get(f"{server.base_url}/healthz?mark", timeout=10.0)
    wait_until(lambda: '"GET /healthz?[redacted]' in log.text(), timeout=5, what="the marker request's access line")


def _post_with_token(server: RunningServer, token: str) -> httpx2.Response:
    headers, body = modern_request("tools/list")
    return httpx2.post(server.mcp_url, headers={**headers, "Authorization": f"Bearer {token}"}, json=body, timeout=15.0)


@pytest.mark.parametrize(
    "token",
    [
        pytest.param(_unsigned_token(_deep(1_000)), id="payload-1000-deep"),
        pytest.param(_unsigned_token(_deep(15_000)), id="payload-15000-deep"),
        pytest.param(_unsigned_token('{"sub":"x"}', header='{"alg":' + "[" * 5_000 + "]" * 5_000 + "}"), id="header"),
    ],
)
def test_a_bearer_token_with_deeply_nested_json_gets_401_and_no_traceback(server: RunningServer, token: str) -> None:
    log = _LogTail(server)
    response = _post_with_token(server, token)
    _mark(server, log)
    assert response.status_code == 401
    assert "Traceback" not in log.text()
    assert "RecursionError" not in log.text()


@pytest.fixture(scope="module")
def short_body_deadline(server_env: dict[str, str]) -> Iterator[RunningServer]:
    port = free_port()
    env = {**server_env, "BODY_READ_TIMEOUT_SECONDS": str(BODY_TIMEOUT)}
    with run_server(env, port=port, public_url=f"http://127.0.0.1:{port}") as running:
        yield running


def _partial_post(server: RunningServer, token: str, protocol_version: str) -> bytes:
    host = server.base_url.removeprefix("http://").encode()
    headers, body = modern_request("tools/list")
    headers["MCP-Protocol-Version"] = protocol_version
    raw = json.dumps(body).encode()
    head = b"".join(f"{name}: {value}\r\n".encode() for name, value in headers.items())
    return (
        b"POST /mcp HTTP/1.1\r\nHost: " + host + b"\r\n" + head + b"Authorization: Bearer " + token.encode() + b"\r\n"
        b"Content-Length: " + str(len(raw) + 100).encode() + b"\r\n\r\n" + raw[:10]
    )


@pytest.mark.parametrize("protocol_version", [PROTOCOL_VERSION, "2025-11-25"])  # both of the SDK's lanes
@pytest.mark.parametrize("how", ["client-closes", "body-deadline"])
async def test_a_client_gone_mid_body_is_logged_quietly_without_a_traceback(
    short_body_deadline: RunningServer, mcp_token: McpTokens, how: str, protocol_version: str
) -> None:
    server = short_body_deadline
    token = await mcp_token("gone-mid-body", resource=server.mcp_url)
    log = _LogTail(server)
    host, port = server.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10.0) as sock:
        sock.sendall(_partial_post(server, token, protocol_version))
        if how == "body-deadline":
            assert sock.recv(4096).startswith(b"HTTP/1.1 408 ")  # blocks until the deadline closes it
    _mark(server, log)
    text = log.text()
    assert "Exception in ASGI application" not in text
    assert "Traceback" not in text
    assert "ClientDisconnect" not in text
    assert " ERROR " not in text
