"""Inside a fresh mount namespace (``unshare --mount``): mount what the container sees, become its user, exec.

Run as a script, ``python -I -S launch.py SPEC.json``, by ``tests.support.compose.up``; standard library only.
The spec holds ``mounts`` ([kind, source, target] with kind ``bind`` or ``rbind``, in order), ``cwd``,
``uid``, ``gid``, ``groups``, ``argv`` and ``env`` (the process's whole environment).
"""

import json
import os
import subprocess
import sys


def main() -> None:
    with open(sys.argv[1]) as file:
        spec = json.load(file)
    for kind, source, target in spec["mounts"]:
        subprocess.run(["mount", f"--{kind}", source, target], check=True)
    os.chdir(spec["cwd"])
    os.setgroups(spec["groups"])
    os.setgid(spec["gid"])
    os.setuid(spec["uid"])
    # execvpe searches the new environment's PATH, as the container runtime does.
    os.execvpe(spec["argv"][0], spec["argv"], spec["env"])  # noqa: S606 - exec form, as Docker runs it


if __name__ == "__main__":
    main()
