"""``coatcheck audit``: read the audit trail without SQL, as JSON lines or a table."""

import argparse
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import TextIO

from api.commands.runner import load_settings, run_with_database
from api.settings import DatabaseSettings
from store.audit import AuditRecord, search_events
from store.db import Database

_RELATIVE = re.compile(r"(\d+)([smhd])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
COLUMNS = ("created_at", "issuer", "subject", "action", "provider", "outcome", "detail")


def moment(value: str) -> datetime:
    """An ISO 8601 date or time (UTC when no offset is given), or a span back from now: ``90m``, ``24h``, ``7d``."""
    relative = _RELATIVE.fullmatch(value.strip())
    if relative:
        return datetime.now(UTC) - timedelta(**{_UNITS[relative[2]]: int(relative[1])})
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not an ISO 8601 time (2026-12-01T09:30:00Z) or a span like 24h"
        ) from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The filters and the output format of ``coatcheck audit``."""
    parser.add_argument("--issuer", help="only events of principals from this issuer (exact)")
    parser.add_argument("--subject", help="only events of this subject (exact)")
    parser.add_argument(
        "--event", help="only this action: connect, refresh, profile, disconnect, subject_mismatch, ..."
    )
    parser.add_argument("--since", type=moment, help="from this time on (ISO 8601, or 24h / 7d back from now)")
    parser.add_argument("--until", type=moment, help="before this time (ISO 8601, or a span back from now)")
    parser.add_argument("--limit", type=int, default=1000, help="at most this many of the newest events (1000)")
    parser.add_argument("--format", choices=("jsonl", "table"), default="table", help="output format (table)")


def _as_json(record: AuditRecord) -> str:
    data = asdict(record)
    data["created_at"] = record.created_at.isoformat()
    return json.dumps(data, ensure_ascii=False)


def _cell(record: AuditRecord, column: str) -> str:
    value = getattr(record, column)
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    return "-" if value is None else str(value)


def write(records: Sequence[AuditRecord], output_format: str, out: TextIO) -> None:
    """Print ``records`` as JSON lines (one object per event) or as an aligned table."""
    if output_format == "jsonl":
        for record in records:
            out.write(_as_json(record) + "\n")
        return
    rows = [[_cell(record, column) for column in COLUMNS] for record in records]
    widths = [max([len(column), *(len(row[i]) for row in rows)]) for i, column in enumerate(COLUMNS)]
    for line in [list(COLUMNS), *rows]:
        out.write("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip() + "\n")


def run(args: argparse.Namespace) -> int:
    """Query and print; the exit status (0, also when nothing matched)."""

    async def query(database: Database) -> list[AuditRecord]:
        async with database.one_statement() as conn:
            return await search_events(
                conn,
                issuer=args.issuer,
                subject=args.subject,
                action=args.event,
                since=args.since,
                until=args.until,
                limit=args.limit,
            )

    # Only the database (DB_POOLER_MODE too: the audit may run through the servers' PgBouncer):
    # an operator's shell need not hold the server's secrets.
    records = run_with_database(load_settings(DatabaseSettings), query)
    write(records, args.format, sys.stdout)
    if not records:
        print("coatcheck: no audit events match", file=sys.stderr)
    return 0
