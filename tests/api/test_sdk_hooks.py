"""The two SDK hooks that cut per-call work (api/mcp/sdk_hooks.py) change no answer.

The Mcp-Param hook must still hand the SDK every schema that declares a header, and may only hide schemas
for which the SDK's own comparison cannot reject anything. The span gate must let the SDK's spans through
once a tracer provider exists, including one installed after the server was built.
"""

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Annotated, Any

from mcp.server.context import CallNext, ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.shared.inbound import validate_mcp_param_headers
from pydantic import Field

from api.mcp.sdk_hooks import McpParamSchemas, SpansWhileTracing
from tests.support.inprocess import production_mcp_server

ROOT = Path(__file__).resolve().parents[2]


def _lookup(mcp: MCPServer) -> McpParamSchemas:
    lookup = mcp._lowlevel_server.get_tool_input_schema
    assert isinstance(lookup, McpParamSchemas)
    return lookup


def _region_tool(mcp: MCPServer) -> None:
    @mcp.tool(name="regional")
    async def regional(region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})]) -> str:
        return region


STRAY_HEADERS = {"mcp-method": "tools/call", "mcp-param-cart": "cart_other", "mcp-param-region": "eu"}


async def test_no_coatcheck_tool_has_its_schema_walked_and_the_sdk_would_not_have_rejected_anything() -> None:
    mcp = production_mcp_server()
    lookup = _lookup(mcp)
    tools = await mcp.list_tools()
    assert len(tools) >= 5
    for tool in tools:
        assert lookup(tool.name) is None, tool.name
        # The SDK's own comparison on the full schema: no declaration, so even stray headers pass.
        assert validate_mcp_param_headers(tool.input_schema, {"cart_id": "cart_x"}, STRAY_HEADERS) is None


async def test_a_tool_that_declares_an_mcp_param_header_keeps_the_sdks_validation() -> None:
    mcp = production_mcp_server()
    _region_tool(mcp)
    schema = _lookup(mcp)("regional")
    assert schema is not None
    mismatch = validate_mcp_param_headers(schema, {"region": "us"}, STRAY_HEADERS)
    assert mismatch is not None
    assert "Mcp-Param-Region" in mismatch.message
    assert validate_mcp_param_headers(schema, {"region": "eu"}, STRAY_HEADERS) is None


async def test_a_re_registered_tool_is_judged_by_its_new_schema() -> None:
    mcp = production_mcp_server()
    lookup = _lookup(mcp)
    assert lookup("cart_view") is None
    mcp.remove_tool("cart_view")

    @mcp.tool(name="cart_view")
    async def cart_view(cart_id: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Cart"})]) -> str:
        return cart_id

    assert lookup("cart_view") is not None
    assert lookup("no_such_tool") is None


async def test_the_sdk_span_middleware_runs_only_while_tracing_is_configured() -> None:
    entered: list[str] = []
    tracing = False

    async def sdk_spans(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> Any:
        entered.append(ctx.method)
        return await call_next(ctx)

    async def handler(ctx: ServerRequestContext[Any, Any]) -> dict[str, Any]:
        return {"handled": ctx.method}

    gate = SpansWhileTracing(sdk_spans, tracing=lambda: tracing)
    ctx: Any = type("Ctx", (), {"method": "tools/call"})()
    assert await gate(ctx, handler) == {"handled": "tools/call"}
    assert entered == []
    tracing = True
    assert await gate(ctx, handler) == {"handled": "tools/call"}
    tracing = False  # a configured provider cannot be removed again, so the gate stays open
    assert await gate(ctx, handler) == {"handled": "tools/call"}
    assert entered == ["tools/call", "tools/call"]


RECORDING_PROVIDER = textwrap.dedent(
    """
    import asyncio, json, sys
    from opentelemetry import trace
    from tests.support.inprocess import production_mcp_server
    from mcp import Client

    names = []

    class RecordingTracer(trace.NoOpTracer):
        def start_as_current_span(self, name, *args, **kwargs):
            names.append(name)
            return super().start_as_current_span(name, *args, **kwargs)

    class RecordingProvider(trace.NoOpTracerProvider):
        def get_tracer(self, *args, **kwargs):
            return RecordingTracer()

    async def main():
        mcp = production_mcp_server()  # built before the provider exists, as with a late instrumentation
        async with Client(mcp) as client:
            await client.list_tools()
            before = list(names)
            trace.set_tracer_provider(RecordingProvider())
            await client.list_tools()
        print(json.dumps({"before": before, "after": names[len(before):]}))

    asyncio.run(main())
    """
)


def test_sdk_spans_are_emitted_once_a_tracer_provider_is_installed_even_after_start_up() -> None:
    # A subprocess: a tracer provider can be set only once per process.
    done = subprocess.run(
        [sys.executable, "-c", RECORDING_PROVIDER], capture_output=True, text=True, cwd=ROOT, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    spans = json.loads(done.stdout.strip().splitlines()[-1])
    assert spans["before"] == []
    assert "tools/list" in spans["after"]
