"""A slow provider cannot starve the pool: the refresh storm of issue 10, reproduced with real parts.

Alice connects the "demo" provider in headless Chromium (the dev IdP plays the provider), her stored token is
made due for refresh, and the dev IdP's token endpoint is slowed to ~6 s. She then sends 25 concurrent
``connection_whoami`` calls spread over two ``coatcheck serve`` processes while bob reads his cart in a loop on
one of them. Each process has the default pool of 10 connections, fewer than the ~13 calls it receives: a
design that holds a pooled connection per waiting caller (or one idle in transaction across the provider call)
runs out, and bob's ``cart_view`` waits seconds for a connection instead of milliseconds (or fails with "server
is busy" after ``DB_POOL_TIMEOUT_SECONDS``).

"During the storm" is the time the provider holds the refresh: from the moment one instance has claimed the
refresh lease to the moment the new token is in the database (both watched in the database every 0.1 s).
Bob's latency over the whole storm, including the bursts of 25 calls arriving and being answered (CPU on a
shared machine, not pool capacity), is printed too. The baseline is bob alone for as long as the storm lasts,
right before and right after it; the larger p99 of the two counts, so that load from elsewhere on the machine
moves both sides alike. The figures are printed (``pytest -s``, or ``-rA`` for the captured output of a
passing test) and are in every assertion message.
"""

import asyncio
import contextlib
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta

from mcp import Client
from mcp.types import CallToolResult
from sqlalchemy import func, select, text, update

from store.db import Database
from store.models import ProviderConnection, table_of
from tests.support import figures
from tests.support.auth_mode import McpTokens
from tests.support.browser import BrowserUserFactory, LinkOpener
from tests.support.devidp import DevIdP
from tests.support.mcp_client import McpClientFactory, connect, text_of
from tests.support.mrtr import another_instance

WHOAMI = {"provider": "demo"}
CALLS = 25
PROVIDER_DELAY = 6.0
POOL = {"DB_POOL_SIZE": "10", "DB_MAX_OVERFLOW": "0"}  # the defaults, spelled out
# Latency on a shared machine is noisy; what the design guarantees (one refresh, every call answered, no
# transaction or lock held, no call of bob's waiting anywhere near the provider's delay) is asserted on every
# storm, and bob's p99 must be within 2x of his baseline in at least one of them.
ATTEMPTS = 3

_connections = table_of(ProviderConnection)
# A transaction left open across a network call shows up as "idle in transaction" for more than an instant.
_HELD = text(
    "SELECT count(*) FILTER (WHERE state LIKE 'idle in transaction%' AND now() - state_change > interval '0.5 s')"
    " AS idle_in_tx, count(*) FILTER (WHERE wait_event_type = 'Lock') AS lock_waits, "
    "count(*) FILTER (WHERE backend_type = 'client backend') AS backends "
    "FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
)


def _p99(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[98]


@dataclass
class Storm:
    """What was observed while the calls ran."""

    results: list[CallToolResult] = field(default_factory=list)
    call_seconds: list[float] = field(default_factory=list)
    bob: list[tuple[float, float]] = field(default_factory=list)  # (started, seconds)
    refresh_seen: float | None = None  # when an instance had claimed the refresh lease
    refresh_stored: float | None = None  # when the new token was in the database
    held: dict[str, int] = field(default_factory=lambda: {"idle_in_tx": 0, "lock_waits": 0, "backends": 0})
    refreshes: int = 0  # refresh requests the provider received

    def bob_while_the_provider_holds_the_refresh(self) -> list[float]:
        assert self.refresh_seen is not None, "no instance ever claimed the refresh lease"
        assert self.refresh_stored is not None, "the refreshed token never reached the database"
        start, end = self.refresh_seen, self.refresh_stored
        # Every call that overlapped the window: one stuck waiting for a pooled connection counts too.
        return [seconds for started, seconds in self.bob if started < end and started + seconds > start]


async def _bob_samples(view: Callable[[], Awaitable[CallToolResult]], seconds: float) -> list[float]:
    """Bob's ``cart_view`` latencies, one call after the other, for ``seconds``."""
    samples = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.monotonic()
        result = await view()
        samples.append(time.monotonic() - started)
        assert not result.is_error, text_of(result)
    return samples


async def test_a_slow_provider_refreshes_once_answers_every_caller_and_does_not_slow_other_users(
    wire_mcp_client: McpClientFactory,
    browser_user: BrowserUserFactory,
    database: Database,
    devidp: DevIdP,
    mcp_token: McpTokens,
    server_env: dict[str, str],
    public_url: str,
) -> None:
    alice_name, bob_name = f"alice-{uuid.uuid4().hex[:8]}", f"bob-{uuid.uuid4().hex[:8]}"
    alice = await browser_user(alice_name)
    opener = LinkOpener(alice)
    async with wire_mcp_client(alice_name, elicitation_callback=opener) as client:
        connected = await client.call_tool("connection_whoami", WHOAMI)
    assert not connected.is_error, text_of(connected)
    await opener.landing()

    resource = f"{public_url}/mcp"
    alice_token = await mcp_token(alice_name, resource=resource)
    bob_token = await mcp_token(bob_name, resource=resource)
    with (
        another_instance(server_env, public_url=public_url, **POOL) as one,
        another_instance(server_env, public_url=public_url, **POOL) as two,
    ):
        async with contextlib.AsyncExitStack() as clients:
            # Opened before the storm, so the storm is the calls themselves, not 25 client set-ups.
            alices = [
                await clients.enter_async_context(connect((one, two)[n % 2].mcp_url, alice_token)) for n in range(CALLS)
            ]
            bob = await clients.enter_async_context(connect(one.mcp_url, bob_token))
            cart = await bob.call_tool("cart_create", {})
            assert cart.structured_content is not None
            cart_id = cart.structured_content["cart_id"]
            added = await bob.call_tool("cart_set_item", {"cart_id": cart_id, "sku": "scarf-cashmere", "quantity": 2})
            assert not added.is_error, text_of(added)

            async def view() -> CallToolResult:
                return await bob.call_tool("cart_view", {"cart_id": cart_id})

            await _bob_samples(view, 0.5)  # warm up: pool connections, prepared statements, JWKS
            # As long as the storm lasts, so both p99s are taken over the same exposure to the machine's noise.
            before = await _bob_samples(view, PROVIDER_DELAY)
            reports = []
            for attempt in range(1, ATTEMPTS + 1):
                storm = await _one_storm(alices, view, database=database, devidp=devidp, alice_name=alice_name)
                after = await _bob_samples(view, PROVIDER_DELAY)
                ratio, report = _check(storm, before, after, alice_name, attempt)
                reports.append(report)
                print(report)
                if ratio <= 2:
                    break
                before = after  # the next storm's "before" is this one's "after"
    summary = "\n".join(reports)
    for line in reports:
        figures.note("Refresh storm (issue 10): one slow provider, 25 calls over 2 instances", line)
    assert ratio <= 2, f"bob's p99 during the storm was above 2x his baseline in every attempt\n{summary}"


async def _one_storm(
    alices: list[Client],
    bob_view: Callable[[], Awaitable[CallToolResult]],
    *,
    database: Database,
    devidp: DevIdP,
    alice_name: str,
) -> Storm:
    """Make alice's token due, slow the provider down, and fire the calls."""
    async with database.one_statement() as conn:
        await conn.execute(
            update(_connections)
            .where(_connections.c.principal_sub == alice_name)
            .values(expires_at=func.now() - timedelta(minutes=1), refreshed_at=None)
        )
    await devidp.reset_stats()
    await devidp.set_token_delay(PROVIDER_DELAY)
    try:
        storm = await _storm(alices, bob_view, database=database, alice_name=alice_name)
    finally:
        await devidp.set_token_delay(0)
    storm.refreshes = (await devidp.stats())["refresh_requests"]
    return storm


def _check(storm: Storm, before: list[float], after: list[float], alice_name: str, attempt: int) -> tuple[float, str]:
    """Assert what noise cannot change; return bob's p99 ratio and the printed figures."""
    baseline_p99 = max(_p99(before), _p99(after))
    during = storm.bob_while_the_provider_holds_the_refresh()
    storm_p99 = _p99(during) if len(during) >= 2 else float("inf")
    ratio = storm_p99 / baseline_p99
    whole = [seconds for _, seconds in storm.bob]
    report = (
        f"refresh storm (attempt {attempt} of at most {ATTEMPTS}): {CALLS} concurrent connection_whoami from one "
        f"user over 2 instances (pool 10 each), provider token endpoint delayed {PROVIDER_DELAY:.0f} s\n"
        f"  refreshes at the provider: {storm.refreshes}\n"
        f"  calls answered: {sum(not r.is_error for r in storm.results)}/{CALLS}, "
        f"slowest {max(storm.call_seconds):.2f} s\n"
        f"  bob cart_view p99: baseline {baseline_p99 * 1000:.1f} ms (before {_p99(before) * 1000:.1f} ms over "
        f"{len(before)} calls, after {_p99(after) * 1000:.1f} ms over {len(after)}; {PROVIDER_DELAY:.0f} s each), "
        f"while the provider held the refresh {storm_p99 * 1000:.1f} ms ({len(during)} calls), "
        f"ratio {ratio:.2f} (limit 2.00)\n"
        f"  bob over the whole storm incl. the bursts of calls arriving and being answered: "
        f"p99 {_p99(whole) * 1000:.1f} ms, slowest {max(whole) * 1000:.1f} ms ({len(whole)} calls)\n"
        f"  database during the storm, at most: {storm.held['idle_in_tx']} backends idle in transaction > 0.5 s, "
        f"{storm.held['lock_waits']} waiting on a lock, {storm.held['backends']} client backends"
    )
    assert storm.refreshes == 1, report
    for result in storm.results:
        assert not result.is_error, f"{text_of(result)}\n{report}"
        assert result.structured_content is not None
        assert result.structured_content["profile"]["sub"] == alice_name
    assert min(storm.call_seconds) >= PROVIDER_DELAY * 0.9, f"the provider was not slow: this proved nothing\n{report}"
    assert len(during) >= 20, report
    assert storm.held["idle_in_tx"] == 0, report
    assert storm.held["lock_waits"] == 0, report
    # Waiting for a pooled connection until the refresh is done would take about the provider's delay.
    assert max(whole) < PROVIDER_DELAY / 2, report
    return ratio, report


async def _storm(
    alices: list[Client],
    bob_view: Callable[[], Awaitable[CallToolResult]],
    *,
    database: Database,
    alice_name: str,
) -> Storm:
    """Fire the calls; sample bob, the provider and the database until every call is answered."""
    storm = Storm()
    done = asyncio.Event()
    lease = select(
        _connections.c.refresh_lease_id.is_not(None) | _connections.c.refreshed_at.is_not(None),
        _connections.c.refreshed_at.is_not(None),
    ).where(_connections.c.principal_sub == alice_name)

    async def whoami(client: Client) -> tuple[float, CallToolResult]:
        started = time.monotonic()
        result = await client.call_tool("connection_whoami", WHOAMI)
        return time.monotonic() - started, result

    async def watch() -> None:
        while not done.is_set():
            # The database only: an HTTP client per poll would cost this event loop (and bob's timings) CPU.
            async with database.one_statement() as conn:
                row = (await conn.execute(_HELD)).mappings().one()
                claimed, stored = (await conn.execute(lease)).one()
            now = time.monotonic()
            if storm.refresh_seen is None and claimed:
                storm.refresh_seen = now
            if storm.refresh_stored is None and stored:
                storm.refresh_stored = now
            for key in storm.held:
                storm.held[key] = max(storm.held[key], int(row[key]))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), timeout=0.1)

    async def sample_bob() -> None:
        while not done.is_set():
            started = time.monotonic()
            result = await bob_view()
            storm.bob.append((started, time.monotonic() - started))
            assert not result.is_error, text_of(result)

    bob_task = asyncio.create_task(sample_bob())
    watcher = asyncio.create_task(watch())
    try:
        outcomes = await asyncio.gather(*(whoami(client) for client in alices))
    finally:
        done.set()
    await bob_task
    await watcher
    storm.call_seconds = [seconds for seconds, _ in outcomes]
    storm.results = [result for _, result in outcomes]
    return storm
