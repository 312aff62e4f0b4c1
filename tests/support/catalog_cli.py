"""``coatcheck catalog …`` as the operator runs it: a process of its own that sees only ``DATABASE_URL``."""

import subprocess

from tests.support.commands import coatcheck_bytes


def coatcheck(*argv: str, database_url: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    """``coatcheck argv…`` in a process whose only setting is ``DATABASE_URL`` (output as bytes)."""
    return coatcheck_bytes(*argv, env={"DATABASE_URL": database_url}, stdin=stdin)
