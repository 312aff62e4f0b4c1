"""Baseline servers measured in the same run as Coatcheck (uvicorn ``--factory`` targets).

- ``floor_app``: a bare Litestar endpoint running the same cart query as ``cart_view`` (no MCP): the floor.
- ``sdk_app``: the stock ``mcp`` streamable-HTTP app (stateless, no auth) with a tool running that query.
- ``fastmcp_app``: FastMCP (the ``bench`` extra, pinned in constraints.txt) with the same tool, stateless, no auth.

All read ``BENCH_DSN`` (an asyncpg DSN) and open one pool (up to 10 connections, as Coatcheck's default
``DB_POOL_SIZE``) in their lifespan; ``BENCH_JSON=1`` selects plain JSON responses.
"""

import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
from litestar import Litestar, post
from mcp.server.mcpserver import MCPServer
from starlette.applications import Starlette

CART_QUERY = """
SELECT c.version, c.status, i.sku, p.name, i.quantity, p.unit_price_cents, p.currency
FROM cart c LEFT JOIN cart_item i ON i.cart_id = c.id LEFT JOIN product p ON p.sku = i.sku
WHERE c.handle = $1 AND c.principal_iss = $2 AND c.principal_sub = $3 ORDER BY i.sku
"""


class _Pool:
    pool: Any = None


async def _view(pool: Any, cart_id: str) -> dict[str, Any]:
    rows = await pool.fetch(CART_QUERY, cart_id, os.environ["BENCH_ISS"], os.environ["BENCH_SUB"])
    items = [
        {"sku": r[2], "name": r[3], "quantity": r[4], "unit_price_cents": r[5], "line_total_cents": r[4] * r[5]}
        for r in rows
        if r[2] is not None
    ]
    return {
        "cart_id": cart_id,
        "version": rows[0][0],
        "items": items,
        "total_cents": sum(i["line_total_cents"] for i in items),
    }


def floor_app() -> Litestar:
    """The physical limit: HTTP + JSON + one query, no protocol."""
    holder = _Pool()

    @contextlib.asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        holder.pool = await asyncpg.create_pool(os.environ["BENCH_DSN"], min_size=2, max_size=10)
        yield
        await holder.pool.close()

    @post("/mcp", status_code=200)
    async def view(data: dict[str, Any]) -> dict[str, Any]:
        result = await _view(holder.pool, data["params"]["arguments"]["cart_id"])
        return {"jsonrpc": "2.0", "id": data["id"], "result": {"structuredContent": result}}

    return Litestar([view], lifespan=[lifespan], openapi_config=None)


def sdk_app() -> Starlette:
    """The stock SDK app with a one-query cart tool (what a plain MCP server costs)."""
    holder = _Pool()

    @contextlib.asynccontextmanager
    async def lifespan(_: MCPServer[Any]) -> AsyncIterator[None]:
        holder.pool = await asyncpg.create_pool(os.environ["BENCH_DSN"], min_size=2, max_size=10)
        yield
        await holder.pool.close()

    mcp: MCPServer[Any] = MCPServer("sdk-cart", lifespan=lifespan, log_level="WARNING")

    @mcp.tool(name="cart_view")
    async def cart_view(cart_id: str) -> dict[str, Any]:
        return await _view(holder.pool, cart_id)

    return mcp.streamable_http_app(
        stateless_http=True, json_response=os.environ.get("BENCH_JSON") == "1", host="127.0.0.1"
    )


def fastmcp_app() -> Any:
    """FastMCP (``bench`` extra) serving the same one-query tool, stateless, no auth."""
    from fastmcp import FastMCP

    holder = _Pool()

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[dict[str, Any]]:
        holder.pool = await asyncpg.create_pool(os.environ["BENCH_DSN"], min_size=2, max_size=10)
        yield {}
        await holder.pool.close()

    mcp: Any = FastMCP("fastmcp-cart", lifespan=lifespan)

    @mcp.tool(name="cart_view")
    async def cart_view(cart_id: str) -> dict[str, Any]:
        return await _view(holder.pool, cart_id)

    return mcp.http_app(path="/mcp", stateless_http=True, json_response=os.environ.get("BENCH_JSON") == "1")


def coatcheck_app() -> Any:
    """Coatcheck's app as ``coatcheck serve`` builds it (settings from the environment, its logging, start-up
    objects frozen), for a server other than uvicorn to run (``python -m bench.granian``)."""
    from api.app import create_app
    from api.gc_policy import serving_policy
    from api.logs import configure_logging
    from api.settings import Settings

    settings = Settings.from_env()
    configure_logging(settings.log_level, settings.log_format)
    app = create_app(settings)
    serving_policy()
    return app
