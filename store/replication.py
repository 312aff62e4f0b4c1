"""Whether the primary has a synchronous standby: the durability condition of a replicated deployment.

With asynchronous replication a failover loses the commits the new primary had not received, acknowledged
orders among them (and with an order its checkout nonce, so a retried confirmation places a second one).
A commit is on two servers before it is acknowledged only while ``synchronous_standby_names`` names a
standby that is connected and in ``sync`` or ``quorum`` state.
"""

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

# One statement. pg_stat_replication shows sync_state only to superusers and members of pg_read_all_stats
# (pg_monitor); for anyone else it reads NULL, so the count is 0 and the check fails safe.
_SYNC_STANDBYS = text(
    "SELECT current_setting('synchronous_standby_names') <> '' AS named, "
    "(SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum'))::int AS standbys"
)


@dataclass(frozen=True, slots=True)
class SyncReplication:
    """What the primary reported: whether synchronous standbys are configured, and how many are in sync."""

    named: bool
    standbys: int

    @property
    def durable(self) -> bool:
        """Whether a commit is acknowledged only once a standby has it."""
        return self.named and self.standbys > 0


async def synchronous_replication(conn: AsyncConnection) -> SyncReplication:
    """The primary's synchronous replication as it stands now."""
    row = (await conn.execute(_SYNC_STANDBYS)).one()
    return SyncReplication(named=bool(row.named), standbys=int(row.standbys))
