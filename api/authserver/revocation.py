"""Which grants are revoked, as every replica sees it within a second: PostgreSQL ``LISTEN``/``NOTIFY``.

Why this and not a database lookup per request: an MCP client presents its access token on every call,
and a lookup would add a round trip to each of them for an answer that is almost always "not revoked".
Revocations are rare and the set that matters is small (only grants revoked within the lifetime of an
access token: older ones name no live token), so each replica keeps it in memory:

1. a dedicated connection ``LISTEN``s on ``coatcheck_grant_revoked`` (a trigger on ``as_grant`` notifies at
   the commit of every revocation, whatever statement made it; see migration d18e00000001);
2. only then is the current set loaded, so no revocation can fall between the two;
3. while that connection is down (start-up, a database restart, a failover), :meth:`is_revoked` asks the
   database for each token instead and a background task reconnects, so the check fails slow, never open.
   A connection that dies silently (a network partition reports nothing) is caught by a ``SELECT 1`` on it
   every second; a database that cannot be asked either counts every grant as revoked.

A notification reaches a listening replica within milliseconds of the commit. Behind a transaction-pooling
PgBouncer (``DB_POOLER_MODE=transaction``) ``LISTEN`` does not work, so every check asks the database.
"""

import asyncio
import contextlib
import logging
import time
from datetime import timedelta
from typing import Any

import asyncpg  # type: ignore[import-untyped]
from sqlalchemy.engine import make_url

from store import authserver as store
from store.db import Database

logger = logging.getLogger(__name__)

RECONNECT_SECONDS = 1.0


class RevokedGrants:
    """The revoked-grant set of this replica (see the module docstring)."""

    def __init__(self, database: Database, database_url: str, *, window: timedelta, listen: bool = True) -> None:
        self._database = database
        self._url = make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)
        self._window = window
        self._listen = listen
        self._revoked: dict[str, float] = {}
        self._connection: Any = None
        self._healthy = False
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def backend_pid(self) -> int | None:
        """The PostgreSQL backend of the listening connection (for operators and tests), if connected."""
        return None if self._connection is None else int(self._connection.get_server_pid())

    @property
    def listening(self) -> bool:
        """Whether the set is kept fresh by notifications right now (else each check asks the database)."""
        return self._healthy

    async def start(self) -> None:
        """Start listening (in the background: a failure here only means database checks for a while)."""
        if self._listen:
            self._task = asyncio.create_task(self._run(), name="coatcheck-revoked-grants")

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._close()

    async def is_revoked(self, grant_id: str) -> bool:
        """Whether ``grant_id`` is revoked (an unknown grant counts as revoked when the database is asked)."""
        if self._healthy:
            return grant_id in self._revoked
        try:
            async with self._database.one_statement() as conn:
                return await store.is_revoked(conn, grant_id)
        except Exception as exc:  # fail closed: a token that cannot be checked is not accepted
            logger.warning("cannot check a grant's revocation (%s); refusing the token", type(exc).__name__)
            return True

    def _heard(self, _connection: object, _pid: int, _channel: str, grant_id: str) -> None:
        now = time.monotonic()
        self._revoked[grant_id] = now
        horizon = now - self._window.total_seconds()
        for stale in [gid for gid, at in self._revoked.items() if at < horizon]:
            del self._revoked[stale]

    def _lost(self, connection: object) -> None:
        if connection is not self._connection:
            return  # closed on purpose (reconnecting or stopping)
        self._healthy = False
        logger.warning("revocation listener lost its connection; checking grants in the database until it is back")

    async def _close(self) -> None:
        self._healthy = False
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.close(timeout=2)

    async def _run(self) -> None:
        while not self._stopping:
            if not self._healthy:
                await self._close()
                try:
                    # Held at once, so a failure below (LISTEN on a standby, say) still closes it next round.
                    self._connection = connection = await asyncpg.connect(self._url, timeout=5)
                    connection.add_termination_listener(self._lost)
                    await connection.add_listener(store.REVOCATION_CHANNEL, self._heard)
                    async with self._database.one_statement() as conn:
                        loaded = await store.revoked_since(conn, self._window)
                    now = time.monotonic()
                    for grant_id in loaded:
                        self._revoked.setdefault(grant_id, now)
                    self._healthy = True
                    logger.info("revocation listener connected (%d recently revoked grants)", len(loaded))
                except Exception as exc:  # any failure: keep checking in the database, try again
                    logger.warning("revocation listener cannot connect (%s); retrying", type(exc).__name__)
            else:
                try:  # a partition closes nothing: prove the connection still answers
                    await self._connection.fetchval("SELECT 1", timeout=RECONNECT_SECONDS)
                except Exception as exc:
                    logger.warning("revocation listener stopped answering (%s); reconnecting", type(exc).__name__)
                    self._healthy = False
                    continue
            await asyncio.sleep(RECONNECT_SECONDS)
