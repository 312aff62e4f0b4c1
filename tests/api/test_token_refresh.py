"""The token refresher against the real database: one refresher, waiters that hold no connection, bounded waits.

``refresh`` stands in for the provider's token endpoint (a coroutine the test controls); the database and the
lease are real. The disconnect-during-refresh test at the end uses the real dev IdP. The end-to-end version with
the real dev IdP and two server processes is tests/browser/test_refresh_storm.py.
"""

import asyncio
import json
import logging
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx2
import pytest
from sqlalchemy import text

from api.oauth.client import OAuthFailure
from api.oauth.providers import ProviderRegistry
from api.oauth.refresh import RefreshTiming, TokenRefresher
from api.oauth.service import Connections
from api.provider_config import parse_providers
from store.audit import AuditRepository
from store.crypto import DecryptError, TokenCipher
from store.db import Database
from store.errors import InvalidGrant
from store.principal import Principal
from store.token_refresh import claim_refresh
from store.vault import TokenSet, VaultRepository
from tests.support.devidp import DEMO_CLIENT_ID, DevIdP, demo_provider_config
from tests.support.oauth import demo_provider_tokens, token_request
from tests.support.sql import recorded_statements
from tests.support.vault import save_tokens, stored_tokens, token_set
from tests.support.waiting import eventually

KEY = b"test-refresh-key-" + b"r" * 20 + b"-0123456789"
OTHER = b"other-refresh-key-" + b"o" * 20 + b"-ABCDEFGHIJ"
CIPHER = TokenCipher([KEY])
SKEW = timedelta(minutes=1)


def _refresher(database: Database, **timing: float) -> TokenRefresher:
    return TokenRefresher(database, CIPHER, skew=SKEW, timing=RefreshTiming(**timing))


async def _audit(database: Database, owner: Principal) -> list[tuple[str, str, str | None]]:
    async with database.one_statement() as conn:
        entries = await AuditRepository(conn).list(owner)
    return [(e.action, e.outcome, e.detail) for e in reversed(entries)]


async def _never(_: str) -> TokenSet:
    raise AssertionError("the provider must not be called")


_HELD = text(
    "SELECT count(*) FILTER (WHERE state LIKE 'idle in transaction%') AS idle_in_tx, "
    "count(*) FILTER (WHERE cardinality(pg_blocking_pids(pid)) > 0) AS blocked "
    "FROM pg_stat_activity WHERE datname = current_database()"
)


async def test_a_fresh_token_costs_one_unlocked_read_and_no_refresh(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    tokens = token_set("fresh")
    await save_tokens(database, CIPHER, owner, tokens)
    with recorded_statements(database) as statements:
        assert await _refresher(database).usable_tokens(owner, "demo", _never) == tokens
    assert len(statements) == 1
    assert "FOR UPDATE" not in statements[0]
    never_expiring = token_set("forever", expires_in=None)
    await save_tokens(database, CIPHER, owner, never_expiring)
    assert await _refresher(database).usable_tokens(owner, "demo", _never) == never_expiring


async def test_no_connection_means_no_tokens(database: Database, new_principal: Callable[[], Principal]) -> None:
    assert await _refresher(database).usable_tokens(new_principal(), "demo", _never) is None


async def test_concurrent_callers_refresh_once_and_nobody_holds_a_transaction_or_waits_on_a_lock_meanwhile(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    """Six callers, as six instances would be: one refreshes while five poll; all get the new token."""
    owner = new_principal()
    await save_tokens(database, CIPHER, owner, token_set("expired", expires_in=timedelta(minutes=-5)))
    callers = 6
    calls: list[str] = []
    statements: list[str] = []
    seen_during_refresh: list[tuple[int, int]] = []

    async def refresh(refresh_token: str) -> TokenSet:
        calls.append(refresh_token)

        # Hold the provider call until every other caller has polled the row at least twice: they are waiting.
        async def everyone_polled_twice() -> bool:
            reads = sum("refresh_lease_until" in s and s.lstrip().startswith("SELECT") for s in statements)
            return reads >= 2 * callers

        await eventually(everyone_polled_twice, within=10, what="the other callers polling the lease", interval=0.01)
        async with database.one_statement() as conn:
            row = (await conn.execute(_HELD)).one()
        seen_during_refresh.append((int(row.idle_in_tx), int(row.blocked)))
        return TokenSet(access_token="at-renewed-SECRET", refresh_token=None, expires_at=None, scopes=())

    refresher = _refresher(database)
    with recorded_statements(database) as recorded:
        statements = recorded
        async with asyncio.timeout(20):
            results = await asyncio.gather(*(refresher.usable_tokens(owner, "demo", refresh) for _ in range(callers)))
    assert calls == ["rt-expired-SECRET"]
    assert seen_during_refresh == [(0, 0)], "a transaction was held open or a caller waited on a row lock"
    assert {r.access_token if r else None for r in results} == {"at-renewed-SECRET"}
    assert {r.refresh_token if r else None for r in results} == {"rt-expired-SECRET"}
    assert await _audit(database, owner) == [("refresh", "ok", None)]


async def test_a_caller_whose_token_is_still_valid_uses_it_while_another_refreshes(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    due = token_set("due", expires_in=timedelta(seconds=30))  # inside the skew, not yet expired
    await save_tokens(database, CIPHER, owner, due)
    async with database.one_statement() as conn:
        assert await claim_refresh(conn, CIPHER, owner, "demo", skew=SKEW, lease_for=timedelta(minutes=1))
    async with asyncio.timeout(5):
        assert await _refresher(database).usable_tokens(owner, "demo", _never) == due


async def test_a_caller_gives_up_after_the_bounded_wait_when_the_refresher_never_writes_back(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    await save_tokens(database, CIPHER, owner, token_set("stuck", expires_in=timedelta(minutes=-1)))
    async with database.one_statement() as conn:  # a refresher that died mid-call: its lease just runs out
        assert await claim_refresh(conn, CIPHER, owner, "demo", skew=SKEW, lease_for=timedelta(minutes=1))
    async with asyncio.timeout(5):
        with pytest.raises(OAuthFailure) as caught:
            await _refresher(database, wait=0.3).usable_tokens(owner, "demo", _never)
    assert caught.value.error == "refresh_in_progress"


async def test_invalid_grant_marks_the_connection_for_reauthorisation_and_returns_no_token(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    await save_tokens(database, CIPHER, owner, token_set("revoked", expires_in=timedelta(seconds=10)))
    calls = 0

    async def refresh(_: str) -> TokenSet:
        nonlocal calls
        calls += 1
        raise InvalidGrant("invalid_grant")

    refresher = _refresher(database)
    assert await refresher.usable_tokens(owner, "demo", refresh) is None
    assert await refresher.usable_tokens(owner, "demo", refresh) is None
    assert calls == 1
    async with database.one_statement() as conn:
        info = await VaultRepository(conn, CIPHER).info(owner, "demo")
    assert info is not None
    assert info.status == "needs_reauth"
    assert await _audit(database, owner) == [("refresh", "invalid_grant", None)]


async def test_a_failed_refresh_leaves_the_tokens_untouched_is_audited_and_others_do_not_retry_until_the_cool_down(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    tokens = token_set("kept", expires_in=timedelta(minutes=-1))
    await save_tokens(database, CIPHER, owner, tokens)

    class ProviderDownError(Exception):
        pass

    calls = 0

    async def refresh(refresh_token: str) -> TokenSet:
        nonlocal calls
        calls += 1
        raise ProviderDownError(f"upstream said no to {refresh_token}")

    refresher = _refresher(database, retry_after=3600)
    with pytest.raises(ProviderDownError):
        await refresher.usable_tokens(owner, "demo", refresh)
    with pytest.raises(OAuthFailure) as caught:
        await refresher.usable_tokens(owner, "demo", refresh)
    assert caught.value.error == "refresh_failed_recently"
    assert calls == 1
    assert await stored_tokens(database, CIPHER, owner) == tokens
    assert await _audit(database, owner) == [("refresh", "failed", "ProviderDownError")]


async def test_a_provider_slower_than_the_refresh_timeout_is_abandoned_and_audited(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    await save_tokens(database, CIPHER, owner, token_set("slow", expires_in=timedelta(minutes=-1)))

    async def hangs(_: str) -> TokenSet:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async with asyncio.timeout(5):
        with pytest.raises(OAuthFailure) as caught:
            await _refresher(database, timeout=0.2).usable_tokens(owner, "demo", hangs)
    assert caught.value.error == "refresh_timeout"
    assert await _audit(database, owner) == [("refresh", "failed", "timeout")]


async def test_an_expired_token_without_a_refresh_token_needs_reauthorisation(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    await save_tokens(database, CIPHER, owner, token_set("once", expires_in=timedelta(minutes=-1), refresh=False))
    assert await _refresher(database).usable_tokens(owner, "demo", _never) is None
    async with database.one_statement() as conn:
        info = await VaultRepository(conn, CIPHER).info(owner, "demo")
    assert info is not None
    assert info.status == "needs_reauth"


async def test_no_token_value_appears_in_reprs_errors_or_logs(
    database: Database, new_principal: Callable[[], Principal], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    owner = new_principal()
    tokens = token_set("leak", expires_in=timedelta(minutes=-1))
    await save_tokens(database, CIPHER, owner, tokens)

    async def failing(refresh_token: str) -> TokenSet:
        raise RuntimeError(f"boom {refresh_token}"[:4])

    async def refused(refresh_token: str) -> TokenSet:
        raise InvalidGrant("invalid_grant")

    refresher = _refresher(database, retry_after=0)
    with pytest.raises(RuntimeError):
        await refresher.usable_tokens(owner, "demo", failing)
    async with database.one_statement() as conn:
        stored = await VaultRepository(conn, CIPHER).read(owner, "demo")
    assert await refresher.usable_tokens(owner, "demo", refused) is None
    with pytest.raises(DecryptError) as caught:
        await stored_tokens(database, TokenCipher([OTHER]), owner)
    shown = " ".join([repr(tokens), repr(stored), str(tokens), str(caught.value), caplog.text])
    for secret in ("at-leak-SECRET", "rt-leak-SECRET", KEY.decode()):
        assert secret not in shown
    assert any(record.name.startswith("api.oauth.refresh") for record in caplog.records)


async def test_a_refresh_overtaken_by_a_new_authorization_answers_with_the_new_tokens_and_revokes_nothing(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    await save_tokens(database, CIPHER, owner, token_set("old", expires_in=timedelta(minutes=-1)))
    reconnected = token_set("reconnected")
    discarded: list[TokenSet] = []

    async def refresh(_: str) -> TokenSet:
        # The user authorised again meanwhile: the lease is dropped.
        await save_tokens(database, CIPHER, owner, reconnected)
        return token_set("refreshed")

    async def discard(tokens: TokenSet) -> str:
        discarded.append(tokens)
        return "revoked"

    assert await _refresher(database).usable_tokens(owner, "demo", refresh, discard) == reconnected
    assert await stored_tokens(database, CIPHER, owner) == reconnected
    assert discarded == []
    assert await _audit(database, owner) == [("refresh", "lease_lost", "superseded")]


# --- against the real dev IdP: a disconnect while a refresh is in flight ----------------------------------------


class HoldsRefreshAnswers(httpx2.AsyncBaseTransport):
    """The real HTTP transport, except that the dev IdP's answer to a refresh grant is held back until released.

    The answer is the provider's own (the refresh really happened upstream); holding it opens the window in which
    the connection is disconnected after the provider issued new tokens and before they are written back.
    """

    def __init__(self) -> None:
        self._real = httpx2.AsyncHTTPTransport()
        self.answered = asyncio.Event()
        self.release = asyncio.Event()
        self.issued: dict[str, Any] = {}

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._real.handle_async_request(request)
        if request.method == "POST" and b"grant_type=refresh_token" in await request.aread():
            self.issued = json.loads(await response.aread())
            self.answered.set()
            await self.release.wait()
        return response

    async def aclose(self) -> None:
        await self._real.aclose()


def _introspect(devidp: DevIdP, token: str, secret: str) -> dict[str, Any]:
    endpoint = httpx2.get(f"{devidp.issuer}/.well-known/openid-configuration", timeout=10.0).json()[
        "introspection_endpoint"
    ]
    response = httpx2.post(endpoint, data={"token": token}, auth=(DEMO_CLIENT_ID, secret), timeout=10.0)
    assert response.status_code == 200, response.text
    return dict(response.json())


async def test_a_refresh_in_flight_at_disconnect_returns_nothing_stores_nothing_and_revokes_the_new_tokens(
    database: Database, devidp: DevIdP, public_url: str, oauth_client_secrets: dict[str, str]
) -> None:
    secret = oauth_client_secrets[DEMO_CLIENT_ID]
    owner = Principal(devidp.issuer, f"leaving-{uuid.uuid4().hex[:8]}")
    issued = await asyncio.to_thread(demo_provider_tokens, devidp, public_url, secret, owner.subject)
    await save_tokens(
        database,
        CIPHER,
        owner,
        TokenSet(
            access_token=issued["access_token"],
            refresh_token=issued["refresh_token"],
            expires_at=datetime.now(UTC) - timedelta(minutes=1),  # expired: the next use refreshes
            scopes=("openid", "profile", "email"),
        ),
    )
    (provider,) = parse_providers(json.loads(demo_provider_config(devidp.issuer)), {"DEMO_CLIENT_SECRET": secret})
    transport = HoldsRefreshAnswers()
    async with httpx2.AsyncClient(timeout=10.0) as http:
        connections = Connections(
            database=database,
            cipher=CIPHER,
            registry=ProviderRegistry(providers=(provider,), http=http),
            http=http,
            public_url=public_url,
            flow_ttl=timedelta(minutes=5),
            wait_seconds=0,
            refresh_skew=SKEW,
            transport=transport,
        )
        async with asyncio.timeout(30):
            in_flight = asyncio.create_task(connections.usable_tokens(owner, provider))
            answered = asyncio.create_task(transport.answered.wait())
            await asyncio.wait({in_flight, answered}, return_when=asyncio.FIRST_COMPLETED)
            assert transport.answered.is_set(), f"the refresh never reached the provider: {in_flight.result()!r}"
            revocations = (await devidp.stats())["revocations"]
            disconnected = await connections.disconnect(owner, provider)
            transport.release.set()
            result = await in_flight
        await transport.aclose()

    fresh_access, fresh_refresh = transport.issued["access_token"], transport.issued.get("refresh_token")
    assert fresh_access != issued["access_token"]
    assert disconnected.was_connected
    assert disconnected.revocation == "revoked"
    assert result is None, "the tool call got tokens for a connection that was just disconnected"
    assert await stored_tokens(database, CIPHER, owner) is None
    # Upstream: besides the disconnect's two revocations, the refresher revoked what it was given.
    assert (await devidp.stats())["revocations"] == revocations + 2 + (2 if fresh_refresh else 1)
    assert (await asyncio.to_thread(_introspect, devidp, fresh_access, secret))["active"] is False
    if fresh_refresh is not None:
        refused = await asyncio.to_thread(
            token_request,
            devidp,
            {"grant_type": "refresh_token", "refresh_token": fresh_refresh},
            (DEMO_CLIENT_ID, secret),
        )
        assert refused.status_code == 400
        assert refused.json()["error"] == "invalid_grant"
    assert await _audit(database, owner) == [
        ("disconnect", "revoked", None),
        ("refresh", "lease_lost", "disconnected; revoked"),
    ]
