"""The token vault against the real test database: encryption at rest, scoping, locking, refresh, rotation."""

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select, text, update

from store.audit import AuditRepository
from store.connections import (
    ConnectionRepository,
    InvalidGrant,
    TokenSet,
    count_stale,
    reencrypt_all,
    refresh_if_needed,
)
from store.crypto import DecryptError, TokenCipher
from store.db import Database
from store.errors import NotFound
from store.models import ProviderConnection, table_of
from store.principal import Principal
from tests.support.scratch import scratch_database
from tests.support.sql import recorded_statements

KEY = b"test-vault-key-" + b"k" * 20 + b"-0123456789"
OLD = b"old-vault-key-" + b"o" * 20 + b"-abcdefghij"
NEW = b"new-vault-key-" + b"n" * 20 + b"-ABCDEFGHIJ"
CIPHER = TokenCipher([KEY])
SKEW = timedelta(minutes=1)

_table = table_of(ProviderConnection)


def _tokens(tag: str, *, expires_in: timedelta | None = timedelta(hours=1), refresh: bool = True) -> TokenSet:
    return TokenSet(
        access_token=f"at-{tag}-SECRET",
        refresh_token=f"rt-{tag}-SECRET" if refresh else None,
        expires_at=datetime.now(UTC) + expires_in if expires_in is not None else None,
        scopes=("read", "write"),
    )


async def _save(database: Database, owner: Principal, tokens: TokenSet, provider: str = "demo") -> None:
    async with database.transaction() as conn:
        await ConnectionRepository(conn, CIPHER).save(owner, provider, tokens)


async def _locked_tokens(database: Database, owner: Principal, cipher: TokenCipher = CIPHER) -> TokenSet | None:
    async with database.transaction() as conn:
        locked = await ConnectionRepository(conn, cipher).lock(owner, "demo")
    return locked.tokens if locked is not None else None


async def _wait_for_lock_waiters(database: Database, count: int) -> None:
    """Return once ``count`` backends of this database are blocked behind another's lock."""
    query = text(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND cardinality(pg_blocking_pids(pid)) > 0"
    )
    async with asyncio.timeout(10):
        while True:
            async with database.one_statement() as conn:
                if (await conn.scalar(query) or 0) >= count:
                    return


async def test_saved_tokens_come_back_decrypted_and_are_stored_only_as_ciphertext(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    tokens = _tokens("a")
    await _save(database, owner, tokens)
    assert await _locked_tokens(database, owner) == tokens
    async with database.transaction() as conn:
        raw = (
            await conn.execute(
                select(_table.c.access_token_enc, _table.c.refresh_token_enc).where(
                    _table.c.principal_sub == owner.subject
                )
            )
        ).one()
        info = await ConnectionRepository(conn, CIPHER).info(owner, "demo")
    assert all(value.startswith(CIPHER.current_prefix) for value in raw)
    assert "SECRET" not in "".join(raw)
    assert info is not None
    assert (info.provider, info.status, info.scopes, info.refreshed_at) == (
        "demo",
        "connected",
        ("read", "write"),
        None,
    )
    assert info.expires_at == tokens.expires_at


async def test_list_shows_every_provider_of_the_principal_without_token_material(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    await _save(database, owner, _tokens("b"), provider="zeta")
    await _save(database, owner, _tokens("a"), provider="alpha")
    async with database.transaction() as conn:
        listed = await ConnectionRepository(conn, CIPHER).list(owner)
    assert [(c.provider, c.status) for c in listed] == [("alpha", "connected"), ("zeta", "connected")]
    assert "SECRET" not in repr(listed)


async def test_saving_again_replaces_the_tokens_and_reconnects_a_connection_that_needed_reauth(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    await _save(database, owner, _tokens("first"))
    async with database.transaction() as conn:
        await ConnectionRepository(conn, CIPHER).mark_needs_reauth(owner, "demo")
        info = await ConnectionRepository(conn, CIPHER).info(owner, "demo")
    assert info is not None
    assert info.status == "needs_reauth"
    second = _tokens("second", refresh=False)
    await _save(database, owner, second)
    async with database.transaction() as conn:
        info = await ConnectionRepository(conn, CIPHER).info(owner, "demo")
        count = await conn.scalar(
            select(func.count()).select_from(_table).where(_table.c.principal_sub == owner.subject)
        )
    assert info is not None
    assert info.status == "connected"
    assert count == 1
    assert await _locked_tokens(database, owner) == second


async def test_another_principal_sees_and_changes_nothing(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    alice, bob = new_principal(), new_principal()
    tokens = _tokens("alice")
    await _save(database, alice, tokens)
    async with database.transaction() as conn:
        vault = ConnectionRepository(conn, CIPHER)
        assert await vault.list(bob) == []
        assert await vault.info(bob, "demo") is None
        assert await vault.lock(bob, "demo") is None
        with pytest.raises(NotFound):
            await vault.replace_tokens(bob, "demo", _tokens("bob"))
        await vault.mark_needs_reauth(bob, "demo")
        assert await vault.delete(bob, "demo") is None
    async with database.transaction() as conn:
        info = await ConnectionRepository(conn, CIPHER).info(alice, "demo")
    assert info is not None
    assert info.status == "connected"
    assert await _locked_tokens(database, alice) == tokens


async def test_a_ciphertext_moved_to_another_row_or_column_does_not_decrypt_and_the_error_names_no_token(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    alice, bob = new_principal(), new_principal()
    await _save(database, alice, _tokens("alice"))
    await _save(database, bob, _tokens("bob"))
    async with database.transaction() as conn:
        alices = (
            await conn.execute(select(_table.c.access_token_enc).where(_table.c.principal_sub == alice.subject))
        ).scalar_one()
        await conn.execute(update(_table).where(_table.c.principal_sub == bob.subject).values(access_token_enc=alices))
    with pytest.raises(DecryptError) as caught:
        await _locked_tokens(database, bob)
    assert "SECRET" not in str(caught.value)
    assert alices not in str(caught.value)

    async with database.transaction() as conn:
        # Within one row: the access token's ciphertext in the refresh token's column.
        await conn.execute(
            update(_table)
            .where(_table.c.principal_sub == alice.subject)
            .values(refresh_token_enc=_table.c.access_token_enc)
        )
    with pytest.raises(DecryptError):
        await _locked_tokens(database, alice)


async def test_replace_tokens_keeps_the_refresh_token_when_the_provider_did_not_rotate_it(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    await _save(database, owner, _tokens("old"))
    rotated = TokenSet(access_token="at-new-SECRET", refresh_token=None, expires_at=None, scopes=())
    async with database.transaction() as conn:
        vault = ConnectionRepository(conn, CIPHER)
        assert await vault.lock(owner, "demo") is not None
        await vault.replace_tokens(owner, "demo", rotated)
    stored = await _locked_tokens(database, owner)
    assert stored is not None
    assert (stored.access_token, stored.refresh_token, stored.expires_at) == ("at-new-SECRET", "rt-old-SECRET", None)
    assert stored.scopes == ("read", "write")
    async with database.transaction() as conn:
        info = await ConnectionRepository(conn, CIPHER).info(owner, "demo")
    assert info is not None
    assert info.refreshed_at is not None


async def test_delete_returns_the_tokens_for_revocation_and_a_second_delete_returns_none(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    tokens = _tokens("gone")
    await _save(database, owner, tokens)
    async with database.transaction() as conn:
        assert await ConnectionRepository(conn, CIPHER).delete(owner, "demo") == tokens
    async with database.transaction() as conn:
        vault = ConnectionRepository(conn, CIPHER)
        assert await vault.delete(owner, "demo") is None
        assert await vault.info(owner, "demo") is None


async def test_a_second_locker_waits_for_the_first_to_commit_and_then_sees_its_tokens(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    await _save(database, owner, _tokens("before"))
    second_has_lock = asyncio.Event()

    async def second() -> TokenSet | None:
        async with database.transaction() as conn:
            locked = await ConnectionRepository(conn, CIPHER).lock(owner, "demo")
            second_has_lock.set()
            return locked.tokens if locked else None

    async with database.engine.connect() as first:
        await first.begin()
        vault = ConnectionRepository(first, CIPHER)
        assert await vault.lock(owner, "demo") is not None
        waiter = asyncio.create_task(second())
        await _wait_for_lock_waiters(database, 1)
        assert not second_has_lock.is_set()
        await vault.replace_tokens(owner, "demo", _tokens("after"))
        await first.commit()
    async with asyncio.timeout(10):
        seen = await waiter
    assert seen is not None
    assert seen.access_token == "at-after-SECRET"


async def test_refresh_if_needed_returns_a_fresh_token_without_calling_refresh(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    tokens = _tokens("fresh")
    await _save(database, owner, tokens)

    async def refresh(_: str) -> TokenSet:
        raise AssertionError("a fresh token must not be refreshed")

    assert await refresh_if_needed(database, CIPHER, owner, "demo", skew=SKEW, refresh=refresh) == tokens
    never_expiring = _tokens("forever", expires_in=None)
    await _save(database, owner, never_expiring)
    assert await refresh_if_needed(database, CIPHER, owner, "demo", skew=SKEW, refresh=refresh) == never_expiring


async def test_a_fresh_token_costs_one_unlocked_read(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    await _save(database, owner, _tokens("cheap"))

    async def refresh(_: str) -> TokenSet:
        raise AssertionError("a fresh token must not be refreshed")

    with recorded_statements(database) as statements:
        assert await refresh_if_needed(database, CIPHER, owner, "demo", skew=SKEW, refresh=refresh) is not None
    assert len(statements) == 1
    assert "FOR UPDATE" not in statements[0]


async def test_refresh_if_needed_returns_none_without_a_connection(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    async def refresh(_: str) -> TokenSet:
        raise AssertionError("nothing to refresh")

    assert await refresh_if_needed(database, CIPHER, new_principal(), "demo", skew=SKEW, refresh=refresh) is None


async def test_concurrent_refreshers_call_the_provider_once_and_all_get_the_new_token(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    """Five callers in separate transactions, as five instances would be: one refreshes, four wait and reuse."""
    owner = new_principal()
    await _save(database, owner, _tokens("expired", expires_in=timedelta(minutes=-5)))
    callers = 5
    calls: list[str] = []

    async def refresh(refresh_token: str) -> TokenSet:
        calls.append(refresh_token)
        # Hold the lock until every other caller is queued behind it.
        await _wait_for_lock_waiters(database, callers - 1)
        return TokenSet(access_token="at-renewed-SECRET", refresh_token=None, expires_at=None, scopes=())

    async with asyncio.timeout(20):
        results = await asyncio.gather(
            *(refresh_if_needed(database, CIPHER, owner, "demo", skew=SKEW, refresh=refresh) for _ in range(callers))
        )
    assert calls == ["rt-expired-SECRET"]
    assert {r.access_token if r else None for r in results} == {"at-renewed-SECRET"}
    assert {r.refresh_token if r else None for r in results} == {"rt-expired-SECRET"}
    async with database.transaction() as conn:
        entries = await AuditRepository(conn).list(owner)
    assert [(e.action, e.outcome) for e in entries] == [("refresh", "ok")]


async def test_invalid_grant_marks_the_connection_for_reauthorisation_and_returns_no_token(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    await _save(database, owner, _tokens("revoked", expires_in=timedelta(seconds=10)))
    calls = 0

    async def refresh(_: str) -> TokenSet:
        nonlocal calls
        calls += 1
        raise InvalidGrant("invalid_grant")

    assert await refresh_if_needed(database, CIPHER, owner, "demo", skew=SKEW, refresh=refresh) is None
    assert await refresh_if_needed(database, CIPHER, owner, "demo", skew=SKEW, refresh=refresh) is None
    assert calls == 1
    async with database.transaction() as conn:
        info = await ConnectionRepository(conn, CIPHER).info(owner, "demo")
        entries = await AuditRepository(conn).list(owner)
    assert info is not None
    assert info.status == "needs_reauth"
    assert [(e.action, e.provider, e.outcome) for e in entries] == [("refresh", "demo", "invalid_grant")]


async def test_a_failed_refresh_leaves_the_tokens_untouched_is_audited_and_reraises(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    tokens = _tokens("kept", expires_in=timedelta(minutes=-1))
    await _save(database, owner, tokens)

    class ProviderDownError(Exception):
        pass

    async def refresh(refresh_token: str) -> TokenSet:
        raise ProviderDownError(f"upstream said no to {refresh_token}")

    with pytest.raises(ProviderDownError):
        await refresh_if_needed(database, CIPHER, owner, "demo", skew=SKEW, refresh=refresh)
    assert await _locked_tokens(database, owner) == tokens
    async with database.transaction() as conn:
        info = await ConnectionRepository(conn, CIPHER).info(owner, "demo")
        entries = await AuditRepository(conn).list(owner)
    assert info is not None
    assert info.status == "connected"
    assert [(e.action, e.outcome, e.detail) for e in entries] == [("refresh", "failed", "ProviderDownError")]


async def test_an_expired_token_without_a_refresh_token_needs_reauthorisation(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    await _save(database, owner, _tokens("once", expires_in=timedelta(minutes=-1), refresh=False))

    async def refresh(_: str) -> TokenSet:
        raise AssertionError("there is no refresh token to use")

    assert await refresh_if_needed(database, CIPHER, owner, "demo", skew=SKEW, refresh=refresh) is None
    async with database.transaction() as conn:
        info = await ConnectionRepository(conn, CIPHER).info(owner, "demo")
    assert info is not None
    assert info.status == "needs_reauth"


async def test_no_token_value_appears_in_reprs_errors_or_logs(
    database: Database, new_principal: Callable[[], Principal], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    owner = new_principal()
    tokens = _tokens("leak", expires_in=timedelta(minutes=-1))
    await _save(database, owner, tokens)

    async def failing(refresh_token: str) -> TokenSet:
        raise RuntimeError("boom")

    async def refused(refresh_token: str) -> TokenSet:
        raise InvalidGrant("invalid_grant")

    with pytest.raises(RuntimeError):
        await refresh_if_needed(database, CIPHER, owner, "demo", skew=SKEW, refresh=failing)
    async with database.transaction() as conn:
        locked = await ConnectionRepository(conn, CIPHER).lock(owner, "demo")
    assert await refresh_if_needed(database, CIPHER, owner, "demo", skew=SKEW, refresh=refused) is None
    with pytest.raises(DecryptError) as caught:
        await _locked_tokens(database, owner, TokenCipher([NEW]))
    shown = " ".join([repr(tokens), repr(locked), str(tokens), str(caught.value), caplog.text])
    for secret in ("at-leak-SECRET", "rt-leak-SECRET", KEY.decode()):
        assert secret not in shown
    assert any(record.name.startswith("store.") for record in caplog.records)


def test_key_rotation_moves_every_row_to_the_newest_key(admin_database_url: str) -> None:
    """Rows under [OLD]; [NEW, OLD] reads them; reencrypt_all moves them; then [NEW] alone reads every token.

    A row under a key outside the ring is left alone and still counted as stale.
    """

    async def scenario(url: str) -> None:
        database = Database.connect(url)
        try:
            owners = [Principal("https://issuer.test", f"user-{n}") for n in range(7)]
            old, ring, new = TokenCipher([OLD]), TokenCipher([NEW, OLD]), TokenCipher([NEW])
            for n, owner in enumerate(owners):
                async with database.transaction() as conn:
                    await ConnectionRepository(conn, old).save(owner, "demo", _tokens(f"r{n}", refresh=n % 2 == 0))
            async with database.transaction() as conn:
                stranger = Principal("https://issuer.test", "stranger")
                await ConnectionRepository(conn, TokenCipher([KEY])).save(stranger, "demo", _tokens("s"))
            for n, owner in enumerate(owners):
                tokens = await _locked_tokens(database, owner, ring)
                assert tokens is not None
                assert tokens.access_token == f"at-r{n}-SECRET"
            async with database.engine.connect() as conn:
                assert await count_stale(conn, ring) == len(owners) + 1
                await conn.commit()  # outside a transaction, reencrypt_all commits batch by batch
                assert await reencrypt_all(conn, ring, batch_size=3) == len(owners)
                assert not conn.in_transaction()
                assert await count_stale(conn, ring) == 1
                assert await reencrypt_all(conn, ring, batch_size=3) == 0
                await conn.rollback()
            for n, owner in enumerate(owners):
                tokens = await _locked_tokens(database, owner, new)
                assert tokens is not None
                assert (tokens.access_token, tokens.refresh_token) == (
                    f"at-r{n}-SECRET",
                    f"rt-r{n}-SECRET" if n % 2 == 0 else None,
                )
        finally:
            await database.dispose()

    with scratch_database(admin_database_url) as url:
        asyncio.run(scenario(url))
