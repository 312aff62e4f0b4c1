"""Three replicas behind a real HAProxy, PgBouncer (transaction pooling) in front of PostgreSQL.

Where each request went is read from the ``X-Coatcheck-Replica`` header HAProxy adds (the name of the
server that answered), never assumed. The load comes from ``tests/support/load.py``: concurrent users each
running the shop flow (create, set item, view, both checkout rounds).
"""

import asyncio
import itertools
import signal
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

import asyncpg
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from mcp.types import ElicitRequestFormParams, ElicitRequestParams, ElicitRequestURLParams, ElicitResult
from playwright.async_api import Response as BrowserResponse
from sqlalchemy.engine import make_url

from tests.browser.conftest import BrowserUserFactory
from tests.browser.harness import Landing
from tests.deploy.conftest import BOUNCER_POOL, MAX_OVERFLOW, POOL_SIZE, REPLICAS, Deployment, note
from tests.support.haproxy import REPLICA_HEADER
from tests.support.load import LoadStats, steady_load, wait_for_requests
from tests.support.waiting import wait_until
from tests.support.wire import modern_request, post, response_message
from tests.support.wrk import WrkRun, run_wrk, wrk_available

SHOPPERS = 6
ROLLING_SHOPPERS = 3
ROUNDS = 2
WRK_SECONDS = 3
WRK_CONNECTIONS = 12
WARM_UP_REQUESTS = 15
BROWSER_PATHS = ("/connect/", "/oauth/login/callback", "/oauth/callback")


def _dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _alternates(sequence: list[str | None]) -> bool:
    return all(a != b for a, b in itertools.pairwise(sequence))


class Person:
    """The user at the client: confirms the checkout form, opens a connect link in their browser."""

    def __init__(self, open_link: Callable[[str], Coroutine[Any, Any, Landing]]) -> None:
        self.open_link = open_link
        self.landing: asyncio.Task[Landing] | None = None

    async def __call__(self, _context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        if isinstance(params, ElicitRequestFormParams):
            return ElicitResult(action="accept", content={"confirm": True})
        assert isinstance(params, ElicitRequestURLParams), params
        if self.landing is None:
            self.landing = asyncio.create_task(self.open_link(params.url))
        return ElicitResult(action="accept")


async def test_the_cart_flow_both_checkout_rounds_and_a_url_connect_are_served_by_different_replicas_in_turn(
    deployment: Deployment, browser_user: BrowserUserFactory
) -> None:
    username = f"roaming-{uuid.uuid4().hex[:8]}"
    token = await deployment.idp.token(username, resource=deployment.mcp_url)
    served: list[tuple[str, str | None]] = []  # (tool, replica) of every MCP response, in order

    async def record(response: httpx2.Response) -> None:
        served.append((response.request.headers.get("mcp-name", "?"), response.headers.get(REPLICA_HEADER)))

    person = await browser_user(username)
    browser_served: list[tuple[str, str | None]] = []

    def record_page(response: BrowserResponse) -> None:
        path = response.url.removeprefix(deployment.balancer.url)
        if response.url.startswith(deployment.balancer.url) and path.startswith(BROWSER_PATHS):
            step = "/connect/…" if path.startswith("/connect/") else path.split("?")[0]
            browser_served.append((step, response.headers.get(REPLICA_HEADER)))

    person.context.on("response", record_page)
    user = Person(person.open)
    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30.0), event_hooks={"response": [record]}
    )
    async with (
        http,
        Client(streamable_http_client(deployment.mcp_url, http_client=http), elicitation_callback=user) as client,
    ):
        cart = (await client.call_tool("cart_create", {})).structured_content
        assert cart is not None
        await client.call_tool("cart_set_item", {**cart, "sku": "hat-beanie", "quantity": 3})
        view = await client.call_tool("cart_view", cart)
        order = await client.call_tool("cart_checkout", cart)
        shopping = list(served)
        whoami = await client.call_tool("connection_whoami", {"provider": "demo"})
    assert user.landing is not None
    landing = await user.landing

    assert view.structured_content is not None
    assert view.structured_content["total_cents"] == 3 * 1800
    assert order.structured_content is not None
    assert order.structured_content["status"] == "placed"
    assert not whoami.is_error, whoami
    assert whoami.structured_content is not None
    assert whoami.structured_content["profile"]["sub"] == username
    assert landing.status == 200
    assert "Connected" in landing.text

    replicas = [replica for _, replica in shopping]
    assert None not in replicas, shopping
    assert [tool for tool, _ in shopping][-2:] == ["cart_checkout", "cart_checkout"]  # both rounds
    assert _alternates(replicas), f"consecutive requests on one replica: {shopping}"
    assert set(replicas) == set(REPLICAS)
    # The connect: round 1 made the link, the browser steps and the retried call were spread out too.
    connect_replicas = {replica for _, replica in browser_served} | {
        r for tool, r in served if tool == "connection_whoami"
    }
    assert {path for path, _ in browser_served} >= {"/oauth/login/callback", "/oauth/callback"}, browser_served
    assert len(connect_replicas) >= 2, (browser_served, served)
    note(f"cart flow + checkout + connect: MCP requests by replica {[r for _, r in served]}, browser {browser_served}")


def _count_backends(database_url: str) -> int:
    async def run() -> int:
        conn = await asyncpg.connect(_dsn(database_url))
        try:
            count = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            return int(count)
        finally:
            await conn.close()

    return asyncio.run(run())


def _warm_up(deployment: Deployment, tokens: list[str]) -> LoadStats:
    # Each replica's first calls fetch the issuer's keys and fill its caches: not what is being compared.
    with steady_load(deployment.mcp_url, tokens) as stats:
        wait_until(
            lambda: all(stats.by_replica()[name] >= WARM_UP_REQUESTS for name in REPLICAS),
            timeout=60,
            what="every replica to serve its first requests",
        )
    return stats


def _cart_view_request(deployment: Deployment, token: str) -> tuple[dict[str, str], dict[str, Any]]:
    """Headers and body of a ``cart_view`` call on a fresh one-line cart of the token's user (checked once)."""
    with httpx.Client(timeout=10) as http:
        create = {"name": "cart_create", "arguments": {}}
        created = response_message(post(http, deployment.mcp_url, "tools/call", create, token=token))
        cart = {"cart_id": created["result"]["structuredContent"]["cart_id"]}
        arguments = {**cart, "sku": "brush-lint", "quantity": 1}
        post(http, deployment.mcp_url, "tools/call", {"name": "cart_set_item", "arguments": arguments}, token=token)
        headers, body = modern_request("tools/call", {"name": "cart_view", "arguments": cart})
        headers["Authorization"] = f"Bearer {token}"
        viewed = response_message(http.post(deployment.mcp_url, headers=headers, json=body))
    assert viewed["result"]["structuredContent"]["total_cents"] == 700, viewed
    return headers, body


async def test_three_replicas_share_the_load_without_failures_and_pgbouncer_bounds_the_connections(
    deployment: Deployment,
) -> None:
    if not wrk_available():
        pytest.fail("wrk is missing: run .ci/system-packages (installs Debian's wrk)")
    tokens = await deployment.tokens(f"load-{uuid.uuid4().hex[:6]}", SHOPPERS)
    shopped = await asyncio.to_thread(_warm_up, deployment, tokens)
    headers, body = await asyncio.to_thread(_cart_view_request, deployment, tokens[0])
    peak_backends = 0

    def sample_backends() -> None:
        nonlocal peak_backends
        peak_backends = max(peak_backends, _count_backends(deployment.database_url))

    def measure(replicas: int) -> WrkRun:
        for name in REPLICAS[replicas:]:
            deployment.balancer.set_state(name, "maint")
        try:
            return run_wrk(
                deployment.mcp_url,
                headers,
                body,
                seconds=WRK_SECONDS,
                connections=WRK_CONNECTIONS,
                while_running=sample_backends if replicas > 1 else None,
            )
        finally:
            for name in REPLICAS[replicas:]:
                deployment.balancer.set_state(name, "ready")
            deployment.wait_all_up()

    ones: list[WrkRun] = []
    threes: list[WrkRun] = []
    for _ in range(ROUNDS):  # interleaved, so a busy moment on the shared machine hits both sides
        ones.append(await asyncio.to_thread(measure, 1))
        threes.append(await asyncio.to_thread(measure, 3))

    ratios = [three.rps / one.rps for one, three in zip(ones, threes, strict=True)]
    note(
        f"cart_view through HAProxy (wrk -c{WRK_CONNECTIONS}, {ROUNDS} interleaved rounds): "
        f"1 replica {sum(r.requests for r in ones)} requests, {sum(r.failures for r in ones)} failures; "
        f"3 replicas {sum(r.requests for r in threes)} requests, {sum(r.failures for r in threes)} failures; "
        f"throughput 3 vs 1 = {', '.join(f'{r:.2f}x' for r in ratios)}"
    )
    note(
        "  (one 2-core machine runs wrk, HAProxy, PgBouncer, PostgreSQL and every replica: the ratio shows the "
        "replicas sharing the load, not how far they scale on separate machines)"
    )
    note(
        f"  shop flow (create, set item, view, both checkout rounds) by {SHOPPERS} users over 3 replicas: "
        f"{shopped.requests} requests, {len(shopped.failures)} failures, by replica "
        f"{dict(sorted(shopped.by_replica().items()))}; PostgreSQL backends seen at most {peak_backends} "
        f"(PgBouncer pool {BOUNCER_POOL}; the replicas' pools add up to {len(REPLICAS) * (POOL_SIZE + MAX_OVERFLOW)})"
    )
    assert shopped.failures == [], shopped.failures[:3]
    assert all(run.failures == 0 for run in [*ones, *threes]), (ones, threes)
    assert all(run.requests > 0 for run in [*ones, *threes])
    # Every replica may open POOL_SIZE + MAX_OVERFLOW connections; PostgreSQL saw PgBouncer's pool only.
    assert 1 <= peak_backends <= BOUNCER_POOL < len(REPLICAS) * (POOL_SIZE + MAX_OVERFLOW)


INVARIANTS = {
    "orders without lines or whose lines do not add up to the total": """
        SELECT o.handle FROM orders o LEFT JOIN order_line l ON l.order_id = o.id
        WHERE o.principal_sub LIKE $1 GROUP BY o.id
        HAVING count(l.sku) = 0 OR sum(l.quantity * l.unit_price_cents) <> o.total_cents""",
    "checked-out carts without their order, or orders of open carts": """
        SELECT c.handle FROM cart c LEFT JOIN orders o ON o.cart_id = c.id
        WHERE c.principal_sub LIKE $1 AND (c.status = 'checked_out') <> (o.id IS NOT NULL)""",
    # Every change bumps the version once: one line set, then the checkout.
    "carts whose version does not match their changes": """
        SELECT c.handle FROM cart c LEFT JOIN cart_item i ON i.cart_id = c.id
        WHERE c.principal_sub LIKE $1 GROUP BY c.id
        HAVING c.version - 1 <> count(i.sku) + CASE WHEN c.status = 'checked_out' THEN 1 ELSE 0 END""",
}


async def _violations(database_url: str, prefix: str) -> dict[str, list[str]]:
    conn = await asyncpg.connect(_dsn(database_url))
    try:
        found = {what: [row[0] for row in await conn.fetch(query, f"{prefix}-%")] for what, query in INVARIANTS.items()}
        carts = await conn.fetchval("SELECT count(*) FROM cart WHERE principal_sub LIKE $1", f"{prefix}-%")
    finally:
        await conn.close()
    assert carts > 0, "no carts were written: the check would pass vacuously"
    return {what: handles for what, handles in found.items() if handles}


async def test_a_replica_killed_with_sigkill_mid_load_leaves_no_partial_rows_and_the_others_carry_on(
    deployment: Deployment,
) -> None:
    prefix = f"kill-{uuid.uuid4().hex[:6]}"
    tokens = await deployment.tokens(prefix, SHOPPERS)
    victim = deployment.replicas["r2"]

    def run() -> tuple[LoadStats, int, float]:
        with steady_load(deployment.mcp_url, tokens) as stats:
            wait_for_requests(stats, 40)
            code = victim.stop(signal.SIGKILL)
            deployment.balancer.wait_for("r2", "DOWN")
            down_at = time.monotonic()
            wait_for_requests(stats, 60, after=down_at)
        return stats, code, down_at

    stats, code, down_at = await asyncio.to_thread(run)
    try:
        assert code == -signal.SIGKILL
        # At most the requests r2 was working on when it died are lost: one per user.
        assert len(stats.failures) <= SHOPPERS, stats.failures
        assert {o.replica for o in stats.ok_after(down_at)} == {"r1", "r3"}
        assert await _violations(deployment.database_url, prefix) == {}
        note(
            f"SIGKILL of r2 under load: {stats.requests} requests, {len(stats.failures)} failed "
            f"(in flight on r2), {len(stats.ok_after(down_at))} served by r1/r3 after HAProxy marked r2 down; "
            "no partial rows"
        )
    finally:
        await asyncio.to_thread(victim.start)
        await asyncio.to_thread(deployment.balancer.wait_for, "r2", "UP")


async def test_a_rolling_restart_loses_no_request_and_every_replica_exits_0(deployment: Deployment) -> None:
    prefix = f"roll-{uuid.uuid4().hex[:6]}"
    tokens = await deployment.tokens(prefix, ROLLING_SHOPPERS)  # fewer: restarts compete with them for CPU
    balancer = deployment.balancer
    exit_codes: dict[str, int] = {}
    out_before_exit: dict[str, bool] = {}

    def run() -> LoadStats:
        with steady_load(deployment.mcp_url, tokens) as stats:
            wait_for_requests(stats, 20)
            for name in REPLICAS:
                replica = deployment.replicas[name]
                replica.signal(signal.SIGTERM)
                balancer.wait_for(name, "DOWN")
                out_before_exit[name] = replica.running  # drained while still serving
                exit_codes[name] = replica.wait()
                replica.start()
                balancer.wait_for(name, "UP")
                wait_for_requests(stats, 10, after=time.monotonic())
        return stats

    stats = await asyncio.to_thread(run)
    assert stats.failures == [], stats.failures[:5]
    assert out_before_exit == dict.fromkeys(REPLICAS, True)
    assert exit_codes == dict.fromkeys(REPLICAS, 0)
    assert set(stats.by_replica()) == set(REPLICAS)
    assert await _violations(deployment.database_url, prefix) == {}
    note(
        f"rolling restart (SIGTERM, drain, restart, wait for UP; one replica at a time): {stats.requests} "
        f"requests, {len(stats.failures)} failures, exit codes {exit_codes}"
    )
