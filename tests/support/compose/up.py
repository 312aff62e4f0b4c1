"""``docker compose up`` without Docker: every service of compose.yaml as a process the way its container runs.

For each service: its command (compose's, else the image's) with exactly its environment (the image's ENV
plus compose's ``environment``, nothing inherited from the test run), as the user the Dockerfile's last
``USER`` names, in the image's WORKDIR, in a private mount namespace where

* ``/etc/hosts`` names every service (``db``, ``idp``, ``app``) as 127.0.0.1, for these processes only;
* the build context is covered by the image's files only (what its ``COPY`` lines copy), plus what its
  ``RUN`` installs produced (the repo's virtualenv for ``pip install``, ``node_modules`` for ``npm install``);
* each named volume is a fresh directory, root-owned unless the image creates that directory with another
  owner (Docker seeds a fresh named volume from the image's directory).

A ``postgres`` image service is the local PostgreSQL on 127.0.0.1:5432, given the role and database its
``POSTGRES_*`` variables declare (the database is dropped and recreated, so runs are independent).
``depends_on`` conditions are honoured in order; ``service_healthy`` runs the healthcheck the way
``docker exec`` would. Needs root (namespaces, bind mounts, switching users) and ``unshare``.
"""

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.compose.accounts import Identity, group_id, identity
from tests.support.compose.errors import ComposeUpError
from tests.support.compose.images import DOCKER_DEFAULT_PATH
from tests.support.compose.postgres import LOCAL_POSTGRES, postgres_env, provision
from tests.support.compose.project import Project, Service, UnsupportedComposeError
from tests.support.compose.staging import BuiltImage, build
from tests.support.databases import drop_database
from tests.support.processes import stop_process
from tests.support.waiting import wait_until

__all__ = ["LOCAL_POSTGRES", "ComposeUp", "ComposeUpError", "RunningService", "compose_up", "unavailable_reason"]

LAUNCH_SCRIPT = Path(__file__).with_name("launch.py")
ONE_SHOT_TIMEOUT = 180.0
STOP_TIMEOUT = 10.0
LOG_TAIL_CHARS = 4000


def unavailable_reason() -> str | None:
    """Why the emulation cannot run on this machine, or ``None``."""
    if os.geteuid() != 0:
        return "the compose emulation needs root (unshare --mount, bind mounts, switching to the images' users)"
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return "the compose emulation needs util-linux's unshare and mount"
    return None


@dataclass
class RunningService:
    """A started service: its process (``None`` for the local PostgreSQL) and its log."""

    service: Service
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    built: BuiltImage | None = None
    healthy: bool = False

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self) -> str:
        return f"--- {self.service.name} log ---\n{self.log_text()[-LOG_TAIL_CHARS:]}"


@dataclass
class ComposeUp:
    """The running project: services by name and what happened, in order (``events``)."""

    project: Project
    services: dict[str, RunningService]
    events: list[str]
    database_dsn: str
    volumes: dict[str, Path]


def _argv(service: Service, built: BuiltImage, env: dict[str, str]) -> list[str]:
    image = built.image
    if service.entrypoint is not None:
        return [*service.entrypoint, *(service.command or [])]
    if image.entrypoint is not None:
        return [*image.entrypoint, *(service.command or image.cmd or [])]
    command = service.command or image.cmd or list(image.base.cmd)
    if image.base.entrypoint is not None:
        return image.base.entrypoint(command, env, built.rootfs)
    return command


def _environment(service: Service, built: BuiltImage, who: Identity) -> dict[str, str]:
    env = dict(built.image.env)
    if built.path_prefix:
        env["PATH"] = ":".join([*built.path_prefix, env.get("PATH", DOCKER_DEFAULT_PATH)])
    env.setdefault("HOME", who.home)
    env["HOSTNAME"] = service.name
    env.update(service.environment)
    return env


@dataclass
class _Launcher:
    hosts_file: Path
    workdir: Path
    volumes: dict[str, Path]
    mountpoints_created: list[Path] = field(default_factory=list)
    volumes_seeded: set[str] = field(default_factory=set)

    def mounts(self, service: Service, built: BuiltImage) -> list[list[str]]:
        mounts = [*built.first_mounts, ["bind", str(self.hosts_file), "/etc/hosts"]]
        mounts += [["bind", str(source), str(inside)] for source, inside in built.installed]
        mounts.append(["rbind", str(built.rootfs), str(built.context)])
        for mount in service.volumes:
            volume = self.volumes[mount.volume]
            self._seed(mount.volume, volume, built, mount.target)
            target = built.host_path(mount.target)
            if target.is_relative_to(built.context):
                built.staged_path(mount.target).mkdir(parents=True, exist_ok=True)
            elif not target.exists():
                target.mkdir(parents=True)  # the mount point; removed again when the project stops
                self.mountpoints_created.append(target)
            mounts.append(["bind", str(volume), str(target)])
        return mounts

    def _seed(self, name: str, volume: Path, built: BuiltImage, target: str) -> None:
        # Docker copies the image's directory (owner and mode included) into an empty named volume the first
        # time a container mounts it; a path the image lacks gives Docker's root-owned 0755 directory.
        if name in self.volumes_seeded:
            return
        self.volumes_seeded.add(name)
        directory = built.image.directory(target)
        if directory is not None:
            os.chown(volume, identity(built.image, directory.owner).uid, group_id(built.image, directory.group))
            volume.chmod(directory.mode)

    def command(self, service: Service, built: BuiltImage, argv: list[str] | None = None) -> list[str]:
        who = identity(built.image, built.image.user)
        env = _environment(service, built, who)
        spec = {
            "mounts": self.mounts(service, built),
            "cwd": str(built.host_path(built.image.workdir)),
            "uid": who.uid,
            "gid": who.gid,
            "groups": who.groups,
            "argv": argv if argv is not None else _argv(service, built, env),
            "env": env,
        }
        spec_file = Path(tempfile.mkstemp(prefix=f"launch-{service.name}-", suffix=".json", dir=self.workdir)[1])
        spec_file.write_text(json.dumps(spec))
        return ["unshare", "--mount", "--propagation", "private", "--",
                sys.executable, "-I", "-S", str(LAUNCH_SCRIPT), str(spec_file)]  # fmt: skip


def check_ports_free(project: Project) -> None:
    """Fail with a clear message if a port compose publishes is taken (compose would fail the same way)."""
    for service in project.services.values():
        for host_port, container_port in service.ports:
            if host_port != container_port:
                raise UnsupportedComposeError(
                    f"{service.name}: ports {host_port}:{container_port} would need NAT, which is not emulated"
                )
            with socket.socket() as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    probe.bind(("0.0.0.0", host_port))  # noqa: S104 - compose publishes on every interface
                except OSError as exc:
                    raise ComposeUpError(
                        f"port {host_port} is already in use on this machine ({exc.strerror}); compose.yaml publishes "
                        f"{service.name} on it, so stop whatever listens there (ss -ltnp 'sport = :{host_port}')"
                    ) from None


class _Up:
    def __init__(self, project: Project, workdir: Path, admin_dsn: str) -> None:
        self.project = project
        self.workdir = workdir
        self.admin_dsn = admin_dsn
        self.events: list[str] = []
        self.running: dict[str, RunningService] = {}
        self.databases: list[str] = []
        hosts = workdir / "hosts"
        hosts.write_text(Path("/etc/hosts").read_text() + f"\n127.0.0.1 {' '.join(project.services)}\n")
        hosts.chmod(0o644)
        volumes = {}
        for name in project.volumes:
            volumes[name] = Path(tempfile.mkdtemp(prefix=f"volume-{name}-", dir=workdir))
            volumes[name].chmod(0o755)
        self.launcher = _Launcher(hosts_file=hosts, workdir=workdir, volumes=volumes)
        self.built: dict[tuple[Path, str], BuiltImage] = {}

    def start(self, service: Service) -> None:
        for dependency, condition in service.depends_on.items():
            self.wait_for(dependency, condition, waiter=service.name)
        log_path = self.workdir / f"{service.name}.log"
        running = RunningService(service=service, log_path=log_path)
        self.running[service.name] = running
        if service.build_context is None:
            self._start_postgres(service, running)
        else:
            key = (service.build_context, service.dockerfile)
            if key not in self.built:
                self.built[key] = build(service, self.workdir)
            running.built = self.built[key]
            with log_path.open("wb") as log:
                running.process = subprocess.Popen(
                    self.launcher.command(service, running.built),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
        self.events.append(f"{service.name} started")

    def _start_postgres(self, service: Service, running: RunningService) -> None:
        if service.image is None or not service.image.startswith("postgres:"):
            raise UnsupportedComposeError(f"{service.name}: only built images and postgres:* are emulated")
        user, password, database = postgres_env(service)
        asyncio.run(provision(self.admin_dsn, user, password, database))
        self.databases.append(database)
        running.log_path.write_text(f"local PostgreSQL {LOCAL_POSTGRES}: role {user}, database {database}\n")

    def _healthcheck_passes(self, running: RunningService) -> bool:
        check = running.service.healthcheck
        assert check is not None
        if running.built is None:
            # The local PostgreSQL: the healthcheck runs on this machine as root. In the container the
            # server is local to the command; here that server is LOCAL_POSTGRES, whatever the socket setup.
            host, port = LOCAL_POSTGRES
            local = {"PGHOST": host, "PGPORT": str(port)}
            command, env = check.argv, {"PATH": DOCKER_DEFAULT_PATH, **running.service.environment, **local}
        else:  # like `docker exec`: the container's user, environment, mounts and working directory
            command, env = self.launcher.command(running.service, running.built, argv=check.argv), None
        try:
            result = subprocess.run(command, env=env, capture_output=True, timeout=check.timeout, check=False)
        except subprocess.TimeoutExpired:
            return False
        return result.returncode == 0

    def wait_for(self, name: str, condition: str, *, waiter: str) -> None:
        running = self.running[name]
        if condition == "service_started":
            return
        if condition == "service_healthy":
            self.wait_healthy(running, waiter=waiter)
            return
        process = running.process
        if process is None:
            raise ComposeUpError(f"{waiter} waits for {name} to complete, but {name} is a long-running database")
        try:
            code = process.wait(timeout=ONE_SHOT_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise ComposeUpError(f"{name} did not finish within {ONE_SHOT_TIMEOUT}s\n{running.log_tail()}") from None
        if code != 0:
            raise ComposeUpError(
                f"service {name!r} didn't complete successfully: exit {code} (needed by {waiter})\n{running.log_tail()}"
            )
        if f"{name} exited 0" not in self.events:
            self.events.append(f"{name} exited 0")

    def wait_healthy(self, running: RunningService, *, waiter: str) -> None:
        name, check = running.service.name, running.service.healthcheck
        if running.healthy:
            return
        if check is None:
            raise ComposeUpError(f"{waiter} waits for {name} to be healthy, but {name} has no healthcheck")

        def healthy() -> bool:
            if running.process is not None and running.process.poll() is not None:
                raise ComposeUpError(
                    f"dependency failed to start: {name} exited with code {running.process.returncode} "
                    f"before it became healthy\n{running.log_tail()}"
                )
            return self._healthcheck_passes(running)

        try:
            wait_until(healthy, timeout=check.patience, what=f"{name} to be healthy", interval=min(check.interval, 0.5))
        except TimeoutError:
            raise ComposeUpError(
                f"dependency failed to start: {name} is unhealthy (healthcheck {check.argv} kept failing for "
                f"{check.patience:.0f}s)\n{running.log_tail()}"
            ) from None
        running.healthy = True
        self.events.append(f"{name} healthy")

    def stop(self) -> None:
        for running in reversed(list(self.running.values())):
            process = running.process
            if process is not None:
                stop_process(process, timeout=STOP_TIMEOUT)
        for database in self.databases:
            asyncio.run(drop_database(self.admin_dsn, database))
        for mountpoint in self.launcher.mountpoints_created:
            with contextlib.suppress(OSError):
                mountpoint.rmdir()


@contextlib.contextmanager
def compose_up(project: Project, *, admin_dsn: str) -> Iterator[ComposeUp]:
    """Start every service like ``docker compose up --wait`` and stop them all when the block ends.

    ``admin_dsn`` is a superuser connection to the PostgreSQL on 127.0.0.1:5432 that plays ``db``.
    Raises ``ComposeUpError`` with the failing service's log, as compose would report it.
    """
    check_ports_free(project)
    with tempfile.TemporaryDirectory(prefix="coatcheck-compose-") as tmp:
        workdir = Path(tmp)
        workdir.chmod(0o755)
        up = _Up(project, workdir, admin_dsn)
        try:
            for service in project.start_order():
                up.start(service)
            for running in up.running.values():  # `--wait`: every service with a healthcheck is healthy
                if running.service.healthcheck is not None:
                    up.wait_healthy(running, waiter="compose up --wait")
            db = next(s for s in project.services.values() if s.build_context is None)
            user, password, database = postgres_env(db)
            host, port = LOCAL_POSTGRES
            yield ComposeUp(
                project=project,
                services=up.running,
                events=up.events,
                database_dsn=f"postgresql://{user}:{password}@{host}:{port}/{database}",
                volumes=up.launcher.volumes,
            )
        finally:
            up.stop()
