"""CPU per call without HTTP or machine noise: ASGI calls made in-process, one at a time.

    python -m bench.inproc [--batches 30] [--mode sse|json] [--ab-sdk-hooks]
    python -m bench.inproc --cprofile cart_view [--pstats FILE] [--callers PATTERN]

Builds the stock SDK app (``bench.targets.sdk_app``) and Coatcheck's ``create_app`` in this process, against a
fresh bench database, and times ``cart_view`` / ``cart_set_item`` through each app's ASGI callable with a real
token and the real database. Coatcheck runs at the shipped defaults as ``coatcheck serve`` sets them up (INFO,
the access line written by the log thread, here into /dev/null; start-up objects frozen; ``--log-level`` to
compare). No uvicorn, no wrk: what remains is the app's own CPU, so a change in api/ shows
up here as microseconds per call, long before it is visible through the noise of ``python -m bench``.
"""

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import secrets
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

import httpx
from sqlalchemy.engine import make_url

from bench.__main__ import _dsn, bench_database
from tests.support.devidp import start_devidp
from tests.support.waiting import free_port
from tests.support.wire import modern_request

Receive = Callable[[], Awaitable[dict[str, Any]]]
ASGI = Callable[[dict[str, Any], Receive, Callable[..., Awaitable[None]]], Awaitable[None]]


async def call(app: ASGI, host: str, headers: dict[str, str], body: bytes) -> bytes:
    """One POST /mcp through ``app``; returns the response body."""
    done = asyncio.Event()
    chunks: list[bytes] = []
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                done.set()

    raw = [(k.lower().encode(), v.encode()) for k, v in {**headers, "host": host}.items()]
    raw.append((b"content-length", str(len(body)).encode()))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/mcp",
        "raw_path": b"/mcp",
        "root_path": "",
        "query_string": b"",
        "headers": raw,
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", int(host.rsplit(":", 1)[1])),
        "state": {},
    }
    await app(scope, receive, send)
    out = b"".join(chunks)
    if b'"isError":true' in out or b'"error"' in out:
        raise RuntimeError(out[:500].decode(errors="replace"))
    return out


async def measure(
    app: ASGI, host: str, headers: dict[str, str], bodies: list[bytes], calls: int, concurrency: int = 16
) -> float:
    """CPU microseconds per call over ``calls`` calls made by ``concurrency`` concurrent callers (after a warm-up).

    Concurrent, as under load: a server that is never idle batches its wake-ups, and a lone caller would
    charge every call the event loop's idle-to-busy transitions.
    """

    async def caller(n: int, k: int) -> None:
        body = bodies[k % len(bodies)]  # one body per caller: writers each keep to their own cart
        for _ in range(n):
            await call(app, host, headers, body)

    await asyncio.gather(*(caller(max(1, 200 // concurrency), k) for k in range(concurrency)))
    per_caller = max(1, calls // concurrency)
    start = time.process_time()
    await asyncio.gather(*(caller(per_caller, k) for k in range(concurrency)))
    return (time.process_time() - start) * 1e6 / (per_caller * concurrency)


async def run(args: argparse.Namespace, url: str, issuer: str, token: str, port: int) -> None:
    os.environ.update({"BENCH_DSN": _dsn(url), "BENCH_ISS": issuer, "BENCH_SUB": "bench-user"})
    os.environ["BENCH_JSON"] = "1" if args.mode == "json" else "0"
    from api.app import create_app
    from api.gc_policy import serving_policy
    from api.logs import configure_logging
    from api.settings import Settings
    from bench.targets import sdk_app

    host = f"127.0.0.1:{port}"
    settings = Settings.from_env(
        database_url=url,
        public_url=f"http://{host}",
        oidc_issuer=issuer,
        request_state_keys=secrets.token_urlsafe(32),
        token_encryption_keys=secrets.token_urlsafe(32),
        oidc_client_id="coatcheck-bench",
        oidc_client_secret=secrets.token_urlsafe(32),
        log_level=args.log_level,
        mcp_json_response=args.mode == "json",
    )
    # As `coatcheck serve` logs (one access line per call, written by the log thread), into /dev/null: the
    # process CPU measured includes that thread's share. Only the log handler writes there; a traceback of
    # this harness still reaches the real stderr.
    real_stderr, sys.stderr = sys.stderr, open(os.devnull, "w")  # noqa: SIM115, ASYNC230 - for the process's life
    try:
        configure_logging(settings.log_level, settings.log_format)  # the handler keeps the stream it found
    finally:
        sys.stderr = real_stderr
    coatcheck = create_app(settings)
    # The same app with the SDK's defaults put back (api/mcp/sdk_hooks.py undone): the hooks' A/B.
    stock_hooks = create_app(settings, configure_mcp=_undo_sdk_hooks) if args.ab_sdk_hooks else None
    sdk = sdk_app()
    auth = {"Authorization": f"Bearer {token}"}

    def req(name: str, arguments: dict[str, Any]) -> tuple[dict[str, str], bytes]:
        headers, body = modern_request("tools/call", {"name": name, "arguments": arguments}, request_id=1)
        return headers, json.dumps(body).encode()

    async with AsyncExitStack() as stack:
        await stack.enter_async_context(coatcheck.lifespan())
        if stock_hooks is not None:
            await stack.enter_async_context(stock_hooks.lifespan())
        await stack.enter_async_context(sdk.router.lifespan_context(sdk))
        cart_ids = []
        for _ in range(16):
            h, b = req("cart_create", {})
            reply = (await call(coatcheck, host, {**h, **auth}, b)).decode()
            message = json.loads(reply[reply.index("{") : reply.rindex("}") + 1])
            cart_ids.append(message["result"]["structuredContent"]["cart_id"])
            for sku, qty in (("hat-beanie", 2), ("scarf-cashmere", 1), ("brush-lint", 3)):
                h, b = req("cart_set_item", {"cart_id": cart_ids[-1], "sku": sku, "quantity": qty})
                await call(coatcheck, host, {**h, **auth}, b)
        view_h, view_b = req("cart_view", {"cart_id": cart_ids[0]})
        set_h = req("cart_set_item", {"cart_id": cart_ids[0], "sku": "hat-beanie", "quantity": 2})[0]
        set_bodies = [req("cart_set_item", {"cart_id": c, "sku": "hat-beanie", "quantity": 2})[1] for c in cart_ids]
        cases: dict[str, tuple[ASGI, dict[str, str], list[bytes]]] = {
            "sdk": (sdk, view_h, [view_b]),  # type: ignore[dict-item]
            "cart_view": (coatcheck, {**view_h, **auth}, [view_b]),  # type: ignore[dict-item]
            "cart_set_item": (coatcheck, {**set_h, **auth}, set_bodies),  # type: ignore[dict-item]
        }
        if stock_hooks is not None:
            cases["cart_view, SDK defaults"] = (stock_hooks, {**view_h, **auth}, [view_b])  # type: ignore[assignment]
        serving_policy()  # as `coatcheck serve` does before it serves (api/gc_policy.py)
        # Many short batches, interleaved: on a shared machine the quiet batches (the low percentiles) are
        # the app's own cost, the rest is other processes stealing the core.
        batches: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.batches):
            for name, (app, headers, body) in cases.items():
                batches[name].append(await measure(app, host, headers, body, args.calls))
        for name, values in batches.items():
            values.sort()
            p10, med = values[len(values) // 10], statistics.median(values)
            print(f"{name:14} [{args.mode}] CPU per call: p10 {p10:5.0f} us, median {med:5.0f} us")
        if args.cprofile:
            app, headers, bodies = cases[args.cprofile]
            profiler = cProfile.Profile(time.process_time)
            profiler.enable()
            await measure(app, host, headers, bodies, args.calls * 5)
            profiler.disable()
            stats = pstats.Stats(profiler)
            if args.pstats:
                stats.dump_stats(args.pstats)
            stats.sort_stats(args.sort).print_stats(args.top)
            for pattern in args.callers:
                stats.print_callers(pattern)


def _undo_sdk_hooks(mcp: Any) -> None:
    from mcp.server._otel import OpenTelemetryMiddleware

    from api.mcp.sdk_hooks import McpParamSchemas, SpansWhileTracing

    mcp.middleware[:] = [OpenTelemetryMiddleware() if isinstance(m, SpansWhileTracing) else m for m in mcp.middleware]
    lowlevel = mcp._lowlevel_server
    if isinstance(lowlevel.get_tool_input_schema, McpParamSchemas):
        lowlevel.get_tool_input_schema = lowlevel.get_tool_input_schema._lookup


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.inproc")
    parser.add_argument("--calls", type=int, default=320, help="calls per batch (16 concurrent callers)")
    parser.add_argument("--batches", type=int, default=30, help="batches per case, interleaved")
    parser.add_argument("--mode", choices=["sse", "json"], default="sse")
    parser.add_argument("--log-level", default="INFO", help="LOG_LEVEL of the Coatcheck app (shipped: INFO)")
    parser.add_argument(
        "--ab-sdk-hooks", action="store_true", help="also measure cart_view with api/mcp/sdk_hooks.py undone"
    )
    parser.add_argument("--cprofile", choices=["sdk", "cart_view", "cart_set_item"])
    parser.add_argument("--sort", default="tottime")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--pstats", help="with --cprofile: also write the raw profile to this file")
    parser.add_argument(
        "--callers", action="append", default=[], help="with --cprofile: also who calls functions matching this"
    )
    args = parser.parse_args()
    admin_url = os.environ.get("TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    port = free_port()
    with (
        bench_database(admin_url) as url,
        start_devidp(port=free_port(), resources=[f"http://127.0.0.1:{port}/mcp"]) as idp,
    ):
        token = asyncio.run(idp.token("bench-user", resource=f"http://127.0.0.1:{port}/mcp"))
        assert make_url(url).database
        httpx.get(idp.issuer + "/.well-known/openid-configuration", timeout=5).raise_for_status()
        import uvloop

        uvloop.run(run(args, url, idp.issuer, token, port))


if __name__ == "__main__":
    main()
