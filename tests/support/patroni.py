"""A real HA PostgreSQL on loopback: one etcd member, three Patroni-managed PostgreSQL 15 nodes, HAProxy in front.

Debian's packages (``etcd-server``, ``patroni``, ``haproxy``; .ci/system-packages installs them), every port
free, everything under one temporary directory, every process stopped at the end. Patroni runs in
``synchronous_mode`` with ``synchronous_mode_strict`` (docs/deployment.md "Behind Patroni": the mode that
lost no acknowledged commit in the measurements). HAProxy checks Patroni's ``GET /primary`` (200 on the
leader only) with the timings of Patroni's example configuration, with or without
``on-marked-down shutdown-sessions``.
"""

import contextlib
import csv
import io
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2

from tests.support.haproxy import HAPROXY
from tests.support.private_postgres import BIN
from tests.support.processes import stop_process
from tests.support.waiting import free_port, wait_until

ETCD = Path("/usr/bin/etcd")
PATRONI = Path("/usr/bin/patroni")
SCOPE = "coatcheck"
# Patroni's default ttl is 30 s and loop_wait 10 s; shorter here so a restart is noticed within seconds.
# (loop_wait + 2 * retry_timeout <= ttl, as Patroni requires.)
TTL, LOOP_WAIT, RETRY_TIMEOUT = 20, 2, 5
# Patroni's example HAProxy timings: a node is taken out after fall x inter, put back after rise x inter.
CHECK_INTER_S, CHECK_FALL, CHECK_RISE = 3, 3, 2

_AS_POSTGRES: dict[str, Any] = {"user": "postgres", "group": "postgres"} if os.getuid() == 0 else {}


@dataclass
class Node:
    """One Patroni member: its PostgreSQL port, REST port and data directory."""

    name: str
    pg_port: int
    rest_port: int
    workdir: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def data(self) -> Path:
        return self.workdir / self.name

    @property
    def rest_url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.name}.patroni.log"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.pg_port}/{database}"

    def postmaster_pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split()[0])


@dataclass
class Balancer:
    """An HAProxy in TCP mode routing to whichever node answers ``GET /primary`` with 200."""

    port: int
    process: subprocess.Popen[bytes]
    shutdown_sessions: bool
    log_path: Path
    admin_socket: Path

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def states(self) -> dict[str, str]:
        """Each node's check state as HAProxy sees it (``UP``, ``DOWN``, ``UP 1/2`` …)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(str(self.admin_socket))
            sock.sendall(b"show stat\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        rows = csv.DictReader(io.StringIO(b"".join(chunks).decode().lstrip("# ")))
        return {
            row["svname"]: row["status"]
            for row in rows
            if row["pxname"] == "primary" and row["svname"] not in {"FRONTEND", "BACKEND"}
        }

    def routes_only_to(self, name: str) -> bool:
        """Whether HAProxy has exactly ``name`` UP (and so sends every new connection there)."""
        states = self.states()
        return states.get(name) == "UP" and all(s.startswith("DOWN") for n, s in states.items() if n != name)


@dataclass
class Cluster:
    """The running cluster: its nodes, etcd and the balancers."""

    workdir: Path
    nodes: list[Node]
    etcd_port: int
    balancers: list[Balancer] = field(default_factory=list)

    def cluster_state(self) -> dict[str, Any]:
        """Patroni's ``GET /cluster`` from the first node that answers."""
        for node in self.nodes:
            with contextlib.suppress(httpx2.HTTPError, ValueError):
                response = httpx2.get(f"{node.rest_url}/cluster", timeout=2)
                if response.status_code == 200:
                    return dict(response.json())
        return {"members": []}

    def leader(self) -> Node | None:
        members = self.cluster_state().get("members", [])
        names = [m["name"] for m in members if m.get("role") == "leader" and m.get("state") == "running"]
        return next((node for node in self.nodes if node.name in names), None)

    def healthy(self) -> bool:
        """A running leader, both replicas streaming, one of them the synchronous standby."""
        members = self.cluster_state().get("members", [])
        leaders = [m for m in members if m.get("role") == "leader" and m.get("state") == "running"]
        streaming = [
            m
            for m in members
            if m.get("role") in {"replica", "sync_standby"} and m.get("state") in {"running", "streaming"}
        ]
        sync = [m for m in members if m.get("role") == "sync_standby"]
        return len(leaders) == 1 and len(streaming) == 2 and len(sync) == 1

    def wait_healthy(self, timeout: float = 90) -> None:
        wait_until(
            self.healthy, timeout=timeout, what="a leader with a synchronous standby and a second replica", interval=0.5
        )

    def switchover(self) -> tuple[str, str]:
        """A planned switchover through the leader's REST API; (old leader, new leader) once it is done."""
        leader = self.leader()
        assert leader is not None, self.cluster_state()
        answers: list[httpx2.Response] = []

        def accepted() -> bool:
            # The leader checks pg_stat_replication itself; just after /cluster shows a sync standby it may not
            # see one yet and answer 412 "can not find sync_standby". Anything else ends the wait.
            answers.append(httpx2.post(f"{leader.rest_url}/switchover", json={"leader": leader.name}, timeout=60))
            return not (answers[-1].status_code == 412 and "sync_standby" in answers[-1].text)

        wait_until(accepted, timeout=30, what="the leader to accept the switchover", interval=0.5)
        response = answers[-1]
        assert response.status_code == 200, response.text
        wait_until(lambda: (self.leader() or leader).name != leader.name, timeout=60, what="a new leader", interval=0.2)
        new = self.leader()
        assert new is not None
        return leader.name, new.name

    def kill_leader_postmaster(self) -> str:
        """SIGKILL the leader's postmaster (Patroni restarts PostgreSQL in place); the leader's name."""
        leader = self.leader()
        assert leader is not None, self.cluster_state()
        os.kill(leader.postmaster_pid(), signal.SIGKILL)
        return leader.name

    def logs(self) -> str:
        return "\n".join(
            f"--- {node.name} ---\n{node.log_path.read_text(errors='replace')[-4000:]}"
            for node in self.nodes
            if node.log_path.exists()
        )


def _patroni_config(cluster: Cluster, node: Node) -> str:
    hba = "\n".join(
        f"    - {line}"
        for line in (
            "local all all trust",
            "host all all 127.0.0.1/32 trust",
            "host replication all 127.0.0.1/32 trust",
        )
    )
    return f"""scope: {SCOPE}
name: {node.name}
log:
  level: INFO
restapi:
  listen: 127.0.0.1:{node.rest_port}
  connect_address: 127.0.0.1:{node.rest_port}
etcd3:
  hosts: 127.0.0.1:{cluster.etcd_port}
bootstrap:
  dcs:
    ttl: {TTL}
    loop_wait: {LOOP_WAIT}
    retry_timeout: {RETRY_TIMEOUT}
    maximum_lag_on_failover: 1048576
    synchronous_mode: true
    synchronous_mode_strict: true
    postgresql:
      use_pg_rewind: true
      parameters:
        wal_level: replica
        hot_standby: "on"
        max_wal_senders: 10
        max_replication_slots: 10
        wal_log_hints: "on"
        fsync: "off"
        max_connections: 100
  initdb:
    - encoding: UTF8
    - auth: trust
  pg_hba:
{hba}
postgresql:
  listen: 127.0.0.1:{node.pg_port}
  connect_address: 127.0.0.1:{node.pg_port}
  data_dir: {node.data}
  bin_dir: {BIN}
  pgpass: {cluster.workdir / (node.name + ".pgpass")}
  authentication:
    superuser:
      username: postgres
      password: unused-trust-auth
    replication:
      username: replicator
      password: unused-trust-auth
  parameters:
    unix_socket_directories: {cluster.workdir}
  pg_hba:
{hba}
"""


def _haproxy_config(cluster: Cluster, port: int, admin_socket: Path, *, shutdown_sessions: bool) -> str:
    on_down = " on-marked-down shutdown-sessions" if shutdown_sessions else ""
    servers = "\n".join(
        f"    server {node.name} 127.0.0.1:{node.pg_port} check port {node.rest_port}" for node in cluster.nodes
    )
    return f"""global
    maxconn 500
    stats socket {admin_socket} mode 600 level admin

defaults
    mode tcp
    timeout connect 2s
    timeout client 30m
    timeout server 30m
    timeout check 2s

listen primary
    bind 127.0.0.1:{port}
    option httpchk GET /primary
    http-check expect status 200
    default-server inter {CHECK_INTER_S}s fall {CHECK_FALL} rise {CHECK_RISE}{on_down}
{servers}
"""


def _start(command: list[str], log_path: Path, *, as_postgres: bool) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as log:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the cleanup can signal everything it started
            **(_AS_POSTGRES if as_postgres else {}),
        )


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@contextlib.contextmanager
def patroni_cluster() -> Iterator[Cluster]:
    """etcd, three Patroni nodes (a leader, a sync standby, a replica) and two HAProxies, on free ports.

    ``balancers[0]`` has ``on-marked-down shutdown-sessions`` (Patroni's template), ``balancers[1]`` has not.
    """
    workdir = Path(tempfile.mkdtemp(prefix="coatcheck-patroni-"))
    if os.getuid() == 0:
        shutil.chown(workdir, "postgres")
    cluster = Cluster(
        workdir=workdir,
        nodes=[Node(f"pg{n}", free_port(), free_port(), workdir) for n in (1, 2, 3)],
        etcd_port=free_port(),
    )
    peer_port = free_port()
    etcd = _start(
        [
            str(ETCD),
            "--name",
            "etcd1",
            "--data-dir",
            str(workdir / "etcd"),
            "--listen-client-urls",
            f"http://127.0.0.1:{cluster.etcd_port}",
            "--advertise-client-urls",
            f"http://127.0.0.1:{cluster.etcd_port}",
            "--listen-peer-urls",
            f"http://127.0.0.1:{peer_port}",
            "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{peer_port}",
            "--initial-cluster",
            f"etcd1=http://127.0.0.1:{peer_port}",
        ],
        workdir / "etcd.log",
        as_postgres=True,
    )
    started: list[subprocess.Popen[bytes]] = [etcd]
    try:
        wait_until(lambda: _answers(f"http://127.0.0.1:{cluster.etcd_port}/health"), timeout=30, what="etcd")
        for index, node in enumerate(cluster.nodes):
            config = workdir / f"{node.name}.yml"
            config.write_text(_patroni_config(cluster, node))
            if os.getuid() == 0:
                shutil.chown(config, "postgres")
            node.process = _start([str(PATRONI), str(config)], node.log_path, as_postgres=True)
            started.append(node.process)
            if index == 0:  # the first one bootstraps; the others then clone it
                wait_until(lambda: cluster.leader() is not None, timeout=60, what="pg1 to bootstrap", interval=0.5)
        cluster.wait_healthy()
        for shutdown_sessions in (True, False):
            port = free_port()
            config = workdir / f"haproxy-{port}.cfg"
            admin = workdir / f"haproxy-{port}.sock"
            config.write_text(_haproxy_config(cluster, port, admin, shutdown_sessions=shutdown_sessions))
            log_path = workdir / f"haproxy-{port}.log"
            process = _start([str(HAPROXY), "-db", "-f", str(config)], log_path, as_postgres=False)
            started.append(process)
            cluster.balancers.append(Balancer(port, process, shutdown_sessions, log_path, admin))
            wait_until(admin.exists, timeout=10, what="haproxy's admin socket")
        yield cluster
    finally:
        for process in reversed(started):
            if process is etcd:
                continue
            _stop_group(process)
        # Patroni stops PostgreSQL on SIGTERM; a postmaster left behind (Patroni killed first) goes now.
        for node in cluster.nodes:
            if (node.data / "postmaster.pid").exists():
                subprocess.run(
                    [str(BIN / "pg_ctl"), "-D", str(node.data), "-m", "immediate", "-w", "stop"],
                    capture_output=True,
                    check=False,
                    **_AS_POSTGRES,
                )
        stop_process(etcd, timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


def _answers(url: str) -> bool:
    try:
        return httpx2.get(url, timeout=1).status_code == 200
    except httpx2.HTTPError:
        return False
