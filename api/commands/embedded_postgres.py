"""An embedded PostgreSQL for development and for the test suite on a machine without one.

Uses the ``pgserver`` wheel (PostgreSQL 16 binaries inside a pip package; the ``dev`` extra,
``pip install -e '.[dev]'``): ``initdb`` on first use, then ``pg_ctl start`` on a Unix socket inside the data
directory (no TCP port, so nothing else on the machine can reach it). Running as root, pgserver runs the
server as a ``pgserver`` system user it creates, and makes the directories above the data directory
traversable for it.

The server trusts every local connection, so only the data directory (mode 0700, the server's own user)
may hold its socket. A Unix socket's path is limited (107 bytes on Linux): when the data directory's is too
long, pgserver would put the socket in its shared runtime directory instead, mode 0777 when running as root,
where any local user could connect as superuser. That is refused before anything starts (use a shorter
``--data-dir``), and a server found running with its socket anywhere else is refused too.

The wheel ships no contrib extensions (``pg_trgm``, ``pgcrypto``…): every migration must work without them.
"""

import asyncio
import logging
import socket
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
from sqlalchemy.engine import make_url

INSTALL_HINT = (
    "install the dev extra: pip install -e '.[dev]' -c constraints.txt in the checkout "
    "(the embedded PostgreSQL comes from the pgserver wheel)"
)
# The name PostgreSQL gives its socket on the default port (pgserver passes no port).
SOCKET_NAME = ".s.PGSQL.5432"


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


def require_embedded_postgres() -> None:
    """Check that the embedded PostgreSQL's packages import (pgserver and its ``psutil``).

    Raises:
        EmbeddedPostgresError: one of them is missing; the message names the extra to install.
    """
    try:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); pgserver then uses /tmp.
            warnings.simplefilter("ignore")
            import psutil  # type: ignore[import-untyped]  # noqa: F401
            from pgserver import postgres_server  # noqa: F401
    except ImportError as exc:
        missing = exc.name or "pgserver"
        raise EmbeddedPostgresError(
            f"the embedded PostgreSQL is not installed (no module named {missing!r}): {INSTALL_HINT}"
        ) from None


def socket_fits(directory: Path) -> bool:
    """Whether PostgreSQL's socket can be bound inside ``directory`` (its path is short enough)."""
    # A probe name as long as the real one; binding is the only exact test of the platform's limit.
    probe = directory / ".s.PGSQL.prob"
    probe.unlink(missing_ok=True)  # left by a run that was killed mid-probe
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(str(probe))
        except OSError:
            return False
    probe.unlink(missing_ok=True)
    return True


def start_embedded_postgres(data_dir: Path) -> EmbeddedPostgres:
    """Start (initialising on first use) PostgreSQL with its data in ``data_dir``; reuses a running one.

    Raises:
        EmbeddedPostgresError: pgserver is missing, ``data_dir``'s path is too long to hold the socket, the
            server would not start, or a running server's socket is outside ``data_dir``.
    """
    require_embedded_postgres()
    from pgserver.postgres_server import get_server

    logging.getLogger("pgserver").setLevel(logging.WARNING)
    data_dir = data_dir.resolve()
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not socket_fits(data_dir):
        socket_path = data_dir / SOCKET_NAME
        raise EmbeddedPostgresError(
            f"the data directory's path is too long for PostgreSQL's Unix socket ({socket_path}, "
            f"{len(str(socket_path).encode())} bytes; the limit is 107 on Linux, 103 on macOS): the socket "
            "must stay inside the data directory, so use a shorter --data-dir"
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            server = get_server(data_dir, cleanup_mode="stop")
    except Exception as exc:
        log = data_dir / "log"
        detail = log.read_text(errors="replace")[-2000:] if log.exists() else str(exc)
        raise EmbeddedPostgresError(f"the embedded PostgreSQL in {data_dir} did not start:\n{detail}") from None
    socket_dir: Path | None = server.get_postmaster_info().socket_dir  # None on a TCP port (Windows)
    if socket_dir is None or Path(socket_dir).resolve() != data_dir:
        # Started earlier (by an older version, or by pgserver directly) with its socket elsewhere.
        server.cleanup()
        raise EmbeddedPostgresError(
            f"the embedded PostgreSQL in {data_dir} listens on a socket outside its data directory "
            f"({socket_dir}); stop it (pg_ctl stop -D {data_dir}) and run again"
        )
    return EmbeddedPostgres(data_dir=data_dir, admin_url=str(server.get_uri("postgres")), _server=server)
