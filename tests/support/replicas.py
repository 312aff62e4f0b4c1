"""``coatcheck serve`` replicas that a test can stop, kill and start again on the same port.

Every replica of a deployment shares one ``PUBLIC_URL`` (the load balancer's) and one configuration;
each has its own port and log file, which accumulates across restarts.
"""

import contextlib
import os
import secrets
import shutil
import signal as signals
import subprocess
import sys
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest

from tests.support import figures
from tests.support.devidp import (
    DEMO_CLIENT_ID,
    LOGIN_CLIENT_ID,
    DevIdP,
    devidp_clients,
    server_environment,
    start_devidp,
)
from tests.support.haproxy import HAPROXY, Balancer, start_haproxy
from tests.support.pgbouncer import PGBOUNCER, RunningPgBouncer, run_pgbouncer
from tests.support.scratch import scratch_database
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
                return httpx2.get(f"{self.url}/healthz", timeout=1).status_code == 200
            except httpx2.HTTPError:
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


# The deployment tests/deploy builds from these replicas: 3 behind HAProxy, PgBouncer in front of PostgreSQL.
REPLICAS = ("r1", "r2", "r3")
DRAIN_SECONDS = 2.0  # several HAProxy check intervals (200 ms, fall 2)
POOL_SIZE, MAX_OVERFLOW = 5, 0  # per replica: 3 x 5 client connections share PgBouncer's server pool
BOUNCER_POOL = 5


def note(line: str) -> None:
    """A line for the "replicas behind HAProxy and PgBouncer" section of the terminal summary."""
    figures.note("Replicas behind HAProxy and PgBouncer (issue 11)", line)


@dataclass
class Deployment:
    """The running parts, for tests to drive and inspect."""

    balancer: Balancer
    bouncer: RunningPgBouncer
    idp: DevIdP
    replicas: dict[str, Replica]
    database_url: str  # direct, for the test's own checks

    @property
    def mcp_url(self) -> str:
        return f"{self.balancer.url}/mcp"

    def wait_all_up(self) -> None:
        for name in self.replicas:
            self.balancer.wait_for(name, "UP")

    async def tokens(self, prefix: str, count: int) -> list[str]:
        return [await self.idp.token(f"{prefix}-{n}", resource=self.mcp_url) for n in range(count)]


@contextlib.contextmanager
def start_deployment(admin_database_url: str, log_dir: Path) -> Iterator[Deployment]:
    """compose.scale.yaml on real processes: ``REPLICAS`` behind HAProxy, PgBouncer in front of PostgreSQL.

    Migrations go straight to PostgreSQL (a scratch database built by ``alembic upgrade head`` on a direct
    connection, with the demo catalog); the replicas reach it only through PgBouncer in transaction-pooling
    mode with ``DB_POOLER_MODE=transaction``. A dev IdP of its own knows the balancer's URL as the public
    one, so the browser sign-in and the provider callbacks go through HAProxy too.
    """
    for binary in (HAPROXY, Path(PGBOUNCER)):
        if not binary.exists():
            pytest.fail(f"{binary} is missing: run .ci/system-packages (installs Debian's haproxy and pgbouncer)")
    assert shutil.which("node"), "the dev IdP needs Node.js"
    replicas = {name: Replica(name, log_dir, port=free_port()) for name in REPLICAS}
    client_secrets = {LOGIN_CLIENT_ID: secrets.token_urlsafe(32), DEMO_CLIENT_ID: secrets.token_urlsafe(32)}
    with (
        scratch_database(admin_database_url, demo_catalog=True) as database_url,
        run_pgbouncer(database_url, pool_size=BOUNCER_POOL) as bouncer,
        start_haproxy({name: r.port for name, r in replicas.items()}) as balancer,
    ):
        public_url = balancer.url
        clients = devidp_clients(public_url, client_secrets)
        with start_devidp(port=free_port(), resources=[f"{public_url}/mcp"], clients=clients) as idp:
            env = {
                **server_environment(
                    database_url=bouncer.url,
                    public_url=public_url,
                    idp=idp,
                    client_secrets=client_secrets,
                    # One key ring for every replica: any of them opens what another sealed.
                    request_state_keys=secrets.token_urlsafe(32),
                    token_encryption_keys=secrets.token_urlsafe(32),
                ),
                "DB_POOLER_MODE": "transaction",
                "SHUTDOWN_DRAIN_SECONDS": str(DRAIN_SECONDS),
                "FORWARDED_ALLOW_IPS": "127.0.0.1",  # HAProxy's X-Forwarded-For names the client
                "DB_POOL_SIZE": str(POOL_SIZE),
                "DB_MAX_OVERFLOW": str(MAX_OVERFLOW),
            }
            for replica in replicas.values():
                replica.configure(env)
            try:
                with ThreadPoolExecutor(len(replicas)) as pool:
                    list(pool.map(Replica.start, replicas.values()))
                deployment = Deployment(balancer, bouncer, idp, replicas, database_url)
                deployment.wait_all_up()
                yield deployment
            finally:
                for replica in replicas.values():
                    replica.ensure_stopped()
