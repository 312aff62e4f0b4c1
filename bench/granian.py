"""Coatcheck's app under Granian against the same app under uvicorn as ``coatcheck serve`` runs it.

    python -m bench.granian [--rounds 4] [--seconds 8] [--mode sse|json]

Issue 20 asked whether Granian (which Litestar supports) would serve ``cart_view`` faster. Both servers run
one worker on uvloop with Coatcheck at its defaults (INFO, one access line per request); uvicorn as ``coatcheck
serve`` starts it (its read deadlines, ``MAX_CONNECTIONS``, the drain), Granian with its own defaults
(``--interface asgi --workers 1 --loop uvloop``, the app from ``bench.targets:coatcheck_app``). ``wrk -t1
-c16`` loads each in turn, rounds alternate the order, and the report is the paired per-round throughput ratio
and the CPU per call of each server's whole process tree (Granian's worker is a child process with Rust
threads). Needs the ``bench`` extra (Granian is pinned in constraints.txt), ``wrk`` and the dev IdP's Node.
"""

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
from sqlalchemy.engine import make_url

from bench.__main__ import ROOT, Target, _dsn, bench_database, coatcheck_env, seed_cart, tool_request, verify
from bench.measure import SessionCounter, Window, lua_script, run_window
from tests.support.devidp import start_devidp
from tests.support.server import run_server, stop_process
from tests.support.waiting import free_port, wait_until


@contextmanager
def granian_server(env: dict[str, str], port: int) -> Iterator[int]:
    """Serve Coatcheck with one Granian worker on ``port``; yields the main process's pid."""
    log = tempfile.NamedTemporaryFile(prefix="bench-granian-", suffix=".log", delete=False)  # noqa: SIM115
    command = [sys.executable, "-m", "granian", "--interface", "asgi", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--workers", "1", "--loop", "uvloop", "--no-ws", "--factory", "bench.targets:coatcheck_app"]
    process = subprocess.Popen(command, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)

    def up() -> bool:
        if process.poll() is not None:
            raise RuntimeError(Path(log.name).read_text())
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(up, timeout=60, what="granian")
        yield process.pid
    finally:
        stop_process(process)
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.granian")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--mode", choices=["sse", "json"], default="sse")
    args = parser.parse_args()
    admin_url = os.environ.get("TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    with ExitStack() as stack:
        url = stack.enter_context(bench_database(admin_url))
        sessions = SessionCounter(_dsn(admin_url), make_url(url).database or "")
        stack.callback(sessions.close)
        ports = {"uvicorn": free_port(), "granian": free_port()}
        mcp_urls = {name: f"http://127.0.0.1:{port}/mcp" for name, port in ports.items()}
        idp = stack.enter_context(start_devidp(port=free_port(), resources=list(mcp_urls.values())))
        common = coatcheck_env(url, idp.issuer)
        common["MCP_JSON_RESPONSE"] = "true" if args.mode == "json" else "false"
        envs = {name: {**common, "PUBLIC_URL": f"http://127.0.0.1:{port}"} for name, port in ports.items()}
        pids = {
            "uvicorn": stack.enter_context(run_server(envs["uvicorn"], port=ports["uvicorn"])).process.pid,
            "granian": stack.enter_context(granian_server(envs["granian"], ports["granian"])),
        }
        scripts = {}
        for name, mcp_url in mcp_urls.items():
            token = asyncio.run(idp.token("bench-user", resource=mcp_url))
            headers, body = tool_request("cart_view", {"cart_id": seed_cart(mcp_url, token)}, token)
            verify(Target("cart_view", name, mcp_url, pids[name], headers, [body]))
            scripts[name] = lua_script(headers, [body])
            run_window(mcp_url, scripts[name], seconds=3, connections=16, pid=pids[name], sessions=sessions)  # warm-up
        windows: dict[str, list[Window]] = {name: [] for name in ports}
        for round_ in range(args.rounds):
            order = list(ports) if round_ % 2 == 0 else list(ports)[::-1]
            for name in order:
                load = {"seconds": args.seconds, "connections": 16, "pid": pids[name], "sessions": sessions}
                windows[name].append(run_window(mcp_urls[name], scripts[name], **load))
        print(f"\ncart_view [{args.mode}], wrk -t1 -c16, {args.rounds} round(s) x {args.seconds}s, one worker each")
        for name, values in windows.items():
            rps = [w.rps for w in values]
            cpu = [w.cpu_ms_per_call for w in values]
            print(
                f"  {name:8} rps {statistics.median(rps):6.0f} [{min(rps):.0f}-{max(rps):.0f}]"
                f"  p99 {statistics.median([w.p99_ms for w in values]):5.1f} ms"
                f"  CPU ms/call {statistics.median(cpu):.3f} [{min(cpu):.3f}-{max(cpu):.3f}]"
            )
        ratios = [g.rps / u.rps for g, u in zip(windows["granian"], windows["uvicorn"], strict=True)]
        print(f"  granian / uvicorn rps, paired: {statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]")


if __name__ == "__main__":
    main()
