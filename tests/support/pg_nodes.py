"""Private PostgreSQL servers a test may break: a primary, a real streaming standby of it, freeze and thaw.

Started from Debian's PostgreSQL 15 binaries in a temporary directory on free loopback ports, as the
``postgres`` user when the tests run as root, and removed afterwards. A standby is a ``pg_basebackup -R`` of
its primary, so it replays the primary's WAL and answers reads but refuses writes (SQLSTATE 25006), as a
demoted primary does after a failover.
"""

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]

from tests.support.private_postgres import BIN
from tests.support.waiting import free_port

_AS_POSTGRES: dict[str, str] = {"user": "postgres", "group": "postgres"} if os.getuid() == 0 else {}


def _run(command: list[str], *, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    # initdb and the server refuse to run as root; CI containers usually are root.
    return subprocess.run(command, check=check, capture_output=True, **_AS_POSTGRES)  # type: ignore[call-overload, no-any-return]


@dataclass
class PgNode:
    """One PostgreSQL server of its own: its data directory, port and log; start, stop, freeze, thaw."""

    name: str
    workdir: Path
    port: int
    settings: tuple[str, ...] = ()
    frozen: list[int] = field(default_factory=list)

    @property
    def data(self) -> Path:
        return self.workdir / self.name

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.name}.log"

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        options = " ".join(
            [
                f"-p {self.port}",
                "-c listen_addresses=127.0.0.1",
                f"-c unix_socket_directories={self.workdir}",
                "-c fsync=off",
                "-c log_line_prefix='%m [%p] '",
                *(f"-c {setting}" for setting in self.settings),
            ]
        )
        _run([str(BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log_path), "-o", options, "-w", "start"])

    def stop(self, mode: str = "fast") -> None:
        self.thaw()
        _run([str(BIN / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop"], check=False)

    def promote(self) -> None:
        _run([str(BIN / "pg_ctl"), "-D", str(self.data), "-w", "promote"])

    def pids(self) -> list[int]:
        """The postmaster and every one of its children (backends, walsender, checkpointer …)."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        children = subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True, text=True, check=False)
        return [postmaster, *(int(pid) for pid in children.stdout.split())]

    def freeze(self) -> None:
        """SIGSTOP the whole server: its sockets stay open and the kernel still ACKs, but nothing answers."""
        self.frozen = self.pids()
        for pid in self.frozen:
            os.kill(pid, signal.SIGSTOP)

    def thaw(self) -> None:
        for pid in self.frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self.frozen = []

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


async def fetchval(url: str, query: str, *args: object) -> object:
    """One value from a fresh connection of its own (the test's view, not the pool's)."""
    conn = await asyncpg.connect(url, timeout=10)
    try:
        return await conn.fetchval(query, *args)
    finally:
        await conn.close()


@contextlib.contextmanager
def _workdir() -> Iterator[Path]:
    workdir = Path(tempfile.mkdtemp(prefix="coatcheck-nodes-"))
    if os.getuid() == 0:
        shutil.chown(workdir, "postgres")
    try:
        yield workdir
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@contextlib.contextmanager
def primary_and_standby(*, standby: bool = True, primary_settings: tuple[str, ...] = ()) -> Iterator[list[PgNode]]:
    """A primary (``[0]``) and, if asked, a streaming hot standby of it (``[1]``, application_name "standby")."""
    with _workdir() as workdir:
        primary = PgNode(
            "primary",
            workdir,
            free_port(),
            ("wal_level=replica", "max_wal_senders=5", "hot_standby=on", *primary_settings),
        )
        _run([str(BIN / "initdb"), "-D", str(primary.data), "-U", "postgres", "-A", "trust", "--no-sync"])
        nodes = [primary]
        try:
            primary.start()
            if standby:
                replica = PgNode("standby", workdir, free_port(), ("hot_standby=on",))
                _run(
                    [
                        str(BIN / "pg_basebackup"),
                        "-h",
                        "127.0.0.1",
                        "-p",
                        str(primary.port),
                        "-U",
                        "postgres",
                        "-D",
                        str(replica.data),
                        "-R",  # standby.signal + primary_conninfo: it streams from the primary
                        "-X",
                        "stream",
                        "--no-sync",
                    ]
                )
                with (replica.data / "postgresql.auto.conf").open("a") as conf:
                    conf.write(
                        f"primary_conninfo = 'host=127.0.0.1 port={primary.port} user=postgres "
                        "application_name=standby'\n"
                    )
                nodes.append(replica)
                replica.start()
            yield nodes
        finally:
            for node in reversed(nodes):
                node.stop("immediate")
