"""Loading a whole catalog file into ``product`` and writing the catalog back out (``coatcheck catalog``).

An import is one transaction: the validated entries are copied (COPY, one round trip for the lot) into a
temporary staging table, compared with ``product`` to count what is added, changed, unchanged and retired,
then merged with one upsert by sku (and, with ``retire_missing``, one UPDATE retiring every product on sale
that the file does not list). Products are never deleted: retiring sets ``active`` false, which keeps every
cart line and order valid. The table is locked against other writers (SHARE ROW EXCLUSIVE: readers and the
foreign-key checks of cart writes go on), so the counts are exactly what the merge did.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import BinaryIO

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from store.catalog_format import CatalogEntry, CatalogFormat, encode_entries, header
from store.db import Database

# Operator work on a whole catalog may take longer than a request's statement_timeout allows.
_STATEMENT_TIMEOUT = "SET LOCAL statement_timeout = '10min'"
_EXPORT_BATCH = 5000
_STAGING_COLUMNS = ("sku", "name", "unit_price_cents", "currency", "active")

_LOCK = text("LOCK TABLE product IN SHARE ROW EXCLUSIVE MODE")
_STAGE = text(
    """
CREATE TEMPORARY TABLE catalog_import (
    sku varchar(64) PRIMARY KEY, name text NOT NULL, unit_price_cents integer NOT NULL,
    currency varchar(3) NOT NULL, active boolean NOT NULL
) ON COMMIT DROP
"""
)
# Each listed product falls in exactly one group. "retired": on sale before, listed as not active now.
# "changed": any other difference, a re-activation included.
_SAME = (
    "(p.name, p.unit_price_cents, p.currency, p.active) IS NOT DISTINCT FROM "
    "(s.name, s.unit_price_cents, s.currency, s.active)"
)
_COMPARE = text(
    f"""
SELECT count(*) FILTER (WHERE p.sku IS NULL) AS added,
       count(*) FILTER (WHERE p.active AND NOT s.active) AS retired,
       count(*) FILTER (WHERE p.sku IS NOT NULL AND NOT (p.active AND NOT s.active) AND NOT {_SAME}) AS changed,
       count(*) FILTER (WHERE p.sku IS NOT NULL AND {_SAME}) AS unchanged,
       (SELECT count(*) FROM product AS q
        WHERE q.active AND NOT EXISTS (SELECT FROM catalog_import AS t WHERE t.sku = q.sku)) AS not_listed
FROM catalog_import AS s LEFT JOIN product AS p ON p.sku = s.sku
"""
)
_MERGE = text(
    """
INSERT INTO product (sku, name, unit_price_cents, currency, active)
SELECT sku, name, unit_price_cents, currency, active FROM catalog_import
ON CONFLICT (sku) DO UPDATE
SET name = excluded.name, unit_price_cents = excluded.unit_price_cents, currency = excluded.currency,
    active = excluded.active
WHERE (product.name, product.unit_price_cents, product.currency, product.active)
      IS DISTINCT FROM (excluded.name, excluded.unit_price_cents, excluded.currency, excluded.active)
"""
)
_RETIRE_MISSING = text(
    """
UPDATE product SET active = false
WHERE active AND NOT EXISTS (SELECT FROM catalog_import AS s WHERE s.sku = product.sku)
"""
)
_EXPORT = text('SELECT sku, name, unit_price_cents, currency, active FROM product ORDER BY sku COLLATE "C"')


@dataclass(frozen=True, slots=True)
class ImportSummary:
    """What an import did (or, in a dry run, would do) to the catalog.

    ``retired`` counts products on sale before and retired now: listed with ``active`` false, or (with
    ``retire_missing``) not listed. ``not_listed`` counts products on sale the file does not list that
    were kept on sale (without ``retire_missing``).
    """

    added: int
    changed: int
    unchanged: int
    retired: int
    not_listed: int
    dry_run: bool


class _DryRun(Exception):  # noqa: N818 - control flow: roll the transaction back with the summary
    def __init__(self, summary: ImportSummary) -> None:
        super().__init__("dry run")
        self.summary = summary


async def _stage(conn: AsyncConnection, entries: Sequence[CatalogEntry]) -> None:
    await conn.execute(_STAGE)
    raw = await conn.get_raw_connection()
    driver = raw.driver_connection
    assert driver is not None  # a checked-out connection always has one  # noqa: S101
    await driver.copy_records_to_table(
        "catalog_import",
        records=[(e.sku, e.name, e.unit_price_cents, e.currency, e.active) for e in entries],
        columns=_STAGING_COLUMNS,
    )
    await conn.execute(text("ANALYZE catalog_import"))  # no autovacuum for temporary tables: plan on real counts


async def import_catalog(
    database: Database, entries: Sequence[CatalogEntry], *, retire_missing: bool = False, dry_run: bool = False
) -> ImportSummary:
    """Upsert ``entries`` by sku in one transaction and return what changed; ``dry_run`` writes nothing.

    ``entries`` must be valid (:func:`store.catalog_format.parse_catalog` checks them) with unique skus.

    Raises:
        Unavailable: another import (or catalog write) held the table past the lock timeout.
    """
    try:
        async with database.transaction() as conn:
            await conn.execute(text(_STATEMENT_TIMEOUT))
            if not dry_run:
                await conn.execute(_LOCK)
            await _stage(conn, entries)
            counts = (await conn.execute(_COMPARE)).one()
            retired = counts.retired + (counts.not_listed if retire_missing else 0)
            summary = ImportSummary(
                added=counts.added,
                changed=counts.changed,
                unchanged=counts.unchanged,
                retired=retired,
                not_listed=0 if retire_missing else counts.not_listed,
                dry_run=dry_run,
            )
            if dry_run:
                raise _DryRun(summary)
            await conn.execute(_MERGE)
            if retire_missing:
                await conn.execute(_RETIRE_MISSING)
    except _DryRun as rolled_back:
        return rolled_back.summary
    return summary


async def export_catalog(database: Database, fmt: CatalogFormat, out: BinaryIO) -> int:
    """Write every product, retired ones included, in sku byte order in the canonical ``fmt``; return how many.

    Read in one transaction (one consistent snapshot) through a server-side cursor, so memory stays flat.
    """
    out.write(header(fmt))
    count = 0
    async with database.transaction() as conn:
        await conn.execute(text(_STATEMENT_TIMEOUT))
        result = await conn.stream(_EXPORT)
        async for rows in result.partitions(_EXPORT_BATCH):
            batch = [CatalogEntry(r.sku, r.name, r.unit_price_cents, r.currency, r.active) for r in rows]
            out.write(encode_entries(batch, fmt))
            count += len(batch)
    return count
