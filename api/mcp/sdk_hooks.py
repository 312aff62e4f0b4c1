"""Per-call work the SDK does that Coatcheck can skip through the SDK's own hooks, without changing an answer.

Two costs show up in a profile of every ``tools/call`` (see docs/performance.md):

* **No-op trace spans.** The SDK wraps every message in an OpenTelemetry span. With no tracer provider in the
  process the span records nothing, but creating it, extracting the caller's trace context from ``_meta``
  and attaching it still costs about as much as Coatcheck's own routing. :class:`SpansWhileTracing` keeps the
  SDK's middleware in its place and calls it once a provider is configured (checked per call, so a provider
  installed after start-up, e.g. by ``opentelemetry-instrument``, is honoured).
* **The Mcp-Param schema walk.** Before dispatch the SDK walks the called tool's input schema twice to find
  ``x-mcp-header`` annotations and compare ``Mcp-Param-*`` headers against them. No Coatcheck tool declares
  one, and for such a schema the comparison can never reject anything, so :class:`McpParamSchemas` answers
  "nothing to validate" for it, remembered per tool. A tool that does declare headers (a test fixture, a
  future tool) gets its schema and the SDK's full validation.
"""

from collections.abc import Callable, Mapping
from typing import Any

from mcp.server._otel import OpenTelemetryMiddleware  # the SDK's default span middleware (no public name)
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.shared.inbound import find_invalid_x_mcp_header, x_mcp_header_map
from opentelemetry import trace

SchemaLookup = Callable[[str], Mapping[str, Any] | None]


def tracing_configured() -> bool:
    """Whether spans would go anywhere: a real tracer provider is installed in this process."""
    # Exact types: the API's placeholders record nothing; anything else (a subclass too) is a real provider.
    return type(trace.get_tracer_provider()) not in (trace.ProxyTracerProvider, trace.NoOpTracerProvider)


class SpansWhileTracing:
    """The SDK's span middleware, skipped while no tracer provider is configured."""

    def __init__(
        self,
        spans: Callable[[ServerRequestContext[Any, Any], CallNext], Any],
        *,
        tracing: Callable[[], bool] = tracing_configured,
    ) -> None:
        self._spans = spans
        self._tracing_configured = tracing
        self._tracing = False  # a provider, once set, cannot be unset

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if not self._tracing:
            if not self._tracing_configured():
                return await call_next(ctx)
            self._tracing = True
        result: HandlerResult = await self._spans(ctx, call_next)
        return result


class McpParamSchemas:
    """The SDK's ``get_tool_input_schema``, answering ``None`` for schemas with no ``x-mcp-header`` to check.

    ``None`` is the SDK's own "skip validation" answer; for a schema without annotations (or with an invalid
    one, which the SDK ignores too) validation has nothing to compare, so the outcome is the same. The verdict
    is kept per tool name together with the schema object it was computed for, so a re-registered tool is
    looked at afresh.
    """

    def __init__(self, lookup: SchemaLookup) -> None:
        self._lookup = lookup
        self._verdicts: dict[str, tuple[Mapping[str, Any], bool]] = {}

    def __call__(self, name: str) -> Mapping[str, Any] | None:
        schema = self._lookup(name)
        if schema is None:
            return None
        known = self._verdicts.get(name)
        if known is None or known[0] is not schema:
            declares = find_invalid_x_mcp_header(schema) is None and bool(x_mcp_header_map(schema))
            known = (schema, declares)
            self._verdicts[name] = known
        return schema if known[1] else None


def install(mcp: MCPServer) -> None:
    """Put both hooks on ``mcp`` (call once, after constructing it)."""
    mcp.middleware[:] = [SpansWhileTracing(m) if isinstance(m, OpenTelemetryMiddleware) else m for m in mcp.middleware]
    lowlevel = mcp._lowlevel_server  # the hook lives on the low-level server; MCPServer has no accessor in 2.3
    if lowlevel.get_tool_input_schema is not None:
        lowlevel.get_tool_input_schema = McpParamSchemas(lowlevel.get_tool_input_schema)
