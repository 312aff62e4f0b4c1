"""``coatcheck purge`` and ``coatcheck serve --purge-every``: delete what no request can use any more.

The rules (which rows, and why each may go) are in :mod:`store.retention`; this module turns the
settings into ages, runs the batches, one short autocommit statement each on a pooled connection,
and reports per table. Safe to run from several replicas at once: rows another purge holds are
skipped, so the totals of concurrent runs add up to what one run would have deleted.
"""

import argparse
import asyncio
import logging
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy.exc import SQLAlchemyError

from api.commands.runner import load_settings, run_with_database
from api.settings import RetentionSettings
from store.db import Database
from store.errors import Unavailable
from store.retention import PURGEABLE, Purgeable, purge_batch

__all__ = ["RetentionPolicy", "parse_duration", "purge", "purge_periodically", "register"]

logger = logging.getLogger(__name__)

BATCH_SIZE = 500
# Beyond the requestState lifetime: clocks of the instances and the database may disagree a little.
REPLAY_MARGIN = timedelta(minutes=1)
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd]?)")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """How old a row of each purgeable table must be to go; ``None`` keeps the table's rows."""

    ages: dict[Purgeable, timedelta | None]

    @classmethod
    def of(cls, *, audit_days: int, cart_days: int, request_state_ttl_seconds: int) -> "RetentionPolicy":
        """The policy for these settings (``0`` days: keep).

        A retried round can arrive until its ``requestState`` expires, so nothing it may still
        read goes sooner than the requestState lifetime plus a margin, whatever the settings say.
        """
        replay_window = timedelta(seconds=request_state_ttl_seconds) + REPLAY_MARGIN

        def age(days: int) -> timedelta | None:
            return max(timedelta(days=days), replay_window) if days > 0 else None

        return cls(
            ages={
                "oauth_flow": replay_window,
                "audit_event": age(audit_days),
                # Dead at expires_at already; the margin covers instances whose clocks run behind the database's.
                "browser_session": REPLAY_MARGIN,
                "cart": age(cart_days),
            }
        )

    @classmethod
    def from_settings(cls, settings: RetentionSettings) -> "RetentionPolicy":
        """The policy of ``AUDIT_RETENTION_DAYS``, ``CART_RETENTION_DAYS`` and the requestState lifetime."""
        return cls.of(
            audit_days=settings.audit_retention_days,
            cart_days=settings.cart_retention_days,
            request_state_ttl_seconds=settings.request_state_ttl_seconds,
        )


async def purge(database: Database, policy: RetentionPolicy, *, batch_size: int = BATCH_SIZE) -> dict[str, int]:
    """Delete everything the policy lets go, in batches; return the rows deleted per table.

    Every batch is its own autocommit statement, so no lock outlives a batch and a request
    never waits for more than one. Stops for a table when a batch deletes nothing (rows that
    another purge holds are left to it).
    """
    totals: dict[str, int] = {}
    for table in PURGEABLE:
        age = policy.ages.get(table)
        if age is None:
            continue
        deleted_total = dependent_total = 0
        while True:
            async with database.one_statement() as conn:
                deleted, dependent = await purge_batch(conn, table, older_than=age, limit=batch_size)
            deleted_total += deleted
            dependent_total += dependent
            if deleted == 0:
                break
            await asyncio.sleep(0)  # let requests on this process run between batches
        totals[table] = deleted_total
        if table == "cart":
            totals["cart_item"] = dependent_total
    return totals


def describe(totals: dict[str, int]) -> str:
    """``oauth_flow=3 audit_event=0 …``, or ``nothing`` when no table is purged."""
    return " ".join(f"{table}={count}" for table, count in totals.items()) or "nothing (every table is kept)"


async def purge_periodically(
    database: Database,
    policy: RetentionPolicy,
    every: timedelta,
    *,
    on_purged: Callable[[str, int], None] | None = None,
) -> None:
    """Purge now and then every ``every`` until cancelled; a failed run is logged and retried next time.

    ``on_purged(table, n)`` hears each run's count per table (the metrics, when they are on).
    """
    while True:
        try:
            totals = await purge(database, policy)
        except asyncio.CancelledError:
            raise
        except Unavailable as exc:
            # An outage, already logged once by the store (cause, no traceback): only say what happens next.
            logger.warning("purge stopped (database unavailable: %s); retrying in %s", exc.cause, every)
        except Exception:
            logger.warning("purge failed; retrying in %s", every, exc_info=True)
        else:
            if on_purged is not None:
                for table, count in totals.items():
                    on_purged(table, count)
            if any(totals.values()):
                logger.info("purge deleted %s", describe(totals))
        await asyncio.sleep(every.total_seconds())


def parse_duration(text: str) -> timedelta:
    """``90``, ``90s``, ``15m``, ``6h``, ``1d`` (at least one second).

    Raises:
        argparse.ArgumentTypeError: anything else (argparse shows the message).
    """
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration such as 30s, 15m, 6h or 1d")
    seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds < 1:
        raise argparse.ArgumentTypeError("the purge interval must be at least 1s")
    return timedelta(seconds=seconds)


def _run(_: argparse.Namespace) -> None:
    # purge needs the database and the retention settings, not the server's secrets.
    settings = load_settings(RetentionSettings)
    policy = RetentionPolicy.from_settings(settings)
    try:
        totals = run_with_database(settings, lambda database: purge(database, policy))
    except (SQLAlchemyError, OSError, Unavailable) as exc:
        # The class only: a driver message may quote the URL.
        print(
            f"coatcheck: purge failed: {type(exc).__name__}; nothing after the last finished batch was deleted",
            file=sys.stderr,
        )
        raise SystemExit(1) from None
    for table, count in totals.items():
        print(f"{table}: deleted {count}")
    kept = [table for table in PURGEABLE if policy.ages.get(table) is None]
    for table in kept:
        print(f"{table}: kept (retention 0 = keep)")


def register(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Add ``purge`` to the ``coatcheck`` command line."""
    commands.add_parser(
        "purge",
        help="delete expired connect flows, old audit entries and carts past CART_RETENTION_DAYS (orders stay)",
    ).set_defaults(run=_run)
