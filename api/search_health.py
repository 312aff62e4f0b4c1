"""Whether catalog_search has its trigram index, for /readyz and the log.

Without ``pg_trgm`` (some embedded or managed PostgreSQL) the migration skips the index and searches
scan the catalog: correct, but their cost grows with the catalog. That is reported, not fatal.
"""

import logging

from sqlalchemy.exc import SQLAlchemyError

from store.catalog import trigram_index_present
from store.db import Database
from store.errors import Unavailable

logger = logging.getLogger(__name__)

INDEXED = "indexed"
DEGRADED = "degraded: no pg_trgm trigram index, so searches scan the catalog"


class SearchHealth:
    """Checks once per process until the index is seen (an operator may add it later), and warns once."""

    def __init__(self, database: Database) -> None:
        self._database = database
        self._indexed = False
        self._warned = False

    async def status(self) -> str | None:
        """``INDEXED`` or ``DEGRADED``; ``None`` if the database could not be asked."""
        if self._indexed:
            return INDEXED
        try:
            async with self._database.one_statement() as conn:
                self._indexed = await trigram_index_present(conn)
        except (SQLAlchemyError, OSError, Unavailable):
            return None
        if self._indexed:
            return INDEXED
        if not self._warned:
            self._warned = True
            logger.warning("catalog_search is %s; docs/lists-and-search.md says how to add it", DEGRADED)
        return DEGRADED
