"""``coatcheck audit``: read the audit trail without SQL, as JSON lines or a table.

Stored values (a subject, a provider's name, a detail) came from outside, so neither format writes a
control character raw to the operator's terminal: the table escapes them (:func:`api.escaping.escape_controls`),
JSON lines leave none unescaped. Arguments out of range are refused by argparse with exit status 2.
"""

import argparse
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import TextIO

from api.commands.runner import load_settings, run_with_database
from api.escaping import escape_controls
from api.settings import DatabaseSettings
from store.audit import AuditRecord, search_events
from store.db import Database

_RELATIVE = re.compile(r"(\d+)([smhd])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
COLUMNS = ("created_at", "issuer", "subject", "action", "provider", "outcome", "detail")
MAX_LIMIT = 1_000_000
# json.dumps escapes C0 controls but, with ensure_ascii=False, writes DEL, C1 (a raw CSI is \x9b) and the
# Unicode line separators as they are.
_JSON_RAW_CONTROLS = re.compile("[\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def moment(value: str) -> datetime:
    """An ISO 8601 date or time (UTC when no offset is given), or a span back from now: ``90m``, ``24h``, ``7d``.

    Returned in UTC. A span reaching before the year 1, or a time that is not one in UTC (the year 1 at
    +14:00), is refused like a malformed one.
    """
    relative = _RELATIVE.fullmatch(value.strip())
    try:
        if relative:
            return datetime.now(UTC) - timedelta(**{_UNITS[relative[2]]: int(relative[1])})
        parsed = datetime.fromisoformat(value.strip())
        return (parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)).astimezone(UTC)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not an ISO 8601 time (2026-12-01T09:30:00Z) or a span like 24h"
        ) from None
    except OverflowError:
        raise argparse.ArgumentTypeError(f"{value!r} is outside the times an audit event can have") from None


def limit(value: str) -> int:
    """A whole number of events from 1 to :data:`MAX_LIMIT`."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if not 1 <= number <= MAX_LIMIT:
        shown = value if len(value) <= 20 else value[:20] + "..."
        raise argparse.ArgumentTypeError(f"{shown!r} is not a whole number from 1 to {MAX_LIMIT}")
    return number


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The filters and the output format of ``coatcheck audit``."""
    parser.add_argument("--issuer", help="only events of principals from this issuer (exact)")
    parser.add_argument("--subject", help="only events of this subject (exact)")
    parser.add_argument(
        "--event", help="only this action: connect, refresh, profile, disconnect, subject_mismatch, ..."
    )
    parser.add_argument("--since", type=moment, help="from this time on (ISO 8601, or 24h / 7d back from now)")
    parser.add_argument("--until", type=moment, help="before this time (ISO 8601, or a span back from now)")
    parser.add_argument(
        "--limit", type=limit, default=1000, help=f"at most this many of the newest events (1000; 1 to {MAX_LIMIT})"
    )
    parser.add_argument("--format", choices=("jsonl", "table"), default="table", help="output format (table)")


def _as_json(record: AuditRecord) -> str:
    data = asdict(record)
    data["created_at"] = record.created_at.isoformat()
    line = json.dumps(data, ensure_ascii=False)
    return _JSON_RAW_CONTROLS.sub(lambda match: f"\\u{ord(match.group()):04x}", line)  # same value, escaped


def _cell(record: AuditRecord, column: str) -> str:
    value = getattr(record, column)
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    return "-" if value is None else escape_controls(str(value))


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
