"""Refreshing stored tokens across instances without holding a database connection across the provider call.

:class:`TokenRefresher` drives the lease in :mod:`store.token_refresh`. Each step is a short
autocommit statement or transaction on a pooled connection that goes back to the pool before
anything waits: the provider call runs outside any transaction, and callers that find another
instance refreshing poll the row with a bounded wait (sleeping between reads with no connection
checked out). So a slow or dead token endpoint costs one lease, not one pooled connection per
waiting caller, and other users' requests keep their connections.
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta

from sqlalchemy.exc import SQLAlchemyError

from api.oauth.client import OAuthFailure
from store.audit import AuditRepository
from store.crypto import TokenCipher
from store.db import Database
from store.errors import InvalidGrant, Unavailable
from store.principal import Principal
from store.token_refresh import (
    RefreshLease,
    claim_refresh,
    mark_needs_reauth_under_lease,
    read_for_refresh,
    release_after_failure,
    store_refreshed,
)
from store.vault import TokenSet, VaultRepository

__all__ = ["RefreshTiming", "TokenRefresher"]

logger = logging.getLogger(__name__)

Refresh = Callable[[str], Awaitable[TokenSet]]
Discard = Callable[[TokenSet], Awaitable[str]]


class RefreshTiming:
    """How long a refresh may take, how long others wait for it, and how soon a failed one is retried.

    The lease outlives the refresher's own timeout by ``margin``, so a lease can only be taken
    over from a refresher that has already given up (or died).
    """

    def __init__(
        self,
        *,
        timeout: float = 15.0,
        margin: float = 15.0,
        wait: float | None = None,
        retry_after: float = 5.0,
        poll_interval: float = 0.05,
        max_poll_interval: float = 0.5,
    ) -> None:
        self.timeout = timeout
        self.lease_for = timedelta(seconds=timeout + margin)
        self.wait = timeout + 2.0 if wait is None else wait
        self.retry_after = timedelta(seconds=retry_after)
        self.poll_interval = poll_interval
        self.max_poll_interval = max_poll_interval


class TokenRefresher:
    """Usable tokens for a principal's connection, refreshed by exactly one caller when they are due."""

    def __init__(
        self, database: Database, cipher: TokenCipher, *, skew: timedelta, timing: RefreshTiming | None = None
    ) -> None:
        self.database = database
        self.cipher = cipher
        self.skew = skew
        self.timing = timing or RefreshTiming()

    async def usable_tokens(
        self, principal: Principal, provider: str, refresh: Refresh, discard: Discard | None = None
    ) -> TokenSet | None:
        """Tokens that are valid now, refreshed first when they expire within the skew.

        A fresh token costs one autocommit read. A due token is refreshed by whichever caller
        claims the lease; the others return the current token at once while it is still valid,
        or poll until the new one is stored (at most ``timing.wait`` seconds).

        Returns ``None`` when there is no connection or it needs re-authorisation, including
        when ``refresh`` raises :class:`~store.errors.InvalidGrant` (the connection is then
        marked ``needs_reauth`` and the event audited) or an expired token has no refresh token.
        Also ``None`` when the connection was disconnected (or stopped being connected) while the
        refresh was in flight: the refreshed tokens are then handed to ``discard`` (which revokes
        them upstream and names the outcome), never returned or stored.

        Raises:
            OAuthFailure: ``refresh_in_progress`` (another caller's refresh did not finish
                within the wait), ``refresh_failed_recently`` (within the cool-down after a
                failure) or ``refresh_timeout``; whatever ``refresh`` raised otherwise (the
                stored tokens are then untouched and a ``refresh``/``failed`` entry audited).
            DecryptError: a stored token does not open with the key ring.
        """
        timing = self.timing
        deadline = time.monotonic() + timing.wait
        interval = timing.poll_interval
        while True:
            async with self.database.one_statement() as conn:
                view = await read_for_refresh(conn, self.cipher, principal, provider, skew=self.skew)
            if view is None or view.status != "connected":
                return None
            tokens = view.tokens
            if not view.due:
                return tokens
            if tokens.refresh_token is None:
                if view.valid:
                    return tokens
                await self._needs_reauth(principal, provider)
                return None
            if not view.leased and not view.cooling:
                async with self.database.one_statement() as conn:
                    lease = await claim_refresh(
                        conn, self.cipher, principal, provider, skew=self.skew, lease_for=timing.lease_for
                    )
                if lease is not None:
                    return await self._refresh(lease, refresh, discard)
                # Lost the race to another caller: wait for its result like everybody else.
            if view.valid:
                return tokens  # good for a little longer: no need to wait for the other refresher
            if view.cooling:
                raise OAuthFailure("refresh_failed_recently")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise OAuthFailure("refresh_in_progress")
            await asyncio.sleep(min(interval, remaining))
            interval = min(interval * 2, timing.max_poll_interval)

    async def _needs_reauth(self, principal: Principal, provider: str) -> None:
        async with self.database.transaction() as conn:
            await VaultRepository(conn, self.cipher).mark_needs_reauth(principal, provider)
            await AuditRepository(conn).record(principal, "refresh", provider=provider, outcome="no_refresh_token")

    async def _refresh(self, lease: RefreshLease, refresh: Refresh, discard: Discard | None) -> TokenSet | None:
        principal, provider = lease.principal, lease.provider
        try:
            # No connection is checked out here: the provider may take as long as the timeout allows.
            async with asyncio.timeout(self.timing.timeout):
                fresh = await refresh(lease.refresh_token)
        except InvalidGrant:
            async with self.database.transaction() as conn:
                if await mark_needs_reauth_under_lease(conn, lease):
                    await AuditRepository(conn).record(principal, "refresh", provider=provider, outcome="invalid_grant")
            logger.info("refresh of a %s connection was refused (invalid_grant); marked needs_reauth", provider)
            return None
        except TimeoutError:
            await self._record_failure(lease, "timeout")
            raise OAuthFailure("refresh_timeout") from None
        except Exception as exc:
            # Only the exception's class: its message could quote a response body or URL.
            await self._record_failure(lease, type(exc).__name__)
            raise
        async with self.database.transaction() as conn:
            if await store_refreshed(conn, self.cipher, lease, fresh):
                await AuditRepository(conn).record(principal, "refresh", provider=provider, outcome="ok")
                return lease.tokens.merged_with(fresh)
            # The lease was lost. Only a refresh of this same, still connected row (another refresher took
            # the lease over after ours ran out) makes the stored tokens the answer; a connection that was
            # disconnected (or re-created, or flagged) meanwhile must not get tokens back.
            current = await read_for_refresh(conn, self.cipher, principal, provider, skew=self.skew)
            superseded = current is not None and current.entry.row_id == lease.row_id and current.status == "connected"
            if superseded:
                await AuditRepository(conn).record(
                    principal, "refresh", provider=provider, outcome="lease_lost", detail="superseded"
                )
        if current is not None and superseded:
            logger.warning("a refreshed %s token was not stored: another refresher took the lease over", provider)
            return current.tokens
        # Nobody holds these tokens any more (a rotated refresh token would be stored nowhere): revoke them,
        # with no connection checked out across the provider call.
        revocation = "not_revoked"
        if discard is not None:
            try:
                revocation = await discard(fresh)
            except Exception as exc:  # best effort: the caller is answered "not connected" either way
                revocation = f"failed ({type(exc).__name__})"
        logger.warning("a %s connection went away during its refresh; the refreshed tokens: %s", provider, revocation)
        async with self.database.one_statement() as conn:
            await AuditRepository(conn).record(
                principal, "refresh", provider=provider, outcome="lease_lost", detail=f"disconnected; {revocation}"
            )
        return None

    async def _record_failure(self, lease: RefreshLease, reason: str) -> None:
        logger.warning("refresh of a %s connection failed: %s", lease.provider, reason)
        try:
            async with self.database.transaction() as conn:
                await release_after_failure(conn, lease, retry_after=self.timing.retry_after)
                await AuditRepository(conn).record(
                    lease.principal, "refresh", provider=lease.provider, outcome="failed", detail=reason
                )
        except (SQLAlchemyError, OSError, Unavailable):
            # The lease then expires on its own.
            logger.warning("could not release the refresh lease or audit the failure", exc_info=True)
