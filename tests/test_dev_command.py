"""``coatcheck dev`` as a newcomer runs it: no DATABASE_URL, an empty directory, then Ctrl-C, then again.

The first run initialises the embedded PostgreSQL (pgserver), starts the dev IdP, migrates, seeds and
serves; a tool call through the official SDK client with a dev token creates a cart. SIGINT stops every
process it started. The second run reuses the data directory: the same token (the dev IdP's keys are kept
there too) finds the same cart.
"""

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx2
import psutil  # type: ignore[import-untyped]
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.support.mcp_client import cart_with_first_product
from tests.support.waiting import free_port, wait_until

REPO = Path(__file__).resolve().parents[1]
START_TIMEOUT = 120.0  # the first run may npm install the dev IdP
STOP_TIMEOUT = 60.0


@dataclass
class DevRun:
    """A running ``coatcheck dev``: its process and everything it printed so far."""

    process: subprocess.Popen[str]
    port: int
    idp_port: int
    lines: list[str] = field(default_factory=list)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    @property
    def mcp_url(self) -> str:
        return f"http://localhost:{self.port}/mcp"


def _answers(url: str) -> bool:
    try:
        return httpx2.get(url, timeout=1.0).status_code == 200
    except httpx2.HTTPError:
        return False


def _environment() -> dict[str, str]:
    # A newcomer's shell: no DATABASE_URL, nothing of a server configuration.
    return {key: value for key, value in os.environ.items() if key not in {"DATABASE_URL", "PUBLIC_URL"}}


def _ports(port: int, idp_port: int) -> list[str]:
    return ["--port", str(port), "--idp-port", str(idp_port)]


@contextmanager
def coatcheck_dev(data_dir: Path, cwd: Path, port: int, idp_port: int) -> Iterator[DevRun]:
    """Start ``coatcheck dev``, wait until it serves, and make sure it is gone when the block ends."""
    process = subprocess.Popen(
        [sys.executable, "-m", "api.cli", "dev", "--data-dir", str(data_dir), *_ports(port, idp_port)],
        cwd=cwd,
        env=_environment(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    run = DevRun(process=process, port=port, idp_port=idp_port)
    assert process.stdout is not None
    stdout = process.stdout
    reader = threading.Thread(target=lambda: run.lines.extend(iter(stdout.readline, "")), daemon=True)
    reader.start()
    try:

        def serving() -> bool:
            assert process.poll() is None, f"coatcheck dev exited with {process.returncode}:\n{run.output}"
            return _answers(f"http://127.0.0.1:{port}/readyz")

        try:
            wait_until(serving, timeout=START_TIMEOUT, what="coatcheck dev to serve")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{run.output}") from None
        yield run
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        reader.join(timeout=10)
        stdout.close()


def _stop_with_sigint(run: DevRun) -> None:
    run.process.send_signal(signal.SIGINT)
    try:
        run.process.wait(timeout=STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"coatcheck dev ignored SIGINT:\n{run.output}") from None
    assert run.process.returncode == 0, run.output


def _postgres_processes(data_dir: Path) -> list[psutil.Process]:
    return [
        process
        for process in psutil.process_iter(attrs=["name", "cmdline"])
        if process.info["name"] == "postgres" and str(data_dir) in " ".join(process.info["cmdline"] or [])
    ]


async def _dev_token(run: DevRun, username: str) -> str:
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(10.0)) as http:
        response = await http.post(
            f"http://localhost:{run.idp_port}/dev/token", json={"username": username, "resource": run.mcp_url}
        )
    assert response.status_code == 200, response.text
    token = response.json()["access_token"]
    assert isinstance(token, str)
    return token


@contextmanager
def _no_leftovers(data_dir: Path) -> Iterator[None]:
    try:
        yield
    finally:
        for process in _postgres_processes(data_dir):
            process.kill()


@pytest.fixture
def dev_workdir() -> Iterator[Path]:
    """A working directory outside pytest's basetemp.

    As root, pgserver runs PostgreSQL as its own ``pgserver`` user and opens up the directories above the data
    directory; pytest sets its ``/tmp/pytest-of-<user>`` back to 0700 whenever another pytest process starts
    (the embedded-fallback test runs one), which would lock that user out mid-run.
    """
    workdir = Path(tempfile.mkdtemp(prefix="coatcheck-dev-test-"))
    try:
        yield workdir
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


async def test_coatcheck_dev_serves_the_whole_stack_stops_on_sigint_and_keeps_the_cart_for_the_next_run(
    dev_workdir: Path,
) -> None:
    tmp_path = dev_workdir
    data_dir = tmp_path / "dev-data"
    port, idp_port = free_port(), free_port()
    username = f"newcomer-{uuid.uuid4().hex[:8]}"
    with _no_leftovers(data_dir):
        with coatcheck_dev(data_dir, tmp_path, port, idp_port) as first:
            output = first.output
            assert "DEVELOPMENT ONLY, NOT FOR PRODUCTION" in output
            assert f"claude mcp add --transport http coatcheck http://localhost:{port}/mcp" in output
            assert "claude mcp login coatcheck" in output
            assert f"--cli http://localhost:{port}/mcp --protocol-era modern" in output
            assert f"http://localhost:{idp_port}/dev/token" in output
            assert "initialised" in output

            token = await _dev_token(first, username)
            http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30.0))
            async with http, Client(streamable_http_client(first.mcp_url, http_client=http)) as client:
                cart_id, sku = await cart_with_first_product(client, quantity=3)

            assert _postgres_processes(data_dir), "the embedded PostgreSQL is not running from the data directory"
            _stop_with_sigint(first)
            assert "stopped" in first.output
            assert not _answers(f"http://127.0.0.1:{idp_port}/.well-known/openid-configuration"), "dev IdP still up"
            wait_until(lambda: not _postgres_processes(data_dir), timeout=30, what="the embedded PostgreSQL to stop")

        secrets_file = data_dir / "secrets.json"
        assert stat.S_IMODE(secrets_file.stat().st_mode) == 0o600

        with coatcheck_dev(data_dir, tmp_path, port, idp_port) as second:
            assert "reusing the data and secrets" in second.output
            assert "initialised" not in second.output
            # The token from the first run: the dev IdP's signing keys survived too.
            http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30.0))
            async with http, Client(streamable_http_client(second.mcp_url, http_client=http)) as client:
                viewed = await client.call_tool("cart_view", {"cart_id": cart_id})
                assert not viewed.is_error, viewed
                assert viewed.structured_content is not None
                assert [(item["sku"], item["quantity"]) for item in viewed.structured_content["items"]] == [(sku, 3)]
            _stop_with_sigint(second)
            wait_until(lambda: not _postgres_processes(data_dir), timeout=30, what="the embedded PostgreSQL to stop")


def test_coatcheck_dev_without_node_says_it_needs_node_20_and_starts_nothing(tmp_path: Path) -> None:
    env = {**_environment(), "PATH": str(Path(sys.executable).parent)}
    result = subprocess.run(
        [sys.executable, "-m", "api.cli", "dev", "--data-dir", str(tmp_path / "dev-data")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "needs Node.js 20 or newer" in result.stderr
    assert not (tmp_path / "dev-data").exists()


def _dev_once(data_dir: Path, cwd: Path, *, prelude: str = "") -> subprocess.CompletedProcess[str]:
    """``coatcheck dev`` run to its end (it must refuse before serving), after ``prelude`` Python lines."""
    argv = ["dev", "--data-dir", str(data_dir), *_ports(free_port(), free_port())]
    program = f"{prelude}\nfrom api.cli import main\nmain({argv!r})\n"
    return subprocess.run(
        [sys.executable, "-c", program],
        cwd=cwd,
        env={**_environment(), "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_coatcheck_dev_refuses_a_secrets_file_that_is_a_symbolic_link_and_leaves_its_target_alone(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "dev-data"
    data_dir.mkdir(mode=0o700)
    target = tmp_path / "someone-elses-file"
    target.write_text("not yours\n")
    target.chmod(0o644)
    (data_dir / "secrets.json").symlink_to(target)
    result = _dev_once(data_dir, tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"coatcheck dev: {data_dir / 'secrets.json'} is a symbolic link" in result.stderr
    assert "Traceback" not in result.stderr
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert target.read_text() == "not yours\n"
    assert not (data_dir / "postgres").exists()


@pytest.mark.skipif(os.getuid() != 0, reason="only root can give a file to another user")
def test_coatcheck_dev_refuses_a_secrets_file_owned_by_another_user(tmp_path: Path) -> None:
    from api.commands.dev import DevError, load_or_create_secrets

    path = tmp_path / "secrets.json"
    secrets_json = '{"REQUEST_STATE_KEYS": "a", "TOKEN_ENCRYPTION_KEYS": "b", "OIDC_CLIENT_SECRET": "c", '
    path.write_text(secrets_json + '"DEMO_CLIENT_SECRET": "d"}')
    path.chmod(0o644)
    os.chown(path, 65534, 65534)  # nobody
    with pytest.raises(DevError, match="is not owned by the user running coatcheck dev"):
        load_or_create_secrets(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    path.chmod(0o600)
    os.chown(path, os.getuid(), os.getgid())
    assert load_or_create_secrets(path)[1] is False  # the same file, once it is the user's, is used


def test_coatcheck_dev_without_the_dev_extra_names_the_extra_to_install_and_starts_nothing(tmp_path: Path) -> None:
    # The dev extra's psutil, as a plain `pip install -e .` leaves it: not importable.
    result = _dev_once(tmp_path / "dev-data", tmp_path, prelude="import sys\nsys.modules['psutil'] = None")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "no module named 'psutil'" in result.stderr
    assert "install the dev extra: pip install -e '.[dev]'" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "dev-data").exists()
