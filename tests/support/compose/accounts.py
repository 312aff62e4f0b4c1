"""The users and groups of an image, made to exist on this machine the way the image's build made them."""

import grp
import os
import pwd
import subprocess
from dataclasses import dataclass

from tests.support.compose.dockerfile import Image
from tests.support.compose.errors import ComposeUpError
from tests.support.compose.images import ROOT


@dataclass(frozen=True)
class Identity:
    uid: int
    gid: int
    groups: list[int]
    home: str


def _exists(kind: str, name: str) -> bool:
    try:
        (pwd.getpwnam if kind == "user" else grp.getgrnam)(name)
    except KeyError:
        return False
    return True


def _id_taken(kind: str, number: int) -> bool:
    try:
        (pwd.getpwuid if kind == "user" else grp.getgrgid)(number)
    except KeyError:
        return False
    return True


def ensure_accounts(image: Image) -> None:
    """Create on this machine the accounts the image has, the way the image created them (idempotent)."""
    for base_account in image.base.accounts:
        # The base image's own users are known by number; give them a name here when the number is free
        # (on a machine where uid 1000 is somebody else, the process still runs as uid 1000).
        if not _exists("user", base_account.name) and not _id_taken("user", base_account.uid):
            for argv in image.base.account_commands:
                kind = "user" if argv[0] == "useradd" else "group"
                number = base_account.uid if kind == "user" else base_account.gid
                if not _exists(kind, argv[-1]) and not _id_taken(kind, number):
                    subprocess.run(list(argv), check=True, capture_output=True)
    for argv in image.account_commands:
        kind = "user" if argv[0] == "useradd" else "group"
        name = argv[-1]
        if _exists(kind, name):
            wanted = _option(argv, "--uid", "-u") if kind == "user" else _option(argv, "--gid", "-g")
            have = pwd.getpwnam(name).pw_uid if kind == "user" else grp.getgrnam(name).gr_gid
            if wanted is not None and int(wanted) != have:
                raise ComposeUpError(f"{' '.join(argv)}: this machine already has {kind} {name} with id {have}")
            continue
        result = subprocess.run(argv, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise ComposeUpError(f"RUN {' '.join(argv)} failed: {result.stderr.strip()}")


def _option(argv: list[str], long: str, short: str) -> str | None:
    for index, word in enumerate(argv):
        if word in (long, short) and index + 1 < len(argv):
            return argv[index + 1]
        if word.startswith(long + "="):
            return word.split("=", 1)[1]
    return None


def group_id(image: Image, name: str) -> int:
    if name.isdigit():
        return int(name)
    if name == "root":
        return 0
    if name in image.base.groups:
        return image.base.groups[name]
    if name in image.created_groups:
        return grp.getgrnam(name).gr_gid
    raise ComposeUpError(f"unable to find group {name}: no matching entries in the image's group file")


def identity(image: Image, spec: str) -> Identity:
    """The uid/gid a container of ``image`` runs as for ``USER spec``, from the image's passwd file."""
    name, _, group = spec.partition(":")
    if name in ("root", "0"):
        found = Identity(0, 0, [0], ROOT.home)
    elif name.isdigit():
        found = Identity(int(name), 0, [0], "/")
    elif (base := next((a for a in image.base.accounts if a.name == name), None)) is not None:
        found = Identity(base.uid, base.gid, [base.gid], base.home)
    elif name in image.created_accounts:
        entry = pwd.getpwnam(name)
        found = Identity(entry.pw_uid, entry.pw_gid, os.getgrouplist(name, entry.pw_gid), entry.pw_dir)
    else:
        raise ComposeUpError(f"unable to find user {name}: no matching entries in the image's passwd file")
    if group:
        gid = group_id(image, group)
        found = Identity(found.uid, gid, [gid], found.home)
    return found
