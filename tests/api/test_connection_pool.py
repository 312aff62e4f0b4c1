"""The connection pool under load and under dropped clients, seen from PostgreSQL.

A ``coatcheck serve`` process gets a database of its own, so ``pg_stat_database.sessions`` and
``pg_stat_activity`` count nothing but this server's connections. Its pool is deliberately smaller
than the number of clients: calls queue for a connection, none opens a new one.
"""

import asyncio
import contextlib
import json
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import pytest
from mcp import Client
from sqlalchemy.engine import make_url

from tests.support.auth_mode import AuthMode, McpTokens
from tests.support.mcp_client import call_ok, connect
from tests.support.mrtr import another_instance
from tests.support.scratch import scratch_database
from tests.support.server import RunningServer
from tests.support.waiting import eventually, wait_until
from tests.support.wire import modern_request

POOL_SIZE = 4


def _dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture(scope="module")
def own_database_url(admin_database_url: str) -> Iterator[str]:
    """A fresh, migrated, seeded database used by one server only."""
    with scratch_database(admin_database_url, prefix="coatcheck_pool", demo_catalog=True) as url:
        yield url


@pytest.fixture(scope="module")
def pooled_server(server_env: dict[str, str], public_url: str, own_database_url: str) -> Iterator[RunningServer]:
    with another_instance(
        server_env,
        public_url=public_url,
        DATABASE_URL=own_database_url,
        DB_POOL_SIZE=str(POOL_SIZE),
        # Long enough that the lock held in the cancellation test is released by the test, not by a timeout.
        DB_LOCK_TIMEOUT_MS="20000",
        DB_STATEMENT_TIMEOUT_MS="30000",
        DB_POOL_TIMEOUT_SECONDS="30",
    ) as running:
        yield running


@dataclass(frozen=True)
class Backends:
    """What PostgreSQL knows about one database's client connections."""

    sessions: int  # pg_stat_database.sessions: every session ever established (closed ones included)
    alive: frozenset[tuple[int, str]]  # (pid, backend_start) of the connected backends
    waiting_on_locks: int


class Observer:
    """Reads PostgreSQL's statistics for the server's database over a connection to another database."""

    def __init__(self, conn: asyncpg.Connection, database: str) -> None:
        self._conn = conn
        self._database = database

    async def read(self) -> Backends:
        await self._conn.execute("SELECT pg_stat_clear_snapshot()")
        sessions = await self._conn.fetchval("SELECT sessions FROM pg_stat_database WHERE datname = $1", self._database)
        rows = await self._conn.fetch(
            "SELECT pid, backend_start::text AS started, wait_event_type FROM pg_stat_activity "
            "WHERE datname = $1 AND backend_type = 'client backend'",
            self._database,
        )
        return Backends(
            sessions=int(sessions),
            alive=frozenset((row["pid"], row["started"]) for row in rows),
            waiting_on_locks=sum(1 for row in rows if row["wait_event_type"] == "Lock"),
        )


@pytest.fixture
async def observer(admin_database_url: str, own_database_url: str) -> AsyncIterator[Observer]:
    conn = await asyncpg.connect(_dsn(admin_database_url))
    try:
        yield Observer(conn, str(make_url(own_database_url).database))
    finally:
        await conn.close()


async def _clients(server: RunningServer, mcp_token: McpTokens, public_url: str, count: int) -> list[tuple[str, str]]:
    """``count`` users, each with a token and a cart of their own."""

    async def user(n: int) -> tuple[str, str]:
        token = await mcp_token(f"load-{n}-{uuid.uuid4().hex[:6]}", resource=f"{public_url}/mcp")
        async with connect(server.mcp_url, token) as client:
            return token, (await call_ok(client, "cart_create"))["cart_id"]

    return list(await asyncio.gather(*(user(n) for n in range(count))))


@contextlib.asynccontextmanager
async def _open(server: RunningServer, users: list[tuple[str, str]]) -> AsyncIterator[list[tuple[Client, str]]]:
    """An SDK client per user, kept open across load rounds."""
    async with contextlib.AsyncExitStack() as stack:
        yield [(await stack.enter_async_context(connect(server.mcp_url, token)), cart_id) for token, cart_id in users]


async def _load(clients: list[tuple[Client, str]], calls_each: int) -> int:
    """Every user at once: ``calls_each`` alternating cart_view / cart_set_item calls. Returns the calls made."""

    async def user(client: Client, cart_id: str) -> int:
        for n in range(calls_each):
            if n % 2:
                await call_ok(client, "cart_set_item", {"cart_id": cart_id, "sku": "hat-beanie", "quantity": n})
            else:
                await call_ok(client, "cart_view", {"cart_id": cart_id})
        return calls_each

    return sum(await asyncio.gather(*(user(client, cart_id) for client, cart_id in clients)))


def _server_backends(auth_mode: AuthMode) -> int:
    """The server's connections once warm: the pool, plus in authorization-server mode the revocation
    listener's own ``LISTEN`` connection (docs/authorization-server.md), which is outside the pool."""
    return POOL_SIZE + (1 if auth_mode == "authorization-server" else 0)


@pytest.mark.parametrize("concurrent_clients", [16, 64])
async def test_steady_load_opens_no_database_connections_after_warm_up(
    pooled_server: RunningServer,
    mcp_token: McpTokens,
    public_url: str,
    observer: Observer,
    concurrent_clients: int,
    auth_mode: AuthMode,
) -> None:
    users = await _clients(pooled_server, mcp_token, public_url, concurrent_clients)
    async with _open(pooled_server, users) as clients:
        await _load(clients, calls_each=2)  # warm-up: more clients than connections fills the pool
        before = await observer.read()
        assert len(before.alive) == _server_backends(auth_mode), before
        calls = await _load(clients, calls_each=256 // concurrent_clients)
    after = await observer.read()
    opened = after.sessions - before.sessions
    print(f"\n{concurrent_clients} concurrent clients, pool {POOL_SIZE}: {calls} calls, {opened} sessions opened")
    assert opened == 0
    assert after.alive == before.alive  # the very same backends: none closed, none opened


def _raw_call(server: RunningServer, token: str, tool: str, arguments: dict[str, Any]) -> socket.socket:
    """Send one tools/call over a plain socket and return the socket without reading the answer."""
    headers, body = modern_request("tools/call", {"name": tool, "arguments": arguments})
    payload = json.dumps(body).encode()
    host = server.base_url.removeprefix("http://")
    lines = ["POST /mcp HTTP/1.1", f"Host: {host}", f"Authorization: Bearer {token}", f"Content-Length: {len(payload)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    sock = socket.create_connection(("127.0.0.1", int(host.rsplit(":", 1)[1])))
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + payload)
    return sock


def _server_side_open(port: int, client_ports: set[int]) -> int:
    """How many of these client connections the server has not closed yet (its side still in the kernel table)."""
    open_count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            entries = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for entry in entries:
            local, remote = entry.split()[1:3]
            if int(local.rsplit(":", 1)[1], 16) == port and int(remote.rsplit(":", 1)[1], 16) in client_ports:
                open_count += 1
    return open_count


async def test_clients_that_disconnect_mid_call_cost_the_pool_no_connection(
    pooled_server: RunningServer,
    mcp_token: McpTokens,
    public_url: str,
    observer: Observer,
    own_database_url: str,
    auth_mode: AuthMode,
) -> None:
    [(token, cart_id)] = await _clients(pooled_server, mcp_token, public_url, 1)
    users = await _clients(pooled_server, mcp_token, public_url, 8)
    async with _open(pooled_server, users) as clients:
        await _load(clients, calls_each=2)

    dropped = POOL_SIZE - 1  # every connection but one is mid-statement when its client goes away
    holder = await asyncpg.connect(_dsn(own_database_url))  # holds the cart's row lock; counted in both readings
    try:
        before = await observer.read()
        assert len(before.alive) == _server_backends(auth_mode) + 1, before
        lock = holder.transaction()
        await lock.start()
        await holder.execute("SELECT 1 FROM cart WHERE handle = $1 FOR UPDATE", cart_id)
        sockets = [
            _raw_call(pooled_server, token, "cart_set_item", {"cart_id": cart_id, "sku": "hat-beanie", "quantity": n})
            for n in range(1, dropped + 1)
        ]

        async def all_waiting() -> bool:
            return (await observer.read()).waiting_on_locks == dropped

        await eventually(all_waiting, within=20, what=f"{dropped} cart_set_item calls waiting for the cart's lock")
        port = int(pooled_server.base_url.rsplit(":", 1)[1])
        client_ports = {sock.getsockname()[1] for sock in sockets}
        for sock in sockets:
            sock.close()  # the client goes away mid-call
        wait_until(lambda: _server_side_open(port, client_ports) == 0, timeout=10, what="the server to see the drops")
        await lock.commit()

        async with connect(pooled_server.mcp_url, token) as client:

            async def every_dropped_write_landed() -> bool:
                # The dropped calls' statements run to completion (cancellation waits for them), one after
                # another on the cart's row lock; a cut-off statement would leave the version short for good.
                return bool((await call_ok(client, "cart_view", {"cart_id": cart_id}))["version"] == 1 + dropped)

            await eventually(every_dropped_write_landed, within=20, what=f"the {dropped} dropped writes to land")
        async with _open(pooled_server, users) as clients:
            await _load(clients, calls_each=4)
        after = await observer.read()
    finally:
        await holder.close()
    print(f"\n{dropped} clients dropped mid-call: {after.sessions - before.sessions} sessions opened afterwards")
    assert after.sessions == before.sessions
    assert after.alive == before.alive
