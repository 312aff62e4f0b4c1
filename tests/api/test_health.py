"""Health endpoints: /healthz says the process is up, /readyz whether the database answers in time, writable.

The answers and the readiness deadline are the app's, so the test builds the app in-process by
``create_app`` from settings naming a database that does not answer; its lifespan starting regardless is
part of what it shows. (The drain on shutdown is a process matter: tests/api/test_draining.py.)
"""

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest

from tests.support.inprocess import settings_from, started_app
from tests.support.pg_nodes import primary_and_standby
from tests.support.waiting import free_port

READYZ_TIMEOUT = 1.0


@contextlib.asynccontextmanager
async def _unanswering_database(kind: str) -> AsyncIterator[int]:
    """A port where the database is unreachable: nothing listens ("refused"), or a listener that never speaks."""
    if kind == "refused":
        yield free_port()
        return
    hang_up = asyncio.Event()

    async def say_nothing(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await hang_up.wait()
        writer.close()

    listener = await asyncio.start_server(say_nothing, "127.0.0.1", 0)
    try:
        yield listener.sockets[0].getsockname()[1]
    finally:
        hang_up.set()
        listener.close()
        await listener.wait_closed()


@pytest.mark.parametrize("kind", ["refused", "silent"])
async def test_readyz_reports_503_within_its_timeout_when_the_database_is_unreachable(
    server_env: dict[str, str], kind: str
) -> None:
    async with _unanswering_database(kind) as port:
        env = {
            **server_env,
            "DATABASE_URL": f"postgresql://postgres@127.0.0.1:{port}/nowhere",
            "READYZ_TIMEOUT_SECONDS": str(READYZ_TIMEOUT),
        }
        async with started_app(settings_from(env)) as app, app.http(timeout=10) as http:
            assert (await http.get("/healthz")).json() == {"status": "ok"}
            started = time.monotonic()
            response = await http.get("/readyz")
            elapsed = time.monotonic() - started
    assert response.status_code == 503
    assert response.json() == {"status": "database unreachable"}
    assert elapsed < READYZ_TIMEOUT + 4  # a loaded machine is slow, a missing deadline is 10 s of client timeout
    if kind == "silent":
        assert elapsed >= READYZ_TIMEOUT * 0.9  # it waited for the deadline, not for the connect to fail
    assert "nowhere" not in response.text


async def test_readyz_is_503_on_a_streaming_standby_and_200_on_its_primary(server_env: dict[str, str]) -> None:
    """A standby answers queries (``SELECT 1`` passed there) but refuses every write: a failover's demoted primary."""
    answers = {}
    with primary_and_standby() as nodes:
        for node in nodes:
            env = {**server_env, "DATABASE_URL": node.url, "READYZ_TIMEOUT_SECONDS": str(READYZ_TIMEOUT)}
            async with started_app(settings_from(env)) as app, app.http(timeout=10) as http:
                response = await http.get("/readyz")
                answers[node.name] = (response.status_code, response.json()["status"])
    assert answers == {"primary": (200, "ready"), "standby": (503, "database read-only")}
