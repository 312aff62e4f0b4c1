"""Key rotation: re-seal stored tokens and pending flow secrets under the newest key of the ring.

``coatcheck keys rotate`` runs :func:`reencrypt_all`; :func:`count_stale` tells whether anything
is still sealed under an older key.
"""

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import and_, bindparam, func, not_, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

from store.crypto import TokenCipher
from store.errors import DecryptError
from store.flows import count_stale_flow_secrets, reencrypt_flow_batch
from store.principal import Principal
from store.vault import VAULT_TABLE, token_aad

__all__ = ["count_stale", "reencrypt_all"]

logger = logging.getLogger(__name__)

_conn_t = VAULT_TABLE


def _stale(cipher: TokenCipher) -> ColumnElement[bool]:
    prefix = cipher.current_prefix
    return or_(
        not_(_conn_t.c.access_token_enc.startswith(prefix, autoescape=True)),
        and_(
            _conn_t.c.refresh_token_enc.is_not(None),
            not_(_conn_t.c.refresh_token_enc.startswith(prefix, autoescape=True)),
        ),
    )


@asynccontextmanager
async def _batch(conn: AsyncConnection) -> AsyncIterator[None]:
    """Commit each batch on a connection outside a transaction; else ride the caller's transaction."""
    if conn.in_transaction():
        yield
    else:
        async with conn.begin():
            yield


async def _reencrypt_connection_batch(
    conn: AsyncConnection, cipher: TokenCipher, *, after_id: int, limit: int
) -> tuple[int, int | None]:
    rows = (
        await conn.execute(
            select(
                _conn_t.c.id,
                _conn_t.c.principal_iss,
                _conn_t.c.principal_sub,
                _conn_t.c.provider,
                _conn_t.c.access_token_enc,
                _conn_t.c.refresh_token_enc,
            )
            .where(_conn_t.c.id > after_id, _stale(cipher))
            .order_by(_conn_t.c.id)
            .limit(limit)
            .with_for_update()
        )
    ).all()
    if not rows:
        return 0, None
    updates: list[dict[str, Any]] = []
    for row in rows:
        row_id, provider, access_enc, refresh_enc = row.id, row.provider, row.access_token_enc, row.refresh_token_enc
        principal = Principal(issuer=row.principal_iss, subject=row.principal_sub)
        access_aad = token_aad(row_id, principal, provider, "access_token")
        refresh_aad = token_aad(row_id, principal, provider, "refresh_token")
        try:
            updates.append(
                {
                    "b_id": row_id,
                    "b_access": cipher.encrypt(cipher.decrypt(access_enc, aad=access_aad), aad=access_aad),
                    "b_refresh": (
                        cipher.encrypt(cipher.decrypt(refresh_enc, aad=refresh_aad), aad=refresh_aad)
                        if refresh_enc is not None
                        else None
                    ),
                }
            )
        except DecryptError as exc:
            logger.warning("provider_connection id=%d: tokens not re-encrypted: %s", row_id, exc)
    if updates:
        await conn.execute(
            update(_conn_t)
            .where(_conn_t.c.id == bindparam("b_id"))
            .values(access_token_enc=bindparam("b_access"), refresh_token_enc=bindparam("b_refresh")),
            updates,
        )
    return len(updates), rows[-1].id


async def reencrypt_all(conn: AsyncConnection, cipher: TokenCipher, *, batch_size: int = 500) -> int:
    """Re-encrypt under ``keys[0]`` every stored token and pending flow secret sealed under another key.

    Safe while servers run, provided every instance already has ``keys[0]`` in its ring. Rows
    are visited in id order in batches of ``batch_size``, each batch locked ``FOR UPDATE`` for
    the few milliseconds it takes (a refresh holds no row lock while it calls the provider, so
    it never delays a batch; its lease write-back after a batch re-seals under ``keys[0]``
    anyway). On a connection outside a transaction every batch commits on its own, so locks
    last one batch; inside the caller's transaction everything commits with it. Rows that no
    ring key opens are logged by id and left alone (see :func:`count_stale`). Returns how many
    rows were re-encrypted.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be positive")
    total = 0
    for step in (_reencrypt_connection_batch, reencrypt_flow_batch):
        after_id: int | None = 0
        while after_id is not None:
            async with _batch(conn):
                done, after_id = await step(conn, cipher, after_id=after_id, limit=batch_size)
            total += done
    return total


async def count_stale(conn: AsyncConnection, cipher: TokenCipher) -> int:
    """How many rows still hold a value sealed under a key other than ``keys[0]`` (0 after a full rotation)."""
    connections = (await conn.execute(select(func.count()).select_from(_conn_t).where(_stale(cipher)))).scalar_one()
    return int(connections) + await count_stale_flow_secrets(conn, cipher)
