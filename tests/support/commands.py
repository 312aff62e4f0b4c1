"""``coatcheck …`` as an operator runs it: a process of its own that sees only the settings a test gives it.

The test process's own ``DATABASE_URL`` and ``TOKEN_ENCRYPTION_KEYS`` are left out, and the command runs in
the temporary directory, where no ``.env`` file is: only the variables given here count.
"""

import os
import subprocess
import sys
import tempfile

_NOT_INHERITED = {"DATABASE_URL", "TOKEN_ENCRYPTION_KEYS"}


def _environment(env: dict[str, str]) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}, **env}


def coatcheck_python(code: str | None, *argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``coatcheck argv…`` (or ``code``, a script importing it) in a process that sees only ``env``'s settings."""
    command = ["-m", "api.cli", *argv] if code is None else ["-c", code]
    return subprocess.run(
        [sys.executable, *command],
        env=_environment(env),
        cwd=tempfile.gettempdir(),
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def coatcheck(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``coatcheck argv…`` with only ``env``'s settings (output as text)."""
    return coatcheck_python(None, *argv, env=env)


def coatcheck_bytes(*argv: str, env: dict[str, str], stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    """``coatcheck argv…`` with only ``env``'s settings, ``stdin`` fed in and the output kept as bytes."""
    return subprocess.run(
        [sys.executable, "-m", "api.cli", *argv],
        env=_environment(env),
        cwd=tempfile.gettempdir(),
        input=stdin,
        capture_output=True,
        timeout=120,
        check=False,
    )
