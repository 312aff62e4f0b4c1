"""A throwaway PostgreSQL cluster with server settings the shared one must not get (statement logging).

Started from the installed server binaries in a temporary directory on a free port, as the ``postgres``
user when the tests run as root, and removed afterwards. Its log is a file the test reads: PostgreSQL's
own account of every parse, bind, execute and simple-query statement a session sent.
"""

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.waiting import free_port

BIN = Path("/usr/lib/postgresql/15/bin")

# "... [pid] LOG:  duration: 0.041 ms  execute __asyncpg_stmt_3__: SELECT ..." or "... statement: BEGIN"
_ENTRY = re.compile(r"\[(\d+)\] LOG:  duration: [\d.]+ ms  (parse|bind|execute|statement)( [^:]*)?: (.*)")


@dataclass(frozen=True)
class LoggedMessage:
    """One protocol step PostgreSQL logged: ``kind`` is parse, bind, execute or statement (simple query)."""

    pid: int
    kind: str
    text: str


@dataclass
class PrivatePostgres:
    """A running private cluster: its admin URL and its statement log."""

    url: str
    log_path: Path

    def log_size(self) -> int:
        return self.log_path.stat().st_size

    def messages_since(self, offset: int) -> list[LoggedMessage]:
        """The logged protocol steps written after byte ``offset`` of the log."""
        with self.log_path.open("rb") as log:
            log.seek(offset)
            lines = log.read().decode(errors="replace").splitlines()
        found = []
        for line in lines:
            match = _ENTRY.search(line)
            if match:
                found.append(LoggedMessage(pid=int(match[1]), kind=match[2], text=match[4]))
        return found


def _run(command: list[str], *, check: bool = True) -> None:
    # initdb and the server refuse to run as root; CI containers usually are root.
    as_postgres: dict[str, str] = {"user": "postgres", "group": "postgres"} if os.getuid() == 0 else {}
    subprocess.run(command, check=check, capture_output=True, **as_postgres)  # type: ignore[call-overload]


@contextlib.contextmanager
def private_postgres(*settings: str) -> Iterator[PrivatePostgres]:
    """Start a private cluster that logs every statement with its protocol step, and remove it afterwards.

    ``settings`` are extra ``name=value`` server settings.
    """
    workdir = Path(tempfile.mkdtemp(prefix="coatcheck-pg-"))
    data, log_path = workdir / "data", workdir / "server.log"
    if os.getuid() == 0:
        shutil.chown(workdir, "postgres")
    port = free_port()
    _run([str(BIN / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "--no-sync"])
    options = " ".join(
        [
            f"-p {port}",
            "-c listen_addresses=127.0.0.1",
            f"-c unix_socket_directories={workdir}",
            "-c log_min_duration_statement=0",  # every parse/bind/execute and simple query, with its kind
            "-c log_line_prefix='%m [%p] '",
            "-c fsync=off",
            *(f"-c {setting}" for setting in settings),
        ]
    )
    _run([str(BIN / "pg_ctl"), "-D", str(data), "-l", str(log_path), "-o", options, "-w", "start"])
    try:
        yield PrivatePostgres(url=f"postgresql://postgres@127.0.0.1:{port}/postgres", log_path=log_path)
    finally:
        _run([str(BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"], check=False)
        shutil.rmtree(workdir, ignore_errors=True)
