"""The token vault: one principal's tokens for one provider, encrypted at rest.

A vault entry is one row of ``provider_connection`` (what the MCP tools call a connection to a
provider); "connection" in this package otherwise means a database connection.

Invariants:

* Every method takes the principal first and scopes its SQL to (issuer, subject, provider);
  another principal's entry reads as absent.
* Access and refresh tokens are sealed by :class:`~store.crypto.TokenCipher` with associated
  data naming this table, the row id, the principal, the provider and the column, so a
  ciphertext copied into another row or column does not decrypt (:func:`seal_tokens`,
  :func:`open_tokens`; the refresh lease and key rotation use the same two).
* Refreshing is :mod:`store.token_refresh`; re-encryption under a new key is
  :mod:`store.key_rotation`.
* Like every store module, this one takes a connection and never opens a transaction: the
  caller owns the unit of work.
* No token value appears in a ``repr``, an exception message or a log record.
"""

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

from sqlalchemy import RowMapping, Table, and_, bindparam, delete, func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

from store.crypto import TokenCipher, associated_data
from store.models import ProviderConnection, table_of
from store.principal import Principal
from store.scoping import owned_by, principal_params

__all__ = [
    "VAULT_TABLE",
    "OpenedVaultEntry",
    "TokenSet",
    "VaultEntry",
    "VaultRepository",
    "open_tokens",
    "seal_tokens",
    "token_aad",
    "vault_params",
]

VAULT_TABLE: Table = table_of(ProviderConnection)
_conn_t = VAULT_TABLE
_TABLE = "provider_connection"

OWNED_ENTRY: ColumnElement[bool] = and_(owned_by(_conn_t), _conn_t.c.provider == bindparam("p_provider"))
_OWNED = OWNED_ENTRY
INFO_COLUMNS = (
    _conn_t.c.provider,
    _conn_t.c.status,
    _conn_t.c.scopes,
    _conn_t.c.connected_at,
    _conn_t.c.expires_at,
    _conn_t.c.refreshed_at,
)
FULL_COLUMNS = (
    *INFO_COLUMNS,
    _conn_t.c.id,
    _conn_t.c.token_type,
    _conn_t.c.access_token_enc,
    _conn_t.c.refresh_token_enc,
)
_LIST = select(*INFO_COLUMNS).where(owned_by(_conn_t)).order_by(_conn_t.c.provider)
_INFO = select(*INFO_COLUMNS).where(_OWNED)
_READ = select(*FULL_COLUMNS).where(_OWNED)
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
# A new authorization replaces everything, including a refresh lease of the old grant (whose
# write-back then finds its lease gone and stores nothing).
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
        refresh_lease_id=None,
        refresh_lease_until=None,
        updated_at=func.now(),
    )
)
# Also takes the refresh lease away, so a refresh in flight cannot write "connected" back over the verdict.
_NEEDS_REAUTH = (
    update(_conn_t)
    .where(_OWNED)
    .values(status="needs_reauth", updated_at=func.now(), refresh_lease_id=None, refresh_lease_until=None)
)
_DELETE = delete(_conn_t).where(_OWNED).returning(*FULL_COLUMNS)


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

    def merged_with(self, fresh: "TokenSet") -> "TokenSet":
        """What a refresh that answered ``fresh`` leaves stored (RFC 6749 §5.1, §6).

        A ``refresh_token`` of ``None`` keeps this one (the provider did not rotate it), and
        empty ``scopes`` keep these scopes (omitted means unchanged).
        """
        return TokenSet(
            access_token=fresh.access_token,
            refresh_token=fresh.refresh_token if fresh.refresh_token is not None else self.refresh_token,
            expires_at=fresh.expires_at,
            scopes=fresh.scopes or self.scopes,
            token_type=fresh.token_type,
        )


ConnectionStatus = Literal["connected", "needs_reauth"]
"""``needs_reauth``: the provider refused the grant; the user must connect again."""


@dataclass(frozen=True, slots=True)
class VaultEntry:
    """What may be shown about a vault entry (a user's connection to a provider): no token material."""

    provider: str
    status: ConnectionStatus
    scopes: tuple[str, ...]
    connected_at: datetime
    expires_at: datetime | None
    refreshed_at: datetime | None


@dataclass(frozen=True, slots=True)
class OpenedVaultEntry:
    """A vault entry with its decrypted tokens."""

    info: VaultEntry
    tokens: TokenSet
    row_id: int = field(repr=False)


def info_of(row: RowMapping) -> VaultEntry:
    """The :class:`VaultEntry` of a row selected with :data:`INFO_COLUMNS`."""
    return VaultEntry(
        provider=row["provider"],
        status=row["status"],
        scopes=tuple(row["scopes"]),
        connected_at=row["connected_at"],
        expires_at=row["expires_at"],
        refreshed_at=row["refreshed_at"],
    )


def token_aad(row_id: int, principal: Principal, provider: str, column: str) -> bytes:
    """The associated data binding a token ciphertext to its row, owner, provider and column."""
    return associated_data(_TABLE, row_id, principal.issuer, principal.subject, provider, column)


def vault_params(principal: Principal, provider: str) -> dict[str, str]:
    """Bind values for :data:`OWNED_ENTRY`."""
    return {**principal_params(principal), "p_provider": provider}


def seal_tokens(
    cipher: TokenCipher, row_id: int, principal: Principal, provider: str, tokens: TokenSet
) -> dict[str, str | None]:
    """The two ciphertexts for a row, as bind values ``p_access`` and ``p_refresh`` (``None``: no refresh token)."""
    encrypt = cipher.encrypt
    return {
        "p_access": encrypt(tokens.access_token, aad=token_aad(row_id, principal, provider, "access_token")),
        "p_refresh": (
            encrypt(tokens.refresh_token, aad=token_aad(row_id, principal, provider, "refresh_token"))
            if tokens.refresh_token is not None
            else None
        ),
    }


def open_tokens(cipher: TokenCipher, principal: Principal, row: RowMapping) -> OpenedVaultEntry:
    """Decrypt a row selected with :data:`FULL_COLUMNS`.

    Raises:
        DecryptError: a token does not open with the key ring.
    """
    info = info_of(row)
    row_id, access_enc, refresh_enc = row["id"], row["access_token_enc"], row["refresh_token_enc"]
    decrypt = cipher.decrypt
    tokens = TokenSet(
        access_token=decrypt(access_enc, aad=token_aad(row_id, principal, info.provider, "access_token")),
        refresh_token=(
            decrypt(refresh_enc, aad=token_aad(row_id, principal, info.provider, "refresh_token"))
            if refresh_enc is not None
            else None
        ),
        expires_at=info.expires_at,
        scopes=info.scopes,
        token_type=row["token_type"],
    )
    return OpenedVaultEntry(info=info, tokens=tokens, row_id=row_id)


class VaultRepository:
    """The vault's entries, over one database connection (in the caller's transaction, or autocommit for one
    statement)."""

    def __init__(self, conn: AsyncConnection, cipher: TokenCipher) -> None:
        self._conn = conn
        self._cipher = cipher

    async def list(self, principal: Principal) -> list[VaultEntry]:
        """The principal's connections by provider name. One query, nothing decrypted."""
        rows = await self._conn.execute(_LIST, principal_params(principal))
        return [info_of(row) for row in rows.mappings()]

    async def info(self, principal: Principal, provider: str) -> VaultEntry | None:
        """The principal's connection to ``provider``, if any. One query, nothing decrypted."""
        row = (await self._conn.execute(_INFO, vault_params(principal, provider))).mappings().one_or_none()
        return info_of(row) if row is not None else None

    async def read(self, principal: Principal, provider: str) -> OpenedVaultEntry | None:
        """The connection with its tokens decrypted, without a lock. One query.

        Raises:
            DecryptError: a token does not open with the key ring.
        """
        row = (await self._conn.execute(_READ, vault_params(principal, provider))).mappings().one_or_none()
        return open_tokens(self._cipher, principal, row) if row is not None else None

    async def save(self, principal: Principal, provider: str, tokens: TokenSet) -> None:
        """Store tokens from a completed authorization: insert, or replace a previous connection.

        Sets the status to ``connected`` and ``connected_at`` to now, and drops any refresh lease of
        the previous grant. Two statements (the row id must be known before the tokens can be bound
        to it), so call it inside a transaction.
        """
        row_id = (await self._conn.execute(_CLAIM, vault_params(principal, provider))).scalar_one()
        await self._conn.execute(
            _STORE,
            {
                "p_id": row_id,
                "p_scopes": list(tokens.scopes),
                "p_token_type": tokens.token_type,
                "p_expires_at": tokens.expires_at,
                **seal_tokens(self._cipher, row_id, principal, provider, tokens),
            },
        )

    async def mark_needs_reauth(self, principal: Principal, provider: str) -> None:
        """Flag the connection as needing a new authorization; the tokens stay for revocation. One statement."""
        await self._conn.execute(_NEEDS_REAUTH, vault_params(principal, provider))

    async def delete(self, principal: Principal, provider: str) -> TokenSet | None:
        """Delete the connection and return its tokens (to revoke upstream); ``None`` if there was none.

        One statement.

        Raises:
            DecryptError: a token does not open with the key ring (the deletion is then rolled
                back with the caller's transaction).
        """
        row = (await self._conn.execute(_DELETE, vault_params(principal, provider))).mappings().one_or_none()
        return open_tokens(self._cipher, principal, row).tokens if row is not None else None
