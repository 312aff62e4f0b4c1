"""Steady load through a load balancer: concurrent shoppers, each one user, in a background thread.

Each shopper repeats the shop flow over raw 2026-07-28 JSON-RPC (lighter than the SDK client, so the
load generator takes less of the CPU it shares with the replicas): ``cart_create``, ``cart_set_item``,
``cart_view``, then both ``cart_checkout`` rounds. A request counts as failed when the HTTP status is not
200, the JSON-RPC answer is an error, the tool result is an error, or the connection failed. After a
failure the shopper starts a new flow. The thread has its own event loop, so the test may block (stop a
replica, wait for HAProxy) while the load runs.
"""

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.support.haproxy import REPLICA_HEADER
from tests.support.waiting import wait_until
from tests.support.wire import modern_request, response_message

FORM: dict[str, Any] = {"elicitation": {"form": {}}}
SKU = "scarf-cashmere"


class FlowError(Exception):
    """One request of the flow did not succeed (the message says how)."""


@dataclass
class Outcome:
    """What one request did: when it ended, where it was served, and whether it failed."""

    ended: float
    tool: str
    replica: str | None
    error: str | None


@dataclass
class LoadStats:
    """Everything the shoppers did so far (appended to from the load thread)."""

    outcomes: list[Outcome] = field(default_factory=list)
    orders: int = 0
    started: float = 0.0
    stopped: float = 0.0

    @property
    def requests(self) -> int:
        return len(self.outcomes)

    @property
    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.error is not None]

    def ok_after(self, moment: float) -> list[Outcome]:
        return [o for o in self.outcomes if o.error is None and o.ended > moment]

    def by_replica(self) -> Counter[str]:
        return Counter(o.replica or "-" for o in self.outcomes if o.error is None)

    @property
    def throughput(self) -> float:
        """Successful requests per second of wall time."""
        span = (self.stopped or time.monotonic()) - self.started
        return (self.requests - len(self.failures)) / span if span > 0 else 0.0


class Shopper:
    """One user's flow against ``mcp_url``."""

    def __init__(self, http: httpx.AsyncClient, mcp_url: str, token: str, stats: LoadStats) -> None:
        self.http = http
        self.mcp_url = mcp_url
        self.token = token
        self.stats = stats

    async def call(self, tool: str, arguments: dict[str, Any], **extra: Any) -> dict[str, Any]:
        headers, body = modern_request("tools/call", {"name": tool, "arguments": arguments, **extra}, capabilities=FORM)
        headers["Authorization"] = f"Bearer {self.token}"
        replica = None
        try:
            response = await self.http.post(self.mcp_url, headers=headers, json=body)
            replica = response.headers.get(REPLICA_HEADER)
            if response.status_code != 200:
                raise FlowError(f"HTTP {response.status_code}")
            message = response_message(response)
            if "error" in message:
                raise FlowError(f"JSON-RPC error {message['error'].get('code')}")
            result: dict[str, Any] = message["result"]
            if result.get("isError"):
                texts = [c.get("text", "") for c in result.get("content", [])]
                raise FlowError(f"tool error: {' '.join(texts)[:200]}")
        except (httpx.HTTPError, FlowError, ValueError, KeyError) as exc:
            self.stats.outcomes.append(Outcome(time.monotonic(), tool, replica, f"{type(exc).__name__}: {exc}"))
            raise FlowError(str(exc)) from None
        self.stats.outcomes.append(Outcome(time.monotonic(), tool, replica, None))
        return result

    async def shop_once(self) -> None:
        created = await self.call("cart_create", {})
        cart = {"cart_id": created["structuredContent"]["cart_id"]}
        await self.call("cart_set_item", {**cart, "sku": SKU, "quantity": 2})
        await self.call("cart_view", cart)
        first = await self.call("cart_checkout", cart)
        if first.get("resultType") != "input_required":
            raise FlowError("checkout did not ask for confirmation")
        answer = {"confirm": {"action": "accept", "content": {"confirm": True}}}
        placed = await self.call("cart_checkout", cart, inputResponses=answer, requestState=first["requestState"])
        if placed["structuredContent"]["status"] != "placed":
            raise FlowError("no order placed")
        self.stats.orders += 1


async def _shop_until(stop: threading.Event, mcp_url: str, tokens: Sequence[str], stats: LoadStats) -> None:
    limits = httpx.Limits(max_connections=len(tokens), max_keepalive_connections=len(tokens))
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0), limits=limits) as http:

        async def shopper(token: str) -> None:
            me = Shopper(http, mcp_url, token, stats)
            while not stop.is_set():
                try:
                    await me.shop_once()
                except FlowError:
                    continue

        await asyncio.gather(*(shopper(token) for token in tokens))


@contextmanager
def steady_load(mcp_url: str, tokens: Sequence[str]) -> Iterator[LoadStats]:
    """Shop with one concurrent shopper per token until the block ends (the last flows finish first)."""
    stats = LoadStats(started=time.monotonic())
    stop = threading.Event()
    thread = threading.Thread(target=asyncio.run, args=(_shop_until(stop, mcp_url, tokens, stats),), daemon=True)
    thread.start()
    try:
        yield stats
    finally:
        stop.set()
        thread.join(timeout=60)
        stats.stopped = time.monotonic()
        assert not thread.is_alive(), "the load did not stop"


def wait_for_requests(stats: LoadStats, count: int, *, after: float = 0.0, timeout: float = 30) -> None:
    """Block until ``count`` requests have succeeded since ``after`` (a ``time.monotonic()`` moment)."""
    wait_until(lambda: len(stats.ok_after(after)) >= count, timeout=timeout, what=f"{count} successful requests")
