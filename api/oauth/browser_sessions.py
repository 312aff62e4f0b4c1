"""Signed-in browsers of ``/connect``: a sealed cookie naming a session, and that session's row in PostgreSQL.

A sealed cookie alone proves who signed in and until when, but a copy of it would keep working until it
expires, sign-out or not. So every sign-in also records a random session id (the cookie carries it, the
database keeps its SHA-256, :mod:`store.browser_sessions`), every use of the cookie checks that record (one
indexed statement), and sign-out deletes it: from then on no copy of the cookie opens a session, on any
replica, since they all read the same table.
"""

import secrets
from collections.abc import Mapping
from datetime import timedelta

from litestar.datastructures import Cookie

from api.oauth.session import BrowserSession, CookieJar
from store.browser_sessions import BrowserSessionRepository
from store.db import Database
from store.principal import Principal


class BrowserSessions:
    """Starts, finds and ends browser sessions; the cookie jar seals them."""

    def __init__(self, jar: CookieJar, database: Database) -> None:
        self.jar = jar
        self._database = database

    async def start(self, person: Principal) -> Cookie:
        """Record a new sign-in of ``person``; the session cookie to set.

        Raises:
            store.errors.Unavailable: the database could not record it (nothing was set).
        """
        session = BrowserSession(issuer=person.issuer, subject=person.subject, session_id=secrets.token_urlsafe(32))
        async with self._database.one_statement() as conn:
            await BrowserSessionRepository(conn).start(
                session.session_id, person, lifetime=timedelta(seconds=self.jar.session_seconds)
            )
        return self.jar.session_cookie(session)

    async def current(self, cookies: Mapping[str, str]) -> BrowserSession | None:
        """The browser's session if its cookie opens and its record is live, else ``None``."""
        session = self.jar.read_session(dict(cookies))
        if session is None:
            return None
        async with self._database.one_statement() as conn:
            live = await BrowserSessionRepository(conn).is_live(session.session_id, session.principal)
        return session if live else None

    async def end(self, session: BrowserSession) -> None:
        """End ``session`` for every copy of its cookie (the caller also clears the browser's)."""
        async with self._database.one_statement() as conn:
            await BrowserSessionRepository(conn).end(session.session_id, session.principal)
