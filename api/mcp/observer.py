"""One observation per ``tools/call``: the facts of its log line, the metrics, and the principal on the trace span.

An SDK server middleware (it runs inside the SDK's own OpenTelemetry span), so it sees every tools/call
whatever tool or client: the tool name, how it ended, how long it took, and whose call it was, as a
keyed digest (:func:`api.logs.principal_digest`), never the subject. Served over HTTP, these facts go
into the request's one log line (:mod:`api.edge`, logger ``coatcheck.access``) with the JSON-RPC method of
every request; outside an HTTP request (an in-memory client) the observer writes a ``coatcheck.tools`` line
of its own. Outcomes:

``ok``                a complete result
``input_required``    the tool asked the client for input (a multi-round call's first round)
``tool_error``        a result with ``isError`` (the tool said what went wrong)
``protocol_error``    a JSON-RPC error (bad params, unknown tool, missing capability, bad requestState)
``exception``         anything else escaped (a bug; the SDK logs the traceback)

Other methods pass straight through (their method name is noted for the request's log line).
"""

import logging
import time
from functools import lru_cache
from typing import Any

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from opentelemetry import trace
from pydantic import ValidationError

from api.edge import CURRENT_REQUEST, RequestFacts
from api.edge import logger as access_logger
from api.logs import principal_digest
from api.metrics import Metrics
from store.principal import Principal

logger = logging.getLogger("coatcheck.tools")

_PRINCIPAL_ATTRIBUTE = "coatcheck.principal.digest"
OTHER_TOOL = "other"  # names a tools/call whose name is no registered tool (a caller's string is never shown)


def _result_field(result: HandlerResult, attribute: str, key: str) -> object:
    if isinstance(result, dict):
        return result.get(key)
    return getattr(result, attribute, None)


def _outcome(result: HandlerResult) -> str:
    if _result_field(result, "result_type", "resultType") == "input_required":
        return "input_required"
    if _result_field(result, "is_error", "isError") is True:
        return "tool_error"
    return "ok"


class ToolCallObserver:
    """``ServerMiddleware`` recording each tools/call in the log, the metrics (if on) and the current span."""

    def __init__(self, server: MCPServer, *, digest_key: bytes, metrics: Metrics | None) -> None:
        self._server = server

        # The keyed digest of a principal, computed once per principal rather than once per call (an HMAC
        # and a Principal each time); bounded, so a flood of distinct subjects costs a fixed amount of memory.
        def digest(issuer: str, subject: str) -> str:
            return principal_digest(digest_key, Principal(issuer=issuer, subject=subject))

        self._digest = lru_cache(maxsize=4096)(digest)
        self._metrics = metrics
        self._tools: frozenset[str] | None = None  # read once, on the first call (tools are all registered)

    async def _tool_label(self, name: object) -> str:
        if self._tools is None:
            self._tools = frozenset(tool.name for tool in await self._server.list_tools())
        return name if isinstance(name, str) and name in self._tools else OTHER_TOOL

    def _principal(self) -> str | None:
        token = get_access_token()
        if token is None or not token.subject or not token.claims:
            return None
        return self._digest(str(token.claims.get("iss")), token.subject)

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        facts = CURRENT_REQUEST.get()
        if facts is not None:
            facts.mcp_method = ctx.method
        if ctx.method != "tools/call":
            return await call_next(ctx)
        tool = await self._tool_label((ctx.params or {}).get("name"))
        started = time.perf_counter()
        outcome = "exception"
        try:
            result = await call_next(ctx)
            outcome = _outcome(result)
            return result
        except (MCPError, ValidationError):
            outcome = "protocol_error"
            raise
        finally:
            self._observe(ctx, tool, outcome, time.perf_counter() - started, facts)

    def _observe(
        self, ctx: ServerRequestContext[Any, Any], tool: str, outcome: str, seconds: float, facts: RequestFacts | None
    ) -> None:
        metrics = self._metrics
        if metrics is not None:
            params = ctx.params or {}
            retried = bool(params.get("requestState") or params.get("inputResponses"))
            metrics.record_tool_call(tool, outcome, seconds)
            if outcome == "input_required":
                metrics.record_round_started(tool)
            elif outcome == "ok" and retried:
                metrics.record_round_completed(tool)
        span = trace.get_current_span()
        recording = span.is_recording()
        # Over HTTP the edge's one line carries the facts; only an in-memory call logs a line of its own.
        if facts is not None:
            facts.tool, facts.outcome = tool, outcome
            logging_calls = access_logger.isEnabledFor(logging.INFO)
        else:
            logging_calls = logger.isEnabledFor(logging.INFO)
        if not (recording or logging_calls):
            return
        principal = self._principal()
        if principal is not None and recording:
            span.set_attribute(_PRINCIPAL_ATTRIBUTE, principal)
        if facts is not None:
            facts.principal = principal
        elif logging_calls:
            duration_ms = round(seconds * 1000, 1)
            logger.info(
                "tools/call %s %s in %.1f ms (principal %s)",
                tool,
                outcome,
                duration_ms,
                principal or "-",
                extra={"tool": tool, "outcome": outcome, "duration_ms": duration_ms, "principal": principal},
            )
