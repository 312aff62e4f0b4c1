"""Writes in one statement (cart_set_item, the checkout placement): counts, the line cap, and races.

Each write runs the way the tools run it (``Database.autocommit``), so a statement here is a round trip.
"""

import asyncio
import uuid
from collections.abc import Callable

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from store.carts import CartRepository
from store.catalog import ProductRow, upsert_products
from store.db import Database
from store.errors import Conflict, InvalidInput, NotFound
from store.orders import CheckoutQuote, OrderRepository
from store.principal import Principal
from tests.support.mrtr import eventually
from tests.support.sql import recorded_statements


async def _products(database: Database, count: int, currency: str = "USD") -> list[str]:
    """``count`` fresh products (their skus sort after the demo catalog's)."""
    tag = uuid.uuid4().hex[:8]
    rows = [ProductRow(f"zz-{tag}-{n:03d}", f"Test product {n}", 100 + n, currency) for n in range(count)]
    async with database.transaction() as conn:
        await upsert_products(conn, rows)
    return [row.sku for row in rows]


async def _new_cart(database: Database, owner: Principal) -> str:
    async with database.autocommit() as conn:
        return await CartRepository(conn).create(owner)


async def _set(database: Database, owner: Principal, handle: str, sku: str, quantity: int, **kw: int) -> object:
    async with database.autocommit() as conn:
        return await CartRepository(conn).set_item(owner, handle, sku, quantity, **kw)


async def test_set_item_is_one_statement_and_a_refused_one_costs_one_more_to_explain(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    handle = await _new_cart(database, owner)
    await _set(database, owner, handle, "hat-beanie", 1)
    for sku, quantity in (("scarf-cashmere", 2), ("hat-beanie", 3), ("hat-beanie", 0)):
        with recorded_statements(database) as statements:
            async with database.autocommit() as conn:
                cart = await CartRepository(conn).set_item(owner, handle, sku, quantity)
        assert len(statements) == 1, statements
        assert statements[0].lstrip().startswith("WITH args AS")
    assert (cart.version, [(i.sku, i.quantity) for i in cart.items]) == (5, [("scarf-cashmere", 2)])

    with recorded_statements(database) as statements, pytest.raises(Conflict, match="version 5, not 2"):
        await _set(database, owner, handle, "hat-beanie", 1, expected_version=2)
    assert len(statements) == 2


async def test_create_and_delete_are_one_statement_each(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    with recorded_statements(database) as created:
        handle = await _new_cart(database, owner)
    with recorded_statements(database) as deleted:
        async with database.one_statement() as conn:
            await CartRepository(conn).delete(owner, handle)
    assert len(created) == 1  # the capped, idempotent insert is one statement of CTEs
    assert "INSERT INTO cart" in created[0]
    assert [s.lstrip().split()[0] for s in deleted] == ["DELETE"]
    with pytest.raises(NotFound):
        async with database.one_statement() as conn:
            await CartRepository(conn).view(owner, handle)


async def test_the_reply_is_the_cart_after_the_write_with_lines_in_sku_order_and_totals(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    handle = await _new_cart(database, owner)
    await _set(database, owner, handle, "scarf-cashmere", 1)
    await _set(database, owner, handle, "brush-lint", 2)
    async with database.autocommit() as conn:
        written = await CartRepository(conn).set_item(owner, handle, "hat-beanie", 1)
        viewed = await CartRepository(conn).view(owner, handle)
    assert written == viewed
    assert [i.sku for i in written.items] == ["brush-lint", "hat-beanie", "scarf-cashmere"]
    assert (written.total_cents, written.currency, written.version) == (2 * 700 + 1800 + 6500, "USD", 4)
    async with database.autocommit() as conn:
        emptied = await CartRepository(conn).set_item(owner, handle, "hat-beanie", 0)
        for sku in ("brush-lint", "scarf-cashmere"):
            emptied = await CartRepository(conn).set_item(owner, handle, sku, 0)
    assert (emptied.items, emptied.total_cents, emptied.currency, emptied.version) == ([], 0, None, 7)


async def test_a_new_line_beyond_the_cap_is_refused_saying_what_to_do_but_existing_lines_still_change(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    handle = await _new_cart(database, owner)
    first, second, third = await _products(database, 3)
    await _set(database, owner, handle, first, 1, max_lines=2)
    await _set(database, owner, handle, second, 1, max_lines=2)
    with pytest.raises(InvalidInput, match=r"already has 2 lines, the most a cart may hold \(2\); remove a line"):
        await _set(database, owner, handle, third, 1, max_lines=2)
    changed = await _set(database, owner, handle, second, 5, max_lines=2)
    assert [(i.sku, i.quantity) for i in changed.items] == [(first, 1), (second, 5)]  # type: ignore[attr-defined]
    await _set(database, owner, handle, first, 0, max_lines=2)
    after = await _set(database, owner, handle, third, 1, max_lines=2)
    assert [i.sku for i in after.items] == [second, third]  # type: ignore[attr-defined]


async def test_a_product_in_another_currency_is_refused_and_changes_nothing(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    handle = await _new_cart(database, owner)
    [euro] = await _products(database, 1, currency="EUR")
    await _set(database, owner, handle, "hat-beanie", 1)
    with pytest.raises(InvalidInput, match="priced in another currency than the items already in this cart"):
        await _set(database, owner, handle, euro, 1)
    async with database.one_statement() as conn:
        cart = await CartRepository(conn).view(owner, handle)
    assert (cart.version, [i.sku for i in cart.items]) == (2, ["hat-beanie"])


async def test_concurrent_writers_of_different_lines_lose_no_write_and_each_reply_is_a_real_state(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    handle = await _new_cart(database, owner)
    skus = await _products(database, 12)
    replies = await asyncio.gather(*(_set(database, owner, handle, sku, 2) for sku in skus))
    async with database.one_statement() as conn:
        cart = await CartRepository(conn).view(owner, handle)
    assert cart.version == 1 + len(skus)
    assert sorted(i.sku for i in cart.items) == skus
    # Each reply shows the cart right after its own write: version v holds exactly v - 1 lines.
    assert sorted(reply.version for reply in replies) == list(range(2, 2 + len(skus)))  # type: ignore[attr-defined]
    assert all(len(reply.items) == reply.version - 1 for reply in replies)  # type: ignore[attr-defined]


async def test_two_currencies_racing_into_one_empty_cart_leave_it_with_one(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    dollars = await _products(database, 4, currency="USD")
    euros = await _products(database, 4, currency="EUR")
    handle = await _new_cart(database, owner)

    async def add(sku: str) -> str:
        try:
            await _set(database, owner, handle, sku, 1)
        except InvalidInput:
            return "refused"
        return "ok"

    outcomes = await asyncio.gather(*(add(sku) for pair in zip(dollars, euros, strict=True) for sku in pair))
    async with database.one_statement() as conn:
        cart = await CartRepository(conn).view(owner, handle)
    skus = {i.sku for i in cart.items}
    assert skus <= set(dollars) or skus <= set(euros), skus
    assert outcomes.count("ok") == len(skus) == 4
    assert cart.version == 1 + 4


async def test_concurrent_new_lines_at_the_cap_admit_exactly_as_many_as_fit(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    handle = await _new_cart(database, owner)
    skus = await _products(database, 10)
    await _set(database, owner, handle, skus[0], 1, max_lines=3)

    async def add(sku: str) -> str:
        try:
            await _set(database, owner, handle, sku, 1, max_lines=3)
        except InvalidInput:
            return "refused"
        return "ok"

    outcomes = await asyncio.gather(*(add(sku) for sku in skus[1:]))
    async with database.one_statement() as conn:
        cart = await CartRepository(conn).view(owner, handle)
    assert (outcomes.count("ok"), len(cart.items), cart.version) == (2, 3, 4)


async def test_a_cart_changed_while_its_placement_waited_for_the_lock_yields_a_new_quote_and_no_order(
    database: Database, database_url: str, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    handle = await _new_cart(database, owner)
    await _set(database, owner, handle, "hat-beanie", 1)
    async with database.one_statement() as conn:
        quote = await OrderRepository(conn).quote(owner, handle)
    blocker = await asyncpg.connect(make_url(database_url).set(drivername="postgresql").render_as_string(False))
    try:
        async with blocker.transaction():
            await blocker.execute("SELECT 1 FROM cart WHERE handle = $1 FOR UPDATE", handle)

            async def place() -> object:
                async with database.autocommit() as conn:
                    return await OrderRepository(conn).place(owner, quote, nonce=uuid.uuid4().hex)

            placing = asyncio.create_task(place())

            async def placement_waits() -> bool:
                await blocker.execute("SELECT pg_stat_clear_snapshot()")  # a fresh view inside this transaction
                waiting = await blocker.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%closed AS%'"
                )
                return bool(waiting) or placing.done()

            await eventually(placement_waits, within=10, what="the placement to wait for the cart's lock")
            assert not placing.done()
            # The change lands while the placement waits: the cart moves to version 3 with two beanies.
            await blocker.execute("UPDATE cart SET version = version + 1 WHERE handle = $1", handle)
            await blocker.execute(
                "UPDATE cart_item SET quantity = 2 FROM cart WHERE cart.id = cart_item.cart_id AND cart.handle = $1",
                handle,
            )
        outcome = await placing
    finally:
        await blocker.close()
    assert outcome == CheckoutQuote(
        cart_handle=handle, version=3, line_count=1, item_count=2, total_cents=3600, currency="USD"
    )
    async with database.one_statement() as conn:
        cart = await CartRepository(conn).view(owner, handle)
        assert await OrderRepository(conn).placed_with(owner, "x") is None
    assert (cart.status, cart.version) == ("open", 3)
