"""Wait on conditions with a deadline instead of sleeping a fixed time."""

import asyncio
import time
from collections.abc import Awaitable, Callable


def wait_until(condition: Callable[[], bool], *, timeout: float, what: str, interval: float = 0.05) -> None:
    """Poll ``condition`` until it holds; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


async def eventually(probe: Callable[[], Awaitable[bool]], *, within: float, what: str, interval: float = 0.1) -> None:
    """Run ``probe`` until it returns true; fail naming ``what`` after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not await probe():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(interval)


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
