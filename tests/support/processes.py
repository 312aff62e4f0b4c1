"""Start-up probes and shutdown for the real processes tests run (servers, proxies, the dev IdP, poolers)."""

import subprocess

import httpx2


def stop_process(process: subprocess.Popen[bytes], *, timeout: float = 15.0) -> None:
    """Terminate ``process`` and wait for it; kill it if it has not exited after ``timeout`` seconds."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def answers_ok(url: str, *processes: subprocess.Popen[bytes]) -> bool:
    """Whether ``GET url`` answers 200 now; raises if one of ``processes`` has exited instead.

    Meant as a :func:`tests.support.waiting.wait_until` condition, so a process that dies at start-up
    fails at once rather than after the whole timeout.
    """
    for process in processes:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode} before answering")
    try:
        return httpx2.get(url, timeout=1.0).status_code == 200
    except httpx2.HTTPError:
        return False
