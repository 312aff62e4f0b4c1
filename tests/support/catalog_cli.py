"""``coatcheck catalog …`` as the operator runs it: a process of its own that sees only ``DATABASE_URL``."""

import os
import subprocess
import sys
import tempfile


def coatcheck(*argv: str, database_url: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    """``coatcheck argv…`` in a process whose only setting is ``DATABASE_URL`` (output as bytes)."""
    base = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "TOKEN_ENCRYPTION_KEYS"}}
    return subprocess.run(
        [sys.executable, "-m", "api.cli", *argv],
        env={**base, "DATABASE_URL": database_url},
        cwd=tempfile.gettempdir(),  # no .env file there
        input=stdin,
        capture_output=True,
        timeout=120,
        check=False,
    )
