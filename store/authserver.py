"""The authorization server's state in PostgreSQL: clients, consents, grants, codes and refresh tokens.

Every function takes the caller's connection (one transaction per effect, opened by ``api/``). The two
races that matter are settled by single statements, not by reading first:

* :func:`consume_code` is ``UPDATE … SET used_at = now() WHERE code_hash = … AND used_at IS NULL AND
  expires_at > now() RETURNING …``: of two concurrent redemptions exactly one gets the row.
* :func:`rotate_refresh_token` spends a refresh token the same way; the loser of a race, or anyone
  presenting a spent token, is a replay, and the caller revokes the whole grant (:func:`revoke_grant`).

Codes and refresh tokens are stored as ``sha256`` digests (:func:`digest`), never in the clear. Revoking a
grant fires the ``coatcheck_grant_revoked`` notification (a trigger, see migration d18e00000001).
"""

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import and_, delete, func, insert, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from store.models import AsAuthorizationCode, AsClient, AsConsent, AsGrant, AsRefreshToken, table_of
from store.principal import Principal

REVOCATION_CHANNEL = "coatcheck_grant_revoked"
GRANT_PREFIX = "grt"

_clients = table_of(AsClient)
_consents = table_of(AsConsent)
_grants = table_of(AsGrant)
_codes = table_of(AsAuthorizationCode)
_refresh = table_of(AsRefreshToken)


def digest(secret: str) -> bytes:
    """How a code or refresh token is stored and looked up: its SHA-256 (they carry 256 random bits)."""
    return hashlib.sha256(secret.encode()).digest()


def new_secret() -> str:
    """A fresh code or refresh token: 256 bits, URL-safe."""
    return secrets.token_urlsafe(32)


@dataclass(frozen=True, slots=True)
class StoredClient:
    """A stored client: dynamically registered or a cached metadata document."""

    client_id: str
    kind: str
    metadata: dict[str, object]
    secret_enc: str | None
    fresh_until: datetime | None


@dataclass(frozen=True, slots=True)
class GrantRecord:
    """A grant as a code or refresh token finds it."""

    id: str
    principal: Principal
    client_id: str
    scopes: list[str]
    resource: str
    revoked: bool


@dataclass(frozen=True, slots=True)
class CodeRecord:
    """An authorization code's binding (the code itself is not stored)."""

    grant: GrantRecord
    client_id: str
    redirect_uri: str
    code_challenge: str
    expires_at: datetime
    used: bool


@dataclass(frozen=True, slots=True)
class RefreshRecord:
    """A refresh token's binding (the token itself is not stored)."""

    grant: GrantRecord
    client_id: str
    expires_at: datetime
    used: bool


@dataclass(frozen=True, slots=True)
class GrantSummary:
    """One of a principal's grants, for the page where they revoke them and the operator's list."""

    id: str
    client_id: str
    scopes: list[str]
    created_at: datetime
    revoked_at: datetime | None


# --- clients ---------------------------------------------------------------------------------------


async def save_client(
    conn: AsyncConnection,
    *,
    client_id: str,
    kind: str,
    metadata: dict[str, object],
    secret_enc: str | None = None,
    fresh_until: datetime | None = None,
) -> None:
    """Insert a client, or refresh a cached metadata document's row. One statement."""
    stmt = pg_insert(_clients).values(
        client_id=client_id, kind=kind, metadata_json=metadata, secret_enc=secret_enc, fresh_until=fresh_until
    )
    stmt = stmt.on_conflict_do_update(
        index_elements=[_clients.c.client_id],
        set_={"metadata_json": stmt.excluded.metadata_json, "fresh_until": stmt.excluded.fresh_until},
        where=_clients.c.kind == "cimd",
    )
    await conn.execute(stmt)


async def load_client(conn: AsyncConnection, client_id: str) -> StoredClient | None:
    """The stored client named ``client_id``, if any. One query."""
    row = (
        await conn.execute(
            select(
                _clients.c.client_id,
                _clients.c.kind,
                _clients.c.metadata_json,
                _clients.c.secret_enc,
                _clients.c.fresh_until,
            ).where(_clients.c.client_id == client_id)
        )
    ).first()
    if row is None:
        return None
    return StoredClient(row.client_id, row.kind, dict(row.metadata_json), row.secret_enc, row.fresh_until)


async def registrations_within(conn: AsyncConnection, window: timedelta) -> int:
    """How many clients registered dynamically within ``window`` (the rate bound). One query."""
    stmt = select(func.count()).where(and_(_clients.c.kind == "dynamic", _clients.c.created_at > func.now() - window))
    return int((await conn.execute(stmt)).scalar_one())


# --- consents --------------------------------------------------------------------------------------


async def consented_scopes(conn: AsyncConnection, principal: Principal, client_id: str) -> list[str] | None:
    """The scopes ``principal`` consented to for ``client_id``, or ``None`` without a consent. One query."""
    stmt = select(_consents.c.scopes).where(
        and_(
            _consents.c.principal_iss == principal.issuer,
            _consents.c.principal_sub == principal.subject,
            _consents.c.client_id == client_id,
        )
    )
    scopes = (await conn.execute(stmt)).scalar_one_or_none()
    return None if scopes is None else list(scopes)


async def remember_consent(conn: AsyncConnection, principal: Principal, client_id: str, scopes: list[str]) -> None:
    """Record (or widen) ``principal``'s consent for ``client_id``. One statement."""
    stmt = pg_insert(_consents).values(
        principal_iss=principal.issuer, principal_sub=principal.subject, client_id=client_id, scopes=sorted(scopes)
    )
    await conn.execute(
        stmt.on_conflict_do_update(
            index_elements=[_consents.c.principal_iss, _consents.c.principal_sub, _consents.c.client_id],
            set_={"scopes": stmt.excluded.scopes, "created_at": func.now()},
        )
    )


async def forget_consent(conn: AsyncConnection, principal: Principal, client_id: str) -> bool:
    """Delete ``principal``'s consent for ``client_id``; whether there was one. One statement."""
    result = await conn.execute(
        delete(_consents).where(
            and_(
                _consents.c.principal_iss == principal.issuer,
                _consents.c.principal_sub == principal.subject,
                _consents.c.client_id == client_id,
            )
        )
    )
    return bool(result.rowcount)


# --- grants, codes, refresh tokens -----------------------------------------------------------------


async def create_grant(
    conn: AsyncConnection, principal: Principal, *, client_id: str, scopes: list[str], resource: str
) -> str:
    """A new grant; its id (``grt_…``, 256 random bits). One statement."""
    grant_id = f"{GRANT_PREFIX}_{new_secret()}"
    await conn.execute(
        insert(_grants).values(
            id=grant_id,
            principal_iss=principal.issuer,
            principal_sub=principal.subject,
            client_id=client_id,
            scopes=scopes,
            resource=resource,
        )
    )
    return grant_id


async def store_code(
    conn: AsyncConnection,
    code: str,
    *,
    grant_id: str,
    client_id: str,
    redirect_uri: str,
    code_challenge: str,
    lifetime: timedelta,
) -> None:
    """Store ``code`` (its digest) for ``grant_id``, valid for ``lifetime``. One statement."""
    await conn.execute(
        insert(_codes).values(
            code_hash=digest(code),
            grant_id=grant_id,
            client_id=client_id,
            redirect_uri=redirect_uri,
            code_challenge=code_challenge,
            expires_at=func.now() + lifetime,
        )
    )


def _grant_of(row: object) -> GrantRecord:
    return GrantRecord(
        id=row.grant_id,  # type: ignore[attr-defined]
        principal=Principal(issuer=row.principal_iss, subject=row.principal_sub),  # type: ignore[attr-defined]
        client_id=row.grant_client_id,  # type: ignore[attr-defined]
        scopes=list(row.scopes),  # type: ignore[attr-defined]
        resource=row.resource,  # type: ignore[attr-defined]
        revoked=row.revoked_at is not None,  # type: ignore[attr-defined]
    )


_GRANT_COLUMNS = (
    _grants.c.id.label("grant_id"),
    _grants.c.principal_iss,
    _grants.c.principal_sub,
    _grants.c.client_id.label("grant_client_id"),
    _grants.c.scopes,
    _grants.c.resource,
    _grants.c.revoked_at,
)


async def load_code(conn: AsyncConnection, code: str) -> CodeRecord | None:
    """What ``code`` was issued for (used or not), or ``None`` for an unknown code. One query."""
    stmt = (
        select(
            *_GRANT_COLUMNS,
            _codes.c.client_id,
            _codes.c.redirect_uri,
            _codes.c.code_challenge,
            _codes.c.expires_at,
            _codes.c.used_at,
        )
        .join(_grants, _grants.c.id == _codes.c.grant_id)
        .where(_codes.c.code_hash == digest(code))
    )
    row = (await conn.execute(stmt)).first()
    if row is None:
        return None
    return CodeRecord(
        grant=_grant_of(row),
        client_id=row.client_id,
        redirect_uri=row.redirect_uri,
        code_challenge=row.code_challenge,
        expires_at=row.expires_at,
        used=row.used_at is not None,
    )


async def consume_code(conn: AsyncConnection, code: str) -> str | None:
    """Spend ``code`` once: its grant id, or ``None`` if it was already used, expired or unknown. One statement.

    Of any number of concurrent calls with the same code, exactly one gets the grant id.
    """
    stmt = (
        update(_codes)
        .where(and_(_codes.c.code_hash == digest(code), _codes.c.used_at.is_(None), _codes.c.expires_at > func.now()))
        .values(used_at=func.now())
        .returning(_codes.c.grant_id)
    )
    grant_id: str | None = (await conn.execute(stmt)).scalar_one_or_none()
    return grant_id


async def store_refresh_token(
    conn: AsyncConnection, token: str, *, grant_id: str, client_id: str, lifetime: timedelta
) -> None:
    """Store ``token`` (its digest) in ``grant_id``'s family. One statement."""
    await conn.execute(
        insert(_refresh).values(
            token_hash=digest(token), grant_id=grant_id, client_id=client_id, expires_at=func.now() + lifetime
        )
    )


async def load_refresh_token(conn: AsyncConnection, token: str) -> RefreshRecord | None:
    """What ``token`` belongs to (spent or not), or ``None`` for an unknown token. One query."""
    stmt = (
        select(*_GRANT_COLUMNS, _refresh.c.client_id, _refresh.c.expires_at, _refresh.c.used_at)
        .join(_grants, _grants.c.id == _refresh.c.grant_id)
        .where(_refresh.c.token_hash == digest(token))
    )
    row = (await conn.execute(stmt)).first()
    if row is None:
        return None
    return RefreshRecord(
        grant=_grant_of(row), client_id=row.client_id, expires_at=row.expires_at, used=row.used_at is not None
    )


async def rotate_refresh_token(conn: AsyncConnection, token: str) -> str | None:
    """Spend ``token`` once: its grant id, or ``None`` if it was spent, expired, unknown or its grant revoked.

    One statement; of concurrent calls with the same token exactly one succeeds.
    """
    live_grant = select(_grants.c.id).where(and_(_grants.c.id == _refresh.c.grant_id, _grants.c.revoked_at.is_(None)))
    stmt = (
        update(_refresh)
        .where(
            and_(
                _refresh.c.token_hash == digest(token),
                _refresh.c.used_at.is_(None),
                _refresh.c.expires_at > func.now(),
                live_grant.exists(),
            )
        )
        .values(used_at=func.now())
        .returning(_refresh.c.grant_id)
    )
    grant_id: str | None = (await conn.execute(stmt)).scalar_one_or_none()
    return grant_id


async def revoke_grant(conn: AsyncConnection, grant_id: str, reason: str) -> GrantRecord | None:
    """Revoke ``grant_id`` (its refresh-token family and access tokens); the grant, if this call revoked it.

    ``None`` when it is unknown or was already revoked. One statement; the trigger notifies every replica.
    """
    stmt = (
        update(_grants)
        .where(and_(_grants.c.id == grant_id, _grants.c.revoked_at.is_(None)))
        .values(revoked_at=func.now(), revoked_reason=reason)
        .returning(*_GRANT_COLUMNS)
    )
    row = (await conn.execute(stmt)).first()
    return None if row is None else _grant_of(row)


async def revoke_grants_of(
    conn: AsyncConnection, principal: Principal, *, client_id: str | None, reason: str
) -> list[str]:
    """Revoke every live grant of ``principal`` (to ``client_id`` only, when given); their ids. One statement."""
    conditions = [
        _grants.c.principal_iss == principal.issuer,
        _grants.c.principal_sub == principal.subject,
        _grants.c.revoked_at.is_(None),
    ]
    if client_id is not None:
        conditions.append(_grants.c.client_id == client_id)
    stmt = (
        update(_grants)
        .where(and_(*conditions))
        .values(revoked_at=func.now(), revoked_reason=reason)
        .returning(_grants.c.id)
    )
    return list((await conn.execute(stmt)).scalars())


async def grants_of(conn: AsyncConnection, principal: Principal) -> list[GrantSummary]:
    """``principal``'s grants, newest first. One query."""
    stmt = (
        select(_grants.c.id, _grants.c.client_id, _grants.c.scopes, _grants.c.created_at, _grants.c.revoked_at)
        .where(and_(_grants.c.principal_iss == principal.issuer, _grants.c.principal_sub == principal.subject))
        .order_by(_grants.c.created_at.desc())
    )
    return [
        GrantSummary(row.id, row.client_id, list(row.scopes), row.created_at, row.revoked_at)
        for row in await conn.execute(stmt)
    ]


async def revoked_since(conn: AsyncConnection, window: timedelta) -> set[str]:
    """Ids of grants revoked within ``window`` (older revocations outlive no access token). One query."""
    stmt = select(_grants.c.id).where(_grants.c.revoked_at > func.now() - window)
    return set((await conn.execute(stmt)).scalars())


async def is_revoked(conn: AsyncConnection, grant_id: str) -> bool:
    """Whether ``grant_id`` is revoked or unknown (fail closed). One query."""
    stmt = select(_grants.c.revoked_at).where(_grants.c.id == grant_id)
    row = (await conn.execute(stmt)).first()
    return row is None or row.revoked_at is not None


# --- retention -------------------------------------------------------------------------------------

_PURGES = {
    # A code is useless an hour after it expired (a replay that late is refused as unknown, not as a replay).
    "as_authorization_code": """
        WITH doomed AS (SELECT code_hash FROM as_authorization_code WHERE expires_at < now() - interval '1 hour'
                        LIMIT :limit FOR UPDATE SKIP LOCKED)
        DELETE FROM as_authorization_code WHERE code_hash IN (SELECT code_hash FROM doomed)""",
    # Spent refresh tokens stay until they expire, so that a replay of one is still recognised.
    "as_refresh_token": """
        WITH doomed AS (SELECT token_hash FROM as_refresh_token WHERE expires_at < now()
                        LIMIT :limit FOR UPDATE SKIP LOCKED)
        DELETE FROM as_refresh_token WHERE token_hash IN (SELECT token_hash FROM doomed)""",
    # A grant goes a day after it was revoked (its access tokens died long before), or a day after it was
    # created once nothing of it is left (no code, no refresh token: its family expired).
    "as_grant": """
        WITH doomed AS (SELECT id FROM as_grant g
                        WHERE g.revoked_at < now() - interval '1 day'
                           OR (g.created_at < now() - interval '1 day'
                               AND NOT EXISTS (SELECT FROM as_refresh_token r WHERE r.grant_id = g.id)
                               AND NOT EXISTS (SELECT FROM as_authorization_code c WHERE c.grant_id = g.id))
                        LIMIT :limit FOR UPDATE SKIP LOCKED)
        DELETE FROM as_grant WHERE id IN (SELECT id FROM doomed)""",
    # A registered client nobody authorised within a day, and a cached metadata document a day stale.
    "as_client": """
        WITH doomed AS (SELECT client_id FROM as_client c
                        WHERE ((c.kind = 'dynamic' AND c.created_at < now() - interval '1 day')
                               OR (c.kind = 'cimd' AND c.fresh_until < now() - interval '1 day'))
                          AND NOT EXISTS (SELECT FROM as_grant g WHERE g.client_id = c.client_id)
                        LIMIT :limit FOR UPDATE SKIP LOCKED)
        DELETE FROM as_client WHERE client_id IN (SELECT client_id FROM doomed)""",
}
PURGEABLE_TABLES = tuple(_PURGES)


async def purge_batch(conn: AsyncConnection, table: str, *, limit: int) -> int:
    """Delete up to ``limit`` rows of ``table`` (one of :data:`PURGEABLE_TABLES`) that nothing can use any more.

    One statement; rows another purge holds are skipped. Consents are never purged (revoking forgets them).
    """
    result = await conn.execute(text(_PURGES[table]), {"limit": limit})
    return int(result.rowcount or 0)
