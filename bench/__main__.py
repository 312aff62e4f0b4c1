"""Measure Coatcheck's tool-call throughput against the servers a user would compare it with, in the same run.

    python -m bench [--rounds 5] [--seconds 8] [--connections 16] [--mode both|sse|json] [--profile]
    python -m bench --smoke        # one short round of every target: proves the bench still runs

Needs ``wrk`` (Debian package ``wrk``), PostgreSQL (``TEST_DATABASE_URL``, default the local server), Node for
the dev IdP, and the ``bench`` extra (FastMCP, py-spy): ``pip install -e '.[test,bench]' -c constraints.txt``.

Coatcheck runs exactly as ``coatcheck serve`` starts it (INFO logging, the access line on; only the secrets and
URLs it needs are set), so in SSE mode (its default) its store tools' calls are answered inline
(``api/mcp/lanes.py``). The peers run with uvicorn's ``--log-level warning --no-access-log``.

Targets, each one uvicorn worker: a bare Litestar endpoint running the cart query (the floor), the stock ``mcp``
app with a one-query cart tool, FastMCP with the same tool, and Coatcheck's ``cart_view`` and ``cart_set_item``
(auth and sealed requestState on). Every target is measured once per round, rounds interleave targets so that
machine noise hits them alike, and ratios are taken between targets of the same round (paired), then summarised
as median and range. Absolute numbers swing up to 1.7x between rounds on shared machines; the ratios carry over.
"""

import argparse
import asyncio
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from sqlalchemy.engine import make_url

from bench import profile
from bench.measure import SessionCounter, Window, lua_script, run_window
from store.db import Database
from store.demo import seed_demo_catalog
from store.migrations import upgrade
from tests.support.devidp import start_devidp
from tests.support.server import run_server
from tests.support.waiting import free_port, wait_until
from tests.support.wire import modern_request, response_message

ROOT = Path(__file__).resolve().parents[1]

FLOOR = "floor"
SDK = "sdk"
FASTMCP = "fastmcp"
VIEW = "cart_view"
SET_ITEM = "cart_set_item"
WORKERS = "cart_view_workers"
LABELS = {
    FLOOR: "bare Litestar + the same query (floor)",
    SDK: "stock mcp app, one-query tool, no auth",
    FASTMCP: "FastMCP, same tool, no auth",
    VIEW: "Coatcheck cart_view",
    SET_ITEM: "Coatcheck cart_set_item",
    WORKERS: "Coatcheck cart_view, serve --workers N",
}
MODES = {"sse": "SSE-capable responses (the SDK default)", "json": "plain JSON responses (MCP_JSON_RESPONSE=true)"}


@dataclass(frozen=True)
class Target:
    """One thing to load: a server process and the request(s) to send it."""

    key: str
    mode: str
    url: str
    pid: int
    headers: dict[str, str]
    bodies: list[dict[str, Any]]

    @property
    def name(self) -> str:
        return self.key if self.key == FLOOR else f"{self.key} [{self.mode}]"


def _dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@contextmanager
def bench_database(admin_url: str) -> Iterator[str]:
    """A fresh database with the schema and the demo catalog, dropped afterwards."""
    name = f"coatcheck_bench_{uuid.uuid4().hex[:8]}"

    async def run(sql: str) -> None:
        conn = await asyncpg.connect(_dsn(admin_url))
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(run(f'CREATE DATABASE "{name}"'))
    url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    try:
        upgrade(url)

        async def seed() -> None:
            db = Database.connect(url)
            await seed_demo_catalog(db)
            await db.dispose()

        asyncio.run(seed())
        yield url
    finally:
        asyncio.run(run(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@contextmanager
def uvicorn_target(factory: str, env: dict[str, str]) -> Iterator[tuple[str, int]]:
    """Serve a ``bench.targets`` factory with one uvicorn worker; yields its /mcp URL and pid."""
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="bench-", suffix=".log", delete=False)  # noqa: SIM115
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "--factory",
            factory,
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--no-access-log",
        ],
        env={**os.environ, **env},
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )

    def up() -> bool:
        if process.poll() is not None:
            raise RuntimeError(Path(log.name).read_text())
        try:
            httpx.post(f"http://127.0.0.1:{port}/mcp", timeout=1)
        except httpx.HTTPError:
            return False
        return True

    try:
        wait_until(up, timeout=30, what=factory)
        yield f"http://127.0.0.1:{port}/mcp", process.pid
    finally:
        process.terminate()
        process.wait(timeout=15)


def verify(target: Target) -> None:
    """Fail unless the target answers its request with a tool result that is not an error."""
    response = httpx.post(target.url, headers=target.headers, json=target.bodies[0], timeout=10)
    if response.status_code != 200:
        raise RuntimeError(f"{target.name}: HTTP {response.status_code}: {response.text[:500]}")
    message = response_message(response)
    result = message.get("result")
    if not isinstance(result, dict) or result.get("isError"):
        raise RuntimeError(f"{target.name}: not a tool result: {message}")


def coatcheck_env(database_url: str, issuer: str) -> dict[str, str]:
    """What a Coatcheck target is started with: only the secrets and URLs it needs (``PUBLIC_URL`` aside)."""
    return {
        "DATABASE_URL": database_url,
        "OIDC_ISSUER": issuer,
        "REQUEST_STATE_KEYS": secrets.token_urlsafe(32),
        "TOKEN_ENCRYPTION_KEYS": secrets.token_urlsafe(32),
        "OIDC_CLIENT_ID": "coatcheck-bench",  # the /connect login is not exercised here
        "OIDC_CLIENT_SECRET": secrets.token_urlsafe(32),
        # Everything else as `coatcheck serve` ships it: INFO logging, one access line per request. Users
        # run the defaults, so that is what is measured (not LOG_LEVEL=WARNING).
    }


def tool_request(name: str, arguments: dict[str, Any], token: str) -> tuple[dict[str, str], dict[str, Any]]:
    """Headers and body of a ``tools/call`` of ``name`` with a bearer ``token``."""
    headers, body = modern_request("tools/call", {"name": name, "arguments": arguments}, request_id=1)
    return {**headers, "Authorization": f"Bearer {token}"}, body


def seed_cart(mcp_url: str, token: str) -> str:
    """A new cart with the bench's three lines, made through the tools; its handle."""
    headers, body = tool_request("cart_create", {}, token)
    reply = response_message(httpx.post(mcp_url, headers=headers, json=body, timeout=10))
    cart_id: str = reply["result"]["structuredContent"]["cart_id"]
    for sku, quantity in (("hat-beanie", 2), ("scarf-cashmere", 1), ("brush-lint", 3)):
        headers, body = tool_request("cart_set_item", {"cart_id": cart_id, "sku": sku, "quantity": quantity}, token)
        verify(Target(SET_ITEM, "-", mcp_url, 0, headers, [body]))
    return cart_id


def _median_range(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def _fmt(values: list[float], digits: int = 2) -> str:
    med, lo, hi = _median_range(values)
    return f"{med:.{digits}f} [{lo:.{digits}f}-{hi:.{digits}f}]"


def report(
    results: dict[str, list[Window]], targets: list[Target], modes: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    """Print the per-target table and the paired ratios with the issue's targets; return them as data."""
    print(
        f"\nwrk -t1 -c{args.connections}, {args.rounds} interleaved round(s) x {args.seconds}s per target, "
        "one uvicorn worker each"
    )
    summary: dict[str, Any] = {"rounds": args.rounds, "seconds": args.seconds, "connections": args.connections}
    floor = results[FLOOR]
    for mode in modes:
        print(f"\n== response mode: {MODES[mode]} ==")
        print(
            f"{'target':42} {'rps median [range]':>22} {'p50 ms':>7} {'p99 ms':>7} {'CPU ms/call':>12} "
            f"{'sessions opened':>16}"
        )
        by_key = {t.key: results[t.name] for t in targets if t.mode in (mode, "-")}
        for key, windows in by_key.items():
            rps = [w.rps for w in windows]
            print(
                f"{LABELS[key]:42} {_fmt(rps, 0):>22} {statistics.median(w.p50_ms for w in windows):7.1f} "
                f"{statistics.median(w.p99_ms for w in windows):7.1f} "
                f"{statistics.median(w.cpu_ms_per_call for w in windows):12.3f} "
                f"{'+'.join(str(w.sessions_opened) for w in windows):>16}"
            )
        view, sdk, fastmcp, set_item = by_key[VIEW], by_key[SDK], by_key[FASTMCP], by_key[SET_ITEM]

        def paired(a: list[Window], b: list[Window], field: str = "rps") -> list[float]:
            return [getattr(x, field) / getattr(y, field) for x, y in zip(a, b, strict=True)]

        ratios = {
            "cart_view / FastMCP": (paired(view, fastmcp), ">=", 1.5),
            "cart_view / stock SDK": (paired(view, sdk), ">=", 0.9),
            "cart_view / floor": (paired(view, floor), None, None),
            "stock SDK / floor": (paired(sdk, floor), None, None),
            "FastMCP / floor": (paired(fastmcp, floor), None, None),
            "cart_set_item / cart_view": (paired(set_item, view), ">=", 0.7),
            "cart_view p99 / its p50": ([w.p99_ms / w.p50_ms for w in view], "<=", 5.0),
            "cart_view p99 / stock SDK p99": (paired(view, sdk, "p99_ms"), "<=", 1.0),
            # Server CPU per call is steadier than rps on a shared machine (a target that loses the core
            # for a while loses requests, not CPU per request): lower is cheaper.
            "CPU/call cart_view / stock SDK": (paired(view, sdk, "cpu_ms_per_call"), None, None),
            "CPU/call cart_view / FastMCP": (paired(view, fastmcp, "cpu_ms_per_call"), None, None),
            "CPU/call cart_set_item / cart_view": (paired(set_item, view, "cpu_ms_per_call"), None, None),
        }
        print(f"paired per-round ratios, median [range] over {args.rounds} round(s):")
        mode_summary: dict[str, Any] = {}
        for name, (values, op, goal) in ratios.items():
            med = statistics.median(values)
            verdict = ""
            if op is not None and goal is not None:
                met = med >= goal if op == ">=" else med <= goal
                verdict = f"target {op} {goal}: " + ("met" if met else f"MISSED by {abs(med / goal - 1) * 100:.0f} %")
            print(f"  {name:32} {_fmt(values):>20}  {verdict}")
            mode_summary[name] = {"median": med, "min": min(values), "max": max(values), "target": verdict}
        if WORKERS in by_key:
            workers = by_key[WORKERS]
            ratios = {
                f"cart_view --workers {args.workers} / 1 worker": (paired(workers, view), None, None),
                f"CPU/call --workers {args.workers} / 1 worker": (paired(workers, view, "cpu_ms_per_call"), None, None),
            }
            for name, (values, _, _) in ratios.items():
                print(f"  {name:32} {_fmt(values):>20}")
                mode_summary[name] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
        opened = {LABELS[k]: sum(w.sessions_opened for w in ws) for k, ws in by_key.items()}
        print("  PostgreSQL sessions opened during measurement: " + ", ".join(f"{k} {v}" for k, v in opened.items()))
        summary[mode] = {"ratios": mode_summary, "sessions_opened": opened}
    summary["windows"] = {name: [w.as_dict() for w in ws] for name, ws in results.items()}
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--seconds", type=int, default=8, help="length of each measured window")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--connections", type=int, default=16, help="concurrent HTTP connections (wrk -c)")
    parser.add_argument("--warmup", type=int, default=2, help="seconds of load per target before the rounds")
    parser.add_argument("--mode", choices=["both", "sse", "json"], default="both", help="response mode(s) to run")
    parser.add_argument("--smoke", action="store_true", help="one 2 s round per target: checks that it all runs")
    parser.add_argument(
        "--profile", action="store_true", help="after the rounds, py-spy each target once and print where CPU goes"
    )
    parser.add_argument(
        "--profile-only", default="", help="with --profile: comma-separated target keys to profile (e.g. sdk,cart_view)"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=0,
        metavar="N",
        help="also measure cart_view on `coatcheck serve --workers N` (N >= 2; DB_POOL_SIZE 10 split between the "
        "workers; CPU summed over them)",
    )
    parser.add_argument("--output", type=Path, help="also write every window and ratio to this JSON file")
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.seconds, args.warmup = 1, 2, 1
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (apt-get install wrk)")
    modes = ["sse", "json"] if args.mode == "both" else [args.mode]

    admin_url = os.environ.get("TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    with ExitStack() as stack:
        url = stack.enter_context(bench_database(admin_url))
        # Reads the counter from the admin database, so the reader is no session of the bench database.
        sessions = SessionCounter(_dsn(admin_url), make_url(url).database or "")
        stack.callback(sessions.close)
        ports = {mode: free_port() for mode in modes}
        if args.workers > 1:
            ports.update({f"{mode}-workers": free_port() for mode in modes})
        publics = {mode: f"http://127.0.0.1:{port}" for mode, port in ports.items()}
        idp = stack.enter_context(start_devidp(port=free_port(), resources=[f"{p}/mcp" for p in publics.values()]))
        common = coatcheck_env(url, idp.issuer)
        bench_env = {"BENCH_DSN": _dsn(url), "BENCH_ISS": idp.issuer, "BENCH_SUB": "bench-user"}

        floor_url, floor_pid = stack.enter_context(uvicorn_target("bench.targets:floor_app", bench_env))
        targets: list[Target] = []
        cart_ids: list[str] = []
        for mode in modes:
            env = {**common, "PUBLIC_URL": publics[mode], "MCP_JSON_RESPONSE": "true" if mode == "json" else "false"}
            server = stack.enter_context(run_server(env, port=ports[mode]))
            token = asyncio.run(idp.token("bench-user", resource=server.mcp_url))

            def call(name: str, arguments: dict[str, Any], token: str = token) -> tuple[dict[str, str], dict[str, Any]]:
                return tool_request(name, arguments, token)

            if not cart_ids:  # one cart per connection, each with three lines, shared by both servers
                cart_ids.extend(seed_cart(server.mcp_url, token) for _ in range(args.connections))
            baseline_env = {**bench_env, "BENCH_JSON": "1" if mode == "json" else "0"}
            sdk_url, sdk_pid = stack.enter_context(uvicorn_target("bench.targets:sdk_app", baseline_env))
            fm_url, fm_pid = stack.enter_context(uvicorn_target("bench.targets:fastmcp_app", baseline_env))
            plain_headers, plain_body = modern_request(
                "tools/call", {"name": "cart_view", "arguments": {"cart_id": cart_ids[0]}}, request_id=1
            )
            view_headers, view_body = call("cart_view", {"cart_id": cart_ids[0]})
            if not targets:
                targets.append(Target(FLOOR, "-", floor_url, floor_pid, plain_headers, [plain_body]))
            if args.workers > 1:
                port = ports[f"{mode}-workers"]
                # The same connection budget as the one-worker target, split between the workers.
                pool = str(max(1, 10 // args.workers))
                many_env = {**env, "PUBLIC_URL": publics[f"{mode}-workers"], "DB_POOL_SIZE": pool}
                many = stack.enter_context(run_server(many_env, port=port, extra_args=["--workers", str(args.workers)]))
                many_token = asyncio.run(idp.token("bench-user", resource=many.mcp_url))
                many_headers = {**view_headers, "Authorization": f"Bearer {many_token}"}
                targets.append(Target(WORKERS, mode, many.mcp_url, many.process.pid, many_headers, [view_body]))
            targets += [
                Target(SDK, mode, sdk_url, sdk_pid, plain_headers, [plain_body]),
                Target(FASTMCP, mode, fm_url, fm_pid, plain_headers, [plain_body]),
                Target(VIEW, mode, server.mcp_url, server.process.pid, view_headers, [view_body]),
                Target(
                    SET_ITEM,
                    mode,
                    server.mcp_url,
                    server.process.pid,
                    call("cart_set_item", {"cart_id": cart_ids[0], "sku": "hat-beanie", "quantity": 2})[0],
                    [call("cart_set_item", {"cart_id": c, "sku": "hat-beanie", "quantity": 2})[1] for c in cart_ids],
                ),
            ]

        for target in targets:
            if target.key != FLOOR:
                verify(target)
            # Warm up until a window opens no database session: the pools have grown to what this load
            # needs (each opens its connections on first use), so the rounds measure the steady state.
            for _ in range(5):
                warm = run_window(
                    target.url,
                    lua_script(target.headers, target.bodies),
                    seconds=args.warmup,
                    connections=args.connections,
                    pid=target.pid,
                    sessions=sessions,
                )
                if warm.sessions_opened == 0:
                    break

        results: dict[str, list[Window]] = {t.name: [] for t in targets}
        for round_no in range(args.rounds):
            # Rotate the order each round, so no target always runs right after the same neighbour.
            shift = round_no % len(targets)
            for target in targets[shift:] + targets[:shift]:
                results[target.name].append(
                    run_window(
                        target.url,
                        lua_script(target.headers, target.bodies),
                        seconds=args.seconds,
                        connections=args.connections,
                        pid=target.pid,
                        sessions=sessions,
                    )
                )
            print(f"round {round_no + 1}/{args.rounds} done", file=sys.stderr)

        summary = report(results, targets, modes, args)

        if args.profile:
            print("\n== profiles (py-spy, one extra window per target) ==")
            summary["profiles"] = {}
            only = {k for k in args.profile_only.split(",") if k}
            for target in targets:
                if only and target.key not in only:
                    continue
                sampler = profile.record(target.pid, args.seconds)
                window = run_window(
                    target.url,
                    lua_script(target.headers, target.bodies),
                    seconds=args.seconds,
                    connections=args.connections,
                    pid=target.pid,
                    sessions=sessions,
                )
                text = profile.collect(sampler).render(window.cpu_ms_per_call)
                print(f"\n-- {target.name} --\n{text}")
                summary["profiles"][target.name] = text
    if args.output:
        args.output.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
