"""Key rotation: re-seal stored tokens and pending flow secrets under the newest key of the ring.

``coatcheck keys rotate`` runs :func:`reencrypt_all`; :func:`count_stale` tells whether anything
is still sealed under an older key. Both walk every table that holds sealed values the same way
(:data:`_SEALED`): a value re-seals under ``keys[0]`` with the associated data it was sealed with.
"""

import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import RowMapping, Table, and_, bindparam, func, not_, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

from store.crypto import TokenCipher
from store.errors import DecryptError
from store.flows import flow_secrets_aad
from store.models import OAuthFlow, table_of
from store.principal import Principal
from store.vault import VAULT_TABLE, token_aad

__all__ = ["count_stale", "reencrypt_all"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _SealedColumns:
    """A table's sealed columns (NULL: nothing sealed) and the associated data each value is bound to."""

    table: Table
    what: str  # names the values in the log line of a row that no ring key opens
    reads: tuple[str, ...]  # the columns ``aad`` needs besides ``id``
    sealed: Mapping[str, str]  # sealed column -> the label ``aad`` is given for it
    aad: Callable[[RowMapping, str], bytes]

    def stale(self, cipher: TokenCipher) -> ColumnElement[bool]:
        prefix = cipher.current_prefix
        return or_(
            *(
                and_(self.table.c[name].is_not(None), not_(self.table.c[name].startswith(prefix, autoescape=True)))
                for name in self.sealed
            )
        )


def _token_aad(row: RowMapping, column: str) -> bytes:
    principal = Principal(issuer=row["principal_iss"], subject=row["principal_sub"])
    return token_aad(row["id"], principal, row["provider"], column)


_SEALED = (
    _SealedColumns(
        table=VAULT_TABLE,
        what="tokens",
        reads=("principal_iss", "principal_sub", "provider"),
        sealed={"access_token_enc": "access_token", "refresh_token_enc": "refresh_token"},
        aad=_token_aad,
    ),
    _SealedColumns(
        table=table_of(OAuthFlow),
        what="secrets",
        reads=("handle",),
        sealed={"secrets_enc": "secrets"},
        aad=lambda row, _label: flow_secrets_aad(row["handle"]),
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


async def _reencrypt_batch(
    conn: AsyncConnection, cipher: TokenCipher, sealed: _SealedColumns, *, after_id: int, limit: int
) -> tuple[int, int | None]:
    """Re-seal the stale values of up to ``limit`` rows with ``id > after_id``, locked ``FOR UPDATE``.

    Returns (rows re-sealed, last id seen), the last id being ``None`` when no rows were left. A row
    with a value no ring key opens is skipped and logged by id.
    """
    table = sealed.table
    rows = (
        (
            await conn.execute(
                select(table.c.id, *(table.c[name] for name in (*sealed.reads, *sealed.sealed)))
                .where(table.c.id > after_id, sealed.stale(cipher))
                .order_by(table.c.id)
                .limit(limit)
                .with_for_update()
            )
        )
        .mappings()
        .all()
    )
    if not rows:
        return 0, None
    updates: list[dict[str, Any]] = []
    for row in rows:
        try:
            values = {}
            for name, label in sealed.sealed.items():
                value, aad = row[name], sealed.aad(row, label)
                values[f"b_{name}"] = None if value is None else cipher.encrypt(cipher.decrypt(value, aad=aad), aad=aad)
        except DecryptError as exc:
            logger.warning("%s id=%d: %s not re-encrypted: %s", table.name, row["id"], sealed.what, exc)
        else:
            updates.append({"b_id": row["id"], **values})
    if updates:
        await conn.execute(
            update(table)
            .where(table.c.id == bindparam("b_id"))
            .values({name: bindparam(f"b_{name}") for name in sealed.sealed}),
            updates,
        )
    return len(updates), rows[-1]["id"]


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
    for sealed in _SEALED:
        after_id: int | None = 0
        while after_id is not None:
            async with _batch(conn):
                done, after_id = await _reencrypt_batch(conn, cipher, sealed, after_id=after_id, limit=batch_size)
            total += done
    return total


async def count_stale(conn: AsyncConnection, cipher: TokenCipher) -> int:
    """How many rows still hold a value sealed under a key other than ``keys[0]`` (0 after a full rotation)."""
    total = 0
    for sealed in _SEALED:
        stmt = select(func.count()).select_from(sealed.table).where(sealed.stale(cipher))
        total += int((await conn.execute(stmt)).scalar_one())
    return total
