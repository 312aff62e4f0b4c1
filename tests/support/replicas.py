"""``coatcheck serve`` replicas that a test can stop, kill and start again on the same port.

Every replica of a deployment shares one ``PUBLIC_URL`` (the load balancer's) and one configuration;
each has its own port and log file, which accumulates across restarts.
"""

import os
import signal as signals
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import httpx

from tests.support.waiting import free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 45.0


class Replica:
    """One ``coatcheck serve`` process of a deployment (started by :meth:`start`)."""

    def __init__(self, name: str, log_dir: Path, *, port: int | None = None) -> None:
        self.name = name
        self.port = port or free_port()
        self.env: dict[str, str] = dict(os.environ)
        self.log_path = log_dir / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.exit_codes: list[int] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def configure(self, env: Mapping[str, str]) -> None:
        """The settings of the next start (on top of this process's environment)."""
        self.env = {**os.environ, **env}

    def start(self) -> None:
        """Start the process and wait until ``/healthz`` answers."""
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "api.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port)],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
            )
        process = self.process

        def healthy() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {process.returncode}:\n{self.log_text()[-3000:]}")
            try:
                return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(healthy, timeout=START_TIMEOUT, what=f"replica {self.name} on port {self.port}")

    def signal(self, sig: int) -> None:
        assert self.process is not None, f"{self.name} is not running"
        self.process.send_signal(sig)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait(self, *, timeout: float = 30) -> int:
        """Wait for the process to end; its exit status (negative: killed by that signal)."""
        assert self.process is not None, f"{self.name} is not running"
        code = self.process.wait(timeout=timeout)
        self.exit_codes.append(code)
        self.process = None
        return code

    def stop(self, sig: int = signals.SIGTERM, *, timeout: float = 30) -> int:
        """Send ``sig`` and wait for the process to end; its exit status."""
        self.signal(sig)
        return self.wait(timeout=timeout)

    def ensure_stopped(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
