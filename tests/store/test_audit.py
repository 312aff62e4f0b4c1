"""The audit trail: per-principal entries, newest first, codes only, no secrets."""

from collections.abc import Callable

import pytest

from store.audit import AuditRepository, identity_digest
from store.db import Database
from store.principal import Principal


async def test_entries_are_listed_per_principal_newest_first(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    alice, bob = new_principal(), new_principal()
    async with database.transaction() as conn:
        audit = AuditRepository(conn)
        await audit.record(alice, "connect", provider="demo", outcome="ok")
        await audit.record(bob, "connect_denied", provider="demo", outcome="denied", detail="access_denied")
        await audit.record(alice, "disconnect", provider="demo", outcome="ok")
    async with database.transaction() as conn:
        audit = AuditRepository(conn)
        alices = await audit.list(alice)
        bobs = await audit.list(bob)
        newest = await audit.list(alice, limit=1)
    assert [(e.action, e.provider, e.outcome, e.detail) for e in alices] == [
        ("disconnect", "demo", "ok", None),
        ("connect", "demo", "ok", None),
    ]
    assert [(e.action, e.outcome, e.detail) for e in bobs] == [("connect_denied", "denied", "access_denied")]
    assert [e.action for e in newest] == ["disconnect"]
    assert alices[0].created_at >= alices[1].created_at


async def test_a_subject_mismatch_is_recorded_for_the_flow_owner_naming_the_other_party_by_digest(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner, intruder = new_principal(), new_principal()
    async with database.transaction() as conn:
        await AuditRepository(conn).record(
            owner, "subject_mismatch", provider="demo", outcome="denied", detail=f"other={identity_digest(intruder)}"
        )
    async with database.transaction() as conn:
        (entry,) = await AuditRepository(conn).list(owner)
        assert await AuditRepository(conn).list(intruder) == []
    assert entry.detail is not None
    assert intruder.subject not in entry.detail
    assert len(identity_digest(intruder)) == 12
    assert identity_digest(intruder) != identity_digest(owner)


async def test_an_event_without_a_principal_is_recorded_and_listed_for_nobody(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    async with database.transaction() as conn:
        await AuditRepository(conn).record(None, "callback", provider=None, outcome="unknown_state")
        assert await AuditRepository(conn).list(new_principal()) == []


async def test_codes_must_be_lower_case_and_detail_is_cut_to_200_characters(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    async with database.transaction() as conn:
        audit = AuditRepository(conn)
        for action, outcome in (("Connect", "ok"), ("connect", "OK"), ("connect", ""), ("x" * 33, "ok")):
            with pytest.raises(ValueError, match="lower-case codes"):
                await audit.record(owner, action, provider="demo", outcome=outcome)
        await audit.record(owner, "refresh", provider="demo", outcome="failed", detail="e" * 500)
        (entry,) = await audit.list(owner)
    assert entry.detail == "e" * 200
