"""Browser sessions of ``/connect``: started at sign-in, ended at sign-out, dead at expiry.

The session id is a random secret inside the browser's sealed cookie; only ``sha256(id)`` is stored. A
session is live while its row exists and ``expires_at`` (database clock) is ahead, so deleting the row ends
it for every copy of the cookie on every replica at once. Every statement is scoped to the principal the
cookie names, and each is one statement (run it as :meth:`store.db.Database.one_statement`).
"""

import hashlib
from datetime import timedelta

from sqlalchemy import Interval, bindparam, delete, func, insert, literal, select
from sqlalchemy.ext.asyncio import AsyncConnection

from store.models import BrowserSession, table_of
from store.principal import Principal
from store.scoping import owned_by, principal_params

__all__ = ["BrowserSessionRepository", "session_digest"]

_session = table_of(BrowserSession)
_START = insert(_session).values(
    session_digest=bindparam("p_digest"),
    principal_iss=bindparam("p_iss"),
    principal_sub=bindparam("p_sub"),
    expires_at=func.now() + bindparam("p_lifetime", type_=Interval()),
)
_LIVE = select(literal(1)).where(
    _session.c.session_digest == bindparam("p_digest"), owned_by(_session), _session.c.expires_at > func.now()
)
_END = delete(_session).where(_session.c.session_digest == bindparam("p_digest"), owned_by(_session))


def session_digest(session_id: str) -> bytes:
    """What is stored for ``session_id``: its SHA-256 (the id is random, so no salt is needed)."""
    return hashlib.sha256(session_id.encode()).digest()


class BrowserSessionRepository:
    """Browser-session writes and reads on one connection."""

    def __init__(self, conn: AsyncConnection) -> None:
        self._conn = conn

    async def start(self, session_id: str, principal: Principal, *, lifetime: timedelta) -> None:
        """Record a sign-in of ``principal`` that lasts ``lifetime`` from now. One statement.

        Raises:
            ValueError: ``lifetime`` is not positive.
        """
        if lifetime <= timedelta(0):
            raise ValueError("a browser session needs a positive lifetime")
        params = {"p_digest": session_digest(session_id), "p_lifetime": lifetime, **principal_params(principal)}
        await self._conn.execute(_START, params)

    async def is_live(self, session_id: str, principal: Principal) -> bool:
        """Whether ``principal``'s session ``session_id`` was started, not ended, and has not expired."""
        params = {"p_digest": session_digest(session_id), **principal_params(principal)}
        return (await self._conn.execute(_LIVE, params)).first() is not None

    async def end(self, session_id: str, principal: Principal) -> bool:
        """End ``principal``'s session ``session_id``; whether it was still recorded. One statement."""
        params = {"p_digest": session_digest(session_id), **principal_params(principal)}
        return (await self._conn.execute(_END, params)).rowcount > 0
