"""The test suite's PostgreSQL on a machine without one: the PostgreSQL 16 of the ``pgserver`` wheel (the same
server ``coatcheck dev`` embeds), as a throwaway cluster on a free TCP port of 127.0.0.1.

TCP rather than pgserver's Unix socket, so everything that reaches the machine's PostgreSQL over TCP
(PgBouncer, ``coatcheck serve`` as another user) reaches this one the same way. PostgreSQL refuses to run as
root; as root the cluster runs as the ``pgserver`` system user, which pgserver itself creates for the purpose.
"""

import contextlib
import os
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

from tests.support.waiting import free_port

SYSTEM_USER = "pgserver"
START_TIMEOUT = 60


def _binaries() -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR unset
        from pgserver._commands import POSTGRES_BIN_PATH
    return Path(POSTGRES_BIN_PATH)


def _prepare_for_system_user(workdir: Path, binaries: Path) -> str | None:
    """As root: the user to run PostgreSQL as, able to reach ``workdir`` and the binaries (pgserver's helpers)."""
    if os.getuid() != 0:
        return None
    import stat

    from pgserver.utils import ensure_folder_permissions, ensure_prefix_permissions, ensure_user_exists

    ensure_user_exists(SYSTEM_USER)
    for path in (workdir, binaries):
        ensure_prefix_permissions(path)
    readable = stat.S_IRGRP | stat.S_IROTH
    ensure_folder_permissions(binaries, readable | stat.S_IXGRP | stat.S_IXOTH)
    ensure_folder_permissions(binaries.parent / "lib", readable)
    ensure_folder_permissions(binaries.parent / "share", readable)
    shutil.chown(workdir, SYSTEM_USER)
    return SYSTEM_USER


@contextlib.contextmanager
def embedded_postgres() -> Iterator[str]:
    """Start a fresh cluster; yield the URL of its ``postgres`` database; stop and delete it afterwards."""
    binaries = _binaries()
    workdir = Path(tempfile.mkdtemp(prefix="coatcheck-test-pg-"))
    data, log = workdir / "data", workdir / "server.log"
    user = _prepare_for_system_user(workdir, binaries)
    port = free_port()

    def run(*command: str) -> None:
        result = subprocess.run(
            list(command), user=user, capture_output=True, text=True, timeout=START_TIMEOUT, check=False
        )
        if result.returncode != 0:
            detail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"{command[0]} failed: {result.stdout}{result.stderr}{detail}")

    try:
        run(str(binaries / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync")
        options = f"-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={workdir} -c fsync=off"
        run(str(binaries / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", options, "-w", "start")
        try:
            yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
        finally:
            run(str(binaries / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
