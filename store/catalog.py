"""The product catalog: shared, read-mostly, not owned by any principal."""

from dataclasses import dataclass

from sqlalchemy import func, or_, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from store.models import Product, table_of

_product = table_of(Product)


@dataclass(frozen=True, slots=True)
class ProductRow:
    """A product as callers see it."""

    sku: str
    name: str
    unit_price_cents: int
    currency: str


def _escape_like(term: str) -> str:
    return term.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


async def search_products(conn: AsyncConnection, query: str, limit: int) -> list[ProductRow]:
    """Products whose sku or name contains ``query`` (case-insensitive), ordered by sku."""
    stmt = select(_product.c.sku, _product.c.name, _product.c.unit_price_cents, _product.c.currency)
    if query:
        pattern = f"%{_escape_like(query)}%"
        stmt = stmt.where(or_(_product.c.sku.ilike(pattern, escape="\\"), _product.c.name.ilike(pattern, escape="\\")))
    rows = await conn.execute(stmt.order_by(_product.c.sku).limit(limit))
    return [ProductRow(*row) for row in rows]


async def upsert_products(conn: AsyncConnection, products: list[ProductRow]) -> int:
    """Insert or update catalog entries; returns how many rows actually changed.

    Rows whose values already match are left untouched, so re-running a seed changes nothing.
    """
    if not products:
        return 0
    values = insert(_product).values(
        [
            {"sku": p.sku, "name": p.name, "unit_price_cents": p.unit_price_cents, "currency": p.currency}
            for p in products
        ]
    )
    excluded = values.excluded
    stmt = values.on_conflict_do_update(
        index_elements=[_product.c.sku],
        set_={"name": excluded.name, "unit_price_cents": excluded.unit_price_cents, "currency": excluded.currency},
        where=func.row(_product.c.name, _product.c.unit_price_cents, _product.c.currency).is_distinct_from(
            func.row(excluded.name, excluded.unit_price_cents, excluded.currency)
        ),
    ).returning(_product.c.sku)
    result = await conn.execute(stmt)
    return len(result.all())
