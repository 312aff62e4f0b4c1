"""The audit trail of connections: who did what, to which provider, when, and how it ended.

Entries never contain a secret: no token, code, state, verifier or handle. ``detail`` is a short
reason (an exception class, an OAuth error code, :func:`identity_digest` of someone else); callers
must keep it that way. Listing is scoped to the principal.
"""

import hashlib
import re
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import bindparam, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from store.models import AuditEvent, table_of
from store.principal import Principal
from store.scoping import owned_by, principal_params

MAX_DETAIL = 200
_CODE = re.compile(r"[a-z][a-z_]{0,31}")

_event = table_of(AuditEvent)

_RECORD = insert(_event).values(
    principal_iss=bindparam("p_iss"),
    principal_sub=bindparam("p_sub"),
    action=bindparam("p_action"),
    provider=bindparam("p_provider"),
    outcome=bindparam("p_outcome"),
    detail=bindparam("p_detail"),
)
_LIST = (
    select(_event.c.action, _event.c.provider, _event.c.outcome, _event.c.detail, _event.c.created_at)
    .where(owned_by(_event))
    .order_by(_event.c.created_at.desc(), _event.c.id.desc())
    .limit(bindparam("p_limit"))
)


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One recorded event of a principal."""

    action: str
    provider: str | None
    outcome: str
    detail: str | None
    created_at: datetime


def identity_digest(principal: Principal) -> str:
    """A short, stable, non-reversible name for ``principal`` (for ``detail`` when it is not the owner)."""
    return hashlib.sha256(f"{principal.issuer}\x00{principal.subject}".encode()).hexdigest()[:12]


class AuditRepository:
    """Audit writes and reads on one connection (inside the caller's transaction)."""

    def __init__(self, conn: AsyncConnection) -> None:
        self._conn = conn

    async def record(
        self,
        principal: Principal | None,
        action: str,
        *,
        provider: str | None,
        outcome: str,
        detail: str | None = None,
    ) -> None:
        """Append one event. One statement.

        ``action`` and ``outcome`` are lower-case codes such as ``"refresh"`` / ``"invalid_grant"``;
        ``detail`` is cut to 200 characters. For a subject mismatch pass the flow owner as
        ``principal`` and name the other party with :func:`identity_digest`.

        Raises:
            ValueError: ``action`` or ``outcome`` is not a lower-case code (a programming error).
        """
        if not _CODE.fullmatch(action) or not _CODE.fullmatch(outcome):
            raise ValueError("audit action and outcome must be lower-case codes of up to 32 characters")
        await self._conn.execute(
            _RECORD,
            {
                "p_iss": principal.issuer if principal is not None else None,
                "p_sub": principal.subject if principal is not None else None,
                "p_action": action,
                "p_provider": provider,
                "p_outcome": outcome,
                "p_detail": detail[:MAX_DETAIL] if detail is not None else None,
            },
        )

    async def list(self, principal: Principal, *, limit: int = 100) -> list[AuditEntry]:
        """The principal's events, newest first. One query."""
        rows = await self._conn.execute(_LIST, {**principal_params(principal), "p_limit": max(0, limit)})
        return [
            AuditEntry(
                action=row.action,
                provider=row.provider,
                outcome=row.outcome,
                detail=row.detail,
                created_at=row.created_at,
            )
            for row in rows
        ]


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One event as an operator sees it: with the principal it belongs to (``None`` when unnamed)."""

    id: int
    created_at: datetime
    issuer: str | None
    subject: str | None
    action: str
    provider: str | None
    outcome: str
    detail: str | None


async def search_events(
    conn: AsyncConnection,
    *,
    issuer: str | None = None,
    subject: str | None = None,
    action: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int = 1000,
) -> list[AuditRecord]:
    """Events matching every given filter, oldest first (``since`` inclusive, ``until`` exclusive). One query.

    The operator's view across principals (``coatcheck audit``); no tool or route calls it, so it is not
    scoped to one principal like every other store query.
    """
    stmt = select(
        _event.c.id,
        _event.c.created_at,
        _event.c.principal_iss,
        _event.c.principal_sub,
        _event.c.action,
        _event.c.provider,
        _event.c.outcome,
        _event.c.detail,
    )
    if issuer is not None:
        stmt = stmt.where(_event.c.principal_iss == issuer)
    if subject is not None:
        stmt = stmt.where(_event.c.principal_sub == subject)
    if action is not None:
        stmt = stmt.where(_event.c.action == action)
    if since is not None:
        stmt = stmt.where(_event.c.created_at >= since)
    if until is not None:
        stmt = stmt.where(_event.c.created_at < until)
    # The newest ``limit`` events, shown oldest first like a log.
    newest = stmt.order_by(_event.c.created_at.desc(), _event.c.id.desc()).limit(max(0, limit)).subquery()
    rows = await conn.execute(select(newest).order_by(newest.c.created_at, newest.c.id))
    return [
        AuditRecord(
            id=row.id,
            created_at=row.created_at,
            issuer=row.principal_iss,
            subject=row.principal_sub,
            action=row.action,
            provider=row.provider,
            outcome=row.outcome,
            detail=row.detail,
        )
        for row in rows
    ]
