"""Retired products (product.active false), loaded through the import: search, carts, checkout and orders cope.

The session database is shared, so these tests import only skus of their own and never retire what the file
does not list; the import's counts over a whole catalog are checked in a database of their own.
"""

import asyncio
import secrets
import uuid
from collections.abc import Callable

import pytest
from sqlalchemy import text

from store.carts import CartRepository
from store.catalog import search_products
from store.catalog_format import CatalogEntry
from store.catalog_transfer import ImportSummary, import_catalog
from store.db import Database
from store.errors import InvalidInput, Unavailable
from store.orders import CheckoutQuote, OrderReceipt, OrderRepository
from store.principal import Principal
from tests.support.scratch import scratch_database


def _sku(prefix: str = "ret") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


async def _load(database: Database, *entries: CatalogEntry) -> ImportSummary:
    return await import_catalog(database, list(entries))


async def _cart(database: Database, owner: Principal, lines: dict[str, int]) -> str:
    async with database.transaction() as conn:
        carts = CartRepository(conn)
        handle = await carts.create(owner)
        for sku, quantity in lines.items():
            await carts.set_item(owner, handle, sku, quantity)
    return handle


async def _search(database: Database, query: str) -> list[str]:
    async with database.one_statement() as conn:
        return [p.sku for p in (await search_products(conn, query, 100)).products]


async def test_a_retired_product_is_not_found_cannot_be_added_and_is_back_once_reactivated(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    word = uuid.uuid4().hex[:12]
    sku = f"lamp-{word}"
    on_sale = CatalogEntry(sku, f"Desk lamp {word}", 2500, "USD")
    await _load(database, on_sale)
    owner = new_principal()
    handle = await _cart(database, owner, {})
    assert await _search(database, "lamp-" + word) == [sku]  # by sku prefix
    assert await _search(database, word) == [sku]  # by substring

    await _load(database, CatalogEntry(sku, on_sale.name, 2500, "USD", active=False))
    assert await _search(database, "lamp-" + word) == []
    assert await _search(database, word) == []
    assert sku not in await _search(database, "")
    async with database.transaction() as conn:
        with pytest.raises(InvalidInput) as refused:
            await CartRepository(conn).set_item(owner, handle, sku, 1)
    assert str(refused.value) == (
        f"{sku!r} is no longer sold (retired from the catalog), so it cannot be added; "
        "use catalog_search to find products on sale"
    )

    await _load(database, on_sale)
    assert await _search(database, word) == [sku]
    async with database.transaction() as conn:
        cart = await CartRepository(conn).set_item(owner, handle, sku, 2)
    assert [(line.sku, line.quantity, line.available) for line in cart.items] == [(sku, 2, True)]


async def test_a_retired_line_shows_unavailable_with_its_name_leaves_the_total_and_can_only_be_removed(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    sku = _sku()
    await _load(database, CatalogEntry(sku, "Wool socks", 900, "USD"))
    owner = new_principal()
    handle = await _cart(database, owner, {sku: 2, "hat-beanie": 1})
    await _load(database, CatalogEntry(sku, "Wool socks", 900, "USD", active=False))

    async with database.one_statement() as conn:
        cart = await CartRepository(conn).view(owner, handle)
    assert [(i.sku, i.name, i.quantity, i.unit_price_cents, i.available) for i in cart.items] == [
        ("hat-beanie", "Knit beanie", 1, 1800, True),
        (sku, "Wool socks", 2, 900, False),
    ]
    assert cart.total_cents == 1800
    async with database.one_statement() as conn:
        (summary,) = [c for c in (await CartRepository(conn).list(owner)).items if c.handle == handle]
    assert (summary.line_count, summary.total_cents) == (2, 1800)

    async with database.transaction() as conn:
        with pytest.raises(InvalidInput, match=r"no longer sold .* remove its line with quantity 0"):
            await CartRepository(conn).set_item(owner, handle, sku, 3)
    async with database.transaction() as conn:
        removed = await CartRepository(conn).set_item(owner, handle, sku, 0)
    assert [(i.sku, i.available) for i in removed.items] == [("hat-beanie", True)]
    assert removed.version == cart.version + 1


async def test_a_retired_line_counts_toward_the_line_cap(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    sku = _sku()
    await _load(database, CatalogEntry(sku, "Retired pin", 100, "USD"))
    owner = new_principal()
    handle = await _cart(database, owner, {sku: 1, "hat-beanie": 1})
    await _load(database, CatalogEntry(sku, "Retired pin", 100, "USD", active=False))
    async with database.transaction() as conn:
        with pytest.raises(InvalidInput, match="already has 2 lines, the most a cart may hold"):
            await CartRepository(conn).set_item(owner, handle, "brush-lint", 1, max_lines=2)
    async with database.transaction() as conn:
        await CartRepository(conn).set_item(owner, handle, sku, 0, max_lines=2)
        cart = await CartRepository(conn).set_item(owner, handle, "brush-lint", 1, max_lines=2)
    assert [i.sku for i in cart.items] == ["brush-lint", "hat-beanie"]


async def test_checkout_refuses_a_cart_with_retired_lines_naming_them_also_when_retired_after_the_quote(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    first, second = sorted([_sku(), _sku()])
    await _load(
        database, CatalogEntry(first, "Old umbrella", 2500, "USD"), CatalogEntry(second, "Old hat", 1000, "USD")
    )
    owner = new_principal()
    handle = await _cart(database, owner, {first: 1, second: 1, "brush-lint": 1})
    async with database.one_statement() as conn:
        quote = await OrderRepository(conn).quote(owner, handle)
    await _load(database, CatalogEntry(first, "Old umbrella", 2500, "USD", active=False))

    async with database.autocommit() as conn:
        with pytest.raises(InvalidInput) as at_placing:
            await OrderRepository(conn).place(owner, quote, nonce=secrets.token_urlsafe(16))
    assert str(at_placing.value) == (
        f"this cart holds 1 product that is no longer sold: {first!r} (Old umbrella); remove it with "
        "cart_set_item quantity 0, then check out again"
    )
    await _load(database, CatalogEntry(second, "Old hat", 1000, "USD", active=False))
    async with database.one_statement() as conn:
        with pytest.raises(InvalidInput) as at_quoting:
            await OrderRepository(conn).quote(owner, handle)
    assert str(at_quoting.value) == (
        f"this cart holds 2 products that are no longer sold: {first!r} (Old umbrella), {second!r} (Old hat); "
        "remove them with cart_set_item quantity 0, then check out again"
    )

    async with database.transaction() as conn:
        await CartRepository(conn).set_item(owner, handle, first, 0)
        await CartRepository(conn).set_item(owner, handle, second, 0)
    async with database.one_statement() as conn:
        quote = await OrderRepository(conn).quote(owner, handle)
    async with database.autocommit() as conn:
        placed = await OrderRepository(conn).place(owner, quote, nonce=secrets.token_urlsafe(16))
    assert isinstance(placed, OrderReceipt)
    assert placed.total_cents == 700


async def test_a_product_retired_between_the_read_and_the_placing_statement_places_nothing(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    sku = _sku()
    await _load(database, CatalogEntry(sku, "Racing product", 300, "USD"))
    owner = new_principal()
    handle = await _cart(database, owner, {sku: 1})
    async with database.autocommit() as conn:
        orders = OrderRepository(conn)
        snapshot = await orders._snapshot(owner, handle)  # what place() read just before the retirement
        assert snapshot is not None
        await _load(database, CatalogEntry(sku, "Racing product", 300, "USD", active=False))
        placed = await orders._insert(owner, snapshot, snapshot.quote(handle), secrets.token_urlsafe(16))
        cart = await CartRepository(conn).view(owner, handle)
    assert placed is None
    assert cart.status == "open"


async def test_an_order_keeps_the_name_and_price_paid_whatever_the_import_does_to_the_product_later(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    sku = _sku()
    await _load(database, CatalogEntry(sku, "Linen shirt", 4200, "EUR"))
    owner = new_principal()
    handle = await _cart(database, owner, {sku: 2})
    async with database.one_statement() as conn:
        quote = await OrderRepository(conn).quote(owner, handle)
    async with database.autocommit() as conn:
        placed = await OrderRepository(conn).place(owner, quote, nonce=secrets.token_urlsafe(16))
    assert isinstance(placed, OrderReceipt)
    await _load(database, CatalogEntry(sku, "Renamed shirt", 9999, "EUR", active=False))
    async with database.one_statement() as conn:
        order = await OrderRepository(conn).view(owner, placed.handle)
    assert [(i.sku, i.name, i.quantity, i.unit_price_cents) for i in order.items] == [(sku, "Linen shirt", 2, 4200)]
    assert (order.total_cents, order.currency) == (8400, "EUR")


async def test_an_upper_case_sku_is_a_prefix_match_for_a_lower_case_query_and_sorts_among_the_others(
    database: Database,
) -> None:
    word = uuid.uuid4().hex[:8]
    upper, lower, mixed = f"PFX{word}-B", f"pfx{word}-a", f"Pfx{word}-C"
    named = f"AAA-{word}"  # sorts before them all by sku: only the prefix group puts it last
    await _load(
        database,
        CatalogEntry(upper, "Upper", 100, "USD"),
        CatalogEntry(lower, "Lower", 100, "USD"),
        CatalogEntry(mixed, "Mixed", 100, "USD"),
        CatalogEntry(named, f"Named pfx{word}", 100, "USD"),
    )
    # All three start with the query in some case, so they come first, in lower-cased order; then the name match.
    assert await _search(database, f"pfx{word}") == [lower, upper, mixed, named]
    assert await _search(database, f"PFX{word}-b") == [upper]


def test_an_import_counts_added_changed_unchanged_and_retired_and_a_dry_run_writes_nothing(
    admin_database_url: str,
) -> None:
    hat, pin, cap, old = (CatalogEntry(f"{name}-1", name.title(), 100, "USD") for name in ("hat", "pin", "cap", "old"))

    async def run(url: str) -> list[ImportSummary | list[tuple[str, int, bool]]]:
        db = Database.connect(url)
        try:
            seen: list[ImportSummary | list[tuple[str, int, bool]]] = [
                await import_catalog(db, [hat, pin, cap, old]),
                await import_catalog(db, [hat, CatalogEntry("pin-1", "Pin", 150, "USD"), cap], dry_run=True),
                await import_catalog(db, [hat, pin, cap, old]),  # the dry run changed nothing
                await import_catalog(
                    db, [hat, CatalogEntry("pin-1", "Pin", 150, "USD"), CatalogEntry("cap-1", "Cap", 100, "USD", False)]
                ),
                await import_catalog(db, [hat, CatalogEntry("new-1", "New", 5, "EUR")], retire_missing=True),
                await import_catalog(db, [hat, CatalogEntry("cap-1", "Cap", 100, "USD")], retire_missing=True),
            ]
            async with db.one_statement() as conn:
                rows = (
                    await conn.execute(text("SELECT sku, unit_price_cents, active FROM product ORDER BY sku"))
                ).all()
            seen.append([(r.sku, r.unit_price_cents, r.active) for r in rows])
            return seen
        finally:
            await db.dispose()

    with scratch_database(admin_database_url) as url:
        first, dry, again, changes, retire, back, catalog = asyncio.run(run(url))
    assert first == ImportSummary(added=4, changed=0, unchanged=0, retired=0, not_listed=0, dry_run=False)
    assert dry == ImportSummary(added=0, changed=1, unchanged=2, retired=0, not_listed=1, dry_run=True)
    assert again == ImportSummary(added=0, changed=0, unchanged=4, retired=0, not_listed=0, dry_run=False)
    assert changes == ImportSummary(added=0, changed=1, unchanged=1, retired=1, not_listed=1, dry_run=False)
    # pin-1 and old-1 were on sale and are not listed; cap-1 was retired already.
    assert retire == ImportSummary(added=1, changed=0, unchanged=1, retired=2, not_listed=0, dry_run=False)
    # Re-activating cap-1 is a change; new-1, on sale and not listed, is retired.
    assert back == ImportSummary(added=0, changed=1, unchanged=1, retired=1, not_listed=0, dry_run=False)
    assert catalog == [
        ("cap-1", 100, True),
        ("hat-1", 100, True),
        ("new-1", 5, False),
        ("old-1", 100, False),
        ("pin-1", 150, False),
    ]


async def test_a_quote_of_a_cart_whose_products_are_all_on_sale_is_unchanged(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    handle = await _cart(database, owner, {"hat-beanie": 2})
    async with database.one_statement() as conn:
        quote = await OrderRepository(conn).quote(owner, handle)
    assert quote == CheckoutQuote(handle, 2, 1, 2, 3600, "USD")


async def _write_catalog_briefly(database: Database) -> None:
    async with database.transaction() as writer:
        await writer.execute(text("SET LOCAL lock_timeout = '200ms'"))
        await writer.execute(text("UPDATE product SET name = name WHERE sku = 'brush-lint'"))


async def test_cart_writes_and_searches_go_on_while_an_import_holds_the_catalog_lock(
    database: Database, new_principal: Callable[[], Principal]
) -> None:
    owner = new_principal()
    handle = await _cart(database, owner, {})
    async with database.transaction() as importing:
        # What an import holds until it commits: the table lock and the row locks of the rows it merged.
        await importing.execute(text("LOCK TABLE product IN SHARE ROW EXCLUSIVE MODE"))
        await importing.execute(text("UPDATE product SET name = name WHERE sku = 'hat-beanie'"))
        async with database.autocommit() as conn:  # another pooled connection; a wait would hit lock_timeout
            cart = await CartRepository(conn).set_item(owner, handle, "hat-beanie", 1)
            found = [p.sku for p in (await search_products(conn, "beanie", 5)).products]
        with pytest.raises(Unavailable, match="lock_timeout"):  # the control: another catalog writer does wait
            await _write_catalog_briefly(database)
    assert [(i.sku, i.available) for i in cart.items] == [("hat-beanie", True)]
    assert found == ["hat-beanie"]
