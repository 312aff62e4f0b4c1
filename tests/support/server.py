"""Run ``coatcheck serve`` as a real process on a free port, the way an operator would."""

import contextlib
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx2

from tests.support.processes import answers_ok, stop_process
from tests.support.waiting import free_port, wait_until


@dataclass(frozen=True)
class RunningServer:
    """A started server: its base URL, MCP endpoint and captured log file."""

    base_url: str
    log_path: Path
    process: subprocess.Popen[bytes]

    @property
    def mcp_url(self) -> str:
        return f"{self.base_url}/mcp"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_text_so_far(self) -> str:
        """The log once every line of the requests answered so far is written (a writer thread writes them).

        Sends one more request and waits for its line: lines are written in the order they were logged.
        """
        marker = f"log-probe-{uuid.uuid4().hex}"
        httpx2.get(f"{self.base_url}/healthz", headers={"X-Request-Id": marker}, timeout=10.0)
        wait_until(lambda: marker in self.log_text(), timeout=10, what="the log probe's line")
        return self.log_text()


@contextlib.contextmanager
def run_server(
    env: Mapping[str, str],
    *,
    port: int | None = None,
    public_url: str | None = None,
    extra_args: Sequence[str] = (),
) -> Iterator[RunningServer]:
    """Start ``coatcheck serve`` with ``env`` (plus PUBLIC_URL for the chosen port) and stop it afterwards.

    ``extra_args`` are appended to the ``serve`` command line (e.g. ``--purge-every 1s``).
    """
    port = port or free_port()
    base_url = f"http://127.0.0.1:{port}"
    full_env = {**os.environ, **env, "PUBLIC_URL": public_url or env.get("PUBLIC_URL", base_url)}
    log = tempfile.NamedTemporaryFile(prefix="coatcheck-serve-", suffix=".log", delete=False)  # noqa: SIM115
    process = subprocess.Popen(
        [sys.executable, "-m", "api.cli", "serve", "--host", "127.0.0.1", "--port", str(port), *extra_args],
        env=full_env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=Path(__file__).resolve().parents[2],
    )
    server = RunningServer(base_url=base_url, log_path=Path(log.name), process=process)
    try:
        try:
            wait_until(lambda: answers_ok(f"{base_url}/healthz", process), timeout=30, what=f"coatcheck on port {port}")
        except (RuntimeError, TimeoutError) as exc:
            raise RuntimeError(f"{exc}\n--- server log ---\n{server.log_text()}") from None
        yield server
    finally:
        stop_process(process)
        log.close()
