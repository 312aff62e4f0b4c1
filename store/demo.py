"""A small demo catalog for development and compose."""

from store.catalog import ProductRow, upsert_products
from store.db import Database

DEMO_PRODUCTS = [
    ProductRow("coat-wool-navy", "Navy wool coat", 18900, "USD"),
    ProductRow("coat-rain-yellow", "Yellow rain coat", 7900, "USD"),
    ProductRow("scarf-cashmere", "Cashmere scarf", 6500, "USD"),
    ProductRow("gloves-leather", "Leather gloves", 4200, "USD"),
    ProductRow("hat-beanie", "Knit beanie", 1800, "USD"),
    ProductRow("umbrella-compact", "Compact umbrella", 2500, "USD"),
    ProductRow("hanger-cedar", "Cedar hanger", 900, "USD"),
    ProductRow("brush-lint", "Lint brush", 700, "USD"),
]


async def seed_demo_catalog(database: Database) -> int:
    """Insert or refresh the demo products; returns how many rows changed (0 on a re-run)."""
    async with database.transaction() as conn:
        return await upsert_products(conn, DEMO_PRODUCTS)
