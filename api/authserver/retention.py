"""Every replica in authorization-server mode deletes, now and then, the codes, refresh tokens, grants and
clients nothing can use any more (rules in :func:`store.authserver.purge_batch`), in short batches that skip
rows another replica holds. It runs with the app, so ``coatcheck purge`` need not know this mode's tables.
"""

import asyncio
import logging
from datetime import timedelta

from store import authserver as store
from store.db import Database

logger = logging.getLogger(__name__)

PURGE_EVERY = timedelta(minutes=10)
BATCH_SIZE = 500


async def purge_once(database: Database, *, batch_size: int = BATCH_SIZE) -> dict[str, int]:
    """One pass over every table; the rows deleted per table."""
    totals: dict[str, int] = {}
    for table in store.PURGEABLE_TABLES:
        total = 0
        while True:
            async with database.one_statement() as conn:
                deleted = await store.purge_batch(conn, table, limit=batch_size)
            total += deleted
            if deleted < batch_size:
                break
            await asyncio.sleep(0)  # let requests run between batches
        totals[table] = total
    return totals


async def purge_periodically(database: Database, every: timedelta = PURGE_EVERY) -> None:
    """:func:`purge_once` now and every ``every`` until cancelled; a failed pass is logged and retried."""
    while True:
        try:
            totals = await purge_once(database)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.warning("authorization-server purge failed (%s); retrying in %s", type(exc).__name__, every)
        else:
            if any(totals.values()):
                logger.info("authorization-server purge deleted %s", " ".join(f"{t}={n}" for t, n in totals.items()))
        await asyncio.sleep(every.total_seconds())
