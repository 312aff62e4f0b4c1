"""The refresh lease against the real database: one winner, conditional write-back, cool-down, takeover."""

import asyncio
from collections.abc import Callable
from datetime import timedelta

from store.crypto import TokenCipher
from store.db import Database
from store.principal import Principal
from store.token_refresh import (
    RefreshLease,
    RefreshView,
    claim_refresh,
    mark_needs_reauth_under_lease,
    read_for_refresh,
    release_after_failure,
    store_refreshed,
)
from store.vault import TokenSet, VaultRepository
from tests.support.vault import save_tokens, token_set

CIPHER = TokenCipher([b"test-lease-key-" + b"l" * 20 + b"-0123456789"])
SKEW = timedelta(minutes=1)
LEASE = timedelta(seconds=30)
DUE = timedelta(minutes=-1)  # expired a minute ago: a refresh is due


async def _claim(database: Database, owner: Principal, lease_for: timedelta = LEASE) -> RefreshLease | None:
    async with database.one_statement() as conn:
        return await claim_refresh(conn, CIPHER, owner, "demo", skew=SKEW, lease_for=lease_for)


async def _won(database: Database, owner: Principal, lease_for: timedelta = LEASE) -> RefreshLease:
    """A claim that must win the lease."""
    lease = await _claim(database, owner, lease_for)
    assert lease is not None, "the claim found the lease taken or nothing to refresh"
    return lease


async def _write_back(database: Database, lease: RefreshLease, fresh: TokenSet) -> bool:
    async with database.transaction() as conn:
        return await store_refreshed(conn, CIPHER, lease, fresh)


async def _view(database: Database, owner: Principal) -> RefreshView:
    async with database.one_statement() as conn:
        view = await read_for_refresh(conn, CIPHER, owner, "demo", skew=SKEW)
    assert view is not None, "nothing is stored for this principal"
    return view


async def _stored(database: Database, owner: Principal) -> TokenSet:
    return (await _view(database, owner)).tokens


async def test_of_many_concurrent_claims_exactly_one_wins_and_the_others_see_the_lease(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    await save_tokens(database, CIPHER, owner, token_set("due", expires_in=DUE))
    leases = await asyncio.gather(*(_claim(database, owner) for _ in range(8)))
    winners = [lease for lease in leases if lease is not None]
    assert len(winners) == 1
    assert winners[0].refresh_token == "rt-due-SECRET"
    view = await _view(database, owner)
    assert (view.due, view.valid, view.leased, view.cooling) == (True, False, True, False)


async def test_nothing_is_leased_for_a_fresh_token_one_without_refresh_token_or_a_foreign_principal(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    fresh, once, stranger = new_principal(), new_principal(), new_principal()
    await save_tokens(database, CIPHER, fresh, token_set("fresh"))
    await save_tokens(database, CIPHER, once, token_set("once", expires_in=DUE, refresh=False))
    assert await _claim(database, fresh) is None
    assert await _claim(database, once) is None
    assert await _claim(database, stranger) is None
    async with database.one_statement() as conn:
        assert await read_for_refresh(conn, CIPHER, stranger, "demo", skew=SKEW) is None
        view = await read_for_refresh(conn, CIPHER, fresh, "demo", skew=SKEW)
    assert view is not None
    assert (view.due, view.valid) == (False, True)


async def test_the_write_back_stores_the_new_tokens_releases_the_lease_and_keeps_what_the_provider_omitted(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    await save_tokens(database, CIPHER, owner, token_set("old", expires_in=DUE))
    lease = await _won(database, owner)
    renewed = TokenSet(access_token="at-new-SECRET", refresh_token=None, expires_at=None, scopes=())
    assert await _write_back(database, lease, renewed)
    stored = await _stored(database, owner)
    assert (stored.access_token, stored.refresh_token, stored.expires_at) == ("at-new-SECRET", "rt-old-SECRET", None)
    assert stored.scopes == ("read", "write")
    assert stored == lease.tokens.merged_with(renewed)
    view = await _view(database, owner)
    assert (view.leased, view.cooling) == (False, False)
    assert view.entry.info.refreshed_at is not None


async def test_a_write_back_whose_lease_expired_and_was_taken_over_stores_nothing(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    await save_tokens(database, CIPHER, owner, token_set("old", expires_in=DUE))
    slow = await _won(database, owner, lease_for=timedelta(0))  # expires at once
    quick = await _won(database, owner)
    assert await _write_back(database, quick, token_set("quick"))
    async with database.transaction() as conn:
        assert not await store_refreshed(conn, CIPHER, slow, token_set("slow"))
        assert not await mark_needs_reauth_under_lease(conn, slow)
    assert (await _stored(database, owner)).access_token == "at-quick-SECRET"


async def test_a_new_authorization_drops_the_lease_so_the_old_grants_write_back_is_ignored(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    await save_tokens(database, CIPHER, owner, token_set("old", expires_in=DUE))
    lease = await _won(database, owner)
    await save_tokens(database, CIPHER, owner, token_set("reconnected"))
    assert not await _write_back(database, lease, token_set("late"))
    assert (await _stored(database, owner)).access_token == "at-reconnected-SECRET"


async def test_a_needs_reauth_verdict_drops_the_lease_so_a_refresh_in_flight_cannot_reconnect_it(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    await save_tokens(database, CIPHER, owner, token_set("old", expires_in=DUE))
    lease = await _won(database, owner)
    async with database.one_statement() as conn:
        await VaultRepository(conn, CIPHER).mark_needs_reauth(owner, "demo")
    assert not await _write_back(database, lease, token_set("late"))
    view = await _view(database, owner)
    assert view.status == "needs_reauth"
    assert view.tokens.access_token == "at-old-SECRET"


async def test_after_a_failure_nobody_claims_the_lease_until_the_cool_down_passes(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner, other = new_principal(), new_principal()
    await save_tokens(database, CIPHER, owner, token_set("down", expires_in=DUE))
    await save_tokens(database, CIPHER, other, token_set("down-briefly", expires_in=DUE))
    lease = await _won(database, owner)
    brief = await _won(database, other)
    async with database.one_statement() as conn:
        await release_after_failure(conn, lease, retry_after=timedelta(hours=1))
    async with database.one_statement() as conn:
        await release_after_failure(conn, brief, retry_after=timedelta(0))
    view = await _view(database, owner)
    assert (view.leased, view.cooling) == (False, True)
    assert view.tokens.access_token == "at-down-SECRET"  # untouched
    assert await _claim(database, owner) is None
    assert await _claim(database, other) is not None  # no cool-down: the next caller may try again
