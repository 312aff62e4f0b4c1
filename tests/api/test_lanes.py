"""The store tools' calls are answered inline; every other request takes the lane the server is configured for.

(api/mcp/lanes.py.) On the wire the inline answer is the JSON the streaming lane gives any handler that sends
nothing, so what is counted here is what differs: the tasks a call starts. The app is the production
``create_app`` at its defaults (streaming), in process, with one test tool added the way the conformance
fixtures are (``configure_mcp``) that reports progress.
"""

import asyncio
import json
from collections.abc import AsyncIterator, Coroutine, Generator
from functools import partial
from typing import Any

import pytest
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import HEADER_MISMATCH

from tests.support.auth_mode import McpTokens
from tests.support.inprocess import InProcessApp, production_server, settings_from, started_app
from tests.support.wire import modern_request

PROBE = "progress_probe"


def _add_progress_probe(mcp: MCPServer[Any], *, runs: list[None]) -> None:
    @mcp.tool(name=PROBE, description="Reports progress once, then returns.")
    async def probe(ctx: Context) -> str:
        runs.append(None)
        await ctx.report_progress(1, total=2, message="half way")
        return "done"


@pytest.fixture
def probe_runs() -> list[None]:
    """One entry per run of the probe tool."""
    return []


@pytest.fixture
async def streaming_app(server_env: dict[str, str], probe_runs: list[None]) -> AsyncIterator[InProcessApp]:
    probe = partial(_add_progress_probe, runs=probe_runs)
    async with started_app(settings_from(server_env), configure_mcp=probe) as started:
        yield started


class TaskCount:
    """Counts the tasks the event loop starts while it is installed."""

    def __init__(self) -> None:
        self.started = 0

    def __call__(
        self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any] | Generator[Any, None, Any], **kw: Any
    ) -> asyncio.Task[Any]:
        self.started += 1
        return asyncio.Task(coro, loop=loop, **kw)


async def _post(app: InProcessApp, token: str, headers: dict[str, str], body: dict[str, Any]) -> tuple[Any, int]:
    """POST ``body`` to the app's /mcp; the response and how many tasks the loop started meanwhile."""
    loop = asyncio.get_running_loop()
    count = TaskCount()
    async with app.http(timeout=15.0) as http:
        loop.set_task_factory(count)
        try:
            response = await http.post("/mcp", headers={**headers, "Authorization": f"Bearer {token}"}, json=body)
        finally:
            loop.set_task_factory(None)
    return response, count.started


async def test_a_store_tool_call_is_answered_inline_without_a_task_while_a_tool_that_reports_progress_streams_it(
    streaming_app: InProcessApp, mcp_token: McpTokens, probe_runs: list[None]
) -> None:
    token = await mcp_token("lanes-user", resource=streaming_app.mcp_url, transport=streaming_app.transport())

    # The first call also verifies the token and opens the pool's first connection, which start tasks.
    created, _ = await _post(streaming_app, token, *modern_request("tools/call", {"name": "cart_create"}))
    assert created.headers["content-type"] == "application/json"
    cart_id = created.json()["result"]["structuredContent"]["cart_id"]
    item = {"cart_id": cart_id, "sku": "hat-beanie", "quantity": 2}
    changed, tasks_for_set_item = await _post(
        streaming_app, token, *modern_request("tools/call", {"name": "cart_set_item", "arguments": item})
    )
    viewed, tasks_for_view = await _post(
        streaming_app, token, *modern_request("tools/call", {"name": "cart_view", "arguments": {"cart_id": cart_id}})
    )
    assert changed.headers["content-type"] == viewed.headers["content-type"] == "application/json"
    assert viewed.json()["result"]["structuredContent"]["items"][0]["quantity"] == 2
    assert (tasks_for_set_item, tasks_for_view) == (0, 0)

    headers, body = modern_request("tools/call", {"name": PROBE})
    body["params"]["_meta"]["progressToken"] = "probe-1"
    streamed, tasks_for_probe = await _post(streaming_app, token, headers, body)
    assert streamed.status_code == 200
    assert streamed.headers["content-type"] == "text/event-stream"
    events = [json.loads(line[len("data: ") :]) for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert [event.get("method") for event in events] == ["notifications/progress", None]
    assert events[0]["params"] == {"progressToken": "probe-1", "progress": 1, "total": 2, "message": "half way"}
    assert events[1]["result"]["content"][0]["text"] == "done"
    assert tasks_for_probe >= 2  # the handler and the disconnect watcher: the streaming lane
    assert probe_runs == [None]


async def test_a_call_whose_header_names_a_store_tool_but_whose_body_calls_another_is_refused_before_that_tool_runs(
    streaming_app: InProcessApp, mcp_token: McpTokens, probe_runs: list[None]
) -> None:
    token = await mcp_token("lanes-user", resource=streaming_app.mcp_url, transport=streaming_app.transport())
    headers, body = modern_request("tools/call", {"name": PROBE})
    headers["Mcp-Name"] = "cart_view"  # would take the inline lane, where the probe's progress could not be sent

    refused, _ = await _post(streaming_app, token, headers, body)

    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == HEADER_MISMATCH
    assert probe_runs == []


async def test_every_tool_but_the_connection_tools_is_answered_inline() -> None:
    built = production_server()
    registered = {tool.name for tool in await built.mcp.list_tools()}

    assert built.store_tools == {name for name in registered if not name.startswith("connection_")}
    assert {"cart_view", "cart_set_item", "cart_checkout", "catalog_search"} <= built.store_tools
