"""One measured window against one target: wrk for load, /proc for server CPU, PostgreSQL for sessions opened."""

import asyncio
import json
import os
import re
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any

import asyncpg

_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Window:
    """What one target did during one measured window."""

    rps: float
    requests: int
    p50_ms: float
    p99_ms: float
    cpu_ms_per_call: float
    sessions_opened: int

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (all its threads) and its live child processes so far.

    Children count (``serve --workers N``: the supervisor's workers do the work); all of them live for the
    whole run, so none drops out of the sum between two readings.
    """
    with open(f"/proc/{pid}/stat") as f:
        # The command name (field 2) may contain spaces; everything after its closing parenthesis is fixed.
        fields = f.read().rsplit(")", 1)[1].split()
    own = (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime (fields 14 and 15 of stat)
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return own + sum(cpu_seconds(int(child)) for child in f.read().split())


class SessionCounter:
    """Counts sessions PostgreSQL opened to one database, from ``pg_stat_database.sessions``.

    Reads over one connection opened before any measurement, so the counter's own session is not counted.
    A backend reports its session when it first goes idle, and one that is closed reports on exit, so a
    pool that opens connections per call (or grows) shows up within the window it happened in.
    """

    def __init__(self, dsn: str, database: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._database = database
        self._conn: Any = self._loop.run_until_complete(asyncpg.connect(dsn))

    def sessions(self) -> int:
        query = "SELECT sessions FROM pg_stat_database WHERE datname = $1"
        return int(self._loop.run_until_complete(self._conn.fetchval(query, self._database)))

    def close(self) -> None:
        self._loop.run_until_complete(self._conn.close())
        self._loop.close()


def lua_script(headers: dict[str, str], bodies: list[dict[str, Any]]) -> str:
    """A wrk script posting ``bodies`` round-robin with ``headers``.

    Round-robin rather than random: with one body per connection (one cart per writer), requests in flight
    at the same time then name different carts, as independent users would.
    """
    lines = [
        'wrk.method = "POST"',
        "local bodies = {" + ", ".join(json.dumps(json.dumps(b)) for b in bodies) + "}",
        "local n = 0",
    ]
    lines += [f"wrk.headers[{json.dumps(k)}] = {json.dumps(v)}" for k, v in headers.items()]
    lines.append("request = function() n = n + 1; return wrk.format(nil, nil, nil, bodies[(n % #bodies) + 1]) end")
    return "\n".join(lines) + "\n"


def _duration_ms(value: str, unit: str) -> float:
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def parse_wrk(out: str, url: str) -> tuple[float, int, float, float]:
    """rps, request count, p50 and p99 (ms) from ``wrk --latency`` output; raises on any error wrk saw."""
    if re.search(r"Non-2xx or 3xx responses: (\d+)", out) or re.search(r"Socket errors: (.*)", out):
        raise RuntimeError(f"wrk saw errors against {url}:\n{out}")
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    count = re.search(r"(\d+) requests in", out)
    p50 = re.search(r"\s50%\s+([\d.]+)(us|ms|s)", out)
    p99 = re.search(r"\s99%\s+([\d.]+)(us|ms|s)", out)
    if not (rps and count and p50 and p99) or int(count[1]) == 0:
        raise RuntimeError(f"wrk made no requests against {url}:\n{out}")
    return float(rps[1]), int(count[1]), _duration_ms(p50[1], p50[2]), _duration_ms(p99[1], p99[2])


def run_window(
    url: str,
    script: str,
    *,
    seconds: int,
    connections: int,
    pid: int,
    sessions: SessionCounter,
) -> Window:
    """Load ``url`` for ``seconds`` and report throughput, latency, server CPU per call and sessions opened."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(script)
    try:
        sessions_before = sessions.sessions()
        cpu_before = cpu_seconds(pid)
        done = subprocess.run(
            ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", f.name, url],
            capture_output=True,
            text=True,
            check=False,
        )
        cpu_after = cpu_seconds(pid)
        # Let backends that wrk's last requests made report their sessions (a new backend reports when it
        # first goes idle, a closed one on exit; both within milliseconds of the call that caused them).
        time.sleep(0.2)
        sessions_after = sessions.sessions()
    finally:
        os.unlink(f.name)
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed against {url}: {done.stderr}")
    rps, count, p50, p99 = parse_wrk(done.stdout, url)
    return Window(
        rps=rps,
        requests=count,
        p50_ms=p50,
        p99_ms=p99,
        cpu_ms_per_call=(cpu_after - cpu_before) * 1000 / count,
        sessions_opened=sessions_after - sessions_before,
    )
