"""The embedded PostgreSQL of ``coatcheck dev`` keeps its trust-authenticated socket to itself.

As root (CI containers are), pgserver runs the server as its ``pgserver`` user. Its socket must be inside the
data directory (0700, that user's), whatever the path length: another local user must not reach it.
"""

import errno
import os
import pwd
import shutil
import socket
import stat
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import psutil  # type: ignore[import-untyped]
import pytest

from api.commands.embedded_postgres import SOCKET_NAME, EmbeddedPostgresError, start_embedded_postgres
from tests.support.waiting import wait_until


def _connect_errno(socket_path: Path, *, as_user: str | None = None) -> int:
    """The errno of connecting to ``socket_path`` (0: connected), as ``as_user`` in a forked child if given.

    A fork rather than a subprocess: no interpreter has to be reachable by that user, only the kernel decides.
    """
    entry = pwd.getpwnam(as_user) if as_user else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Python 3.12+ warns about fork() with threads
        pid = os.fork()
    if pid == 0:  # the child: drop to the user, try, report, and never return into pytest
        code = 255
        try:
            if entry is not None:
                os.setgroups([])
                os.setgid(entry.pw_gid)
                os.setuid(entry.pw_uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.connect(str(socket_path))
            code = 0
        except OSError as exc:
            code = exc.errno or 255
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.fixture
def workdir() -> Iterator[Path]:
    # Outside pytest's basetemp, which pytest sets back to 0700 while pgserver's user needs to traverse it.
    path = Path(tempfile.mkdtemp(prefix="coatcheck-pg-test-"))
    try:
        yield path
    finally:
        for process in psutil.process_iter(attrs=["name", "cmdline"]):
            if process.info["name"] == "postgres" and str(path) in " ".join(process.info["cmdline"] or []):
                process.kill()
        shutil.rmtree(path, ignore_errors=True)


def _postgres_running_in(path: Path) -> bool:
    return any(
        process.info["name"] == "postgres" and str(path) in " ".join(process.info["cmdline"] or [])
        for process in psutil.process_iter(attrs=["name", "cmdline"])
    )


def test_a_data_directory_too_long_for_the_socket_is_refused_before_any_server_starts(workdir: Path) -> None:
    data_dir = workdir / ("d" * 60) / ("e" * 60) / "postgres"
    assert len(str(data_dir / SOCKET_NAME).encode()) > 107
    try:
        started = start_embedded_postgres(data_dir)
    except EmbeddedPostgresError as exc:
        refusal = str(exc)
    else:
        started.stop()  # without the fix: the server started, with its socket somewhere else
        pytest.fail(f"started with its socket outside the data directory: {started.admin_url}")
    assert "too long for PostgreSQL's Unix socket" in refusal
    assert "use a shorter --data-dir" in refusal
    assert not _postgres_running_in(workdir)
    assert not (data_dir / "PG_VERSION").exists()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run as another user")
def test_the_embedded_server_socket_is_in_its_0700_data_directory_out_of_another_users_reach(workdir: Path) -> None:
    workdir.chmod(0o755)
    data_dir = workdir / "postgres"
    embedded = start_embedded_postgres(data_dir)
    try:
        socket_path = data_dir / SOCKET_NAME
        assert stat.S_ISSOCK(socket_path.stat().st_mode)
        assert f"host={data_dir}" in embedded.admin_url
        assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
        assert _connect_errno(socket_path) == 0  # the probe reaches a socket it may reach
        assert _connect_errno(socket_path, as_user="nobody") == errno.EACCES
    finally:
        embedded.stop()
    wait_until(lambda: not _postgres_running_in(workdir), timeout=30, what="the embedded PostgreSQL to stop")
