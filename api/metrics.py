"""Prometheus metrics of one app, in a registry of its own (``METRICS_ENABLED=true``; scraped at ``/metrics``).

Labels are closed sets chosen here (tool names the server registered, outcome words, table names), never
a token, a handle, a principal or anything else a caller chooses, so no series grows per user or per call.

Other code calls the small ``record_*`` methods; with metrics off there is no :class:`Metrics` object and
callers skip the call, so nothing is done per request.
"""

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy.engine import Engine
from sqlalchemy.pool import Pool, QueuePool

from store.errors import UNAVAILABLE_CAUSES

#: Tool latency buckets (seconds): a cached read takes about a millisecond, a slow provider several seconds.
#: How a tools/call can end (see api.mcp.observer); the last three are errors.
OUTCOMES = ("ok", "input_required", "tool_error", "protocol_error", "exception")
ERROR_OUTCOMES = frozenset(OUTCOMES[2:])
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def _pool_waiting(pool: Pool) -> int:
    """Callers blocked waiting for a pooled connection.

    SQLAlchemy exposes no waiter count; its async queue is an :class:`asyncio.Queue` whose ``_getters``
    are exactly those callers. If a future release changes that, this reads 0 rather than failing a scrape.
    """
    queue = getattr(getattr(pool, "_pool", None), "_queue", None)
    getters = getattr(queue, "_getters", None)
    return len(getters) if getters is not None else 0


class _PoolCollector(Collector):
    """Reads the engine's pool at scrape time (nothing is counted per checkout)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        pool = self._engine.pool
        in_use = GaugeMetricFamily("coatcheck_db_pool_in_use", "Database connections checked out of the pool.")
        idle = GaugeMetricFamily("coatcheck_db_pool_idle", "Database connections idle in the pool.")
        waiting = GaugeMetricFamily(
            "coatcheck_db_pool_waiting", "Callers waiting for a database connection (the pool is exhausted)."
        )
        size = GaugeMetricFamily("coatcheck_db_pool_size", "Connections the pool keeps open (DB_POOL_SIZE).")
        if isinstance(pool, QueuePool):
            in_use.add_metric([], pool.checkedout())
            idle.add_metric([], pool.checkedin())
            waiting.add_metric([], _pool_waiting(pool))
            size.add_metric([], pool.size())
        yield from (in_use, idle, waiting, size)


class Metrics:
    """Every Coatcheck metric, registered in :attr:`registry` (one per app, none at import time)."""

    def __init__(self, engine: Engine | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        self._tool_children: dict[tuple[str, str], tuple[Any, Any, Any]] = {}
        self.tool_calls = Counter(
            "coatcheck_tool_calls", "Tool calls finished, by tool and outcome.", ["tool", "outcome"], registry=registry
        )
        self.tool_errors = Counter(
            "coatcheck_tool_errors",
            "Tool calls that failed: tool_error (the tool said why), protocol_error (a JSON-RPC error), "
            "exception (a bug; see the log).",
            ["tool", "kind"],
            registry=registry,
        )
        self.tool_duration = Histogram(
            "coatcheck_tool_call_duration_seconds",
            "Time from the tools/call reaching the SDK's handler chain to its result.",
            ["tool"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.rounds_started = Counter(
            "coatcheck_mrtr_rounds_started",
            "Multi-round tool calls that asked the client for input (an input_required result).",
            ["tool"],
            registry=registry,
        )
        self.rounds_completed = Counter(
            "coatcheck_mrtr_rounds_completed",
            "Retried tool calls that carried the client's input and finished with a complete result.",
            ["tool"],
            registry=registry,
        )
        self.refreshes = Counter(
            "coatcheck_token_refreshes",
            "Third-party token refreshes attempted, by outcome (ok, invalid_grant, failed).",
            ["outcome"],
            registry=registry,
        )
        self.purged = Counter(
            "coatcheck_purged_rows", "Rows deleted by the retention purge, by table.", ["table"], registry=registry
        )
        self.db_unavailable = Counter(
            "coatcheck_db_unavailable",
            "Units of work (tool calls, purge batches, background checks) failed by a database outage, by cause: "
            "pool_timeout, "
            "statement_timeout, lock_timeout, refused, connect_failed, no_writable_host, read_only, "
            "connection_lost, no_answer (see store.errors.UNAVAILABLE_CAUSES).",
            ["cause"],
            registry=registry,
        )
        for cause in UNAVAILABLE_CAUSES:  # every series exists from the start, so rate() sees the first one
            self.db_unavailable.labels(cause)
        self.sync_standbys = Gauge(
            "coatcheck_db_sync_standbys",
            "Synchronous standbys the primary has (DB_REQUIRE_SYNC_STANDBY; -1: it could not be asked, "
            "0: synchronous_standby_names empty or no standby in sync).",
            registry=registry,
        )
        if engine is not None:
            registry.register(_PoolCollector(engine))

    def record_tool_call(self, tool: str, outcome: str, seconds: float) -> None:
        """Count one finished tools/call (``tool`` is a registered tool's name or ``other``; ``outcome`` one of
        :data:`OUTCOMES`, the last three of which also count as errors)."""
        children = self._tool_children.get((tool, outcome))
        if children is None:  # labels() costs a lock and a lookup per call; the set of pairs is small and closed
            errors = self.tool_errors.labels(tool, outcome) if outcome in ERROR_OUTCOMES else None
            children = (self.tool_calls.labels(tool, outcome), self.tool_duration.labels(tool), errors)
            self._tool_children[(tool, outcome)] = children
        calls, duration, errors = children
        calls.inc()
        duration.observe(seconds)
        if errors is not None:
            errors.inc()

    def record_round_started(self, tool: str) -> None:
        """A tool answered ``input_required``: a round trip to the client began."""
        self.rounds_started.labels(tool).inc()

    def record_round_completed(self, tool: str) -> None:
        """A retry carrying the client's input finished with a complete result."""
        self.rounds_completed.labels(tool).inc()

    def record_refresh(self, outcome: str) -> None:
        """One refresh of a stored third-party token: ``ok``, ``invalid_grant`` or ``failed``."""
        self.refreshes.labels(outcome).inc()

    def record_purged(self, table: str, n: int) -> None:
        """``n`` rows of ``table`` deleted by the retention purge."""
        if n:
            self.purged.labels(table).inc(n)

    def record_db_unavailable(self, cause: str) -> None:
        """A unit of work failed with :class:`store.errors.Unavailable` for ``cause``."""
        self.db_unavailable.labels(cause if cause in UNAVAILABLE_CAUSES else "connection_lost").inc()

    def record_sync_standbys(self, count: int) -> None:
        """The synchronous-standby check found ``count`` standbys in sync (-1: the database did not answer)."""
        self.sync_standbys.set(count)

    def exposition(self) -> bytes:
        """The registry in Prometheus' text format."""
        return generate_latest(self.registry)
