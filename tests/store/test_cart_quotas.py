"""cart_create's open-cart cap and idempotency keys, against the real database, under concurrency."""

import asyncio
import secrets
import uuid
from collections.abc import Callable
from datetime import timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError

from store.carts import CartRepository
from store.db import Database
from store.errors import Conflict
from store.migrations import downgrade, upgrade
from store.orders import OrderReceipt, OrderRepository
from store.principal import Principal
from tests.support.databases import create_database, drop_database
from tests.support.sql import recorded_statements

MIGRATION = "a1b2c3d40005"


async def _create(database: Database, owner: Principal, **options: object) -> str:
    async with database.transaction() as conn:
        return await CartRepository(conn).create(owner, **options)  # type: ignore[arg-type]


async def _outcome(database: Database, owner: Principal, **options: object) -> str:
    try:
        return await _create(database, owner, **options)
    except Conflict as exc:
        return f"refused: {exc}"


async def _open_carts(database: Database, owner: Principal) -> int:
    async with database.transaction() as conn:
        page = await CartRepository(conn).list(owner, limit=200)
    return sum(1 for cart in page.items if cart.status == "open")


async def test_concurrent_creates_at_the_cap_never_exceed_it_and_the_refusal_says_what_to_do(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    await _create(database, owner, max_open=3)
    await _create(database, owner, max_open=3)
    outcomes = await asyncio.gather(*(_outcome(database, owner, max_open=3) for _ in range(6)))
    made = [outcome for outcome in outcomes if outcome.startswith("cart_")]
    refused = [outcome for outcome in outcomes if outcome.startswith("refused")]
    assert (len(made), len(refused)) == (1, 5)
    assert "you already have 3 open carts, the most allowed" in refused[0]
    assert "cart_delete" in refused[0]
    assert "check out" in refused[0]
    assert await _open_carts(database, owner) == 3


async def _waiting_on_a_lock(database: Database) -> bool:
    async with database.one_statement() as conn:
        found = await conn.execute(
            text(
                "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE '%INSERT INTO cart%' AND datname = current_database())"
            )
        )
        return bool(found.scalar_one())


async def test_a_create_racing_an_uncommitted_create_for_the_last_slot_waits_for_it_and_is_refused(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    await _create(database, owner, max_open=2)
    async with database.transaction() as first:
        await CartRepository(first).create(owner, max_open=2)  # in flight: holds the last slot, uncommitted
        racer = asyncio.create_task(_outcome(database, owner, max_open=2))
        deadline = asyncio.get_running_loop().time() + 10
        while not racer.done() and not await _waiting_on_a_lock(database):
            assert asyncio.get_running_loop().time() < deadline, "the racing create neither finished nor waited"
            await asyncio.sleep(0.02)  # polling interval of the condition above, not a fixed wait
        assert not racer.done(), "the racing create went ahead without waiting for the one in flight"
    assert (await racer).startswith("refused")
    assert await _open_carts(database, owner) == 2


async def test_the_cap_counts_each_principal_separately_and_a_deleted_cart_frees_a_place(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner, other = new_principal(), new_principal()
    first = await _create(database, owner, max_open=1)
    with pytest.raises(Conflict):
        await _create(database, owner, max_open=1)
    await _create(database, other, max_open=1)
    async with database.transaction() as conn:
        assert await CartRepository(conn).delete(owner, first)
    assert (await _create(database, owner, max_open=1)).startswith("cart_")


async def test_the_same_idempotency_key_returns_the_same_cart_even_when_retried_concurrently(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    first = await _create(database, owner, idempotency_key="order-42")
    retries = await asyncio.gather(*(_create(database, owner, idempotency_key="order-42") for _ in range(4)))
    assert set(retries) == {first}
    racing = await asyncio.gather(*(_create(database, owner, idempotency_key="fresh-key") for _ in range(4)))
    assert len(set(racing)) == 1
    assert await _open_carts(database, owner) == 2


async def test_a_key_is_scoped_to_its_principal_and_no_key_always_makes_a_new_cart(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    alice, bob = new_principal(), new_principal()
    alices = await _create(database, alice, idempotency_key="k")
    bobs = await _create(database, bob, idempotency_key="k")
    assert alices != bobs
    assert await _create(database, alice) != await _create(database, alice)


async def test_a_key_past_its_ttl_or_whose_cart_was_deleted_makes_a_new_cart(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    first = await _create(database, owner, idempotency_key="k")
    # A zero TTL: the first cart was created in an earlier transaction, so its key has already expired.
    expired = await _create(database, owner, idempotency_key="k", key_ttl=timedelta(0))
    assert expired != first
    async with database.transaction() as conn:
        await CartRepository(conn).delete(owner, expired)
        await CartRepository(conn).delete(owner, first)
    assert await _create(database, owner, idempotency_key="k") not in {first, expired}


async def test_a_retried_create_at_the_cap_returns_its_cart_instead_of_refusing(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    first = await _create(database, owner, idempotency_key="k", max_open=1)
    assert await _create(database, owner, idempotency_key="k", max_open=1) == first
    with pytest.raises(Conflict):
        await _create(database, owner, idempotency_key="other", max_open=1)


async def test_a_create_is_one_statement(database: Database, new_principal: Callable[[], Principal]) -> None:
    owner = new_principal()
    with recorded_statements(database) as statements:
        async with database.autocommit() as conn:
            await CartRepository(conn).create(owner, idempotency_key="k")
    assert len(statements) == 1
    assert "INSERT INTO cart" in statements[0]


async def test_slots_freed_by_delete_are_taken_again_and_the_cap_still_holds(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    handles = [await _create(database, owner, max_open=3) for _ in range(3)]
    async with database.transaction() as conn:
        await CartRepository(conn).delete(owner, handles[1])
    await _create(database, owner, max_open=3)
    with pytest.raises(Conflict):
        await _create(database, owner, max_open=3)
    assert await _open_carts(database, owner) == 3
    # Raising the cap frees more slots at once; lowering it below what is open refuses new carts only.
    assert (await _create(database, owner, max_open=4)).startswith("cart_")
    with pytest.raises(Conflict):
        await _create(database, owner, max_open=2)


async def test_checked_out_carts_do_not_count_toward_the_open_cart_cap(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    handle = await _create(database, owner, max_open=1)
    async with database.transaction() as conn:
        await CartRepository(conn).set_item(owner, handle, "hat-beanie", 1)
    async with database.transaction() as conn:
        orders = OrderRepository(conn)
        placed = await orders.place(owner, await orders.quote(owner, handle), nonce=secrets.token_urlsafe(16))
    assert isinstance(placed, OrderReceipt)
    assert (await _create(database, owner, max_open=1)).startswith("cart_")


def test_the_migration_gives_existing_open_carts_their_slots_oldest_first(admin_database_url: str) -> None:
    name = f"coatcheck_slots_{uuid.uuid4().hex[:10]}"
    asyncio.run(create_database(admin_database_url, name))
    url = make_url(admin_database_url).set(database=name).render_as_string(hide_password=False)

    async def fill_and_read(before: bool) -> list[tuple[str, str, int | None]]:
        db = Database.connect(url)
        try:
            async with db.transaction() as conn:
                if before:
                    await conn.execute(
                        text(
                            "INSERT INTO cart (handle, principal_iss, principal_sub, status, created_at) "
                            "VALUES ('cart_a', 'i', 'alice', 'open', now() - interval '3 s'), "
                            "('cart_b', 'i', 'alice', 'checked_out', now() - interval '2 s'), "
                            "('cart_c', 'i', 'alice', 'open', now() - interval '1 s'), "
                            "('cart_d', 'i', 'bob', 'open', now())"
                        )
                    )
                    return []
                rows = await conn.execute(text("SELECT handle, status, open_slot FROM cart ORDER BY handle"))
                return [(handle, status, slot) for handle, status, slot in rows]
        finally:
            await db.dispose()

    try:
        upgrade(url, f"{MIGRATION}-1")
        asyncio.run(fill_and_read(before=True))
        upgrade(url)
        assert asyncio.run(fill_and_read(before=False)) == [
            ("cart_a", "open", 1),
            ("cart_b", "checked_out", None),
            ("cart_c", "open", 2),
            ("cart_d", "open", 1),
        ]
    finally:
        asyncio.run(drop_database(admin_database_url, name))


def test_open_carts_an_older_replica_left_without_a_slot_take_free_slots_and_count_against_the_cap(
    admin_database_url: str,
) -> None:
    name = f"coatcheck_slots_{uuid.uuid4().hex[:10]}"
    asyncio.run(create_database(admin_database_url, name))
    url = make_url(admin_database_url).set(database=name).render_as_string(hide_password=False)
    alice = Principal("i", "alice")
    # As a1b2c3d40005's code wrote them (cart_c's slot 2 was freed by its checkout), and as the code before it
    # went on writing them during that rollout: no slot.
    slotted = (
        "INSERT INTO cart (handle, principal_iss, principal_sub, status, open_slot, created_at) "
        "VALUES ('cart_a', 'i', 'alice', 'open', 1, now() - interval '6 s'), "
        "('cart_b', 'i', 'alice', 'open', 3, now() - interval '5 s'), "
        "('cart_c', 'i', 'alice', 'checked_out', 2, now() - interval '4 s')"
    )
    slotless = (
        "INSERT INTO cart (handle, principal_iss, principal_sub, status, created_at) "
        "VALUES ('cart_d', 'i', 'alice', 'open', now() - interval '3 s'), "
        "('cart_e', 'i', 'alice', 'open', now() - interval '2 s'), "
        "('cart_f', 'i', 'alice', 'checked_out', now() - interval '1 s'), "
        "('cart_g', 'i', 'bob', 'open', now())"
    )

    async def run(*statements: str) -> list[tuple[str, str, int | None]]:
        db = Database.connect(url)
        try:
            async with db.transaction() as conn:
                for statement in statements:
                    await conn.execute(text(statement))
                rows = await conn.execute(text("SELECT handle, status, open_slot FROM cart ORDER BY handle"))
                return [(handle, status, slot) for handle, status, slot in rows]
        finally:
            await db.dispose()

    async def outcome(max_open: int) -> str:
        db = Database.connect(url)
        try:
            return await _outcome(db, alice, max_open=max_open)
        finally:
            await db.dispose()

    try:
        upgrade(url, MIGRATION)
        asyncio.run(run(slotted, slotless))
        upgrade(url)
        assert (asyncio.run(outcome(max_open=4))).startswith("refused: you already have 4 open carts")
        assert asyncio.run(run()) == [
            ("cart_a", "open", 1),
            ("cart_b", "open", 3),
            ("cart_c", "checked_out", 2),
            ("cart_d", "open", 2),
            ("cart_e", "open", 4),
            ("cart_f", "checked_out", None),
            ("cart_g", "open", 1),
        ]
        assert (asyncio.run(outcome(max_open=5))).startswith("cart_")
        with pytest.raises(IntegrityError, match="ck_cart_open_holds_slot"):
            asyncio.run(run("INSERT INTO cart (handle, principal_iss, principal_sub) VALUES ('cart_h', 'i', 'carol')"))
        downgrade(url, MIGRATION)
        assert ("cart_h", "open", None) in asyncio.run(
            run("INSERT INTO cart (handle, principal_iss, principal_sub) VALUES ('cart_h', 'i', 'carol')")
        )
    finally:
        asyncio.run(drop_database(admin_database_url, name))
