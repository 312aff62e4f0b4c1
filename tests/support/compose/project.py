"""Read compose.yaml into services, the way ``docker compose`` interprets the parts this project uses.

YAML anchors and merge keys (``<<: *dev-secrets``) are resolved by the YAML loader, as compose does. Keys
the emulation does not understand are refused with ``UnsupportedComposeError`` rather than ignored.
"""

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

SERVICE_KEYS = {
    "image", "build", "command", "entrypoint", "environment", "volumes", "ports", "depends_on", "healthcheck",
}  # fmt: skip
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}


class UnsupportedComposeError(ValueError):
    """compose.yaml uses something the emulation does not know how to reproduce."""


@dataclass(frozen=True)
class Healthcheck:
    """A service's healthcheck: the command (``CMD`` exec form or ``CMD-SHELL``) and its timing."""

    argv: list[str]
    interval: float
    timeout: float
    retries: int
    start_period: float

    @property
    def patience(self) -> float:
        """How long Docker keeps trying before it calls the service unhealthy."""
        return self.start_period + self.retries * (self.interval + self.timeout)


@dataclass(frozen=True)
class VolumeMount:
    volume: str
    target: str


@dataclass(frozen=True)
class Service:
    """One service of compose.yaml."""

    name: str
    image: str | None
    build_context: Path | None
    dockerfile: str
    command: list[str] | None
    entrypoint: list[str] | None
    environment: dict[str, str]
    volumes: list[VolumeMount]
    ports: list[tuple[int, int]]
    depends_on: dict[str, str]
    healthcheck: Healthcheck | None = field(default=None)


@dataclass(frozen=True)
class Project:
    """compose.yaml: services in file order and the named volumes."""

    root: Path
    services: dict[str, Service]
    volumes: list[str]

    def start_order(self) -> list[Service]:
        """Services in an order that starts every dependency first (file order among independent ones)."""
        order: list[Service] = []
        visiting: set[str] = set()

        def visit(name: str) -> None:
            if any(service.name == name for service in order):
                return
            if name in visiting:
                raise UnsupportedComposeError(f"depends_on cycle through {name}")
            if name not in self.services:
                raise UnsupportedComposeError(f"depends_on names an unknown service {name!r}")
            visiting.add(name)
            for dependency in self.services[name].depends_on:
                visit(dependency)
            order.append(self.services[name])

        for name in self.services:
            visit(name)
        return order


def parse_duration(value: str | int | float) -> float:
    """Compose durations: ``2s``, ``1m30s``, ``500ms``."""
    if isinstance(value, int | float):
        return float(value)
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", value)
    if not parts or "".join(number + unit for number, unit in parts) != value:
        raise UnsupportedComposeError(f"not a duration: {value!r}")
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 0.000001}
    return sum(float(number) * scale[unit] for number, unit in parts)


def _argv(value: Any, what: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return ["/bin/sh", "-c", value]
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return list(value)
    raise UnsupportedComposeError(f"{what}: a string or a list of strings")


def _environment(value: Any, name: str) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, list):
        pairs = [str(item).partition("=") for item in value]
        return {key: val for key, _, val in pairs}
    if isinstance(value, dict):
        # compose stringifies scalars; booleans and null need quoting in compose.yaml, so refuse them here.
        for key, val in value.items():
            if isinstance(val, bool) or val is None:
                raise UnsupportedComposeError(f"{name}.environment.{key}: quote booleans and empty values")
        return {str(key): str(val) for key, val in value.items()}
    raise UnsupportedComposeError(f"{name}.environment: a mapping or a list")


def _healthcheck(value: Any, name: str) -> Healthcheck | None:
    if value is None or value.get("disable"):
        return None
    test = value["test"]
    if isinstance(test, str):
        argv = ["/bin/sh", "-c", test]
    elif test[0] == "CMD":
        argv = list(test[1:])
    elif test[0] == "CMD-SHELL":
        argv = ["/bin/sh", "-c", " ".join(test[1:])]
    elif test[0] == "NONE":
        return None
    else:
        raise UnsupportedComposeError(f"{name}.healthcheck.test: starts with CMD, CMD-SHELL or NONE")
    return Healthcheck(
        argv=argv,
        interval=parse_duration(value.get("interval", "30s")),
        timeout=parse_duration(value.get("timeout", "30s")),
        retries=int(value.get("retries", 3)),
        start_period=parse_duration(value.get("start_period", "0s")),
    )


def _depends_on(value: Any, name: str) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, list):
        return {str(dependency): "service_started" for dependency in value}
    conditions = {
        str(dependency): str((spec or {}).get("condition", "service_started")) for dependency, spec in value.items()
    }
    for dependency, condition in conditions.items():
        if condition not in CONDITIONS:
            raise UnsupportedComposeError(f"{name}.depends_on.{dependency}: unknown condition {condition!r}")
    return conditions


def _ports(value: Any, name: str) -> list[tuple[int, int]]:
    ports = []
    for spec in value or []:
        match = re.fullmatch(r"(\d+):(\d+)", str(spec))
        if match is None:
            raise UnsupportedComposeError(f"{name}.ports: only HOST:CONTAINER is emulated, not {spec!r}")
        ports.append((int(match[1]), int(match[2])))
    return ports


def _service(root: Path, name: str, spec: dict[str, Any], volume_names: list[str]) -> Service:
    unknown = set(spec) - SERVICE_KEYS
    if unknown:
        raise UnsupportedComposeError(f"service {name}: keys {sorted(unknown)} are not emulated")
    build = spec.get("build")
    dockerfile = "Dockerfile"
    if isinstance(build, dict):
        dockerfile = str(build.get("dockerfile", dockerfile))
        build = build.get("context", ".")
    mounts = []
    for volume in spec.get("volumes", []) or []:
        source, sep, target = str(volume).partition(":")
        if not sep or source not in volume_names:
            raise UnsupportedComposeError(f"{name}.volumes: only named volumes declared under volumes: ({volume!r})")
        mounts.append(VolumeMount(source, target))
    return Service(
        name=name,
        image=spec.get("image"),
        build_context=(root / str(build)).resolve() if build is not None else None,
        dockerfile=dockerfile,
        command=_argv(spec.get("command"), f"{name}.command"),
        entrypoint=_argv(spec.get("entrypoint"), f"{name}.entrypoint"),
        environment=_environment(spec.get("environment"), name),
        volumes=mounts,
        ports=_ports(spec.get("ports"), name),
        depends_on=_depends_on(spec.get("depends_on"), name),
        healthcheck=_healthcheck(spec.get("healthcheck"), name),
    )


def load_project(root: Path, filename: str = "compose.yaml") -> Project:
    """Read ``root/filename``."""
    document = yaml.safe_load((root / filename).read_text())
    volume_names = list((document.get("volumes") or {}).keys())
    services = {
        str(name): _service(root, str(name), spec or {}, volume_names) for name, spec in document["services"].items()
    }
    return Project(root=root, services=services, volumes=volume_names)
