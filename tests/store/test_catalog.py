"""Catalog search and the idempotent demo seed."""

from store.catalog import search_products
from store.db import Database
from store.demo import DEMO_PRODUCTS, seed_demo_catalog


async def test_search_matches_sku_or_name_case_insensitively(database: Database) -> None:
    async with database.transaction() as conn:
        by_name = (await search_products(conn, "COAT", 20)).products
        by_sku = (await search_products(conn, "hanger", 20)).products
    assert [p.sku for p in by_name] == ["coat-rain-yellow", "coat-wool-navy"]
    assert [p.sku for p in by_sku] == ["hanger-cedar"]


async def test_search_treats_like_wildcards_as_literal_text(database: Database) -> None:
    async with database.transaction() as conn:
        assert (await search_products(conn, "%", 20)).products == []
        assert (await search_products(conn, "_", 20)).products == []


async def test_empty_query_lists_in_sku_order_up_to_the_limit(database: Database) -> None:
    async with database.transaction() as conn:
        first_three = await search_products(conn, "", 3)
    assert [p.sku for p in first_three.products] == sorted(p.sku for p in DEMO_PRODUCTS)[:3]
    assert first_three.more


async def test_seeding_the_demo_catalog_again_changes_nothing(database: Database) -> None:
    assert await seed_demo_catalog(database) == 0


async def test_sku_prefix_matches_come_first_then_other_matches_each_in_sku_order(database: Database) -> None:
    async with database.transaction() as conn:
        found = await search_products(conn, "H", 20)
        one = await search_products(conn, "h", 1)
    # hanger-… and hat-… start with "h"; the others only contain it, so they follow although brush-lint
    # and gloves-leather sort first.
    assert [p.sku for p in found.products] == [
        "hanger-cedar",
        "hat-beanie",
        "brush-lint",
        "gloves-leather",
        "scarf-cashmere",
    ]
    assert not found.more
    assert ([p.sku for p in one.products], one.more) == (["hanger-cedar"], True)
