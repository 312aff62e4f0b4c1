"""An image staged on disk without building it: its WORKDIR's files and what its RUN installs produced."""

import importlib.metadata
import os
import shutil
import sys
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.compose.accounts import ensure_accounts, group_id, identity
from tests.support.compose.dockerfile import Image, load_image
from tests.support.compose.errors import ComposeUpError
from tests.support.compose.project import Service
from tests.support.devidp import DEVIDP_DIR, ensure_devidp_installed


@dataclass
class BuiltImage:
    """An image staged on disk: ``rootfs`` holds its WORKDIR, mounted over the build context."""

    image: Image
    context: Path
    rootfs: Path
    # (host source, path inside rootfs): what the image's RUN installs put there
    installed: list[tuple[Path, Path]] = field(default_factory=list)
    path_prefix: list[str] = field(default_factory=list)
    # mounts made first in the namespace: what the image user must reach on this machine (see _reachable)
    first_mounts: list[list[str]] = field(default_factory=list)

    def host_path(self, container_path: str) -> Path:
        """Where a container path is, seen from inside the service's namespace."""
        workdir = self.image.workdir.rstrip("/") or "/"
        if container_path == workdir or container_path.startswith(workdir.rstrip("/") + "/"):
            return self.context / os.path.relpath(container_path, workdir)
        return Path(container_path)

    def staged_path(self, container_path: str) -> Path:
        workdir = self.image.workdir
        return self.rootfs / os.path.relpath(container_path, workdir)


def _copy_into(source: Path, target: Path, *, into_directory: bool) -> None:
    if source.is_dir():
        # COPY of a directory copies its contents. A virtualenv inside the context is not image content.
        shutil.copytree(source, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".venv", "__pycache__"))
        return
    if into_directory or target.is_dir():
        target.mkdir(parents=True, exist_ok=True)
        target = target / source.name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, target)


def _project_name(context: Path) -> str:
    return str(tomllib.loads((context / "pyproject.toml").read_text())["project"]["name"])


def build(service: Service, workdir: Path) -> BuiltImage:
    """Stage ``service``'s image: its accounts on this machine, its WORKDIR's files in a fresh directory."""
    assert service.build_context is not None
    context = service.build_context
    image = load_image(context, service.dockerfile)
    ensure_accounts(image)
    rootfs = Path(tempfile.mkdtemp(prefix=f"rootfs-{service.name}-", dir=workdir))
    rootfs.chmod(0o755)
    built = BuiltImage(image=image, context=context, rootfs=rootfs)
    for copy in image.copies:
        if not (copy.dest.rstrip("/") + "/").startswith(image.workdir.rstrip("/") + "/"):
            raise ComposeUpError(f"COPY {' '.join(copy.sources)} {copy.dest}: only copies into WORKDIR are emulated")
        for source in copy.sources:
            if not (context / source).exists():
                raise ComposeUpError(f"COPY failed: file not found in build context: {source}")
            into = copy.dest.endswith("/") or len(copy.sources) > 1
            _copy_into(context / source, built.staged_path(copy.dest.rstrip("/") or "/"), into_directory=into)
    for path, directory in image.directories.items():
        staged = built.staged_path(path) if built.host_path(path) != Path(path) else None
        if staged is not None and staged != rootfs:
            staged.mkdir(parents=True, exist_ok=True)
            uid, gid = identity(image, directory.owner).uid, group_id(image, directory.group)
            os.chown(staged, uid, gid)
            staged.chmod(directory.mode)
    reach = [context]  # what the container's user must be able to enter on this machine
    for tool, where in image.installs:
        if tool == "pip":
            # `pip install -e .` in the image: this test run's virtualenv has the project installed.
            name = _project_name(built.host_path(where))
            try:
                importlib.metadata.distribution(name)
            except importlib.metadata.PackageNotFoundError:
                raise ComposeUpError(f"pip install in {context}: {name} is not installed in {sys.prefix}") from None
            venv = Path(sys.prefix)
            reach += [Path(sys.base_prefix).resolve(), venv]
            if venv.is_relative_to(context):
                built.installed.append((venv, rootfs / venv.relative_to(context)))
            built.path_prefix.append(str(Path(sys.executable).parent))
        elif tool == "npm":
            host_dir = built.host_path(where)
            if host_dir.resolve() != DEVIDP_DIR.resolve():
                raise ComposeUpError(f"npm install in {host_dir}: only the dev IdP's install is emulated")
            ensure_devidp_installed()
            built.installed.append((host_dir / "node_modules", built.staged_path(where) / "node_modules"))
            # The node image has node in /usr/local/bin; here it is this machine's node, wherever it lives.
            node = shutil.which("node")
            if node is None:
                raise ComposeUpError("node is not on PATH; the node image's services need Node.js 20+")
            node_dir = Path(node).resolve().parent
            if str(node_dir) not in image.env.get("PATH", "").split(":"):
                built.path_prefix.append(str(node_dir))
                reach.append(node_dir.parent)
    for _source, inside in built.installed:
        inside.mkdir(parents=True, exist_ok=True)
    built.first_mounts = _reachable(reach, workdir)
    return built


def _reachable(paths: list[Path], workdir: Path) -> list[list[str]]:
    """Mounts that let any user reach ``paths`` (in the image they are world-readable, e.g. /usr/local).

    On this machine the interpreter, node or the clone may live under a directory only root may enter (pyenv
    in /root). Inside the namespace such a directory is covered by a world-traversable one that holds only
    ``paths``.
    """
    outermost = [path for path in paths if not any(path != other and path.is_relative_to(other) for other in paths)]
    covers: dict[Path, list[Path]] = {}
    for path in dict.fromkeys(outermost):
        closed = next((p for p in reversed(path.parents) if not os.stat(p).st_mode & 0o001), None)
        if closed is not None:
            covers.setdefault(closed, []).append(path)
    mounts = []
    for closed, inside in covers.items():
        cover = Path(tempfile.mkdtemp(prefix="cover-", dir=workdir))
        cover.chmod(0o755)
        for path in inside:
            target = cover / path.relative_to(closed)
            target.mkdir(parents=True, exist_ok=True)
            for directory in target.relative_to(cover).parents:
                (cover / directory).chmod(0o755)
            mounts.append(["rbind", str(path), str(target)])
        mounts.append(["rbind", str(cover), str(closed)])
    return mounts
