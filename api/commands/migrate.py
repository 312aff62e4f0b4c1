"""``coatcheck migrate --check``: is the schema at this code's head? (a gate for rolling deploys)."""

import sys

from sqlalchemy.exc import SQLAlchemyError

from store.migrations import schema_status


def check_schema(database_url: str) -> int:
    """Print where the schema is; the exit status: 0 at head, 1 not at head, 2 database unreachable."""
    try:
        status = schema_status(database_url)
    except (OSError, SQLAlchemyError) as exc:
        print(f"coatcheck: cannot read the schema revision: {type(exc).__name__}", file=sys.stderr)
        return 2
    heads = ", ".join(status.heads)
    if status.at_head:
        print(f"schema at head ({heads})")
        return 0
    current = ", ".join(status.current) or "empty (no migrations applied)"
    print(f"coatcheck: schema not at head: database at {current}, this code expects {heads}", file=sys.stderr)
    return 1
