"""Measure Coatcheck's tool-call throughput against baselines measured in the same run.

    python -m bench [--seconds 10] [--rounds 3] [--connections 16]

Needs ``wrk`` (Debian package ``wrk``), PostgreSQL (``TEST_DATABASE_URL``, default the local server) and
Node for the dev IdP. Each target is one uvicorn worker; rounds are interleaved so that machine noise hits
every target alike. Report ratios, not absolute numbers: these machines swing up to 1.7x between rounds.
"""

import argparse
import asyncio
import json
import os
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from sqlalchemy.engine import make_url

from store.db import Database
from store.demo import seed_demo_catalog
from store.migrations import upgrade
from tests.support.devidp import start_devidp
from tests.support.server import run_server
from tests.support.waiting import free_port, wait_until
from tests.support.wire import modern_request, response_message

ROOT = Path(__file__).resolve().parents[1]


def _dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@contextmanager
def bench_database(admin_url: str) -> Iterator[str]:
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
def uvicorn_target(factory: str, env: dict[str, str]) -> Iterator[str]:
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
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(timeout=15)


def lua_script(headers: dict[str, str], body: dict[str, Any] | list[dict[str, Any]]) -> str:
    """A wrk script posting ``body`` (or a random one of a list of bodies) with ``headers``."""
    bodies = body if isinstance(body, list) else [body]
    lines = ['wrk.method = "POST"', "local bodies = {" + ", ".join(json.dumps(json.dumps(b)) for b in bodies) + "}"]
    lines += [f"wrk.headers[{json.dumps(k)}] = {json.dumps(v)}" for k, v in headers.items()]
    lines.append("request = function() return wrk.format(nil, nil, nil, bodies[math.random(#bodies)]) end")
    return "\n".join(lines) + "\n"


def verify(url: str, headers: dict[str, str], body: dict[str, Any]) -> None:
    response = httpx.post(url, headers=headers, json=body, timeout=10)
    assert response.status_code == 200, response.text
    message = response_message(response)
    assert "result" in message, message
    assert not message["result"].get("isError"), message


def run_wrk(url: str, script: str, seconds: int, connections: int) -> dict[str, float]:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(script)
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", f.name, url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out)[1])  # type: ignore[index]
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)

    def pct(p: str) -> float:
        m = re.search(rf"\s{p}%\s+([\d.]+)(us|ms|s)", out)
        assert m, out
        return float(m[1]) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[m[2]]

    if non2xx or errors:
        raise RuntimeError(f"wrk saw errors against {url}:\n{out}")
    return {"rps": rps, "p50": pct("50"), "p99": pct("99")}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument(
        "--json", action="store_true", help="plain JSON responses instead of SSE (MCP_JSON_RESPONSE=true) everywhere"
    )
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (apt-get install wrk)")

    admin_url = os.environ.get("TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    with ExitStack() as stack:
        url = stack.enter_context(bench_database(admin_url))
        port = free_port()
        public = f"http://127.0.0.1:{port}"
        idp = stack.enter_context(start_devidp(port=free_port(), resources=[f"{public}/mcp"]))
        env = {
            "DATABASE_URL": url,
            "PUBLIC_URL": public,
            "OIDC_ISSUER": idp.issuer,
            "REQUEST_STATE_KEYS": secrets.token_urlsafe(32),
            "TOKEN_ENCRYPTION_KEYS": secrets.token_urlsafe(32),
            "OIDC_CLIENT_ID": "coatcheck-bench",  # the /connect login is not exercised here
            "OIDC_CLIENT_SECRET": secrets.token_urlsafe(32),
            "LOG_LEVEL": "WARNING",
            "MCP_JSON_RESPONSE": "true" if args.json else "false",
        }
        coatcheck = stack.enter_context(run_server(env, port=port))
        token = asyncio.run(idp.token("bench-user", resource=coatcheck.mcp_url))
        auth = {"Authorization": f"Bearer {token}"}

        def call(name: str, arguments: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
            headers, body = modern_request("tools/call", {"name": name, "arguments": arguments}, request_id=1)
            return {**headers, **auth}, body

        cart_ids = []
        for _ in range(args.connections):
            headers, body = call("cart_create", {})
            cart_ids.append(
                response_message(httpx.post(coatcheck.mcp_url, headers=headers, json=body))["result"][
                    "structuredContent"
                ]["cart_id"]
            )
            for sku, qty in (("hat-beanie", 2), ("scarf-cashmere", 1), ("brush-lint", 3)):
                headers, body = call("cart_set_item", {"cart_id": cart_ids[-1], "sku": sku, "quantity": qty})
                verify(coatcheck.mcp_url, headers, body)
        cart_id = cart_ids[0]

        bench_env = {
            "BENCH_DSN": _dsn(url),
            "BENCH_ISS": idp.issuer,
            "BENCH_SUB": "bench-user",
            "BENCH_JSON": "1" if args.json else "0",
        }
        floor = stack.enter_context(uvicorn_target("bench.targets:floor_app", bench_env))
        sdk = stack.enter_context(uvicorn_target("bench.targets:sdk_app", bench_env))

        view = call("cart_view", {"cart_id": cart_id})
        # Writers spread over one cart per connection, as users would; one shared cart would measure row-lock
        # contention instead.
        set_item_headers = call("cart_set_item", {"cart_id": cart_id, "sku": "hat-beanie", "quantity": 2})[0]
        set_item_bodies = [
            call("cart_set_item", {"cart_id": c, "sku": "hat-beanie", "quantity": 2})[1] for c in cart_ids
        ]
        sdk_headers, sdk_body = modern_request(
            "tools/call", {"name": "cart_view", "arguments": {"cart_id": cart_id}}, request_id=1
        )
        targets = {
            "floor-cart (bare Litestar + query)": (floor, sdk_headers, sdk_body),
            "sdk-cart (stock mcp app, no auth)": (sdk, sdk_headers, sdk_body),
            "coatcheck cart_view": (coatcheck.mcp_url, *view),
            "coatcheck cart_set_item": (coatcheck.mcp_url, set_item_headers, set_item_bodies),
        }
        for name, (target_url, h, b) in targets.items():
            if not name.startswith("floor"):
                verify(target_url, h, b[0] if isinstance(b, list) else b)
            run_wrk(target_url, lua_script(h, b), 2, args.connections)  # warm-up

        results: dict[str, list[dict[str, float]]] = {name: [] for name in targets}
        for round_no in range(args.rounds):
            for name, (target_url, h, b) in targets.items():
                results[name].append(run_wrk(target_url, lua_script(h, b), args.seconds, args.connections))
            print(f"round {round_no + 1}/{args.rounds} done", file=sys.stderr)

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    floor_rps = med("floor-cart (bare Litestar + query)", "rps")
    sdk_rps = med("sdk-cart (stock mcp app, no auth)", "rps")
    mode = "JSON responses" if args.json else "SSE responses (the SDK default)"
    print(
        f"\nwrk -t1 -c{args.connections}, {args.rounds} interleaved rounds x {args.seconds}s, one uvicorn worker each"
    )
    print(f"response mode: {mode}")
    print(f"{'target':40} {'rps (median)':>13} {'min-max':>15} {'p50 ms':>8} {'p99 ms':>8} {'/floor':>7} {'/sdk':>6}")
    for name in targets:
        rps = [r["rps"] for r in results[name]]
        print(
            f"{name:40} {med(name, 'rps'):13.0f} {min(rps):7.0f}-{max(rps):<7.0f} {med(name, 'p50'):8.1f} "
            f"{med(name, 'p99'):8.1f} {med(name, 'rps') / floor_rps:7.2f} {med(name, 'rps') / sdk_rps:6.2f}"
        )


if __name__ == "__main__":
    main()
