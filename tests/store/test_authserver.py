"""The authorization server's store against real PostgreSQL: single-use codes, rotating refresh tokens,
revocation that every replica hears about."""

import asyncio
import uuid
from collections.abc import Callable
from datetime import timedelta

import asyncpg  # type: ignore[import-untyped]
from sqlalchemy import select, text, update
from sqlalchemy.engine import make_url

from api.authserver.retention import purge_once
from store import authserver as store
from store.db import Database
from store.models import AsAuthorizationCode, AsClient, AsGrant, AsRefreshToken, table_of
from store.principal import Principal

RESOURCE = "https://coatcheck.test/mcp"
CHALLENGE = "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"


async def _grant_with_code(
    database: Database, owner: Principal, lifetime: timedelta = timedelta(seconds=60)
) -> tuple[str, str]:
    code = store.new_secret()
    async with database.transaction() as conn:
        grant_id = await store.create_grant(conn, owner, client_id="client-a", scopes=["mcp"], resource=RESOURCE)
        await store.store_code(
            conn,
            code,
            grant_id=grant_id,
            client_id="client-a",
            redirect_uri="http://127.0.0.1:9/cb",
            code_challenge=CHALLENGE,
            lifetime=lifetime,
        )
    return grant_id, code


async def test_of_many_concurrent_redemptions_of_a_code_exactly_one_gets_its_grant(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    grant_id, code = await _grant_with_code(database, new_principal())

    async def redeem() -> str | None:
        async with database.one_statement() as conn:
            return await store.consume_code(conn, code)

    outcomes = await asyncio.gather(*(redeem() for _ in range(8)))
    assert sorted(outcomes, key=str) == [None] * 7 + [grant_id]


async def test_an_expired_code_cannot_be_consumed_and_codes_are_stored_only_as_digests(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    _, code = await _grant_with_code(database, new_principal(), lifetime=timedelta(seconds=-1))
    async with database.one_statement() as conn:
        assert await store.consume_code(conn, code) is None
    async with database.one_statement() as conn:
        stored = (await conn.execute(select(table_of(AsAuthorizationCode).c.code_hash))).scalars().all()
    assert store.digest(code) in stored
    assert code.encode() not in stored


async def test_a_refresh_token_rotates_once_and_a_spent_one_is_refused(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    grant_id, _ = await _grant_with_code(database, new_principal())
    token = store.new_secret()
    async with database.one_statement() as conn:
        await store.store_refresh_token(
            conn, token, grant_id=grant_id, client_id="client-a", lifetime=timedelta(days=1)
        )

    async def rotate() -> str | None:
        async with database.one_statement() as conn:
            return await store.rotate_refresh_token(conn, token)

    assert sorted(await asyncio.gather(*(rotate() for _ in range(5))), key=str) == [None] * 4 + [grant_id]
    async with database.one_statement() as conn:
        record = await store.load_refresh_token(conn, token)
        hashes = (await conn.execute(select(table_of(AsRefreshToken).c.token_hash))).scalars().all()
    assert record is not None
    assert record.used
    assert record.grant.id == grant_id
    assert token.encode() not in hashes


async def test_a_revoked_grant_is_announced_to_listeners_and_its_refresh_tokens_stop_rotating(
    database: Database, database_url: str, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    grant_id, _ = await _grant_with_code(database, owner)
    token = store.new_secret()
    async with database.one_statement() as conn:
        await store.store_refresh_token(
            conn, token, grant_id=grant_id, client_id="client-a", lifetime=timedelta(days=1)
        )
    heard: asyncio.Queue[str] = asyncio.Queue()
    url = make_url(database_url).set(drivername="postgresql")
    listener = await asyncpg.connect(url.render_as_string(hide_password=False))
    try:
        await listener.add_listener(store.REVOCATION_CHANNEL, lambda *args: heard.put_nowait(args[3]))
        async with database.one_statement() as conn:
            revoked = await store.revoke_grant(conn, grant_id, "test")
        assert revoked is not None
        assert revoked.principal == owner
        assert await asyncio.wait_for(heard.get(), timeout=5) == grant_id
    finally:
        await listener.close()
    async with database.one_statement() as conn:
        assert await store.rotate_refresh_token(conn, token) is None
        assert await store.revoke_grant(conn, grant_id, "again") is None  # only the first revocation counts
        assert await store.is_revoked(conn, grant_id)
        assert grant_id in await store.revoked_since(conn, timedelta(minutes=5))


async def test_grants_and_consents_are_scoped_to_their_principal(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    alice, bob = new_principal(), new_principal()
    alice_grant, _ = await _grant_with_code(database, alice)
    await _grant_with_code(database, bob)
    async with database.transaction() as conn:
        await store.remember_consent(conn, alice, "client-a", ["mcp"])
        assert await store.consented_scopes(conn, alice, "client-a") == ["mcp"]
        assert await store.consented_scopes(conn, bob, "client-a") is None
        assert [g.id for g in await store.grants_of(conn, alice)] == [alice_grant]
        assert await store.revoke_grants_of(conn, alice, client_id="client-a", reason="user") == [alice_grant]
        assert all(g.revoked_at is None for g in await store.grants_of(conn, bob))
        assert await store.forget_consent(conn, alice, "client-a")
        assert await store.consented_scopes(conn, alice, "client-a") is None


async def test_the_purge_deletes_only_what_nothing_can_use_any_more(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    live_grant, live_code = await _grant_with_code(database, owner)
    old_grant, old_code = await _grant_with_code(database, owner, lifetime=timedelta(hours=-2))
    revoked_grant, _ = await _grant_with_code(database, owner)
    spent, expired = store.new_secret(), store.new_secret()
    stale_client, kept_client = f"dcr-{uuid.uuid4().hex}", f"dcr-{uuid.uuid4().hex}"
    grants, clients = table_of(AsGrant), table_of(AsClient)
    async with database.transaction() as conn:
        await store.store_refresh_token(
            conn, spent, grant_id=live_grant, client_id="client-a", lifetime=timedelta(days=1)
        )
        await store.rotate_refresh_token(conn, spent)  # spent but unexpired: kept, so a replay is recognised
        await store.store_refresh_token(
            conn, expired, grant_id=live_grant, client_id="client-a", lifetime=timedelta(seconds=-1)
        )
        await store.revoke_grant(conn, revoked_grant, "test")
        await conn.execute(
            update(grants).where(grants.c.id == revoked_grant).values(revoked_at=text("now() - interval '2 days'"))
        )
        await conn.execute(
            update(grants).where(grants.c.id == old_grant).values(created_at=text("now() - interval '2 days'"))
        )
        for client_id in (stale_client, kept_client):
            await store.save_client(conn, client_id=client_id, kind="dynamic", metadata={"client_id": client_id})
        await conn.execute(
            update(clients)
            .where(clients.c.client_id == stale_client)
            .values(created_at=text("now() - interval '2 days'"))
        )

    await purge_once(database, batch_size=1)

    async with database.one_statement() as conn:
        assert await store.load_code(conn, live_code) is not None
        assert await store.load_code(conn, old_code) is None  # expired two hours ago
        assert await store.load_refresh_token(conn, spent) is not None
        assert await store.load_refresh_token(conn, expired) is None
        left = set((await conn.execute(select(grants.c.id).where(grants.c.principal_sub == owner.subject))).scalars())
        assert await store.load_client(conn, stale_client) is None
        assert await store.load_client(conn, kept_client) is not None
    assert left == {live_grant}  # the old one's code is gone (so it is), the revoked one went after a day
