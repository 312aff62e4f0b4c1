"""Connect flows against the real test database: reuse, single-use state, expiry, scoping.

Waiting for a flow to settle is the service's job: tests/api/test_flow_wait.py.
"""

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import timedelta

import pytest
from sqlalchemy import func, select, update

from store.crypto import TokenCipher
from store.db import Database
from store.errors import NotFound
from store.flows import FLOW_PREFIX, Flow, FlowRepository
from store.handles import is_well_formed
from store.models import OAuthFlow, table_of
from store.principal import Principal

CIPHER = TokenCipher([b"test-flow-key-" + b"f" * 20 + b"-0123456789"])
TTL = timedelta(minutes=10)

_table = table_of(OAuthFlow)


@asynccontextmanager
async def _flows(database: Database) -> AsyncIterator[FlowRepository]:
    """The flow repository inside one committed transaction."""
    async with database.transaction() as conn:
        yield FlowRepository(conn, CIPHER)


async def _begin(database: Database, owner: Principal, provider: str = "demo", ttl: timedelta = TTL) -> Flow:
    async with _flows(database) as flows:
        return await flows.begin(owner, provider, ttl=ttl)


async def _attach(database: Database, flow: Flow, *, nonce: str | None = "nonce-SECRET") -> str:
    state = secrets.token_urlsafe(32)
    async with _flows(database) as flows:
        await flows.attach_provider_state(flow.handle, state=state, code_verifier="verifier-SECRET", nonce=nonce)
    return state


async def _settled(database: Database, owner: Principal, flow: Flow) -> Flow:
    """``flow`` as ``owner`` reads it now."""
    async with _flows(database) as flows:
        settled = await flows.get(owner, flow.handle)
    assert settled is not None, f"{flow.handle} is gone"
    return settled


async def _expire(database: Database, flow: Flow) -> None:
    async with database.transaction() as conn:
        await conn.execute(
            update(_table).where(_table.c.handle == flow.handle).values(expires_at=func.now() - timedelta(seconds=1))
        )


async def test_begin_returns_a_pending_flow_with_an_opaque_handle_expiring_after_the_ttl(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    flow = await _begin(database, owner)
    assert is_well_formed(flow.handle, FLOW_PREFIX)
    assert (flow.principal, flow.provider, flow.status, flow.error) == (owner, "demo", "pending", None)
    assert flow.expires_at - flow.created_at == TTL


async def test_open_flow_reuses_the_newest_pending_flow_and_ignores_expired_or_finished_ones(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    async with _flows(database) as flows:
        assert await flows.open_flow(owner, "demo") is None
    older = await _begin(database, owner)
    newer = await _begin(database, owner)
    await _begin(database, owner, provider="other")
    async with _flows(database) as flows:
        assert await flows.open_flow(owner, "demo") == newer
        await flows.finish(newer.handle, "denied", error="access_denied")
        assert await flows.open_flow(owner, "demo") == older
    await _expire(database, older)
    async with _flows(database) as flows:
        assert await flows.open_flow(owner, "demo") is None


async def test_get_is_scoped_to_the_principal_and_malformed_or_unknown_handles_read_as_none(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    alice, bob = new_principal(), new_principal()
    flow = await _begin(database, alice)
    async with _flows(database) as flows:
        assert await flows.get(alice, flow.handle) == flow
        for handle in (flow.handle, "flow_" + "A" * 32, "flow_short", "cart_" + "A" * 32, ""):
            assert await flows.get(bob, handle) is None
        assert await flows.open_flow(bob, "demo") is None
        assert await flows.get_for_browser("flow_" + "A" * 32) is None
        assert await flows.get_for_browser("nonsense") is None
        # The browser lookup is unscoped by design; the route compares flow.principal itself.
        browser = await flows.get_for_browser(flow.handle)
    assert browser is not None
    assert browser.principal == alice


async def test_a_state_is_consumed_once_and_returns_the_flow_with_its_verifier_and_nonce(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    flow = await _begin(database, owner)
    state = await _attach(database, flow)
    async with _flows(database) as flows:
        consumed = await flows.consume_state(state)
    assert consumed is not None
    assert consumed.flow == flow
    assert (consumed.code_verifier, consumed.nonce) == ("verifier-SECRET", "nonce-SECRET")
    assert "SECRET" not in repr(consumed)
    async with database.transaction() as conn:
        assert await FlowRepository(conn, CIPHER).consume_state(state) is None
        stored = (
            await conn.execute(
                select(_table.c.state_digest, _table.c.secrets_enc).where(_table.c.handle == flow.handle)
            )
        ).one()
    assert stored.state_digest is not None
    assert state.encode() not in stored.state_digest
    assert stored.secrets_enc is None


async def test_concurrent_consumers_of_one_state_get_it_exactly_once(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    flow = await _begin(database, new_principal())
    state = await _attach(database, flow, nonce=None)

    async def consume() -> bool:
        async with _flows(database) as flows:
            return await flows.consume_state(state) is not None

    async with asyncio.timeout(10):
        results = await asyncio.gather(*(consume() for _ in range(5)))
    assert sorted(results) == [False, False, False, False, True]


async def test_unknown_empty_superseded_and_expired_states_are_not_consumed(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    flow = await _begin(database, owner)
    first = await _attach(database, flow)
    second = await _attach(database, flow)  # the user reloaded /connect: only the newest state counts
    expiring = await _begin(database, owner)
    expired_state = await _attach(database, expiring)
    await _expire(database, expiring)
    async with _flows(database) as flows:
        for state in ("", secrets.token_urlsafe(32), first, expired_state):
            assert await flows.consume_state(state) is None
        assert await flows.consume_state(second) is not None
    assert (await _settled(database, owner, expiring)).status == "expired"


async def test_a_finished_flow_accepts_no_state_and_the_first_outcome_wins(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    flow = await _begin(database, owner)
    state = await _attach(database, flow)
    async with _flows(database) as flows:
        assert await flows.finish(flow.handle, "denied", error="access_denied") is True
        assert await flows.finish(flow.handle, "connected") is False
        assert await flows.consume_state(state) is None
        with pytest.raises(NotFound):
            await flows.attach_provider_state(flow.handle, state="s", code_verifier="v", nonce=None)
    settled = await _settled(database, owner, flow)
    assert (settled.status, settled.error) == ("denied", "access_denied")


async def test_finish_records_only_short_error_codes_and_refuses_non_final_statuses(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    flow = await _begin(database, owner)
    async with _flows(database) as flows:
        with pytest.raises(ValueError, match="finishes as one of"):
            await flows.finish(flow.handle, "pending")
        assert await flows.finish(flow.handle, "failed", error="eyJhbGciOi token=abc <script>") is True
    settled = await _settled(database, owner, flow)
    assert (settled.status, settled.error) == ("failed", "unrecognised_error")


async def test_a_flow_can_still_finish_after_it_expired_once_its_state_was_consumed(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    flow = await _begin(database, owner)
    state = await _attach(database, flow)
    async with _flows(database) as flows:
        assert await flows.consume_state(state) is not None
    await _expire(database, flow)
    async with _flows(database) as flows:
        assert await flows.finish(flow.handle, "connected") is True
    assert (await _settled(database, owner, flow)).status == "connected"


async def test_attach_provider_state_refuses_unknown_and_expired_flows(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    flow = await _begin(database, new_principal())
    await _expire(database, flow)
    async with _flows(database) as flows:
        for handle in (flow.handle, "flow_" + "B" * 32, "bogus"):
            with pytest.raises(NotFound):
                await flows.attach_provider_state(handle, state="s", code_verifier="v", nonce=None)


async def test_flow_secrets_never_reach_logs_or_reprs(
    database: Database, new_principal: Callable[[], Principal], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    flow = await _begin(database, new_principal())
    state = await _attach(database, flow)
    async with _flows(database) as flows:
        consumed = await flows.consume_state(state)
    shown = repr(consumed) + caplog.text
    assert "verifier-SECRET" not in shown
    assert "nonce-SECRET" not in shown
    assert state not in shown
