"""Read a Dockerfile into what its image holds, without building it.

Every instruction and every ``RUN`` command is either understood or refused with ``UnsupportedDockerfileError``:
an image the emulation cannot reproduce must stop the test, never pass it by accident.
"""

import json
import posixpath
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.compose.images import BASE_IMAGES, BaseImage


class UnsupportedDockerfileError(ValueError):
    """The Dockerfile uses something the emulation does not know how to reproduce."""


@dataclass(frozen=True)
class Directory:
    """A directory the image creates, with the owner Docker copies into a fresh named volume mounted there."""

    owner: str = "root"
    group: str = "root"
    mode: int = 0o755


@dataclass(frozen=True)
class Copy:
    """``COPY sources dest``: paths relative to the build context, ``dest`` an absolute image path."""

    sources: tuple[str, ...]
    dest: str


@dataclass
class Image:
    """What ``docker build`` would produce from one Dockerfile, as far as a running process can tell."""

    base_name: str
    base: BaseImage
    workdir: str = "/"
    env: dict[str, str] = field(default_factory=dict)
    user: str = "root"
    directories: dict[str, Directory] = field(default_factory=dict)
    copies: list[Copy] = field(default_factory=list)
    # ``useradd``/``groupadd`` argument lists, in order, as the Dockerfile runs them.
    account_commands: list[list[str]] = field(default_factory=list)
    created_accounts: list[str] = field(default_factory=list)
    created_groups: list[str] = field(default_factory=list)
    # ("pip" | "npm", image directory the install ran in)
    installs: list[tuple[str, str]] = field(default_factory=list)
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None

    def directory(self, path: str) -> Directory | None:
        """The directory the image has at ``path`` (``None``: Docker creates the mount point root-owned)."""
        return self.directories.get(posixpath.normpath(path))


def _logical_lines(text: str) -> list[str]:
    lines: list[str] = []
    current = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue  # comments inside a continued instruction are dropped by Docker too
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        lines.append(current)
        current = ""
    if current:
        lines.append(current)
    return lines


def _exec_or_shell(argument: str) -> list[str]:
    if argument.startswith("["):
        parsed = json.loads(argument)
        if not (isinstance(parsed, list) and all(isinstance(item, str) for item in parsed)):
            raise UnsupportedDockerfileError(f"not a JSON list of strings: {argument}")
        return parsed
    return ["/bin/sh", "-c", argument]


def _env_pairs(argument: str) -> dict[str, str]:
    words = shlex.split(argument)
    if words and "=" not in words[0]:
        key, _, value = argument.partition(" ")
        return {key: value.strip()}
    pairs = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep:
            raise UnsupportedDockerfileError(f"ENV {argument}: mixes KEY=value and KEY value forms")
        pairs[key] = value
    return pairs


def _commands(shell: str) -> list[list[str]]:
    """Split a RUN shell line into simple commands joined by ``&&`` or ``;``; refuse any other shell syntax."""
    lexer = shlex.shlex(shell, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in ("&&", ";"):
            commands.append([])
        elif token and set(token) <= set("|&;<>()"):
            raise UnsupportedDockerfileError(f"RUN {shell}: shell operator {token!r} is not emulated")
        else:
            commands[-1].append(token)
    return [command for command in commands if command]


class _Builder:
    def __init__(self, image: Image) -> None:
        self.image = image

    def path(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.image.workdir, path))

    def run(self, shell: str) -> None:
        for argv in _commands(shell):
            self._run_command(argv, shell)

    def _run_command(self, argv: list[str], shell: str) -> None:
        program, args = argv[0], argv[1:]
        as_root = self.image.user.split(":")[0] in ("root", "0")
        if program in ("pip", "pip3") or argv[:3] in (["python", "-m", "pip"], ["python3", "-m", "pip"]):
            if "install" not in argv:
                raise UnsupportedDockerfileError(f"RUN {shell}: only pip install is emulated")
            self.image.installs.append(("pip", self.image.workdir))
        elif program == "npm":
            if not args or args[0] not in ("install", "ci"):
                raise UnsupportedDockerfileError(f"RUN {shell}: only npm install / npm ci is emulated")
            self.image.installs.append(("npm", self.image.workdir))
        elif program in ("useradd", "groupadd"):
            if not as_root:
                raise UnsupportedDockerfileError(f"RUN {shell}: {program} fails unless the build runs as root")
            self.image.account_commands.append(argv)
            created = self.image.created_accounts if program == "useradd" else self.image.created_groups
            created.append(args[-1])
            if program == "useradd" and not {"-N", "--no-user-group", "-g", "--gid"} & set(args):
                self.image.created_groups.append(args[-1])  # Debian's useradd makes a group of the same name
        elif program == "mkdir":
            self._mkdir(args, shell)
        elif program == "chown":
            if not as_root:
                raise UnsupportedDockerfileError(f"RUN {shell}: chown fails unless the build runs as root")
            self._chown(args, shell)
        elif program == "chmod":
            self._chmod(args, shell)
        else:
            raise UnsupportedDockerfileError(
                f"RUN {shell}: {program!r} is not emulated; teach tests/support/compose/dockerfile.py what it does"
            )

    def _mkdir(self, args: list[str], shell: str) -> None:
        mode = 0o755
        paths = []
        words = iter(args)
        for word in words:
            if word in ("-p", "--parents"):
                continue
            if word in ("-m", "--mode"):
                mode = int(next(words), 8)
            elif word.startswith("-"):
                raise UnsupportedDockerfileError(f"RUN {shell}: mkdir {word} is not emulated")
            else:
                paths.append(word)
        owner = self.image.user.split(":")[0]
        group = self.image.user.split(":")[1] if ":" in self.image.user else owner
        for path in paths:
            self.image.directories[self.path(path)] = Directory(owner, group, mode)

    def _existing(self, path: str, shell: str) -> Directory:
        directory = self.image.directories.get(self.path(path))
        if directory is None:
            raise UnsupportedDockerfileError(f"RUN {shell}: {path} is not a directory this Dockerfile created")
        return directory

    def _chown(self, args: list[str], shell: str) -> None:
        words = [word for word in args if word not in ("-R", "--recursive")]
        if len(words) < 2 or any(word.startswith("-") for word in words):
            raise UnsupportedDockerfileError(f"RUN {shell}: only chown [-R] user[:group] path... is emulated")
        owner, _, group = words[0].partition(":")
        for path in words[1:]:
            current = self._existing(path, shell)
            self.image.directories[self.path(path)] = Directory(owner, group or current.group, current.mode)

    def _chmod(self, args: list[str], shell: str) -> None:
        words = [word for word in args if word not in ("-R", "--recursive")]
        if len(words) < 2 or not words[0].isdigit():
            raise UnsupportedDockerfileError(f"RUN {shell}: only chmod [-R] OCTAL path... is emulated")
        for path in words[1:]:
            current = self._existing(path, shell)
            self.image.directories[self.path(path)] = Directory(current.owner, current.group, int(words[0], 8))


def parse_dockerfile(text: str) -> Image:
    """The image ``text`` builds. Raises ``UnsupportedDockerfileError`` for anything it cannot reproduce."""
    lines = _logical_lines(text)
    if not lines or not lines[0].upper().startswith("FROM "):
        raise UnsupportedDockerfileError("a Dockerfile starts with FROM")
    base_name = lines[0].split(None, 1)[1].strip()
    if base_name not in BASE_IMAGES:
        raise UnsupportedDockerfileError(f"FROM {base_name}: no facts about this base image in images.py")
    base = BASE_IMAGES[base_name]
    image = Image(base_name=base_name, base=base, env=dict(base.env))
    builder = _Builder(image)
    for line in lines[1:]:
        instruction, _, argument = line.partition(" ")
        instruction, argument = instruction.upper(), argument.strip()
        if instruction == "FROM":
            raise UnsupportedDockerfileError("multi-stage builds are not emulated")
        if instruction == "WORKDIR":
            image.workdir = builder.path(argument)
            image.directories.setdefault(image.workdir, Directory())
        elif instruction == "ENV":
            image.env.update(_env_pairs(argument))
        elif instruction == "COPY":
            words = shlex.split(argument)
            if any(word.startswith("--") for word in words) or len(words) < 2:
                raise UnsupportedDockerfileError(f"COPY {argument}: only COPY source... dest is emulated")
            dest = builder.path(words[-1]) + ("/" if words[-1].endswith("/") else "")
            image.copies.append(Copy(tuple(words[:-1]), dest))
        elif instruction == "RUN":
            builder.run(argument)
        elif instruction == "USER":
            image.user = argument
        elif instruction == "CMD":
            image.cmd = _exec_or_shell(argument)
        elif instruction == "ENTRYPOINT":
            image.entrypoint = _exec_or_shell(argument)
            image.cmd = None  # Docker resets an inherited CMD when ENTRYPOINT is set
        elif instruction in ("EXPOSE", "LABEL"):
            continue  # documentation only; compose's ports decide what is published
        else:
            raise UnsupportedDockerfileError(f"{instruction} is not emulated")
    return image


def load_image(context: Path, dockerfile: str = "Dockerfile") -> Image:
    """Parse ``context/dockerfile``."""
    return parse_dockerfile((context / dockerfile).read_text())
