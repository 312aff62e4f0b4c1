"""Token sets and direct vault writes and reads for the tests of the vault, the refresh lease and key rotation."""

from datetime import UTC, datetime, timedelta

from store.crypto import TokenCipher
from store.db import Database
from store.principal import Principal
from store.vault import TokenSet, VaultRepository


def token_set(tag: str, *, expires_in: timedelta | None = timedelta(hours=1), refresh: bool = True) -> TokenSet:
    """Provider tokens named after ``tag`` (``at-{tag}-SECRET``, ``rt-{tag}-SECRET``) expiring after ``expires_in``.

    ``expires_in=None``: the provider gave no expiry; ``refresh=False``: it issued no refresh token.
    """
    return TokenSet(
        access_token=f"at-{tag}-SECRET",
        refresh_token=f"rt-{tag}-SECRET" if refresh else None,
        expires_at=datetime.now(UTC) + expires_in if expires_in is not None else None,
        scopes=("read", "write"),
    )


async def save_tokens(
    database: Database, cipher: TokenCipher, owner: Principal, tokens: TokenSet, provider: str = "demo"
) -> None:
    """Store ``tokens`` as ``owner``'s connection to ``provider``, encrypted under ``cipher``."""
    async with database.transaction() as conn:
        await VaultRepository(conn, cipher).save(owner, provider, tokens)


async def stored_tokens(
    database: Database, cipher: TokenCipher, owner: Principal, provider: str = "demo"
) -> TokenSet | None:
    """``owner``'s tokens for ``provider`` decrypted with ``cipher``; ``None`` when there is no connection."""
    async with database.one_statement() as conn:
        stored = await VaultRepository(conn, cipher).read(owner, provider)
    return stored.tokens if stored is not None else None
