"""Log injection: outside text (a request's method name, a provider's error string) cannot forge a line of
the text log or reach the operator's terminal as an escape sequence; the JSON log stays one object a line."""

import json
import logging
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import httpx2
import pytest

from api.logs import TextFormatter
from api.oauth.client import ClientCredentials, OAuthClient, OAuthFailure
from tests.support.auth_mode import McpTokens
from tests.support.json_server import QuietHandler, send_json, serving
from tests.support.server import RunningServer, run_server
from tests.support.waiting import free_port, wait_until
from tests.support.wire import PROTOCOL_VERSION

FORGED = "2026-01-01 00:00:00,000 ERROR api.auth [-]: forged line"
HOSTILE_METHOD = f"notifications/probe-{{}}\r\n{FORGED}\n\x1b]0;owned\x07\x1b[31mred\x9b2J\u2028after"
_RECORD_START = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ ")


@pytest.fixture(scope="module", params=["text", "json"])
def debug_server(request: pytest.FixtureRequest, server_env: dict[str, str]) -> Iterator[RunningServer]:
    port = free_port()
    env = {**server_env, "LOG_LEVEL": "DEBUG", "LOG_FORMAT": request.param}
    with run_server(env, port=port, public_url=f"http://127.0.0.1:{port}") as running:
        yield running


async def _send_notification(server: RunningServer, mcp_token: McpTokens, method: str) -> None:
    token = await mcp_token("log-injector", resource=server.mcp_url)
    body = {
        "jsonrpc": "2.0",
        "method": method,
        "params": {"_meta": {"io.modelcontextprotocol/protocolVersion": PROTOCOL_VERSION}},
    }
    headers = {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": PROTOCOL_VERSION,
        "Authorization": f"Bearer {token}",
    }
    async with httpx2.AsyncClient(timeout=15.0) as client:
        response = await client.post(server.mcp_url, headers=headers, content=json.dumps(body))
    assert response.status_code == 202  # acknowledged (and logged at DEBUG by the SDK)


_RAW_CONTROLS = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")


async def test_a_method_name_with_control_characters_cannot_forge_log_lines_in_either_format(
    debug_server: RunningServer, mcp_token: McpTokens
) -> None:
    marker = uuid.uuid4().hex
    method = HOSTILE_METHOD.format(marker)
    await _send_notification(debug_server, mcp_token, method)
    wait_until(lambda: marker in debug_server.log_text(), timeout=10, what="the method name in the debug log")
    text = debug_server.log_text()
    assert _RAW_CONTROLS.search(text) is None  # no CR, ESC, BEL, CSI or U+2028 reached the log
    lines = [line for line in text.splitlines() if line]
    assert not any(line.startswith(FORGED) for line in lines)
    (logged,) = [line for line in lines if marker in line]
    if lines[0].startswith("{"):
        records = [json.loads(line) for line in lines]  # every line is one whole JSON object
        assert any(method in record["message"] for record in records)  # and says exactly what was sent
    else:
        assert all(_RECORD_START.match(line) or line.startswith(" ") for line in lines)
        assert "\\r\\n" + FORGED + "\\n\\x1b]0;owned\\x07\\x1b[31mred\\x9b2J\\u2028after" in logged


def _record(message: str, *args: object, exc: BaseException | None = None) -> logging.LogRecord:
    record = logging.LogRecord("api.\x1b[2Jname", logging.INFO, __file__, 1, message, args, None)
    record.request_id = "id\r\nforged"
    if exc is not None:
        record.exc_info = (type(exc), exc, exc.__traceback__)
    return record


def test_the_text_format_escapes_every_field_and_indents_a_traceback_under_its_record() -> None:
    try:
        raise ValueError(f"bad\n{FORGED}\x1b]0;t\x07")
    except ValueError as exc:
        caught = exc
    line = TextFormatter().format(_record("said %s", f"hi\r\n{FORGED}\x9b31m", exc=caught))
    first, *continuation = line.split("\n")
    assert _RAW_CONTROLS.search(line) is None
    assert "api.\\x1b[2Jname [id\\r\\nforged]: said hi\\r\\n" + FORGED + "\\x9b31m" in first
    assert continuation
    assert all(part.startswith("  ") for part in continuation)
    assert "  Traceback (most recent call last):" in continuation
    assert f"  {FORGED}\\x1b]0;t\\x07" in continuation  # the exception's own text, indented: not a record


# --- a provider's OAuth error string -------------------------------------------------------------------------

HOSTILE_ERROR = f"invalid_grant\r\n{FORGED}\x1b]0;owned\x07" + "x" * 5000


@contextmanager
def _refusing_token_endpoint(error: object) -> Iterator[str]:
    """A real HTTP endpoint that answers every POST with 400 and ``{"error": error}``."""

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            send_json(self, 400, {"error": error, "error_description": "d"})

    with serving(Handler) as base:
        yield f"{base}/token"


def _logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == "api.oauth.client"]


async def test_a_providers_error_string_is_kept_only_as_a_code_and_logged_escaped_and_short(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = OAuthClient(ClientCredentials("coatcheck-test", "secret-of-the-test"))
    caplog.set_level(logging.INFO, logger="api.oauth.client")
    with _refusing_token_endpoint(HOSTILE_ERROR) as endpoint:
        with pytest.raises(OAuthFailure) as exchange:
            await client.exchange_code(endpoint, code="c", code_verifier="v" * 43, redirect_uri="http://127.0.0.1/cb")
        with pytest.raises(OAuthFailure) as refresh:
            await client.refresh(endpoint, "refresh-token")
    assert exchange.value.error == refresh.value.error == "provider_error"  # what flows, tools and logs see
    logged = _logged(caplog)
    assert len(logged) == 2
    for message in logged:
        assert "unrecognised error: invalid_grant\\r\\n2026-01-01" in message  # the operator sees what came
        assert _RAW_CONTROLS.search(message) is None
        assert "\n" not in message
        assert len(message) < 200


async def test_a_providers_well_formed_error_code_is_kept_as_it_is(caplog: pytest.LogCaptureFixture) -> None:
    client = OAuthClient(ClientCredentials("coatcheck-test", "secret-of-the-test"))
    caplog.set_level(logging.INFO, logger="api.oauth.client")
    with _refusing_token_endpoint("invalid_grant") as endpoint, pytest.raises(OAuthFailure) as refused:
        await client.refresh(endpoint, "refresh-token")
    assert refused.value.invalid_grant
    assert _logged(caplog) == ["refresh refused by the provider: invalid_grant"]
