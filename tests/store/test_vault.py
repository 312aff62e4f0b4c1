"""The token vault against the real test database: encryption at rest, scoping, replacement, deletion.

The refresh lease is tested in tests/store/test_token_refresh.py and tests/api/test_token_refresh.py, key
rotation in tests/store/test_key_rotation.py.
"""

from collections.abc import Callable
from datetime import timedelta

import pytest
from sqlalchemy import func, select, update

from store.crypto import DecryptError, TokenCipher
from store.db import Database
from store.models import ProviderConnection, table_of
from store.principal import Principal
from store.vault import VaultRepository
from tests.support.vault import save_tokens, stored_tokens, token_set

KEY = b"test-vault-key-" + b"k" * 20 + b"-0123456789"
OLD = b"old-vault-key-" + b"o" * 20 + b"-abcdefghij"
NEW = b"new-vault-key-" + b"n" * 20 + b"-ABCDEFGHIJ"
CIPHER = TokenCipher([KEY])
SKEW = timedelta(minutes=1)

_table = table_of(ProviderConnection)


async def test_saved_tokens_come_back_decrypted_and_are_stored_only_as_ciphertext(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    tokens = token_set("a")
    await save_tokens(database, CIPHER, owner, tokens)
    assert await stored_tokens(database, CIPHER, owner) == tokens
    async with database.transaction() as conn:
        raw = (
            await conn.execute(
                select(_table.c.access_token_enc, _table.c.refresh_token_enc).where(
                    _table.c.principal_sub == owner.subject
                )
            )
        ).one()
        info = await VaultRepository(conn, CIPHER).info(owner, "demo")
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
    await save_tokens(database, CIPHER, owner, token_set("b"), provider="zeta")
    await save_tokens(database, CIPHER, owner, token_set("a"), provider="alpha")
    async with database.transaction() as conn:
        listed = await VaultRepository(conn, CIPHER).list(owner)
    assert [(c.provider, c.status) for c in listed] == [("alpha", "connected"), ("zeta", "connected")]
    assert "SECRET" not in repr(listed)


async def test_saving_again_replaces_the_tokens_and_reconnects_a_connection_that_needed_reauth(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    await save_tokens(database, CIPHER, owner, token_set("first"))
    async with database.transaction() as conn:
        await VaultRepository(conn, CIPHER).mark_needs_reauth(owner, "demo")
        info = await VaultRepository(conn, CIPHER).info(owner, "demo")
    assert info is not None
    assert info.status == "needs_reauth"
    second = token_set("second", refresh=False)
    await save_tokens(database, CIPHER, owner, second)
    async with database.transaction() as conn:
        info = await VaultRepository(conn, CIPHER).info(owner, "demo")
        count = await conn.scalar(
            select(func.count()).select_from(_table).where(_table.c.principal_sub == owner.subject)
        )
    assert info is not None
    assert info.status == "connected"
    assert count == 1
    assert await stored_tokens(database, CIPHER, owner) == second


async def test_another_principal_sees_and_changes_nothing(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    alice, bob = new_principal(), new_principal()
    tokens = token_set("alice")
    await save_tokens(database, CIPHER, alice, tokens)
    async with database.transaction() as conn:
        vault = VaultRepository(conn, CIPHER)
        assert await vault.list(bob) == []
        assert await vault.info(bob, "demo") is None
        assert await vault.read(bob, "demo") is None
        await vault.mark_needs_reauth(bob, "demo")
        assert await vault.delete(bob, "demo") is None
    async with database.transaction() as conn:
        info = await VaultRepository(conn, CIPHER).info(alice, "demo")
    assert info is not None
    assert info.status == "connected"
    assert await stored_tokens(database, CIPHER, alice) == tokens


async def test_a_ciphertext_moved_to_another_row_or_column_does_not_decrypt_and_the_error_names_no_token(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    alice, bob = new_principal(), new_principal()
    await save_tokens(database, CIPHER, alice, token_set("alice"))
    await save_tokens(database, CIPHER, bob, token_set("bob"))
    async with database.transaction() as conn:
        alices = (
            await conn.execute(select(_table.c.access_token_enc).where(_table.c.principal_sub == alice.subject))
        ).scalar_one()
        await conn.execute(update(_table).where(_table.c.principal_sub == bob.subject).values(access_token_enc=alices))
    with pytest.raises(DecryptError) as caught:
        await stored_tokens(database, CIPHER, bob)
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
        await stored_tokens(database, CIPHER, alice)


async def test_delete_returns_the_tokens_for_revocation_and_a_second_delete_returns_none(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    tokens = token_set("gone")
    await save_tokens(database, CIPHER, owner, tokens)
    async with database.transaction() as conn:
        assert await VaultRepository(conn, CIPHER).delete(owner, "demo") == tokens
    async with database.transaction() as conn:
        vault = VaultRepository(conn, CIPHER)
        assert await vault.delete(owner, "demo") is None
        assert await vault.info(owner, "demo") is None
