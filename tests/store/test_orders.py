"""The order repository against the real test database: quotes, exactly-once placement, scoping."""

import asyncio
import secrets
import uuid
from collections.abc import Callable

import pytest
from sqlalchemy import func, select

from store.carts import CartRepository
from store.catalog import ProductRow, upsert_products
from store.db import Database
from store.errors import Conflict, InvalidInput, NotFound
from store.handles import is_well_formed
from store.models import Order, OrderLine, table_of
from store.orders import CheckoutQuote, OrderReceipt, OrderRepository
from store.principal import Principal
from tests.support.sql import recorded_statements


def _nonce() -> str:
    return secrets.token_urlsafe(16)


async def _filled_cart(database: Database, owner: Principal, lines: dict[str, int]) -> str:
    async with database.transaction() as conn:
        carts = CartRepository(conn)
        handle = await carts.create(owner)
        for sku, quantity in lines.items():
            await carts.set_item(owner, handle, sku, quantity)
    return handle


async def _quote(database: Database, owner: Principal, handle: str) -> CheckoutQuote:
    async with database.transaction() as conn:
        return await OrderRepository(conn).quote(owner, handle)


async def _place(
    database: Database, owner: Principal, quote: CheckoutQuote, nonce: str
) -> OrderReceipt | CheckoutQuote:
    async with database.autocommit() as conn:  # as cart_checkout runs it
        return await OrderRepository(conn).place(owner, quote, nonce=nonce)


async def _order_rows(database: Database, cart_handle: str) -> int:
    orders = table_of(Order)
    async with database.transaction() as conn:
        count = await conn.scalar(select(func.count()).select_from(orders).where(orders.c.cart_handle == cart_handle))
    return int(count or 0)


async def test_a_quote_prices_the_cart_in_one_query_and_writes_nothing(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    handle = await _filled_cart(database, owner, {"scarf-cashmere": 2, "hat-beanie": 1})
    with recorded_statements(database) as statements:
        quote = await _quote(database, owner, handle)
    assert len(statements) == 1
    assert statements[0].lstrip().upper().startswith("SELECT")
    assert quote == CheckoutQuote(
        cart_handle=handle, version=3, line_count=2, item_count=3, total_cents=14800, currency="USD"
    )
    async with database.transaction() as conn:
        cart = await CartRepository(conn).view(owner, handle)
    assert (cart.status, cart.version) == ("open", 3)


async def test_an_empty_cart_cannot_be_quoted_or_placed(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    handle = await _filled_cart(database, owner, {})
    with pytest.raises(InvalidInput, match="empty; add items with cart_set_item first"):
        await _quote(database, owner, handle)
    stale = CheckoutQuote(cart_handle=handle, version=1, line_count=1, item_count=1, total_cents=1, currency="USD")
    with pytest.raises(InvalidInput, match="empty"):
        await _place(database, owner, stale, _nonce())
    assert await _order_rows(database, handle) == 0


async def test_placing_a_confirmed_quote_copies_lines_and_prices_and_closes_the_cart_in_two_statements(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    handle = await _filled_cart(database, owner, {"scarf-cashmere": 2, "hat-beanie": 1})
    quote = await _quote(database, owner, handle)
    with recorded_statements(database) as statements:
        receipt = await _place(database, owner, quote, _nonce())
    assert len(statements) == 2, statements
    assert statements[0].lstrip().startswith("SELECT")
    assert "UPDATE cart" in statements[1]
    assert "FOR UPDATE" not in " ".join(statements)
    assert isinstance(receipt, OrderReceipt)
    assert is_well_formed(receipt.handle, "ord")
    assert (receipt.total_cents, receipt.currency, receipt.status) == (14800, "USD", "placed")

    async with database.transaction() as conn:
        order = await OrderRepository(conn).view(owner, receipt.handle)
        cart = await CartRepository(conn).view(owner, handle)
    assert (order.cart_handle, order.status, order.item_count, order.total_cents) == (handle, "placed", 3, 14800)
    assert [(i.sku, i.name, i.quantity, i.unit_price_cents, i.line_total_cents) for i in order.items] == [
        ("hat-beanie", "Knit beanie", 1, 1800, 1800),
        ("scarf-cashmere", "Cashmere scarf", 2, 6500, 13000),
    ]
    assert (cart.status, cart.version) == ("checked_out", 4)
    with pytest.raises(Conflict, match="checked out and can no longer be changed"):
        async with database.transaction() as conn:
            await CartRepository(conn).set_item(owner, handle, "hat-beanie", 5)


async def test_placing_again_with_the_same_nonce_returns_the_same_order_and_writes_nothing(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    handle = await _filled_cart(database, owner, {"gloves-leather": 1})
    quote = await _quote(database, owner, handle)
    nonce = _nonce()
    first = await _place(database, owner, quote, nonce)
    with recorded_statements(database) as statements:
        again = await _place(database, owner, quote, nonce)
    assert again == first
    assert all(s.lstrip().upper().startswith("SELECT") for s in statements)
    assert await _order_rows(database, handle) == 1
    async with database.transaction() as conn:
        assert await OrderRepository(conn).placed_with(owner, nonce) == first
        assert await OrderRepository(conn).placed_with(owner, _nonce()) is None


async def test_another_confirmation_for_a_checked_out_cart_is_refused_naming_the_order(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    handle = await _filled_cart(database, owner, {"gloves-leather": 1})
    quote = await _quote(database, owner, handle)
    placed = await _place(database, owner, quote, _nonce())
    assert isinstance(placed, OrderReceipt)
    with pytest.raises(Conflict, match=f"already checked out \\(order {placed.handle}\\)"):
        await _place(database, owner, quote, _nonce())
    with pytest.raises(Conflict, match=f"already checked out \\(order {placed.handle}\\)"):
        await _quote(database, owner, handle)
    assert await _order_rows(database, handle) == 1


async def test_a_cart_changed_since_the_quote_yields_a_new_quote_and_no_order(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    handle = await _filled_cart(database, owner, {"hat-beanie": 1})
    quote = await _quote(database, owner, handle)
    async with database.transaction() as conn:
        await CartRepository(conn).set_item(owner, handle, "hat-beanie", 3)
    outcome = await _place(database, owner, quote, _nonce())
    assert outcome == CheckoutQuote(
        cart_handle=handle, version=3, line_count=1, item_count=3, total_cents=5400, currency="USD"
    )
    assert await _order_rows(database, handle) == 0
    async with database.transaction() as conn:
        assert (await CartRepository(conn).view(owner, handle)).status == "open"


async def test_a_price_change_since_the_quote_yields_a_new_quote_even_at_the_same_cart_version(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    sku = f"test-{uuid.uuid4().hex[:8]}"  # a private product, so repricing it disturbs no other test
    async with database.transaction() as conn:
        await upsert_products(conn, [ProductRow(sku, "Test product", 1000, "USD")])
    handle = await _filled_cart(database, owner, {sku: 2})
    quote = await _quote(database, owner, handle)
    async with database.transaction() as conn:
        await upsert_products(conn, [ProductRow(sku, "Test product", 1100, "USD")])
    outcome = await _place(database, owner, quote, _nonce())
    assert isinstance(outcome, CheckoutQuote)
    assert (outcome.version, outcome.total_cents) == (quote.version, 2200)
    placed = await _place(database, owner, outcome, _nonce())
    assert isinstance(placed, OrderReceipt)
    assert placed.total_cents == 2200


async def test_concurrent_placements_of_one_confirmation_create_one_order_and_all_return_it(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    handle = await _filled_cart(database, owner, {"coat-wool-navy": 1, "brush-lint": 2})
    quote = await _quote(database, owner, handle)
    nonce = _nonce()
    outcomes = await asyncio.gather(*(_place(database, owner, quote, nonce) for _ in range(6)))
    assert len(set(outcomes)) == 1
    assert isinstance(outcomes[0], OrderReceipt)
    assert await _order_rows(database, handle) == 1


async def test_concurrent_placements_of_different_confirmations_create_one_order_and_refuse_the_rest(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    handle = await _filled_cart(database, owner, {"umbrella-compact": 1})
    quote = await _quote(database, owner, handle)

    async def attempt() -> str:
        try:
            outcome = await _place(database, owner, quote, _nonce())
        except Conflict as exc:
            return str(exc)
        assert isinstance(outcome, OrderReceipt)
        return outcome.handle

    outcomes = await asyncio.gather(*(attempt() for _ in range(4)))
    winners = [o for o in outcomes if o.startswith("ord_")]
    assert len(winners) == 1
    assert sorted(outcomes) == sorted([winners[0]] + [_refusal(winners[0])] * 3)
    assert await _order_rows(database, handle) == 1


def _refusal(order_handle: str) -> str:
    return (
        f"this cart is already checked out (order {order_handle}); use order_view to see the order, "
        "or cart_create to start a new cart"
    )


async def test_an_order_outlives_its_cart_and_a_retried_confirmation_still_returns_it(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    handle = await _filled_cart(database, owner, {"hanger-cedar": 4})
    quote = await _quote(database, owner, handle)
    nonce = _nonce()
    placed = await _place(database, owner, quote, nonce)
    assert isinstance(placed, OrderReceipt)
    async with database.transaction() as conn:
        await CartRepository(conn).delete(owner, handle)
    assert await _place(database, owner, quote, nonce) == placed
    with pytest.raises(NotFound):
        await _place(database, owner, quote, _nonce())
    async with database.transaction() as conn:
        order = await OrderRepository(conn).view(owner, placed.handle)
    assert (order.cart_handle, order.total_cents, [i.quantity for i in order.items]) == (handle, 3600, [4])


async def test_another_principals_cart_or_order_behaves_exactly_like_a_made_up_one(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    alice, bob = new_principal(), new_principal()
    alices_cart = await _filled_cart(database, alice, {"hat-beanie": 1})
    quote = await _quote(database, alice, alices_cart)
    alices_nonce = _nonce()
    placed = await _place(database, alice, quote, alices_nonce)
    assert isinstance(placed, OrderReceipt)

    for handle in (placed.handle, "ord_" + "A" * 32, "ord_short", "cart_" + "A" * 32):
        async with database.transaction() as conn:
            with pytest.raises(NotFound) as caught:
                await OrderRepository(conn).view(bob, handle)
        assert (caught.value.kind, caught.value.handle) == ("order", handle)
    for handle in (alices_cart, "cart_" + "B" * 32, "not-a-handle"):
        with pytest.raises(NotFound) as caught:
            await _quote(database, bob, handle)
        assert (caught.value.kind, caught.value.handle) == ("cart", handle)
    with pytest.raises(NotFound):
        await _place(database, bob, quote, alices_nonce)
    async with database.transaction() as conn:
        assert (await OrderRepository(conn).list(bob)).items == []
        assert await OrderRepository(conn).placed_with(bob, alices_nonce) is None
    assert await _order_rows(database, alices_cart) == 1


async def test_list_shows_only_own_orders_newest_first_with_counts(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner, other = new_principal(), new_principal()
    receipts = []
    for lines in ({"hat-beanie": 2, "brush-lint": 1}, {"coat-rain-yellow": 1}):
        handle = await _filled_cart(database, owner, lines)
        placed = await _place(database, owner, await _quote(database, owner, handle), _nonce())
        assert isinstance(placed, OrderReceipt)
        receipts.append(placed)
    foreign = await _filled_cart(database, other, {"hat-beanie": 1})
    await _place(database, other, await _quote(database, other, foreign), _nonce())

    async with database.transaction() as conn:
        listed = (await OrderRepository(conn).list(owner)).items
    assert [o.handle for o in listed] == [receipts[1].handle, receipts[0].handle]
    assert [(o.line_count, o.item_count, o.total_cents, o.currency) for o in listed] == [
        (1, 1, 7900, "USD"),
        (2, 3, 4300, "USD"),
    ]


async def test_order_lines_are_a_snapshot_that_later_price_changes_do_not_touch(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    sku = f"test-{uuid.uuid4().hex[:8]}"
    async with database.transaction() as conn:
        await upsert_products(conn, [ProductRow(sku, "Snapshot product", 500, "EUR")])
    handle = await _filled_cart(database, owner, {sku: 3})
    placed = await _place(database, owner, await _quote(database, owner, handle), _nonce())
    assert isinstance(placed, OrderReceipt)
    async with database.transaction() as conn:
        await upsert_products(conn, [ProductRow(sku, "Renamed product", 900, "EUR")])
        order = await OrderRepository(conn).view(owner, placed.handle)
        lines = (await conn.execute(select(table_of(OrderLine)).where(table_of(OrderLine).c.sku == sku))).all()
    assert (order.currency, order.total_cents) == ("EUR", 1500)
    assert [(i.name, i.unit_price_cents) for i in order.items] == [("Snapshot product", 500)]
    assert len(lines) == 1
