"""The refresh lease: one refresher per stored token across instances, with no lock held during the refresh.

A refresh calls the provider's token endpoint, which may take seconds (or never answer). Nothing
here spans that call: every function is one short statement on the caller's connection.

1. :func:`read_for_refresh` reads the tokens and the lease state (one query, no lock).
2. :func:`claim_refresh` takes the lease with a compare-and-swap ``UPDATE``: it succeeds only
   while the token is still due for refresh, the connection is ``connected``, has a refresh
   token and no live lease. The winner gets a random lease id and the tokens to refresh with;
   everybody else gets ``None`` and polls (1.) until the winner's write-back lands.
3. The caller commits, calls the provider *outside any transaction*, then writes the outcome
   back conditionally on its lease: :func:`store_refreshed`, :func:`mark_needs_reauth_under_lease`
   or :func:`release_after_failure`. A write-back whose lease was taken over (it outlived
   ``lease_for``) or dropped (a new authorization replaced the connection) changes nothing.

A lease that is never written back (the process died) simply expires. After a failure the
lease is released with a cool-down: until ``retry_after`` passes, nobody calls the provider
again for this token, so an outage costs one attempt per cool-down, not one per caller.
"""

import secrets
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy import Interval, and_, bindparam, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from store.crypto import TokenCipher
from store.principal import Principal
from store.vault import (
    FULL_COLUMNS,
    OWNED_ENTRY,
    VAULT_TABLE,
    OpenedVaultEntry,
    TokenSet,
    open_tokens,
    seal_tokens,
    vault_params,
)

__all__ = [
    "RefreshLease",
    "RefreshView",
    "claim_refresh",
    "mark_needs_reauth_under_lease",
    "read_for_refresh",
    "release_after_failure",
    "store_refreshed",
]

_t = VAULT_TABLE
_LEASE_FREE = or_(_t.c.refresh_lease_until.is_(None), _t.c.refresh_lease_until <= func.now())
_LEASED = and_(_t.c.refresh_lease_id.is_not(None), _t.c.refresh_lease_until > func.now())
_COOLING = and_(_t.c.refresh_lease_id.is_(None), _t.c.refresh_lease_until > func.now())

# Due and valid on the database clock, the same clock the claim decides by (an instance whose clock runs
# ahead must not see a token as due that the claim then refuses, over and over).
_DUE = _t.c.expires_at <= func.now() + bindparam("p_skew", type_=Interval())
_VALID = or_(_t.c.expires_at.is_(None), _t.c.expires_at > func.now())
_VIEW = select(
    *FULL_COLUMNS, _DUE.label("due"), _VALID.label("valid"), _LEASED.label("leased"), _COOLING.label("cooling")
).where(OWNED_ENTRY)
_CLAIM = (
    update(_t)
    .where(
        OWNED_ENTRY,
        _t.c.status == "connected",
        _t.c.refresh_token_enc.is_not(None),
        _DUE,
        _LEASE_FREE,
    )
    .values(
        refresh_lease_id=bindparam("p_lease"),
        refresh_lease_until=func.now() + bindparam("p_lease_for", type_=Interval()),
    )
    .returning(*FULL_COLUMNS)
)
_UNDER_LEASE = and_(_t.c.id == bindparam("p_id"), _t.c.refresh_lease_id == bindparam("p_lease"))
_REAUTH = (
    update(_t)
    .where(_UNDER_LEASE)
    .values(status="needs_reauth", refresh_lease_id=None, refresh_lease_until=None, updated_at=func.now())
    .returning(_t.c.id)
)
_RELEASE_FAILED = (
    update(_t)
    .where(_UNDER_LEASE)
    .values(refresh_lease_id=None, refresh_lease_until=func.now() + bindparam("p_retry_after", type_=Interval()))
)


@dataclass(frozen=True, slots=True)
class RefreshView:
    """A vault entry as a refresher sees it: its tokens, and whether someone else is refreshing them."""

    entry: OpenedVaultEntry
    due: bool  # the access token expires within the skew (never, without an expiry)
    valid: bool  # the access token has not expired yet
    leased: bool  # another caller holds a live lease: its result is on the way
    cooling: bool  # the last refresh failed and its cool-down has not passed yet

    @property
    def tokens(self) -> TokenSet:
        return self.entry.tokens

    @property
    def status(self) -> str:
        return self.entry.info.status


@dataclass(frozen=True, slots=True)
class RefreshLease:
    """The right to refresh one connection's tokens, until its lease expires."""

    principal: Principal
    provider: str
    row_id: int = field(repr=False)
    lease_id: str = field(repr=False)
    tokens: TokenSet  # as stored when the lease was claimed
    refresh_token: str = field(repr=False)  # the one to redeem (the claim leases only rows that have one)


async def read_for_refresh(
    conn: AsyncConnection, cipher: TokenCipher, principal: Principal, provider: str, *, skew: timedelta
) -> RefreshView | None:
    """The connection with its tokens, whether they are due (within ``skew``) and the lease state, or ``None``.

    Every flag is computed on the database clock, like :func:`claim_refresh`. One query, no lock.

    Raises:
        DecryptError: a stored token does not open with the key ring.
    """
    params = {**vault_params(principal, provider), "p_skew": skew}
    row = (await conn.execute(_VIEW, params)).mappings().one_or_none()
    if row is None:
        return None
    # NULL (no expiry, no lease) reads as False.
    return RefreshView(
        entry=open_tokens(cipher, principal, row),
        due=bool(row["due"]),
        valid=bool(row["valid"]),
        leased=bool(row["leased"]),
        cooling=bool(row["cooling"]),
    )


async def claim_refresh(
    conn: AsyncConnection,
    cipher: TokenCipher,
    principal: Principal,
    provider: str,
    *,
    skew: timedelta,
    lease_for: timedelta,
) -> RefreshLease | None:
    """Take the refresh lease for ``lease_for`` if the token is due and nobody holds it. One statement.

    ``None`` when someone else holds the lease, a refresh failed within its cool-down, the token
    was refreshed meanwhile (it no longer expires within ``skew``), or there is nothing to
    refresh. Run it as its own (autocommit) statement: the row lock of the ``UPDATE`` lasts only
    that long.

    Raises:
        DecryptError: a stored token does not open with the key ring (the lease is then taken;
            it expires after ``lease_for``).
    """
    lease_id = secrets.token_hex(16)
    params = {**vault_params(principal, provider), "p_skew": skew, "p_lease": lease_id, "p_lease_for": lease_for}
    row = (await conn.execute(_CLAIM, params)).mappings().one_or_none()
    if row is None:
        return None
    stored = open_tokens(cipher, principal, row)
    refresh_token = stored.tokens.refresh_token
    if refresh_token is None:  # excluded by the WHERE clause; keeps the type honest
        return None
    return RefreshLease(
        principal=principal,
        provider=provider,
        row_id=stored.row_id,
        lease_id=lease_id,
        tokens=stored.tokens,
        refresh_token=refresh_token,
    )


async def store_refreshed(conn: AsyncConnection, cipher: TokenCipher, lease: RefreshLease, fresh: TokenSet) -> bool:
    """Write refreshed tokens and release the lease, if the lease is still ours. One statement.

    A ``refresh_token`` of ``None`` keeps the stored one and empty ``scopes`` keep the stored
    scopes (:meth:`TokenSet.merged_with`). Returns ``False``, storing nothing, when the lease was
    lost meanwhile.
    """
    sealed = seal_tokens(cipher, lease.row_id, lease.principal, lease.provider, fresh)
    values: dict[str, Any] = {
        "status": "connected",
        "access_token_enc": sealed["p_access"],
        "token_type": fresh.token_type,
        "expires_at": fresh.expires_at,
        "refreshed_at": func.now(),
        "updated_at": func.now(),
        "refresh_lease_id": None,
        "refresh_lease_until": None,
    }
    if fresh.refresh_token is not None:
        values["refresh_token_enc"] = sealed["p_refresh"]
    if fresh.scopes:
        values["scopes"] = list(fresh.scopes)
    stmt = update(_t).where(_UNDER_LEASE).values(values).returning(_t.c.id)
    params = {"p_id": lease.row_id, "p_lease": lease.lease_id}
    return (await conn.execute(stmt, params)).scalar_one_or_none() is not None


async def mark_needs_reauth_under_lease(conn: AsyncConnection, lease: RefreshLease) -> bool:
    """The provider refused the grant: flag the connection ``needs_reauth`` and release the lease. One statement.

    Returns ``False``, changing nothing, when the lease was lost meanwhile (a new authorization
    may have replaced the refused grant).
    """
    params = {"p_id": lease.row_id, "p_lease": lease.lease_id}
    return (await conn.execute(_REAUTH, params)).scalar_one_or_none() is not None


async def release_after_failure(conn: AsyncConnection, lease: RefreshLease, *, retry_after: timedelta) -> None:
    """The refresh failed: release the lease; nobody calls the provider again for ``retry_after``. One statement."""
    params = {"p_id": lease.row_id, "p_lease": lease.lease_id, "p_retry_after": retry_after}
    await conn.execute(_RELEASE_FAILED, params)
