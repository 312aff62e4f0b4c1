"""The token vault: one principal's tokens for one provider, encrypted at rest.

Invariants:

* Every method takes the principal first and scopes its SQL to (issuer, subject, provider);
  another principal's connection reads as absent.
* Access and refresh tokens are sealed by :class:`~store.crypto.TokenCipher` with associated
  data naming this table, the row id, the principal, the provider and the column, so a
  ciphertext copied into another row or column does not decrypt.
* Exactly one instance refreshes an expiring token (:func:`refresh_if_needed`): the row lock
  (``SELECT … FOR UPDATE``) serialises refreshers; the ones that waited re-read the row and use
  the winner's tokens. A failed refresh rolls back and leaves the stored tokens as they were;
  ``invalid_grant`` only marks the connection ``needs_reauth``.
* No token value appears in a ``repr``, an exception message or a log record.
"""

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import RowMapping, and_, bindparam, delete, func, not_, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection

from store.audit import AuditRepository
from store.crypto import TokenCipher, associated_data
from store.db import Database
from store.errors import DecryptError, InvalidGrant, NotFound
from store.flows import count_stale_flow_secrets, reencrypt_flow_batch
from store.models import ProviderConnection, table_of
from store.principal import Principal
from store.scoping import owned_by, principal_params

__all__ = [
    "ConnectionInfo",
    "ConnectionRepository",
    "InvalidGrant",
    "LockedConnection",
    "TokenSet",
    "count_stale",
    "reencrypt_all",
    "refresh_if_needed",
]

logger = logging.getLogger(__name__)

_conn_t = table_of(ProviderConnection)
_TABLE = "provider_connection"

_OWNED = and_(owned_by(_conn_t), _conn_t.c.provider == bindparam("p_provider"))
_INFO_COLUMNS = (
    _conn_t.c.provider,
    _conn_t.c.status,
    _conn_t.c.scopes,
    _conn_t.c.connected_at,
    _conn_t.c.expires_at,
    _conn_t.c.refreshed_at,
)
_FULL_COLUMNS = (
    *_INFO_COLUMNS,
    _conn_t.c.id,
    _conn_t.c.token_type,
    _conn_t.c.access_token_enc,
    _conn_t.c.refresh_token_enc,
)
_LIST = select(*_INFO_COLUMNS).where(owned_by(_conn_t)).order_by(_conn_t.c.provider)
_INFO = select(*_INFO_COLUMNS).where(_OWNED)
_READ = select(*_FULL_COLUMNS).where(_OWNED)
_LOCK = _READ.with_for_update()
_LOCK_ID = select(_conn_t.c.id).where(_OWNED).with_for_update()
# Claims the row (inserting a placeholder, or locking the existing row) to learn its id, which
# the associated data needs before the tokens can be sealed; the placeholder never commits.
_CLAIM = (
    pg_insert(_conn_t)
    .values(
        principal_iss=bindparam("p_iss"),
        principal_sub=bindparam("p_sub"),
        provider=bindparam("p_provider"),
        status="connected",
        scopes=[],
        token_type="",
        access_token_enc="",
    )
    .on_conflict_do_update(constraint="uq_provider_connection_principal", set_={"updated_at": func.now()})
    .returning(_conn_t.c.id)
)
_STORE = (
    update(_conn_t)
    .where(_conn_t.c.id == bindparam("p_id"))
    .values(
        status="connected",
        scopes=bindparam("p_scopes"),
        token_type=bindparam("p_token_type"),
        access_token_enc=bindparam("p_access"),
        refresh_token_enc=bindparam("p_refresh"),
        expires_at=bindparam("p_expires_at"),
        connected_at=func.now(),
        refreshed_at=None,
        updated_at=func.now(),
    )
)
_NEEDS_REAUTH = update(_conn_t).where(_OWNED).values(status="needs_reauth", updated_at=func.now())
_DELETE = delete(_conn_t).where(_OWNED).returning(*_FULL_COLUMNS)


@dataclass(frozen=True, slots=True)
class TokenSet:
    """Tokens from a provider. Their values never appear in ``repr``."""

    access_token: str = field(repr=False)
    refresh_token: str | None = field(repr=False)
    expires_at: datetime | None
    scopes: tuple[str, ...]
    token_type: str = "Bearer"  # noqa: S105 - a token type, not a secret

    def expiring(self, *, within: timedelta, now: datetime | None = None) -> bool:
        """Tell whether the access token has expired or will within ``within`` (no expiry: never)."""
        if self.expires_at is None:
            return False
        return self.expires_at - within <= (now or datetime.now(UTC))


@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    """What may be shown about a connection: no token material."""

    provider: str
    status: str  # "connected" | "needs_reauth"
    scopes: tuple[str, ...]
    connected_at: datetime
    expires_at: datetime | None
    refreshed_at: datetime | None


@dataclass(frozen=True, slots=True)
class LockedConnection:
    """A connection read under its row lock, which lasts until the caller's transaction ends."""

    info: ConnectionInfo
    tokens: TokenSet
    row_id: int = field(repr=False)


def _info_of(row: RowMapping) -> ConnectionInfo:
    return ConnectionInfo(
        provider=row["provider"],
        status=row["status"],
        scopes=tuple(row["scopes"]),
        connected_at=row["connected_at"],
        expires_at=row["expires_at"],
        refreshed_at=row["refreshed_at"],
    )


def _aad(row_id: int, principal: Principal, provider: str, column: str) -> bytes:
    return associated_data(_TABLE, row_id, principal.issuer, principal.subject, provider, column)


def _owner(principal: Principal, provider: str) -> dict[str, str]:
    return {**principal_params(principal), "p_provider": provider}


class ConnectionRepository:
    """Vault operations on one connection (inside the caller's transaction)."""

    def __init__(self, conn: AsyncConnection, cipher: TokenCipher) -> None:
        self._conn = conn
        self._cipher = cipher
        # Row ids this repository holds the lock on, so replace_tokens needs no second lookup.
        self._locked: dict[tuple[Principal, str], int] = {}

    async def list(self, principal: Principal) -> list[ConnectionInfo]:
        """The principal's connections by provider name. One query, nothing decrypted."""
        rows = await self._conn.execute(_LIST, principal_params(principal))
        return [_info_of(row) for row in rows.mappings()]

    async def info(self, principal: Principal, provider: str) -> ConnectionInfo | None:
        """The principal's connection to ``provider``, if any. One query, nothing decrypted."""
        row = (await self._conn.execute(_INFO, _owner(principal, provider))).mappings().one_or_none()
        return _info_of(row) if row is not None else None

    async def _snapshot(self, principal: Principal, provider: str) -> LockedConnection | None:
        # Like lock() without the lock: for the fast path of refresh_if_needed only.
        row = (await self._conn.execute(_READ, _owner(principal, provider))).mappings().one_or_none()
        return self._open(principal, row) if row is not None else None

    async def save(self, principal: Principal, provider: str, tokens: TokenSet) -> None:
        """Store tokens from a completed authorization: insert, or replace a previous connection.

        Sets the status to ``connected`` and ``connected_at`` to now. Two statements (the row id
        must be known before the tokens can be bound to it).
        """
        row_id = (await self._conn.execute(_CLAIM, _owner(principal, provider))).scalar_one()
        self._locked[(principal, provider)] = row_id
        await self._conn.execute(
            _STORE,
            {
                "p_id": row_id,
                "p_scopes": list(tokens.scopes),
                "p_token_type": tokens.token_type,
                "p_expires_at": tokens.expires_at,
                **self._seal(row_id, principal, provider, tokens),
            },
        )

    async def lock(self, principal: Principal, provider: str) -> LockedConnection | None:
        """Lock the connection row until the caller's transaction ends, and decrypt its tokens. One query.

        A concurrent caller blocks here until the holder commits or rolls back, then reads the
        row as the holder left it.

        Raises:
            DecryptError: a token does not open with the key ring.
        """
        row = (await self._conn.execute(_LOCK, _owner(principal, provider))).mappings().one_or_none()
        if row is None:
            return None
        locked = self._open(principal, row)
        self._locked[(principal, provider)] = locked.row_id
        return locked

    async def replace_tokens(self, principal: Principal, provider: str, tokens: TokenSet) -> None:
        """Store refreshed tokens; call under :meth:`lock` in the same transaction.

        A ``refresh_token`` of ``None`` keeps the stored one (the provider did not rotate it),
        and empty ``scopes`` keep the stored scopes (RFC 6749 §5.1: omitted means unchanged).
        One statement after :meth:`lock`.

        Raises:
            NotFound: the principal has no connection to ``provider``.
        """
        row_id = self._locked.get((principal, provider))
        if row_id is None:
            row_id = (await self._conn.execute(_LOCK_ID, _owner(principal, provider))).scalar_one_or_none()
            if row_id is None:
                raise NotFound("connection", provider)
            self._locked[(principal, provider)] = row_id
        sealed = self._seal(row_id, principal, provider, tokens)
        values: dict[str, Any] = {
            "status": "connected",
            "access_token_enc": sealed["p_access"],
            "token_type": tokens.token_type,
            "expires_at": tokens.expires_at,
            "refreshed_at": func.now(),
            "updated_at": func.now(),
        }
        if tokens.refresh_token is not None:
            values["refresh_token_enc"] = sealed["p_refresh"]
        if tokens.scopes:
            values["scopes"] = list(tokens.scopes)
        stmt = update(_conn_t).where(_conn_t.c.id == row_id, _OWNED).values(values).returning(_conn_t.c.id)
        if (await self._conn.execute(stmt, _owner(principal, provider))).scalar_one_or_none() is None:
            raise NotFound("connection", provider)

    async def mark_needs_reauth(self, principal: Principal, provider: str) -> None:
        """Flag the connection as needing a new authorization; the tokens stay for revocation. One statement."""
        await self._conn.execute(_NEEDS_REAUTH, _owner(principal, provider))

    async def delete(self, principal: Principal, provider: str) -> TokenSet | None:
        """Delete the connection and return its tokens (to revoke upstream); ``None`` if there was none.

        One statement.

        Raises:
            DecryptError: a token does not open with the key ring (the deletion is then rolled
                back with the caller's transaction).
        """
        row = (await self._conn.execute(_DELETE, _owner(principal, provider))).mappings().one_or_none()
        self._locked.pop((principal, provider), None)
        return self._open(principal, row).tokens if row is not None else None

    def _seal(self, row_id: int, principal: Principal, provider: str, tokens: TokenSet) -> dict[str, str | None]:
        encrypt = self._cipher.encrypt
        return {
            "p_access": encrypt(tokens.access_token, aad=_aad(row_id, principal, provider, "access_token")),
            "p_refresh": (
                encrypt(tokens.refresh_token, aad=_aad(row_id, principal, provider, "refresh_token"))
                if tokens.refresh_token is not None
                else None
            ),
        }

    def _open(self, principal: Principal, row: RowMapping) -> LockedConnection:
        info = _info_of(row)
        row_id, access_enc, refresh_enc = row["id"], row["access_token_enc"], row["refresh_token_enc"]
        decrypt = self._cipher.decrypt
        tokens = TokenSet(
            access_token=decrypt(access_enc, aad=_aad(row_id, principal, info.provider, "access_token")),
            refresh_token=(
                decrypt(refresh_enc, aad=_aad(row_id, principal, info.provider, "refresh_token"))
                if refresh_enc is not None
                else None
            ),
            expires_at=info.expires_at,
            scopes=info.scopes,
            token_type=row["token_type"],
        )
        return LockedConnection(info=info, tokens=tokens, row_id=row_id)


def _merged(old: TokenSet, new: TokenSet) -> TokenSet:
    """What :meth:`ConnectionRepository.replace_tokens` leaves stored."""
    return TokenSet(
        access_token=new.access_token,
        refresh_token=new.refresh_token if new.refresh_token is not None else old.refresh_token,
        expires_at=new.expires_at,
        scopes=new.scopes or old.scopes,
        token_type=new.token_type,
    )


async def refresh_if_needed(
    database: Database,
    cipher: TokenCipher,
    principal: Principal,
    provider: str,
    *,
    skew: timedelta,
    refresh: Callable[[str], Awaitable[TokenSet]],
) -> TokenSet | None:
    """Usable tokens for ``provider``, refreshed first if they expire within ``skew``.

    A fresh token costs one autocommit read and no lock. Otherwise one transaction locks the
    row and re-checks: if another instance refreshed while this one waited for the lock, its
    tokens are returned and ``refresh`` is not called. Else ``refresh(refresh_token)`` runs
    while the lock is held (the caller bounds it with a timeout), the result is stored and
    audited, and the transaction commits.

    Returns ``None`` when there is no connection or it needs re-authorisation, including
    when ``refresh`` raises :class:`~store.errors.InvalidGrant` (the connection is then marked
    ``needs_reauth`` and the event audited) or when an expired token has no refresh token.

    Raises:
        Exception: whatever ``refresh`` raised other than ``InvalidGrant``; the stored tokens
            are untouched and a ``refresh``/``failed`` audit entry is written.
        DecryptError: a stored token does not open with the key ring.
    """
    async with database.one_statement() as conn:
        current = await ConnectionRepository(conn, cipher)._snapshot(principal, provider)
    if current is None or current.info.status != "connected":
        return None
    tokens = current.tokens
    if not tokens.expiring(within=skew) or (tokens.refresh_token is None and not tokens.expiring(within=timedelta(0))):
        return tokens  # fresh, or not refreshable but still valid for a moment
    try:
        async with database.transaction() as conn:
            vault = ConnectionRepository(conn, cipher)
            locked = await vault.lock(principal, provider)
            if locked is None or locked.info.status != "connected":
                return None
            tokens = locked.tokens
            if not tokens.expiring(within=skew):
                return tokens  # another instance refreshed while we waited for the lock
            audit = AuditRepository(conn)
            if tokens.refresh_token is None:
                if tokens.expiring(within=timedelta(0)):
                    await vault.mark_needs_reauth(principal, provider)
                    await audit.record(principal, "refresh", provider=provider, outcome="no_refresh_token")
                    return None
                return tokens  # not refreshable, but still valid for a moment
            try:
                fresh = await refresh(tokens.refresh_token)
            except InvalidGrant:
                await vault.mark_needs_reauth(principal, provider)
                await audit.record(principal, "refresh", provider=provider, outcome="invalid_grant")
                logger.info("refresh of a %s connection was refused (invalid_grant); marked needs_reauth", provider)
                return None
            await vault.replace_tokens(principal, provider, fresh)
            await audit.record(principal, "refresh", provider=provider, outcome="ok")
            return _merged(tokens, fresh)
    except Exception as exc:
        await _record_failed_refresh(database, principal, provider, exc)
        raise


async def _record_failed_refresh(database: Database, principal: Principal, provider: str, exc: Exception) -> None:
    # Only the exception's class: its message could quote a response body or URL.
    reason = type(exc).__name__
    logger.warning("refresh of a %s connection failed: %s", provider, reason)
    try:
        async with database.one_statement() as conn:
            await AuditRepository(conn).record(principal, "refresh", provider=provider, outcome="failed", detail=reason)
    except (SQLAlchemyError, OSError):
        logger.warning("could not record the failed refresh in the audit trail", exc_info=True)


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
    prefix = cipher.current_prefix
    stale = or_(
        not_(_conn_t.c.access_token_enc.startswith(prefix, autoescape=True)),
        and_(
            _conn_t.c.refresh_token_enc.is_not(None),
            not_(_conn_t.c.refresh_token_enc.startswith(prefix, autoescape=True)),
        ),
    )
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
            .where(_conn_t.c.id > after_id, stale)
            .order_by(_conn_t.c.id)
            .limit(limit)
            .with_for_update()
        )
    ).all()
    if not rows:
        return 0, None
    updates: list[dict[str, Any]] = []
    for row_id, issuer, subject, provider, access_enc, refresh_enc in rows:
        principal = Principal(issuer=issuer, subject=subject)
        access_aad = _aad(row_id, principal, provider, "access_token")
        refresh_aad = _aad(row_id, principal, provider, "refresh_token")
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
    return len(updates), rows[-1][0]


async def reencrypt_all(conn: AsyncConnection, cipher: TokenCipher, *, batch_size: int = 500) -> int:
    """Re-encrypt under ``keys[0]`` every stored token and pending flow secret sealed under another key.

    Safe while servers run, provided every instance already has ``keys[0]`` in its ring. Rows
    are visited in id order in batches of ``batch_size``, each batch locked ``FOR UPDATE`` (a
    refresh in progress delays it by one network call; a row rewritten meanwhile is skipped
    because it no longer matches). On a connection outside a transaction every batch commits
    on its own, so locks last one batch; inside the caller's transaction everything commits
    with it. Rows that no ring key opens are logged by id and left alone (see :func:`count_stale`).
    Returns how many rows were re-encrypted.
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
    prefix = cipher.current_prefix
    connections = (
        await conn.execute(
            select(func.count())
            .select_from(_conn_t)
            .where(
                or_(
                    not_(_conn_t.c.access_token_enc.startswith(prefix, autoescape=True)),
                    and_(
                        _conn_t.c.refresh_token_enc.is_not(None),
                        not_(_conn_t.c.refresh_token_enc.startswith(prefix, autoescape=True)),
                    ),
                )
            )
        )
    ).scalar_one()
    return int(connections) + await count_stale_flow_secrets(conn, cipher)
