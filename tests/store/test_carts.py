"""The cart repository against the real test database: scoping, absolute writes, versions."""

import asyncio
from collections.abc import Callable

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from store.carts import CartRepository
from store.db import Database
from store.errors import Conflict, InvalidInput, NotFound
from store.handles import is_well_formed
from store.principal import Principal


async def _new_cart(database: Database, owner: Principal) -> str:
    async with database.transaction() as conn:
        return await CartRepository(conn).create(owner)


async def test_create_returns_a_prefixed_url_safe_handle_with_an_empty_cart(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    handle = await _new_cart(database, owner)
    assert handle.startswith("cart_")
    assert is_well_formed(handle, "cart")
    async with database.transaction() as conn:
        cart = await CartRepository(conn).view(owner, handle)
    assert (cart.version, cart.status, cart.items, cart.total_cents, cart.currency) == (1, "open", [], 0, None)


async def test_set_item_is_absolute_so_repeating_it_changes_only_the_version(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    handle = await _new_cart(database, owner)
    async with database.transaction() as conn:
        first = await CartRepository(conn).set_item(owner, handle, "hat-beanie", 3)
    async with database.transaction() as conn:
        again = await CartRepository(conn).set_item(owner, handle, "hat-beanie", 3)
    assert [(i.sku, i.quantity, i.line_total_cents) for i in first.items] == [("hat-beanie", 3, 5400)]
    assert again.items == first.items
    assert again.total_cents == first.total_cents == 5400
    assert (first.version, again.version) == (2, 3)
    assert again.currency == "USD"


async def test_quantity_zero_removes_the_line(database: Database, new_principal: Callable[[], Principal]) -> None:
    owner = new_principal()
    handle = await _new_cart(database, owner)
    async with database.transaction() as conn:
        carts = CartRepository(conn)
        await carts.set_item(owner, handle, "hat-beanie", 1)
        await carts.set_item(owner, handle, "brush-lint", 2)
        cart = await carts.set_item(owner, handle, "hat-beanie", 0)
    assert [(i.sku, i.quantity) for i in cart.items] == [("brush-lint", 2)]
    assert cart.total_cents == 1400


async def test_a_product_on_a_cart_line_cannot_leave_the_catalog_so_the_line_can_always_be_removed(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    # Nothing in the code deletes or hides products; an operator's DELETE is what could. The cart queries
    # price lines by joining the product (store/carts.py), so they rely on this foreign key.
    owner = new_principal()
    handle = await _new_cart(database, owner)
    async with database.transaction() as conn:
        await CartRepository(conn).set_item(owner, handle, "brush-lint", 2)
        with pytest.raises(DBAPIError, match="fk_cart_item_sku_product"):
            async with conn.begin_nested():
                await conn.execute(text("DELETE FROM product WHERE sku = 'brush-lint'"))
        cart = await CartRepository(conn).set_item(owner, handle, "brush-lint", 0)
    assert (cart.version, cart.items) == (3, [])


@pytest.mark.parametrize("quantity", [-1, 1000])
async def test_quantity_outside_0_to_999_is_refused_and_changes_nothing(
    database: Database, new_principal: Callable[[], Principal], quantity: int
) -> None:
    owner = new_principal()
    handle = await _new_cart(database, owner)
    with pytest.raises(InvalidInput, match="between 0 and 999"):
        async with database.transaction() as conn:
            await CartRepository(conn).set_item(owner, handle, "hat-beanie", quantity)
    async with database.transaction() as conn:
        assert (await CartRepository(conn).view(owner, handle)).version == 1


async def test_unknown_sku_is_refused_and_rolls_back_the_version_bump(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    handle = await _new_cart(database, owner)
    for quantity in (2, 0):
        with pytest.raises(InvalidInput, match="unknown sku 'no-such-sku'; use catalog_search"):
            async with database.transaction() as conn:
                await CartRepository(conn).set_item(owner, handle, "no-such-sku", quantity)
    async with database.transaction() as conn:
        cart = await CartRepository(conn).view(owner, handle)
    assert (cart.version, cart.items) == (1, [])


async def test_expected_version_mismatch_is_a_conflict_that_names_the_current_version(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    handle = await _new_cart(database, owner)
    async with database.transaction() as conn:
        await CartRepository(conn).set_item(owner, handle, "hat-beanie", 1, expected_version=1)
    with pytest.raises(Conflict, match="version 2, not 1"):
        async with database.transaction() as conn:
            await CartRepository(conn).set_item(owner, handle, "hat-beanie", 5, expected_version=1)
    async with database.transaction() as conn:
        cart = await CartRepository(conn).view(owner, handle)
    assert (cart.version, cart.items[0].quantity) == (2, 1)


async def test_another_principals_handle_behaves_exactly_like_a_made_up_one(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    alice, bob = new_principal(), new_principal()
    alices_cart = await _new_cart(database, alice)
    made_up = "cart_" + "A" * 32
    for handle in (alices_cart, made_up, "cart_short", "not-a-handle"):
        async with database.transaction() as conn:
            carts = CartRepository(conn)
            for call in (
                carts.view(bob, handle),
                carts.set_item(bob, handle, "hat-beanie", 1),
            ):
                with pytest.raises(NotFound) as caught:
                    await call
                assert (caught.value.kind, caught.value.handle) == ("cart", handle)
            assert await carts.delete(bob, handle) is False  # "nothing of yours to delete", for each of them
    async with database.transaction() as conn:
        assert (await CartRepository(conn).list(bob)).items == []
        cart = await CartRepository(conn).view(alice, alices_cart)
    assert (cart.version, cart.items) == (1, [])


async def test_same_subject_from_another_issuer_is_another_principal(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    alice = new_principal()
    impostor = Principal(issuer="https://other-issuer.test", subject=alice.subject)
    handle = await _new_cart(database, alice)
    async with database.transaction() as conn:
        with pytest.raises(NotFound):
            await CartRepository(conn).view(impostor, handle)


async def test_list_shows_only_own_carts_newest_first_with_counts_and_totals(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner, other = new_principal(), new_principal()
    older = await _new_cart(database, owner)
    newer = await _new_cart(database, owner)
    await _new_cart(database, other)
    async with database.transaction() as conn:
        carts = CartRepository(conn)
        await carts.set_item(owner, older, "hat-beanie", 2)
        await carts.set_item(owner, older, "brush-lint", 1)
        page = await carts.list(owner)
    listed = page.items
    assert page.next is None
    assert [c.handle for c in listed] == [newer, older]
    summary = listed[1]
    assert (summary.line_count, summary.item_count, summary.total_cents, summary.currency) == (2, 3, 4300, "USD")
    assert (listed[0].line_count, listed[0].total_cents, listed[0].currency) == (0, 0, None)


async def test_delete_removes_the_cart_and_a_second_delete_reports_nothing_deleted(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    handle = await _new_cart(database, owner)
    async with database.transaction() as conn:
        await CartRepository(conn).set_item(owner, handle, "hat-beanie", 1)
        assert await CartRepository(conn).delete(owner, handle) is True
    async with database.transaction() as conn:
        assert await CartRepository(conn).delete(owner, handle) is False
        assert (await CartRepository(conn).list(owner)).items == []
        with pytest.raises(NotFound):
            await CartRepository(conn).view(owner, handle)


async def test_concurrent_writers_with_the_same_expected_version_let_exactly_one_win(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    handle = await _new_cart(database, owner)

    async def write(sku: str) -> str:
        try:
            async with database.transaction() as conn:
                await CartRepository(conn).set_item(owner, handle, sku, 1, expected_version=1)
        except Conflict:
            return "conflict"
        return "ok"

    outcomes = await asyncio.gather(*(write(sku) for sku in ("hat-beanie", "brush-lint", "hanger-cedar")))
    assert sorted(outcomes) == ["conflict", "conflict", "ok"]
    async with database.transaction() as conn:
        cart = await CartRepository(conn).view(owner, handle)
    assert (cart.version, len(cart.items)) == (2, 1)
