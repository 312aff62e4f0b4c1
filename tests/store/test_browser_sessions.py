"""Browser sessions in PostgreSQL: live from sign-in until sign-out or expiry, scoped to their principal."""

import secrets
from collections.abc import Callable
from datetime import timedelta

import pytest
from sqlalchemy import func, select, update

from store.browser_sessions import BrowserSessionRepository, session_digest
from store.db import Database
from store.models import BrowserSession, table_of
from store.principal import Principal

_session = table_of(BrowserSession)
LIFETIME = timedelta(minutes=15)


async def _live(database: Database, session_id: str, principal: Principal) -> bool:
    async with database.one_statement() as conn:
        return await BrowserSessionRepository(conn).is_live(session_id, principal)


async def test_a_session_is_live_until_it_ends_and_only_for_its_own_principal(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    alice, bob = new_principal(), new_principal()
    session_id = secrets.token_urlsafe(32)
    async with database.one_statement() as conn:
        await BrowserSessionRepository(conn).start(session_id, alice, lifetime=LIFETIME)
    assert await _live(database, session_id, alice)
    assert not await _live(database, session_id, bob)  # a cookie naming bob with alice's id opens nothing
    assert not await _live(database, secrets.token_urlsafe(32), alice)
    async with database.one_statement() as conn:
        assert not await BrowserSessionRepository(conn).end(session_id, bob)  # bob cannot end alice's session
    assert await _live(database, session_id, alice)
    async with database.one_statement() as conn:
        assert await BrowserSessionRepository(conn).end(session_id, alice)
    assert not await _live(database, session_id, alice)
    async with database.one_statement() as conn:
        assert not await BrowserSessionRepository(conn).end(session_id, alice)


async def test_an_expired_session_is_not_live_and_only_the_id_digest_is_stored(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    alice = new_principal()
    session_id = secrets.token_urlsafe(32)
    async with database.one_statement() as conn:
        await BrowserSessionRepository(conn).start(session_id, alice, lifetime=LIFETIME)
    async with database.one_statement() as conn:
        stored = (await conn.execute(select(_session).where(_session.c.principal_sub == alice.subject))).one()
    assert stored.session_digest == session_digest(session_id)
    assert session_id.encode() not in stored.session_digest
    async with database.one_statement() as conn:
        await conn.execute(
            update(_session)
            .where(_session.c.session_digest == session_digest(session_id))
            .values(expires_at=func.now() - timedelta(seconds=1))
        )
    assert not await _live(database, session_id, alice)


async def test_a_session_without_a_positive_lifetime_is_refused(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    async with database.one_statement() as conn:
        with pytest.raises(ValueError, match="positive lifetime"):
            await BrowserSessionRepository(conn).start("id", new_principal(), lifetime=timedelta(0))
