"""Drive ``wrk`` (Debian package) at one MCP tool call, for throughput figures a Python client cannot reach.

wrk is C: on a machine where the load generator shares the CPU with the servers it takes far less of it
than a Python client would, so more replicas have room to show.
"""

import contextlib
import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

WRK = "wrk"
SAMPLE_INTERVAL = 0.5


@dataclass(frozen=True)
class WrkRun:
    """What one wrk run did."""

    requests: int
    failures: int  # non-2xx responses, socket errors and timeouts
    rps: float


def wrk_available() -> bool:
    return shutil.which(WRK) is not None


def _script(headers: dict[str, str], body: dict[str, Any]) -> str:
    lines = ['wrk.method = "POST"', f"wrk.body = {json.dumps(json.dumps(body))}"]
    lines += [f"wrk.headers[{json.dumps(k)}] = {json.dumps(v)}" for k, v in headers.items()]
    return "\n".join(lines) + "\n"


def run_wrk(
    url: str,
    headers: dict[str, str],
    body: dict[str, Any],
    *,
    seconds: int,
    connections: int,
    while_running: Callable[[], None] | None = None,
) -> WrkRun:
    """POST ``body`` to ``url`` for ``seconds`` over ``connections`` kept-alive connections.

    ``while_running`` is called every ``SAMPLE_INTERVAL`` seconds until wrk ends (to sample something during
    the load without adding much to it).
    """
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(_script(headers, body))
    command = [WRK, "-t1", f"-c{connections}", f"-d{seconds}s", "-s", script.name, url]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if while_running is not None:
        while process.poll() is None:
            while_running()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=SAMPLE_INTERVAL)  # returns as soon as wrk ends
    out, err = process.communicate(timeout=seconds + 30)
    if process.returncode != 0:
        raise RuntimeError(f"wrk failed ({process.returncode}): {err}")
    total = re.search(r"(\d+) requests in", out)
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if total is None or rps is None:
        raise RuntimeError(f"unexpected wrk output:\n{out}")
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    failures = (int(non2xx[1]) if non2xx else 0) + (sum(int(n) for n in socket.groups()) if socket else 0)
    return WrkRun(requests=int(total[1]), failures=failures, rps=float(rps[1]))
