"""Waiting for a connect flow to settle: polls with no connection held between reads, returns as soon as it can."""

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import timedelta

import httpx2
import pytest
from sqlalchemy import func, update

from api.oauth.providers import ProviderRegistry
from api.oauth.service import Connections
from store.crypto import TokenCipher
from store.db import Database
from store.flows import Flow, FlowRepository
from store.models import OAuthFlow, table_of
from store.principal import Principal

CIPHER = TokenCipher([b"test-wait-key-" + b"w" * 20 + b"-0123456789"])
TTL = timedelta(minutes=10)

_table = table_of(OAuthFlow)


@pytest.fixture
async def service(database: Database) -> AsyncIterator[Connections]:
    async with httpx2.AsyncClient() as http:
        yield Connections(
            database=database,
            cipher=CIPHER,
            registry=ProviderRegistry(providers=(), http=http),
            http=http,
            public_url="http://127.0.0.1:1",
            flow_ttl=TTL,
            wait_seconds=0.0,
            refresh_skew=timedelta(minutes=1),
        )


async def _begin(database: Database, owner: Principal) -> Flow:
    async with database.transaction() as conn:
        return await FlowRepository(conn, CIPHER).begin(owner, "demo", ttl=TTL)


async def _expire(database: Database, flow: Flow) -> None:
    async with database.transaction() as conn:
        await conn.execute(
            update(_table).where(_table.c.handle == flow.handle).values(expires_at=func.now() - timedelta(seconds=1))
        )


async def test_waiting_for_a_flow_returns_as_soon_as_another_transaction_settles_the_flow(
    database: Database, service: Connections, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    flow = await _begin(database, owner)
    waiting = asyncio.create_task(service.wait(owner, flow.handle, 30.0, interval=0.01))
    async with database.transaction() as conn:
        await FlowRepository(conn, CIPHER).finish(flow.handle, "connected")
    async with asyncio.timeout(5):  # far below the 30 s the waiter would allow
        settled = await waiting
    assert settled is not None
    assert settled.status == "connected"


async def test_waiting_for_a_flow_gives_up_after_the_timeout_with_the_flow_still_pending(
    database: Database, service: Connections, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    flow = await _begin(database, owner)
    async with asyncio.timeout(5):
        still = await service.wait(owner, flow.handle, 0.05, interval=0.01)
    assert still == flow


async def test_waiting_for_a_flow_returns_at_once_for_a_foreign_or_expired_flow(
    database: Database, service: Connections, new_principal: Callable[[], Principal]
) -> None:
    alice, bob = new_principal(), new_principal()
    flow = await _begin(database, alice)
    async with asyncio.timeout(5):
        assert await service.wait(bob, flow.handle, 30.0) is None
    await _expire(database, flow)
    async with asyncio.timeout(5):
        expired = await service.wait(alice, flow.handle, 30.0)
    assert expired is not None
    assert expired.status == "expired"
