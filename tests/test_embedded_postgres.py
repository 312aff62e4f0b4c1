"""The embedded PostgreSQL of ``coatcheck dev`` keeps its trust-authenticated socket to itself.

As root (CI containers are), pgserver runs the server as its ``pgserver`` user. Its socket must be inside the
data directory (0700, that user's), whatever the path length: another local user must not reach it.
"""

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil  # type: ignore[import-untyped]
import pytest

from api.commands.embedded_postgres import SOCKET_NAME, EmbeddedPostgresError, start_embedded_postgres
from tests.support.waiting import wait_until

# Where another local user tries to connect: plain sockets, so nothing but the kernel decides.
CONNECT_AS_NOBODY = "import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])"


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
        tried = subprocess.run(
            ["/usr/bin/python3", "-c", CONNECT_AS_NOBODY, str(socket_path)],
            user="nobody",
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert tried.returncode != 0
        assert "PermissionError" in tried.stderr
    finally:
        embedded.stop()
    wait_until(lambda: not _postgres_running_in(workdir), timeout=30, what="the embedded PostgreSQL to stop")
