"""``DB_REQUIRE_SYNC_STANDBY``: not ready unless the primary has a synchronous standby, re-checked periodically.

The check runs in the background every ``DB_SYNC_STANDBY_CHECK_SECONDS`` (one short statement on the app's
pool), never in a tool call's way; ``/readyz`` reads its last answer and the metric
``coatcheck_db_sync_standbys`` shows it. A database that cannot be asked counts as not durable.
"""

import asyncio
import logging
from collections.abc import Callable
from typing import Literal

from sqlalchemy.exc import SQLAlchemyError

from store.db import Database
from store.errors import Unavailable
from store.replication import synchronous_replication

logger = logging.getLogger(__name__)

Durability = Literal["unknown", "synchronous standby", "no synchronous standby"]


class SyncStandbyCheck:
    """The last answer of the synchronous-standby check, and the loop that renews it."""

    def __init__(self, database: Database, *, on_count: Callable[[int], None] | None = None) -> None:
        self._database = database
        self._on_count = on_count
        self.status: Durability = "unknown"

    @property
    def durable(self) -> bool:
        return self.status == "synchronous standby"

    async def check(self) -> Durability:
        """Ask the primary once; remember and return the answer."""
        try:
            async with self._database.one_statement() as conn:
                found = await synchronous_replication(conn)
        except (SQLAlchemyError, OSError, Unavailable) as exc:
            if self.status != "unknown":  # the store logged an outage already; say what it means here, once
                logger.warning("DB_REQUIRE_SYNC_STANDBY: the primary could not be asked (%s)", type(exc).__name__)
            status: Durability = "unknown"
            count = -1
        else:
            status = "synchronous standby" if found.durable else "no synchronous standby"
            count = found.standbys if found.named else 0
        if status != self.status and status == "no synchronous standby":
            logger.warning("DB_REQUIRE_SYNC_STANDBY: the primary has no synchronous standby; /readyz answers 503")
        self.status = status
        if self._on_count is not None:
            self._on_count(count)
        return status

    async def run(self, every: float) -> None:
        """Check now, then every ``every`` seconds, until cancelled."""
        while True:
            await self.check()
            await asyncio.sleep(every)
