"""What the base images named in our Dockerfiles bring with them (their published Dockerfiles say so).

Only facts a process can observe are kept: the environment, the accounts in ``/etc/passwd``, the entry
point and the default command. A base image not listed here cannot be emulated, and says so.
"""

import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

DOCKER_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Account:
    """An ``/etc/passwd`` entry of an image."""

    name: str
    uid: int
    gid: int
    home: str


Entrypoint = Callable[[Sequence[str], Mapping[str, str], Path], list[str]]


def node_docker_entrypoint(argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> list[str]:
    """The node image's ``docker-entrypoint.sh``: run ``node`` with the arguments unless they name a command.

    ``if [ "${1#-}" != "${1}" ] || [ -z "$(command -v "${1}")" ] || { [ -f "${1}" ] && ! [ -x "${1}" ]; }``
    ``then set -- node "$@"; fi; exec "$@"``
    """
    first = argv[0] if argv else ""
    found = shutil.which(first, path=env.get("PATH", "")) if first and "/" not in first else None
    as_file = cwd / first if first else None
    if "/" in first and as_file is not None and as_file.exists():
        found = str(as_file) if as_file.stat().st_mode & 0o111 else None
    not_executable_file = as_file is not None and as_file.is_file() and not (as_file.stat().st_mode & 0o111)
    if first.startswith("-") or found is None or not_executable_file:
        return ["node", *argv]
    return list(argv)


@dataclass(frozen=True)
class BaseImage:
    """A base image: its environment, accounts, entry point and default command."""

    env: Mapping[str, str]
    accounts: Sequence[Account] = ()
    groups: Mapping[str, int] = field(default_factory=dict)
    # The commands that created ``accounts`` in the base image, replayed on a machine that lacks them.
    account_commands: Sequence[Sequence[str]] = ()
    entrypoint: Entrypoint | None = None
    cmd: Sequence[str] = ()


ROOT = Account("root", 0, 0, "/root")

BASE_IMAGES: Mapping[str, BaseImage] = {
    # https://github.com/nodejs/docker-node (22/bookworm-slim/Dockerfile)
    "node:22-slim": BaseImage(
        env={"PATH": DOCKER_DEFAULT_PATH},
        accounts=(Account("node", 1000, 1000, "/home/node"),),
        groups={"node": 1000},
        account_commands=(
            ("groupadd", "--gid", "1000", "node"),
            ("useradd", "--uid", "1000", "--gid", "node", "--shell", "/bin/bash", "--create-home", "node"),
        ),
        entrypoint=node_docker_entrypoint,
        cmd=("node",),
    ),
    # https://github.com/docker-library/python (3.11/slim-bookworm/Dockerfile)
    "python:3.11-slim": BaseImage(
        env={"PATH": f"/usr/local/bin:{DOCKER_DEFAULT_PATH}", "LANG": "C.UTF-8"},
        cmd=("python3",),
    ),
}
