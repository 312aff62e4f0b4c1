"""What an operator sees of a running server: JSON logs, Prometheus metrics and OpenTelemetry traces.

One real ``coatcheck serve`` with ``LOG_FORMAT=json``, ``METRICS_ENABLED=true`` and
``OTEL_TRACES_EXPORTER=console`` (spans are printed as JSON to the same captured output), used by real
MCP clients; every test also checks that no token, secret or raw subject shows up in what it reads.
"""

import asyncio
import contextlib
import hashlib
import http.server
import json
import os
import re
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import asyncpg  # type: ignore[import-untyped]
import httpx2
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from prometheus_client.parser import text_string_to_metric_families

from api.logs import principal_digest, principal_digest_key
from store.crypto import TokenCipher
from store.db import Database
from store.principal import Principal
from store.vault import TokenSet, VaultRepository
from tests.support.auth_mode import McpTokens
from tests.support.devidp import DevIdP
from tests.support.inprocess import settings_from
from tests.support.leaks import assert_no_secrets
from tests.support.mcp_client import connect
from tests.support.mrtr import ScriptedUser, confirms
from tests.support.processes import answers_ok, stop_process
from tests.support.server import RunningServer, run_server
from tests.support.waiting import free_port, wait_until
from tests.support.wire import modern_request, post, response_message

POOL_SIZE = 2


@pytest.fixture(scope="module")
def observed(server_env: dict[str, str]) -> Iterator[RunningServer]:
    port = free_port()
    env = {
        **server_env,
        "LOG_FORMAT": "json",
        "METRICS_ENABLED": "true",
        "OTEL_TRACES_EXPORTER": "console",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "PYTHONUNBUFFERED": "1",  # each span is printed in one write, so it never interleaves with a log line
        "DB_POOL_SIZE": str(POOL_SIZE),
        "DB_MAX_OVERFLOW": "0",
    }
    with run_server(env, port=port, public_url=f"http://127.0.0.1:{port}") as running:
        yield running


@pytest.fixture
def user() -> str:
    return f"observed-{uuid.uuid4().hex[:10]}"


async def _token(mcp_token: McpTokens, server: RunningServer, username: str) -> str:
    return await mcp_token(username, resource=server.mcp_url)


@contextlib.asynccontextmanager
async def _client(mcp_token: McpTokens, server: RunningServer, username: str) -> AsyncIterator[Client]:
    async with connect(server.mcp_url, await _token(mcp_token, server, username)) as connected:
        yield connected


def _json_objects(text: str) -> list[dict[str, Any]]:
    """Every top-level JSON object in the captured output (one-line log records and indented spans)."""
    decoder = json.JSONDecoder()
    found: list[dict[str, Any]] = []
    position = 0
    while (start := text.find("{", position)) != -1:
        try:
            value, end = decoder.raw_decode(text, start)
        except ValueError:
            position = start + 1
            continue
        if isinstance(value, dict):
            found.append(value)
        position = end
    return found


def _outside_json(text: str) -> str:
    """Whatever the captured output holds outside top-level JSON objects."""
    decoder = json.JSONDecoder()
    outside: list[str] = []
    position = 0
    while (start := text.find("{", position)) != -1:
        outside.append(text[position:start])
        try:
            _, position = decoder.raw_decode(text, start)
        except ValueError:
            outside.append("{")
            position = start + 1
    outside.append(text[position:])
    return "".join(outside)


def _log_records(server: RunningServer) -> list[dict[str, Any]]:
    return [entry for entry in _json_objects(server.log_text()) if "logger" in entry and "level" in entry]


def _spans(server: RunningServer) -> list[dict[str, Any]]:
    return [entry for entry in _json_objects(server.log_text()) if "context" in entry and "name" in entry]


def _request_lines(server: RunningServer) -> list[dict[str, Any]]:
    """The one line each HTTP request writes (``coatcheck.access``)."""
    return [r for r in _log_records(server) if r["logger"] == "coatcheck.access"]


def _tool_lines(server: RunningServer, principal: str | None = None) -> list[dict[str, Any]]:
    lines = [r for r in _request_lines(server) if r.get("mcp_method") == "tools/call"]
    return [r for r in lines if principal is None or r.get("principal") == principal]


def _secrets(server_env: dict[str, str]) -> list[str]:
    return [
        *server_env["REQUEST_STATE_KEYS"].split(","),
        *server_env["TOKEN_ENCRYPTION_KEYS"].split(","),
        server_env["OIDC_CLIENT_SECRET"],
        server_env["DEMO_CLIENT_SECRET"],
    ]


def _assert_nothing_secret(text: str, *values: str) -> None:
    assert_no_secrets(text, values)


# --- logs ------------------------------------------------------------------------------------------------------


async def test_each_tool_call_logs_one_json_line_with_its_request_id_tool_outcome_status_duration_and_principal_digest(
    observed: RunningServer, mcp_token: McpTokens, user: str, server_env: dict[str, str]
) -> None:
    token = await _token(mcp_token, observed, user)
    with httpx2.Client(timeout=15.0) as http:
        created = post(http, observed.mcp_url, "tools/call", {"name": "cart_create", "arguments": {}}, token=token)
        missing = {"name": "cart_view", "arguments": {"cart_id": "cart_nope"}}
        failed = post(http, observed.mcp_url, "tools/call", missing, token=token)
    assert not response_message(created)["result"].get("isError")
    assert response_message(failed)["result"]["isError"] is True

    ids = {created.headers["x-request-id"], failed.headers["x-request-id"]}
    wait_until(
        lambda: ids <= {line["request_id"] for line in _request_lines(observed)}, timeout=5, what="the request lines"
    )
    # One line per call: the HTTP request's line carries the tool call's facts too; no access line or tool
    # line besides it (a first call also logs the JWKS fetch, a failing tool the SDK's own INFO line).
    [ok] = [line for line in _request_lines(observed) if line["request_id"] == created.headers["x-request-id"]]
    [error] = [line for line in _request_lines(observed) if line["request_id"] == failed.headers["x-request-id"]]
    others = {r["logger"] for r in _log_records(observed) if r["request_id"] in ids}
    assert not others & {"uvicorn.access", "coatcheck.tools"}, others
    assert (ok["logger"], ok["mcp_method"], ok["tool"], ok["outcome"], ok["level"]) == (
        "coatcheck.access",
        "tools/call",
        "cart_create",
        "ok",
        "INFO",
    )
    assert (error["tool"], error["outcome"]) == ("cart_view", "tool_error")
    for line in (ok, error):
        assert (line["method"], line["path"], line["status"]) == ("POST", "/mcp", 200)
        assert line["client"].startswith("127.0.0.1:")
        assert isinstance(line["duration_ms"], int | float)
        assert line["duration_ms"] >= 0
        assert re.fullmatch(r"[0-9a-f]{16}", line["principal"])
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["time"])
    assert ok["principal"] == error["principal"]  # one user, one digest

    log = observed.log_text()
    _assert_nothing_secret(log, token, *_secrets(server_env))
    assert user not in log  # the subject: only its digest


async def test_every_logger_writes_in_the_one_json_format(
    observed: RunningServer, mcp_token: McpTokens, user: str
) -> None:
    async with _client(mcp_token, observed, user) as client:
        await client.call_tool("cart_list", {})
    wait_until(lambda: bool(_tool_lines(observed)), timeout=5, what="a tool-call line")
    text = observed.log_text()
    assert not _outside_json(text).strip(), _outside_json(text)[:2000]  # nothing but JSON records (and spans)
    loggers = {record["logger"] for record in _log_records(observed)}
    assert {"uvicorn.error", "coatcheck.access"} <= loggers
    assert any(r["message"].startswith("Uvicorn running on") for r in _log_records(observed))


async def test_the_principal_digest_differs_between_users_and_is_keyed(
    observed: RunningServer, devidp: DevIdP, mcp_token: McpTokens, user: str, server_env: dict[str, str]
) -> None:
    other = f"{user}-other"
    observed.log_text_so_far()  # the module's server has logged other tests' calls already: all written
    before = len(_tool_lines(observed))
    for username in (user, other):
        async with _client(mcp_token, observed, username) as connected:
            await connected.call_tool("cart_list", {})
    wait_until(lambda: len(_tool_lines(observed)) >= before + 2, timeout=5, what="this test's two tool-call lines")
    digests = [line["principal"] for line in _tool_lines(observed)[before:]]
    # Keyed with the server's own token key: what the logs show is exactly this digest of each caller.
    key = principal_digest_key(settings_from(server_env).token_key_ring)
    expected = [principal_digest(key, Principal(issuer=devidp.issuer, subject=name)) for name in (user, other)]
    assert digests == expected
    assert expected[0] != expected[1]
    for username in (user, other):
        unkeyed = hashlib.sha256(f"{devidp.issuer}\n{username}".encode()).hexdigest()
        assert unkeyed[:16] not in digests  # a dictionary of likely subjects does not reveal who it is


async def test_log_level_warning_silences_info_from_every_logger(
    server_env: dict[str, str], mcp_token: McpTokens, user: str
) -> None:
    port = free_port()
    env = {**server_env, "LOG_LEVEL": "WARNING"}
    with run_server(env, port=port, public_url=f"http://127.0.0.1:{port}") as running:
        # A failing tool call makes the SDK's logger say so at INFO; the request itself is an INFO access line.
        async with _client(mcp_token, running, user) as client:
            failed = await client.call_tool("cart_view", {"cart_id": "cart_nope"})
        # The positive control, written after the INFO lines would have been: a refused sign-out warns.
        refused = httpx2.post(
            f"{running.base_url}/connect/signout", headers={"Origin": "https://evil.example"}, timeout=10
        )
        wait_until(lambda: "sign-out refused" in running.log_text(), timeout=5, what="the WARNING line")
        log = running.log_text()
    assert failed.is_error
    assert refused.status_code == 403
    assert re.search(r"\bWARNING\b.*sign-out refused", log), log[-3000:]
    assert not re.search(r"\bINFO\b", log), log[-3000:]


LOGGED_REQUESTS = 400


async def test_a_clean_sigterm_shutdown_writes_the_line_of_every_request_answered_even_to_a_stalled_reader(
    server_env: dict[str, str], mcp_token: McpTokens, user: str
) -> None:
    # The server's log goes to a pipe nobody reads until after the SIGTERM: it fills (64 KiB), so the log
    # writer is stuck behind it and its queue holds most of the lines when the shutdown begins. Requests are
    # still answered meanwhile (the writing is off the event loop), and the shutdown must write them all.
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    process = await asyncio.to_thread(
        subprocess.Popen,
        [sys.executable, "-m", "api.cli", "serve", "--host", "127.0.0.1", "--port", str(port)],
        env={**os.environ, **server_env, "PUBLIC_URL": base_url},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until(lambda: answers_ok(f"{base_url}/healthz", process), timeout=30, what="the server")
        token = await _token(mcp_token, RunningServer(base_url, Path(os.devnull), process), user)
        headers, body = modern_request("tools/call", {"name": "cart_list", "arguments": {}})
        headers["Authorization"] = f"Bearer {token}"
        answered: list[str] = []

        async def one(http: httpx2.AsyncClient, number: int) -> None:
            marker = {"X-Request-Id": f"shutdown-{uuid.uuid4().hex[:8]}-{number}"}
            if number % 2:
                response = await http.post(f"{base_url}/mcp", headers={**headers, **marker}, json=body)
            else:
                response = await http.get(f"{base_url}/healthz", headers=marker)
            assert response.status_code == 200
            answered.append(response.headers["x-request-id"])

        limits = httpx2.Limits(max_connections=16)
        async with httpx2.AsyncClient(timeout=30.0, limits=limits) as http:
            await asyncio.gather(*(one(http, number) for number in range(LOGGED_REQUESTS)))
        process.send_signal(signal.SIGTERM)
        assert process.stdout is not None
        log = (await asyncio.to_thread(process.stdout.read)).decode(errors="replace")
        exit_code = await asyncio.to_thread(process.wait, 30)
    finally:
        stop_process(process)
        if process.stdout is not None:
            process.stdout.close()
    assert exit_code == 0
    logged = set(re.findall(r"INFO coatcheck\.access \[(shutdown-[0-9a-f]+-\d+)\]", log))
    assert len(answered) == LOGGED_REQUESTS
    assert set(answered) <= logged, f"{len(set(answered) - logged)} lines lost; log ends: {log[-300:]}"
    assert log.rstrip().endswith(f"Finished server process [{process.pid}]"), log[-500:]


QUEUED_LINES = 20_000


def test_a_process_that_ends_normally_writes_every_queued_line_first() -> None:
    # Logging 20 000 lines takes far less time than writing them: at exit most are still queued for the
    # writer thread, which is a daemon thread (it would be dropped mid-queue without the flush at exit).
    script = (
        "import logging\n"
        "from api.logs import configure_logging\n"
        "configure_logging('INFO')\n"
        f"for number in range({QUEUED_LINES}):\n"
        "    logging.getLogger('queued').info('line %d', number)\n"
        "logging.getLogger('queued').info('last line')\n"
    )
    finished = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, timeout=60, check=True, cwd=Path(__file__).parents[2]
    )
    lines = finished.stderr.decode().splitlines()
    assert len(lines) == QUEUED_LINES + 1, lines[-3:]
    assert lines[-1].endswith("INFO queued [-]: last line")


# --- metrics ---------------------------------------------------------------------------------------------------


def _metrics(server: RunningServer) -> tuple[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    response = httpx2.get(f"{server.base_url}/metrics", timeout=10.0)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }
    return response.text, samples


def _value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_metrics_count_calls_errors_and_latency_per_tool_without_caller_strings_in_labels(
    observed: RunningServer, mcp_token: McpTokens, user: str, server_env: dict[str, str]
) -> None:
    _, before = _metrics(observed)
    made_up_tool = f"no_such_tool_{uuid.uuid4().hex[:8]}"
    async with _client(mcp_token, observed, user) as client:
        await client.call_tool("cart_create", {})
        await client.call_tool("cart_view", {"cart_id": "cart_nope"})
    token = await _token(mcp_token, observed, user)
    with httpx2.Client(timeout=15.0) as http:
        unknown = {"name": made_up_tool, "arguments": {}}
        assert response_message(post(http, observed.mcp_url, "tools/call", unknown, token=token))["result"]["isError"]
        # No elicitation capability declared: a JSON-RPC error (-32021), not a tool result.
        checkout = {"name": "cart_checkout", "arguments": {"cart_id": "cart_" + "A" * 32}}
        assert response_message(post(http, observed.mcp_url, "tools/call", checkout, token=token))["error"]
    text, after = _metrics(observed)

    def grew(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    assert grew("coatcheck_tool_calls_total", tool="cart_create", outcome="ok") == 1
    assert grew("coatcheck_tool_calls_total", tool="cart_view", outcome="tool_error") == 1
    assert grew("coatcheck_tool_errors_total", tool="cart_view", kind="tool_error") == 1
    assert grew("coatcheck_tool_calls_total", tool="other", outcome="tool_error") == 1
    assert grew("coatcheck_tool_calls_total", tool="cart_checkout", outcome="protocol_error") == 1
    assert grew("coatcheck_tool_errors_total", tool="cart_checkout", kind="protocol_error") == 1
    assert grew("coatcheck_tool_call_duration_seconds_count", tool="cart_create") == 1
    assert grew("coatcheck_tool_call_duration_seconds_bucket", tool="cart_create", le="+Inf") == 1
    assert made_up_tool not in text
    assert user not in text
    _assert_nothing_secret(text, *_secrets(server_env))


async def test_metrics_count_the_rounds_of_a_checkout(observed: RunningServer, mcp_token: McpTokens, user: str) -> None:
    _, before = _metrics(observed)
    token = await _token(mcp_token, observed, user)
    async with connect(observed.mcp_url, token, elicitation_callback=ScriptedUser(confirms(True))) as confirming:
        cart_id = (await confirming.call_tool("cart_create", {})).structured_content["cart_id"]
        await confirming.call_tool("cart_set_item", {"cart_id": cart_id, "sku": "hat-beanie", "quantity": 1})
        placed = await confirming.call_tool("cart_checkout", {"cart_id": cart_id})
    assert not placed.is_error
    _, after = _metrics(observed)
    for name in ("coatcheck_mrtr_rounds_started_total", "coatcheck_mrtr_rounds_completed_total"):
        assert _value(after, name, tool="cart_checkout") - _value(before, name, tool="cart_checkout") == 1
    assert _value(after, "coatcheck_tool_calls_total", tool="cart_checkout", outcome="input_required") >= 1


async def test_pool_gauges_show_connections_in_use_and_callers_waiting(
    observed: RunningServer, mcp_token: McpTokens, user: str, server_env: dict[str, str]
) -> None:
    callers = POOL_SIZE + 3
    token = await _token(mcp_token, observed, user)
    headers, body = modern_request("tools/call", {"name": "cart_list", "arguments": {}})
    headers["Authorization"] = f"Bearer {token}"
    locker = await asyncpg.connect(server_env["DATABASE_URL"])
    try:
        async with httpx2.AsyncClient(timeout=30.0) as http:
            transaction = locker.transaction()
            await transaction.start()
            await locker.execute("LOCK TABLE cart IN ACCESS EXCLUSIVE MODE")  # every cart query now waits
            calls = [
                asyncio.create_task(http.post(observed.mcp_url, headers=headers, json=body)) for _ in range(callers)
            ]

            def stuck() -> bool:
                _, samples = _metrics(observed)
                return _value(samples, "coatcheck_db_pool_waiting") == callers - POOL_SIZE

            await asyncio.to_thread(wait_until, stuck, timeout=10, what="callers waiting for the pool")
            _, during = _metrics(observed)
            await transaction.rollback()
            answers = await asyncio.gather(*calls)
    finally:
        await locker.close()
    assert _value(during, "coatcheck_db_pool_in_use") == POOL_SIZE
    assert _value(during, "coatcheck_db_pool_size") == POOL_SIZE
    assert all(response.status_code == 200 for response in answers)
    _, after = _metrics(observed)
    assert _value(after, "coatcheck_db_pool_waiting") == 0
    assert _value(after, "coatcheck_db_pool_in_use") == 0


async def test_a_refused_token_refresh_is_counted(
    observed: RunningServer,
    devidp: DevIdP,
    mcp_token: McpTokens,
    user: str,
    server_env: dict[str, str],
    database: Database,
) -> None:
    cipher = TokenCipher([key.encode() for key in server_env["TOKEN_ENCRYPTION_KEYS"].split(",")])
    expired = TokenSet(
        access_token=f"expired-{uuid.uuid4().hex}",
        refresh_token=f"never-issued-{uuid.uuid4().hex}",
        expires_at=datetime.now(UTC) - timedelta(hours=1),
        scopes=("openid",),
    )
    async with database.transaction() as conn:
        await VaultRepository(conn, cipher).save(Principal(devidp.issuer, user), "demo", expired)
    _, before = _metrics(observed)
    async with _client(mcp_token, observed, user) as connected:
        # The refresh is refused, so the tool goes on to ask for a new connection, which this client cannot show.
        with contextlib.suppress(MCPError):
            await connected.call_tool("connection_whoami", {"provider": "demo"})
    text, after = _metrics(observed)
    grew = _value(after, "coatcheck_token_refreshes_total", outcome="invalid_grant") - _value(
        before, "coatcheck_token_refreshes_total", outcome="invalid_grant"
    )
    assert grew == 1
    _assert_nothing_secret(text, expired.access_token, expired.refresh_token or "")


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"Host": "rebound.example:{port}"}, 421),
        ({"Host": "127.0.0.1.evil.test:{port}"}, 421),
        ({"Host": "localhost:{port}", "Origin": "http://rebound.example:{port}"}, 403),
        ({"Host": "localhost:{port}"}, 200),
        ({"Host": "127.0.0.1:{port}", "Origin": "http://127.0.0.1:{port}"}, 200),
    ],
)
async def test_metrics_apply_the_same_host_and_origin_allow_list_as_the_mcp_endpoint(
    observed: RunningServer, mcp_token: McpTokens, user: str, headers: dict[str, str], status: int
) -> None:
    port = observed.base_url.rsplit(":", 1)[1]
    sent = {name: value.format(port=port) for name, value in headers.items()}
    scraped = httpx2.get(f"{observed.base_url}/metrics", headers=sent, timeout=10.0)
    request_headers, body = modern_request("tools/list")
    token = await _token(mcp_token, observed, user)
    mcp = httpx2.post(
        observed.mcp_url, headers={**request_headers, **sent, "Authorization": f"Bearer {token}"}, json=body
    )
    assert scraped.status_code == status
    assert mcp.status_code == status  # the rule /mcp applies
    if status != 200:
        assert b"coatcheck_" not in scraped.content


def test_metrics_are_off_by_default(server: RunningServer) -> None:
    assert httpx2.get(f"{server.base_url}/metrics", timeout=10.0).status_code == 404


# --- traces ----------------------------------------------------------------------------------------------------


async def test_each_tool_call_is_a_span_with_a_child_span_per_database_statement(
    observed: RunningServer, mcp_token: McpTokens, user: str, server_env: dict[str, str]
) -> None:
    def exported() -> list[dict[str, Any]]:
        return [s for s in _spans(observed) if s["name"] == "tools/call cart_view"]

    earlier = len(exported())
    async with _client(mcp_token, observed, user) as client:
        result = await client.call_tool("cart_create", {})
        cart_id = result.structured_content["cart_id"]
        await client.call_tool("cart_view", {"cart_id": cart_id})

    wait_until(lambda: len(exported()) > earlier, timeout=10, what="the cart_view span")
    [tool_span] = exported()[earlier:]
    assert tool_span["kind"] == "SpanKind.SERVER"
    assert tool_span["attributes"]["gen_ai.tool.name"] == "cart_view"
    assert re.fullmatch(r"[0-9a-f]{16}", tool_span["attributes"]["coatcheck.principal.digest"])
    assert tool_span["resource"]["attributes"]["service.name"] == "coatcheck"
    statements = [s for s in _spans(observed) if s["parent_id"] == tool_span["context"]["span_id"]]
    assert statements, "no database span under the tool span"
    assert all(s["name"].startswith("db ") and s["kind"] == "SpanKind.CLIENT" for s in statements)
    assert all(s["context"]["trace_id"] == tool_span["context"]["trace_id"] for s in statements)
    assert any(s["attributes"]["db.operation.name"] == "SELECT" for s in statements)
    span_text = json.dumps(_spans(observed))
    assert cart_id not in span_text  # bound values never reach a span
    assert user not in span_text
    _assert_nothing_secret(span_text, *_secrets(server_env))


class _Collector(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP trace receiver: keeps every export request it is sent."""

    received: ClassVar[list[bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == "/v1/traces":
            self.received.append(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        del format, args


async def test_spans_reach_an_otlp_collector_over_http(
    server_env: dict[str, str], mcp_token: McpTokens, user: str
) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    collector = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    port = free_port()
    env = {
        **server_env,
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector.server_address[1]}",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_SERVICE_NAME": "coatcheck-otlp-test",
    }
    try:
        with run_server(env, port=port, public_url=f"http://127.0.0.1:{port}") as running:
            async with _client(mcp_token, running, user) as client:
                await client.call_tool("cart_list", {})

            def spans() -> list[tuple[str, str]]:
                found: list[tuple[str, str]] = []
                for body in list(_Collector.received):
                    request = ExportTraceServiceRequest.FromString(body)
                    for resource_spans in request.resource_spans:
                        service = next(
                            a.value.string_value for a in resource_spans.resource.attributes if a.key == "service.name"
                        )
                        for scope_spans in resource_spans.scope_spans:
                            found.extend((service, span.name) for span in scope_spans.spans)
                return found

            wait_until(lambda: ("coatcheck-otlp-test", "tools/call cart_list") in spans(), timeout=15, what="spans")
    finally:
        collector.shutdown()
        collector.server_close()
    assert any(service == "coatcheck-otlp-test" and name.startswith("db ") for service, name in spans())


def test_an_unknown_trace_exporter_stops_start_up_with_a_clear_error(server_env: dict[str, str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "api.cli", "serve", "--port", str(free_port())],
        env={**os.environ, **server_env, "OTEL_TRACES_EXPORTER": "no-such-exporter"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "OTEL_TRACES_EXPORTER names 'no-such-exporter', which is not installed" in result.stderr
