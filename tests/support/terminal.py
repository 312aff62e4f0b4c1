"""Run a command in a pseudo-terminal, as in a person's terminal window, and read what it shows.

Interactive commands (``claude mcp login``) behave differently when their output is not a terminal: they
print less, or refuse to prompt. :class:`PseudoTerminal` gives the command a pty as stdin, stdout and stderr
(Python's :mod:`pty` machinery, no extra dependency), reads everything it writes on a background thread and
lets a test wait for a pattern in the visible text (escape sequences removed) or for the command to exit,
each with a deadline.
"""

import asyncio
import fcntl
import os
import re
import struct
import subprocess
import termios
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from tests.support.processes import stop_process

# OSC sequences (hyperlinks: ESC ] 8 ;; url BEL), then CSI sequences (colours, cursor moves), then lone ESC pairs.
_ESCAPES = re.compile(r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")


def visible_text(raw: str) -> str:
    """``raw`` terminal output as a person reads it: escape sequences and carriage returns removed."""
    return _ESCAPES.sub("", raw).replace("\r", "")


class PseudoTerminal:
    """``argv`` running with a pseudo-terminal of ``columns`` x ``rows`` as its controlling streams.

    Use as a context manager: leaving the block stops the command if it is still running.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: Path,
        columns: int = 200,
        rows: int = 50,
    ) -> None:
        master, slave = os.openpty()
        # A wide window, so nothing the command prints is wrapped or truncated to a default width.
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        try:
            self.process = subprocess.Popen(
                list(argv), stdin=slave, stdout=slave, stderr=slave, env=dict(env), cwd=cwd, start_new_session=True
            )
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        self._master = master
        self._raw = bytearray()
        self._ended = False
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, name=f"pty reader for {argv[0]}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self._master, 65536)
            except OSError:  # EIO: the command and everything it started have closed the terminal
                chunk = b""
            with self._changed:
                if not chunk:
                    self._ended = True
                    self._changed.notify_all()
                    return
                self._raw += chunk
                self._changed.notify_all()

    def text(self) -> str:
        """Everything shown so far, as :func:`visible_text`."""
        with self._changed:
            return visible_text(self._raw.decode(errors="replace"))

    def wait_for(self, pattern: re.Pattern[str], *, timeout: float, what: str) -> re.Match[str]:
        """The first match of ``pattern`` in the visible text, once it appears.

        Raises ``TimeoutError`` naming ``what`` with the whole screen if it has not appeared after ``timeout``
        seconds or the terminal closed without it.
        """
        with self._changed:
            self._changed.wait_for(
                lambda: self._ended or pattern.search(visible_text(self._raw.decode(errors="replace"))) is not None,
                timeout=timeout,
            )
        match = pattern.search(self.text())
        if match is None:
            state = f"exited with {self.process.poll()}" if self.process.poll() is not None else "still running"
            screen = self.text()
            raise TimeoutError(f"{what} did not appear within {timeout}s ({state}); the terminal showed:\n{screen}")
        return match

    def wait_exit(self, *, timeout: float) -> int:
        """The command's exit code, once it has exited and its output has been read to the end."""
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(
                f"{self.process.args!r} still running after {timeout}s; the terminal showed:\n{self.text()}"
            ) from None
        self._reader.join(timeout=timeout)
        return code

    async def appears(self, pattern: re.Pattern[str], *, within: float, what: str) -> re.Match[str]:
        """:meth:`wait_for` off the event loop, so a browser driven by the same loop keeps going meanwhile."""
        return await asyncio.to_thread(self.wait_for, pattern, timeout=within, what=what)

    async def exits(self, *, within: float) -> int:
        """:meth:`wait_exit` off the event loop."""
        return await asyncio.to_thread(self.wait_exit, timeout=within)

    def close(self) -> None:
        """Stop the command if it still runs, and release the terminal."""
        stop_process(self.process, timeout=5.0)
        self._reader.join(timeout=5.0)
        os.close(self._master)

    def __enter__(self) -> "PseudoTerminal":
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()
