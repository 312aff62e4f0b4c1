"""Run Debian's PgBouncer (``/usr/sbin/pgbouncer``) in front of the test PostgreSQL, on a free port.

The ini is generated per test run: transaction pooling, a fixed server pool per database, no Unix socket,
logging to the captured output. ``auth_type = any`` lets any client name in; PgBouncer logs in to
PostgreSQL as the user of the upstream URL (the test server trusts local connections).
"""

import asyncio
import contextlib
import os
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
from sqlalchemy.engine import make_url

from tests.support.waiting import free_port, wait_until

PGBOUNCER = Path("/usr/sbin/pgbouncer")
STARTUP_TIMEOUT = 15.0


@dataclass(frozen=True)
class PgBouncer:
    """A running PgBouncer: the URL clients use instead of PostgreSQL's, and its captured log."""

    url: str
    pool_size: int
    log_path: Path
    process: subprocess.Popen[bytes]

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


def _ini(upstream: str, *, port: int, pool_mode: str, pool_size: int) -> str:
    url = make_url(upstream)
    return f"""[databases]
* = host={url.host or "127.0.0.1"} port={url.port or 5432} user={url.username or "postgres"}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = any
pool_mode = {pool_mode}
default_pool_size = {pool_size}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 500
server_lifetime = 3600
log_connections = 0
log_disconnections = 0
"""


async def _answers(url: str) -> bool:
    try:
        conn = await asyncpg.connect(url, timeout=2, statement_cache_size=0)
    except (OSError, asyncpg.PostgresError, TimeoutError):
        return False
    try:
        return bool(await conn.fetchval("SELECT 1") == 1)
    finally:
        await conn.close()


@contextlib.contextmanager
def start_pgbouncer(upstream: str, *, pool_mode: str = "transaction", pool_size: int = 6) -> Iterator[PgBouncer]:
    """Start PgBouncer pooling ``upstream``'s server; yields a URL for the same database through it."""
    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix="coatcheck-pgbouncer-"))
    workdir.chmod(0o755)  # PgBouncer drops root for another user, which must still read the ini
    ini = workdir / "pgbouncer.ini"
    ini.write_text(_ini(upstream, port=port, pool_mode=pool_mode, pool_size=pool_size))
    ini.chmod(0o644)
    command = [str(PGBOUNCER), str(ini)]
    if os.geteuid() == 0:
        command[1:1] = ["-u", "postgres"]  # PgBouncer refuses to run as root
    log = tempfile.NamedTemporaryFile(prefix="coatcheck-pgbouncer-", suffix=".log", delete=False)  # noqa: SIM115
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    through = make_url(upstream).set(host="127.0.0.1", port=port).render_as_string(hide_password=False)
    bouncer = PgBouncer(url=through, pool_size=pool_size, log_path=Path(log.name), process=process)
    dsn = make_url(through).set(drivername="postgresql").render_as_string(hide_password=False)

    def answers() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"pgbouncer exited with {process.returncode}\n--- log ---\n{bouncer.log_text()}")
        return asyncio.run(_answers(dsn))

    try:
        wait_until(answers, timeout=STARTUP_TIMEOUT, what=f"pgbouncer on port {port}", interval=0.1)
        yield bouncer
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
