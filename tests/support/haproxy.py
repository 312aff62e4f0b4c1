"""Run Debian's HAProxy (``/usr/sbin/haproxy``) round-robin in front of ``coatcheck serve`` replicas.

The generated configuration is the one docs/deployment.md recommends: ``/readyz`` health checks (a draining
replica answers 503 and leaves the rotation before it stops listening), ``retries`` + ``option redispatch``
so a request whose connection is refused goes to another replica, and ``option http-server-close`` so a
request is never written to a kept-alive server connection that a stopping replica is closing (that
failure could not be retried safely). Every response names the replica that served it in
``X-Coatcheck-Replica``, so tests can see where each request went. The admin socket reads server states
and takes servers in or out of the rotation.
"""

import contextlib
import csv
import io
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.support.processes import stop_process
from tests.support.waiting import free_port, wait_until

HAPROXY = Path("/usr/sbin/haproxy")
BACKEND = "replicas"
REPLICA_HEADER = "x-coatcheck-replica"
STARTUP_TIMEOUT = 10.0


def haproxy_config(*, port: int, servers: Mapping[str, int], admin_socket: Path, check_interval_ms: int) -> str:
    """An HAProxy configuration balancing ``servers`` (name → local port) behind ``127.0.0.1:port``."""
    lines = "\n".join(f"    server {name} 127.0.0.1:{server_port}" for name, server_port in servers.items())
    return f"""global
    stats socket {admin_socket} mode 600 level admin
    maxconn 2000

defaults
    mode http
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    # A busy replica may take a while to answer its check; only a refusal or a 503 should take it out.
    timeout check 3s
    # A refused connection (a replica that stopped or died) is retried on another replica.
    retries 3
    option redispatch 1
    option http-server-close

frontend coatcheck
    bind 127.0.0.1:{port}
    http-request set-header X-Forwarded-For %[src]
    default_backend {BACKEND}

backend {BACKEND}
    balance roundrobin
    option httpchk GET /readyz
    http-check expect status 200
    default-server check inter {check_interval_ms} fall 2 rise 2
    http-response set-header X-Coatcheck-Replica %[srv_name]
{lines}
"""


@dataclass(frozen=True)
class Balancer:
    """A running HAProxy: its public URL, admin socket and log."""

    url: str
    admin_socket: Path
    log_path: Path
    process: subprocess.Popen[bytes]

    def command(self, line: str) -> str:
        """One command on the admin socket (``show stat``, ``set server …``), its answer."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(str(self.admin_socket))
            sock.sendall(line.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def states(self) -> dict[str, str]:
        """Each replica's check state as HAProxy sees it: ``UP``, ``DOWN``, ``MAINT``, ``UP 1/2`` …"""
        table = self.command("show stat").lstrip("# ")
        rows = csv.DictReader(io.StringIO(table))
        return {
            row["svname"]: row["status"]
            for row in rows
            if row["pxname"] == BACKEND and row["svname"] not in {"FRONTEND", "BACKEND"}
        }

    def set_state(self, server: str, state: str) -> None:
        """``ready`` puts a server back in the rotation, ``maint`` takes it out."""
        answer = self.command(f"set server {BACKEND}/{server} state {state}")
        assert not answer.strip(), answer

    def wait_for(self, server: str, state: str, *, timeout: float = 20) -> None:
        wait_until(lambda: self.states().get(server) == state, timeout=timeout, what=f"{server} to be {state}")

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextlib.contextmanager
def start_haproxy(servers: Mapping[str, int], *, check_interval_ms: int = 200) -> Iterator[Balancer]:
    """Start HAProxy in the foreground in front of ``servers``; stop it when the block ends."""
    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix="coatcheck-haproxy-"))
    admin = workdir / "admin.sock"
    config = workdir / "haproxy.cfg"
    config.write_text(
        haproxy_config(port=port, servers=servers, admin_socket=admin, check_interval_ms=check_interval_ms)
    )
    check = subprocess.run([str(HAPROXY), "-c", "-q", "-f", str(config)], capture_output=True, text=True, check=False)
    if check.returncode != 0:
        raise RuntimeError(f"haproxy refused the generated configuration:\n{check.stderr}\n{config.read_text()}")
    log = tempfile.NamedTemporaryFile(prefix="coatcheck-haproxy-", suffix=".log", delete=False)  # noqa: SIM115
    process = subprocess.Popen(
        [str(HAPROXY), "-db", "-f", str(config)], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
    )
    balancer = Balancer(url=f"http://127.0.0.1:{port}", admin_socket=admin, log_path=Path(log.name), process=process)

    def listening() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"haproxy exited with {process.returncode}\n{balancer.log_text()}")
        return admin.exists()

    try:
        wait_until(listening, timeout=STARTUP_TIMEOUT, what="haproxy's admin socket")
        yield balancer
    finally:
        stop_process(process, timeout=10)
        log.close()
