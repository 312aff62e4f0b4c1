"""Run Debian's PgBouncer (1.18) as a real transaction-mode pooler in front of the test PostgreSQL."""

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import make_url

from tests.support.processes import stop_process
from tests.support.waiting import free_port, wait_until

PGBOUNCER = "/usr/sbin/pgbouncer"


@dataclass(frozen=True)
class RunningPgBouncer:
    """A started PgBouncer: the URL that reaches the target database through it, and its log."""

    url: str
    log_path: Path

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def _unprivileged() -> str | None:
    # PgBouncer refuses to run as root; CI containers usually are root.
    return "postgres" if os.getuid() == 0 else None


def _accepting(port: int, process: subprocess.Popen[bytes]) -> bool:
    if process.poll() is not None:
        raise RuntimeError(f"pgbouncer exited with {process.returncode}")
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True
    return False


@contextlib.contextmanager
def run_pgbouncer(
    database_url: str, *, pool_mode: str = "transaction", pool_size: int = 20
) -> Iterator[RunningPgBouncer]:
    """Start PgBouncer on a free port, pooling ``database_url``'s database in ``pool_mode``.

    The generated ini is PgBouncer's stock configuration apart from the target and the pool: in
    particular no ``ignore_startup_parameters``, so a client that sends ``statement_timeout`` (or any
    other unsupported startup parameter) is refused, as it would be in production.
    """
    target = make_url(database_url)
    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix="coatcheck-pgbouncer-"))
    workdir.chmod(0o755)
    user = target.username or "postgres"
    (workdir / "userlist.txt").write_text(f'"{user}" ""\n')
    log_path = workdir / "pgbouncer.log"
    (workdir / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"{target.database} = host={target.host or '127.0.0.1'} port={target.port or 5432} dbname={target.database}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        f"unix_socket_dir = {workdir}\n"
        "auth_type = trust\n"
        f"auth_file = {workdir / 'userlist.txt'}\n"
        f"pool_mode = {pool_mode}\n"
        f"default_pool_size = {pool_size}\n"
        "max_client_conn = 500\n"
        f"pidfile = {workdir / 'pgbouncer.pid'}\n"
    )
    if os.getuid() == 0:
        shutil.chown(workdir, "postgres")
        for child in workdir.iterdir():
            shutil.chown(child, "postgres")
    log = log_path.open("wb")
    process = subprocess.Popen(
        [PGBOUNCER, str(workdir / "pgbouncer.ini")],
        stdout=log,
        stderr=subprocess.STDOUT,
        user=_unprivileged(),
        group=_unprivileged(),
    )
    url = target.set(host="127.0.0.1", port=port).render_as_string(hide_password=False)
    running = RunningPgBouncer(url=url, log_path=log_path)
    try:
        try:
            wait_until(lambda: _accepting(port, process), timeout=15, what=f"pgbouncer on port {port}")
        except (RuntimeError, TimeoutError) as exc:
            raise RuntimeError(f"{exc}\n--- pgbouncer log ---\n{running.log_text()}") from None
        yield running
    finally:
        stop_process(process, timeout=10)
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)
