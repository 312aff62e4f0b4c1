"""The product catalog: shared, read-mostly, not owned by any principal."""

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row, Text, and_, bindparam, func, literal, or_, select, text, union_all
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from store.compiled import Compiled, fetch
from store.models import Product, table_of

_product = table_of(Product)


@dataclass(frozen=True, slots=True)
class ProductRow:
    """A product as callers see it."""

    sku: str
    name: str
    unit_price_cents: int
    currency: str


_SEARCH_TRGM_INDEX = "ix_product_search_trgm"


@dataclass(frozen=True, slots=True)
class SearchResult:
    """Products found by :func:`search_products`; ``more`` tells that other products match too."""

    products: list[ProductRow]
    more: bool


def _escape_like(term: str) -> str:
    return term.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _prefix_range(term: str) -> tuple[str, str] | None:
    """``[lo, hi)`` in byte order holding exactly the strings that start with ``term`` (lower-cased)."""
    lo = term.lower()
    if not lo or ord(lo[-1]) >= 0x10FFFF:
        return None
    return lo, lo[:-1] + chr(ord(lo[-1]) + 1)


_COLUMNS = (_product.c.sku, _product.c.name, _product.c.unit_price_cents, _product.c.currency)
# Retired products (active false) are kept for the carts that hold them but are never found.
_SOLD = _product.c.active
# The sku lower-cased, in byte order: the leading column of ix_product_sku_ci_prefix (partial on active), so
# an upper-case sku is found by a lower-case prefix. The sku in byte order breaks ties (the second column).
_SKU_CI = func.lower(_product.c.sku).collate("C")
_SKU_C = _product.c.sku.collate("C")
_IN_PREFIX = and_(bindparam("p_lo") <= _SKU_CI, bindparam("p_hi") > _SKU_CI)

# The catalog on sale in sku order: a walk of the primary key.
_LIST_ALL = select(*_COLUMNS).where(_SOLD).order_by(_product.c.sku).limit(bindparam("p_limit"))
# A search is two groups, each served by an index with bounded work, in one statement:
#  1. skus starting with the query (case-insensitively), in lower-cased sku order: a range of
#     ix_product_sku_ci_prefix (lower(sku) COLLATE "C", sku COLLATE "C" WHERE active), at most limit + 1 entries;
#  2. the other products whose sku or name contains the query, in sku order, among the first limit + 1
#     matches found: the trigram index finds rare terms, a short scan finds common ones. With at most
#     `limit` matches that is all of them; with more, `more` is set and which ones come back is unspecified
#     (ordering every match by sku would cost a heap visit and a sort per match, growing with the catalog).
# Both are MATERIALIZED CTEs, so the planner cannot turn them into a walk of the sku order that filters
# every row until it finds a match (the plan that read 999 993 rows for a rare word at 1 M products).
# The outer LIMIT stops before group 2 runs at all when group 1 fills the page.
_PREFIXED = (
    select(*_COLUMNS)
    .where(_IN_PREFIX, _SOLD)
    .order_by(_SKU_CI, _SKU_C)
    .limit(bindparam("p_limit"))
    .cte("prefixed")
    .prefix_with("MATERIALIZED")
)
_pattern = bindparam("p_pattern", type_=Text)
_CONTAINED = (
    select(*_COLUMNS)
    .where(
        or_(_product.c.sku.ilike(_pattern, escape="\\"), _product.c.name.ilike(_pattern, escape="\\")),
        ~_IN_PREFIX,
        _SOLD,
    )
    .limit(bindparam("p_limit"))
    .cte("contained")
    .prefix_with("MATERIALIZED")
)
_first_contained = (
    select(_CONTAINED.c.sku, _CONTAINED.c.name, _CONTAINED.c.unit_price_cents, _CONTAINED.c.currency)
    .order_by(_CONTAINED.c.sku)
    .limit(bindparam("p_limit"))
    .subquery("first_contained")
)
_SEARCH = union_all(
    select(literal(0).label("grp"), *_PREFIXED.c),
    select(literal(1).label("grp"), *_first_contained.c),
).limit(bindparam("p_limit"))
# catalog_search's lone statement either way, run on the driver (store/compiled.py).
_LIST_ALL_SQL = Compiled(_LIST_ALL)
_SEARCH_SQL = Compiled(_SEARCH)


def _product_of(row: Row[*tuple[Any, ...]]) -> ProductRow:
    return ProductRow(sku=row.sku, name=row.name, unit_price_cents=row.unit_price_cents, currency=row.currency)


async def search_products(conn: AsyncConnection, query: str, limit: int) -> SearchResult:
    """Products on sale whose sku or name contains ``query`` (case-insensitive): sku-prefix matches first.

    Retired products are never returned. The prefix group is in lower-cased sku order, the other in sku
    order. An empty query lists the catalog in sku order. The work is bounded by
    ``limit`` whatever the size of the catalog: with at most ``limit`` matches you get all of them; with
    more, ``more`` is set and which of them are returned is not specified beyond the sku-prefix ones
    (narrow the query, or raise ``limit``).
    """
    if not query:
        listed = await fetch(conn, _LIST_ALL_SQL, {"p_limit": limit + 1})
        return SearchResult(products=[_product_of(row) for row in listed[:limit]], more=len(listed) > limit)
    lo, hi = _prefix_range(query) or ("", "")  # an empty range matches nothing
    params = {"p_lo": lo, "p_hi": hi, "p_pattern": f"%{_escape_like(query)}%", "p_limit": limit + 1}
    rows = sorted(await fetch(conn, _SEARCH_SQL, params), key=lambda row: int(row.grp))  # stable: groups in order
    products = [_product_of(row) for row in rows[:limit]]
    return SearchResult(products=products, more=len(rows) > limit)


async def trigram_index_present(conn: AsyncConnection) -> bool:
    """Tell whether the trigram index exists; without it (no pg_trgm) searches scan the catalog."""
    found = await conn.execute(
        text("SELECT EXISTS (SELECT FROM pg_indexes WHERE indexname = :name AND schemaname = current_schema())"),
        {"name": _SEARCH_TRGM_INDEX},
    )
    return bool(found.scalar_one())


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
