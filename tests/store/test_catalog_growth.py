"""catalog_search as the catalog grows to 1 M products, and without pg_trgm.

The growth test generates 1 000 000 products with one INSERT … SELECT generate_series in a scratch
database and reads the plans of the store's own search statement. It asserts what does not depend on
timing noise (which index answers, buffers touched, rows read and thrown away) and prints the timing
ratios against the 8-product demo catalog.
"""

import asyncio
import logging
import statistics
import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, text
from sqlalchemy.ext.asyncio import AsyncConnection

from api.search_health import DEGRADED, INDEXED, SearchHealth
from store.catalog import _LIST_ALL, _SEARCH, search_products, trigram_index_present
from store.db import Database
from store.demo import seed_demo_catalog
from store.migrations import alembic_config
from tests.support.explain import buffers, explain, rows_removed, scans_table, uses_index
from tests.support.prerequisites import missing
from tests.support.scratch import scratch_database

MIGRATION = "a1b2c3d40005"
CATEGORIES = "ARRAY['boots','brush','coat','gloves','hanger','hat','scarf','umbrella']"
MATERIALS = "ARRAY['wool','cotton','leather','silk','linen','cashmere','tweed','denim']"
COLOURS = "ARRAY['navy','red','yellow','green','black','white','grey','brown','blue','pink']"

# sku "<category>-<material>-<n>": every category holds 1/8 of the catalog, so 'coat' (and with it the
# common substring 'oat') and the prefix 'umbrella-' each match 125 000 products, clustered in sku
# order; 'zeppelin' is in 4 names. Umbrella skus are upper-case (the prefix group must find them by a
# lower-case prefix), and one product in ten is retired (n ending in 3: never found).
GENERATE = f"""
INSERT INTO product (sku, name, unit_price_cents, currency, active)
SELECT CASE WHEN k = 'umbrella' THEN upper(k || '-' || m) ELSE k || '-' || m END || '-' || lpad(i::text, 7, '0'),
       initcap(c) || ' ' || m || ' ' || k || CASE WHEN i % 250000 = 7 THEN ' zeppelin' ELSE '' END,
       100 + i % 50000, 'USD', i % 10 <> 3
FROM generate_series(1, 1000000) i,
     LATERAL (SELECT ({CATEGORIES})[1 + i % 8] k, ({MATERIALS})[1 + (i / 8) % 8] m,
                     ({COLOURS})[1 + (i / 64) % 10] c) x
"""

QUERIES = {"rare word": "zeppelin", "common 3-letter substring": "oat", "sku prefix": "umbrella-"}


def _migration() -> ModuleType:
    script = ScriptDirectory.from_config(alembic_config()).get_revision(MIGRATION)
    assert script is not None
    assert script.module is not None
    return script.module


def _search_params(query: str, limit: int = 20) -> dict[str, Any]:
    lo = query.lower()
    return {"p_lo": lo, "p_hi": lo[:-1] + chr(ord(lo[-1]) + 1), "p_pattern": f"%{query}%", "p_limit": limit + 1}


async def _figures(conn: AsyncConnection, query: str) -> tuple[dict[str, Any], float]:
    """The plan of the search for ``query`` and the median client-side time of five real searches."""
    plan = await explain(conn, _SEARCH, _search_params(query))
    timings = []
    for _ in range(5):
        started = time.perf_counter()
        await search_products(conn, query, 20)
        timings.append((time.perf_counter() - started) * 1000)
    return plan, statistics.median(timings)


@pytest.fixture(scope="module")
def big_catalog(admin_database_url: str) -> Iterator[str]:
    with scratch_database(admin_database_url) as url:

        async def fill() -> None:
            db = Database.connect(url, statement_timeout_ms=300_000)  # bulk load on a shared, busy machine
            try:
                async with db.transaction() as conn:
                    # Build the GIN index once over the filled table rather than row by row.
                    await conn.execute(text("DROP INDEX IF EXISTS ix_product_search_trgm"))
                    await conn.execute(text(GENERATE))
                    indexed = await conn.run_sync(lambda sync: _migration().install_trigram_index(sync))
                if not indexed:
                    return
                async with db.one_statement() as conn:
                    await conn.execute(text("VACUUM ANALYZE product"))
            finally:
                await db.dispose()

        asyncio.run(fill())
        yield url


def _offers_trigrams(url: str) -> bool:
    async def ask() -> bool:
        db = Database.connect(url)
        try:
            async with db.one_statement() as conn:
                return await trigram_index_present(conn)
        finally:
            await db.dispose()

    return asyncio.run(ask())


async def test_rare_words_common_substrings_and_sku_prefixes_stay_cheap_at_a_million_products(
    big_catalog: str, database: Database
) -> None:
    if not await asyncio.to_thread(_offers_trigrams, big_catalog):
        missing("this PostgreSQL offers no pg_trgm (e.g. the embedded pgserver): no trigram index to measure")
    big = Database.connect(big_catalog)
    try:
        async with big.one_statement() as conn:
            at_scale = {label: await _figures(conn, query) for label, query in QUERIES.items()}
            found = {label: await search_products(conn, query, 20) for label, query in QUERIES.items()}
            old_shape = await explain(
                conn,
                _LIST_ALL.where(text("(sku ILIKE :p_pattern OR name ILIKE :p_pattern)")),
                # The last category in sku byte order now that the umbrellas are upper-case (they sort first).
                {"p_pattern": "%scarf-%", "p_limit": 20},
            )
    finally:
        await big.dispose()
    async with database.one_statement() as conn:  # the session database holds the 8-product demo catalog
        demo = {label: await _figures(conn, query) for label, query in QUERIES.items()}

    rare, _ = at_scale["rare word"]
    assert uses_index(rare, "ix_product_search_trgm")
    assert not scans_table(rare, "product")
    rare_skus = [p.sku for p in found["rare word"].products]
    assert rare_skus == sorted(rare_skus)
    assert len(found["rare word"].products) == 4
    assert not found["rare word"].more

    common, _ = at_scale["common 3-letter substring"]
    assert rows_removed(common) < 2_000  # the sku-order walk threw away 250 000 rows before the first 'coat-'
    assert buffers(common) < 100  # sorting all 125 000 trigram matches touched ~9 700
    assert len(found["common 3-letter substring"].products) == 20
    assert found["common 3-letter substring"].more

    prefix, _ = at_scale["sku prefix"]
    assert uses_index(prefix, "ix_product_sku_ci_prefix")
    assert not scans_table(prefix, "product")
    assert buffers(prefix) < 50
    assert rows_removed(prefix) == 0  # the partial index holds no retired product to skip
    skus = [p.sku for p in found["sku prefix"].products]
    assert skus == sorted(skus)
    assert all(sku.startswith("UMBRELLA-") for sku in skus)  # upper-case skus, found by 'umbrella-'
    assert skus[0] == "UMBRELLA-CASHMERE-0000047"  # the first umbrella by sku: exact, not a sample
    every_found = [p.sku for result in found.values() for p in result.products]
    assert not [sku for sku in every_found if sku.endswith("3")]  # no retired product is ever found

    assert rows_removed(old_shape) > 800_000  # the plan this replaces, for the record
    lines = [
        f"\ncatalog_search at 1 000 000 products vs the 8-product demo (old shape for 'scarf-': "
        f"{rows_removed(old_shape)} rows removed by filter, {old_shape['Execution Time']:.1f} ms, "
        f"JIT {'used' if 'JIT' in old_shape else 'not used'})"
    ]
    for label, query in QUERIES.items():
        plan, millis = at_scale[label]
        demo_plan, demo_millis = demo[label]
        lines.append(
            f"  {label} {query!r}: {buffers(plan)} buffers, {rows_removed(plan)} rows removed, "
            f"execution {plan['Execution Time']:.3f} ms vs {demo_plan['Execution Time']:.3f} ms; "
            f"client median {millis:.2f} ms vs {demo_millis:.2f} ms (x{millis / demo_millis:.1f}); "
            f"JIT {'used' if 'JIT' in plan else 'not used'}"
        )
    print("\n".join(lines))


def test_without_pg_trgm_the_migration_skips_the_index_search_still_answers_by_scanning_and_health_says_degraded(
    admin_database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with scratch_database(admin_database_url) as url:

        def without_extension(sync: Connection) -> bool:
            sync.execute(text("DROP INDEX IF EXISTS ix_product_search_trgm"))
            installed: bool = _migration().install_trigram_index(sync, extension="pg_trgm_not_offered_here")
            return installed

        async def run() -> tuple[bool, bool, list[str], list[str], dict[str, Any], bool, bool, list[str | None], bool]:
            db = Database.connect(url)
            try:
                async with db.transaction() as conn:
                    installed = await conn.run_sync(without_extension)
                await seed_demo_catalog(db)
                health = SearchHealth(db)
                reported = [await health.status()]
                async with db.one_statement() as conn:
                    present = await trigram_index_present(conn)
                    coats = [p.sku for p in (await search_products(conn, "coat", 20)).products]
                    lints = [p.sku for p in (await search_products(conn, "LINT", 20)).products]
                    plan = await explain(conn, _SEARCH, _search_params("lint"))
                async with db.one_statement() as conn:
                    offered = bool(
                        (
                            await conn.execute(
                                text("SELECT EXISTS (SELECT FROM pg_available_extensions WHERE name = 'pg_trgm')")
                            )
                        ).scalar_one()
                    )
                async with db.transaction() as conn:  # the real extension: on offer here unless this is pgserver
                    reinstalled = await conn.run_sync(lambda sync: _migration().install_trigram_index(sync))
                async with db.one_statement() as conn:
                    present_after = await trigram_index_present(conn)
                reported.append(await health.status())
            finally:
                await db.dispose()
            return installed, present, coats, lints, plan, reinstalled, present_after, reported, offered

        with caplog.at_level(logging.WARNING):
            installed, present, coats, lints, plan, reinstalled, present_after, reported, offered = asyncio.run(run())
    assert (installed, present) == (False, False)
    assert "does not offer the pg_trgm_not_offered_here extension" in caplog.text
    assert "degraded" in caplog.text
    assert coats == ["coat-rain-yellow", "coat-wool-navy"]
    assert lints == ["brush-lint"]
    assert scans_table(plan, "product")  # the plain scan
    assert (reinstalled, present_after) == (offered, offered)
    assert reported == [DEGRADED, INDEXED if offered else DEGRADED]  # what /readyz says before and after
    assert "catalog_search is degraded" in caplog.text
