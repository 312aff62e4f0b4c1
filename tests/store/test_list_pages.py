"""cart_list / order_list pages: keyset order, stability under inserts, and a cost that does not grow.

The cost test builds 100 000 carts of other users plus 2 000 of one user with one INSERT … SELECT
generate_series each, in a scratch database, and reads the plans of the store's own statements.
"""

import asyncio
import secrets
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import text

from store.carts import _LIST as _CARTS
from store.carts import CartRepository
from store.db import Database
from store.orders import _LIST as _ORDERS
from store.orders import OrderReceipt, OrderRepository
from store.paging import Position
from store.principal import Principal
from tests.support.explain import buffers, explain, plan_nodes, rows_removed, scans_table, uses_index
from tests.support.scratch import scratch_database


async def _all_pages(database: Database, owner: Principal, limit: int) -> list[list[str]]:
    pages: list[list[str]] = []
    after: Position | None = None
    while True:
        async with database.one_statement() as conn:
            page = await CartRepository(conn).list(owner, limit=limit, after=after)
        pages.append([cart.handle for cart in page.items])
        if page.next is None:
            return pages
        after = page.next


async def test_pages_return_every_cart_once_newest_first_and_the_last_page_has_no_next(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    async with database.transaction() as conn:  # four carts with one created_at: the handle breaks the tie
        same_instant = [await CartRepository(conn).create(owner) for _ in range(4)]
    later = []
    for _ in range(3):
        async with database.transaction() as conn:
            later.append(await CartRepository(conn).create(owner))
    pages = await _all_pages(database, owner, limit=3)
    assert [len(page) for page in pages] == [3, 3, 1]
    flat = [handle for page in pages for handle in page]
    assert flat == [*reversed(later), *sorted(same_instant, reverse=True)]


async def test_carts_created_while_paging_neither_shift_nor_repeat_the_pages_still_to_come(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    for _ in range(5):
        async with database.transaction() as conn:
            await CartRepository(conn).create(owner)
    async with database.one_statement() as conn:
        everything = [cart.handle for cart in (await CartRepository(conn).list(owner)).items]
        first = await CartRepository(conn).list(owner, limit=2)
    async with database.transaction() as conn:
        newcomer = await CartRepository(conn).create(owner)
    async with database.one_statement() as conn:
        rest = await CartRepository(conn).list(owner, limit=10, after=first.next)
    assert [cart.handle for cart in first.items] + [cart.handle for cart in rest.items] == everything
    assert newcomer not in [cart.handle for cart in rest.items]


async def test_order_pages_return_every_order_once_newest_first(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    placed = []
    for _ in range(3):
        async with database.transaction() as conn:
            handle = await CartRepository(conn).create(owner)
            await CartRepository(conn).set_item(owner, handle, "hat-beanie", 1)
        async with database.transaction() as conn:
            orders = OrderRepository(conn)
            receipt = await orders.place(owner, await orders.quote(owner, handle), nonce=secrets.token_urlsafe(16))
            assert isinstance(receipt, OrderReceipt)
            placed.append(receipt.handle)
    async with database.one_statement() as conn:
        first = await OrderRepository(conn).list(owner, limit=2)
        rest = await OrderRepository(conn).list(owner, limit=2, after=first.next)
    assert [order.handle for order in first.items + rest.items] == list(reversed(placed))
    assert rest.next is None


@pytest.fixture(scope="module")
def crowded_database(admin_database_url: str) -> Iterator[str]:
    """100 000 carts of 1 000 other users and 2 000 of "heavy", each with two lines and placed as an order."""
    with scratch_database(admin_database_url) as url:

        async def fill() -> None:
            db = Database.connect(url)
            try:
                async with db.transaction() as conn:
                    await conn.execute(
                        text(
                            "INSERT INTO product (sku, name, unit_price_cents, currency) "
                            "VALUES ('a', 'A', 100, 'USD'), ('b', 'B', 250, 'USD')"
                        )
                    )
                    await conn.execute(
                        text(
                            "INSERT INTO cart (handle, principal_iss, principal_sub, open_slot, created_at) "
                            "SELECT 'cart_' || lpad(i::text, 32, '0'), 'https://issuer.test', "
                            "CASE WHEN i <= 2000 THEN 'heavy' ELSE 'other-' || (i % 1000) END, i, "
                            "now() - i * interval '1 second' FROM generate_series(1, 102000) i"
                        )
                    )
                    await conn.execute(
                        text(
                            "INSERT INTO cart_item (cart_id, sku, quantity) "
                            "SELECT id, s, 2 FROM cart, (VALUES ('a'), ('b')) v(s)"
                        )
                    )
                    await conn.execute(
                        text(
                            "INSERT INTO orders (handle, principal_iss, principal_sub, cart_id, cart_handle, "
                            "checkout_nonce, total_cents, currency, placed_at) SELECT 'ord_' || substr(handle, 6), "
                            "principal_iss, principal_sub, id, handle, 'n' || id, 700, 'USD', created_at FROM cart"
                        )
                    )
                    await conn.execute(
                        text(
                            "INSERT INTO order_line (order_id, sku, name, quantity, unit_price_cents) "
                            "SELECT id, 'a', 'A', 7, 100 FROM orders"
                        )
                    )
                    await conn.execute(text("ANALYZE"))
            finally:
                await db.dispose()

        asyncio.run(fill())
        yield url


async def test_a_page_costs_the_same_at_the_start_and_deep_in_the_list_whatever_others_hold(
    crowded_database: str,
) -> None:
    heavy = Principal(issuer="https://issuer.test", subject="heavy")
    db = Database.connect(crowded_database)
    try:
        async with db.one_statement() as conn:
            repo = CartRepository(conn)
            first = await repo.list(heavy, limit=50)
            deep_after = None
            for _ in range(37):  # 38 pages in: the next page starts at the 1 901st cart of 2 000
                deep_after = (await repo.list(heavy, limit=50, after=deep_after or first.next)).next
            assert deep_after is not None
            params = {"p_iss": heavy.issuer, "p_sub": heavy.subject, "p_limit": 51}
            at_start = await explain(conn, _CARTS.first, params)
            deep = await explain(
                conn, _CARTS.after, {**params, "p_after_at": deep_after.at, "p_after_handle": deep_after.handle}
            )
            orders_deep = await explain(
                conn,
                _ORDERS.after,
                {**params, "p_after_at": deep_after.at, "p_after_handle": "ord_" + "z" * 32},
            )
    finally:
        await db.dispose()
    for plan in (at_start, deep):
        assert uses_index(plan, "ix_cart_principal_page")
        assert not scans_table(plan, "cart")
        assert not scans_table(plan, "cart_item")
        assert rows_removed(plan) == 0  # nobody else's rows are read and thrown away
        cart_rows = sum(
            int(node.get("Actual Rows", 0)) * int(node.get("Actual Loops", 1))
            for node in plan_nodes(plan)
            if node.get("Relation Name") == "cart"
        )
        assert cart_rows == 51
    assert uses_index(orders_deep, "ix_orders_principal_page")
    assert not scans_table(orders_deep, "orders")
    assert rows_removed(orders_deep) == 0
    ratio = buffers(deep) / buffers(at_start)
    print(
        f"\ncart_list page of 50 with 102 000 carts (2 000 own): first page {buffers(at_start)} buffers "
        f"{at_start['Execution Time']:.2f} ms, page 39 {buffers(deep)} buffers {deep['Execution Time']:.2f} ms "
        f"(buffer ratio {ratio:.2f})"
    )
    assert 0.5 < ratio < 2
