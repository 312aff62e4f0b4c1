"""An embedded PostgreSQL for development and for the test suite on a machine without one.

Uses the ``pgserver`` wheel (PostgreSQL 16 binaries inside a pip package; ``pip install 'coatcheck[dev]'``):
``initdb`` on first use, then ``pg_ctl start`` on a Unix socket inside the data directory (no TCP port,
so nothing else on the machine can reach it). Running as root, pgserver runs the server as a ``pgserver``
system user it creates, and makes the directories above the data directory traversable for it.

The wheel ships no contrib extensions (``pg_trgm``, ``pgcrypto``…): every migration must work without them.
"""

import asyncio
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
from sqlalchemy.engine import make_url

INSTALL_HINT = "pip install 'coatcheck[dev]'  (the embedded PostgreSQL comes from the pgserver wheel)"


class EmbeddedPostgresError(RuntimeError):
    """pgserver is not installed, or the embedded server would not start."""


@dataclass
class EmbeddedPostgres:
    """A running embedded server: the admin URL of its ``postgres`` database; :meth:`stop` shuts it down."""

    data_dir: Path
    admin_url: str
    _server: Any

    def url(self, database: str) -> str:
        """A ``postgresql://`` URL of ``database`` on this server (over its Unix socket)."""
        return make_url(self.admin_url).set(database=database).render_as_string(hide_password=False)

    def ensure_database(self, name: str) -> str:
        """Create ``name`` unless it exists; return its URL."""

        async def create() -> None:
            conn = await asyncpg.connect(self.admin_url)
            try:
                if not await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
                    await conn.execute(f'CREATE DATABASE "{name}"')
            finally:
                await conn.close()

        asyncio.run(create())
        return self.url(name)

    def stop(self) -> None:
        """Stop the server (a fast shutdown; the data stays in ``data_dir``)."""
        self._server.cleanup()


def start_embedded_postgres(data_dir: Path) -> EmbeddedPostgres:
    """Start (initialising on first use) PostgreSQL with its data in ``data_dir``; reuses a running one."""
    try:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); pgserver then uses /tmp.
            warnings.simplefilter("ignore")
            from pgserver.postgres_server import get_server
    except ImportError:
        raise EmbeddedPostgresError(f"the embedded PostgreSQL is not installed: {INSTALL_HINT}") from None
    logging.getLogger("pgserver").setLevel(logging.WARNING)
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            server = get_server(data_dir, cleanup_mode="stop")
    except Exception as exc:
        log = data_dir / "log"
        detail = log.read_text(errors="replace")[-2000:] if log.exists() else str(exc)
        raise EmbeddedPostgresError(f"the embedded PostgreSQL in {data_dir} did not start:\n{detail}") from None
    return EmbeddedPostgres(data_dir=data_dir, admin_url=str(server.get_uri("postgres")), _server=server)
