"""Key rotation against a private database: every row moves to the newest key, unreadable rows stay counted."""

import asyncio

from store.crypto import TokenCipher
from store.db import Database
from store.key_rotation import count_stale, reencrypt_all
from store.principal import Principal
from store.vault import VaultRepository
from tests.support.scratch import scratch_database
from tests.support.vault import stored_tokens, token_set

KEY = b"test-vault-key-" + b"k" * 20 + b"-0123456789"
OLD = b"old-vault-key-" + b"o" * 20 + b"-abcdefghij"
NEW = b"new-vault-key-" + b"n" * 20 + b"-ABCDEFGHIJ"


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
                    await VaultRepository(conn, old).save(owner, "demo", token_set(f"r{n}", refresh=n % 2 == 0))
            async with database.transaction() as conn:
                stranger = Principal("https://issuer.test", "stranger")
                await VaultRepository(conn, TokenCipher([KEY])).save(stranger, "demo", token_set("s"))
            for n, owner in enumerate(owners):
                tokens = await stored_tokens(database, ring, owner)
                assert tokens is not None
                assert tokens.access_token == f"at-r{n}-SECRET"
            async with database.transactional_connection() as conn:
                assert await count_stale(conn, ring) == len(owners) + 1
                await conn.commit()  # outside a transaction, reencrypt_all commits batch by batch
                assert await reencrypt_all(conn, ring, batch_size=3) == len(owners)
                assert not conn.in_transaction()
                assert await count_stale(conn, ring) == 1
                assert await reencrypt_all(conn, ring, batch_size=3) == 0
                await conn.rollback()
            for n, owner in enumerate(owners):
                tokens = await stored_tokens(database, new, owner)
                assert tokens is not None
                assert (tokens.access_token, tokens.refresh_token) == (
                    f"at-r{n}-SECRET",
                    f"rt-r{n}-SECRET" if n % 2 == 0 else None,
                )
        finally:
            await database.dispose()

    with scratch_database(admin_database_url) as url:
        asyncio.run(scenario(url))
