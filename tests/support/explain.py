"""EXPLAIN a store statement exactly as the store sends it, and read figures out of the plan."""

import json
from collections.abc import Iterator, Mapping
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import Executable


async def explain(conn: AsyncConnection, statement: Executable, params: Mapping[str, Any]) -> dict[str, Any]:
    """``EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)`` of ``statement`` compiled for this connection's dialect."""
    compiled = statement.compile(dialect=conn.dialect)  # type: ignore[attr-defined]
    values = compiled.construct_params(dict(params))
    args = [values[name] for name in compiled.positiontup or []]
    raw = await conn.get_raw_connection()
    driver = raw.driver_connection
    assert driver is not None
    document = await driver.fetchval(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {compiled.string}", *args)
    return dict(json.loads(document)[0]) if isinstance(document, str) else dict(document[0])


def nodes(plan: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """Every node of a plan tree, depth first."""
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def plan_nodes(document: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The nodes of an EXPLAIN document."""
    return list(nodes(document["Plan"]))


def buffers(document: Mapping[str, Any]) -> int:
    """Shared buffers the whole statement touched (hit + read): what the work costs, without timing noise."""
    top = document["Plan"]
    return int(top.get("Shared Hit Blocks", 0)) + int(top.get("Shared Read Blocks", 0))


def rows_removed(document: Mapping[str, Any]) -> int:
    """Rows every node read and threw away (filters and index rechecks), summed over loops."""
    total = 0
    for node in plan_nodes(document):
        loops = int(node.get("Actual Loops", 1))
        total += loops * int(node.get("Rows Removed by Filter", 0))
        total += loops * int(node.get("Rows Removed by Index Recheck", 0))
    return total


def uses_index(document: Mapping[str, Any], index: str) -> bool:
    """Whether any executed node reads ``index``."""
    return any(node.get("Index Name") == index and node.get("Actual Loops", 0) > 0 for node in plan_nodes(document))


def scans_table(document: Mapping[str, Any], table: str) -> bool:
    """Whether any executed node is a sequential scan of ``table``."""
    return any(
        node.get("Node Type") == "Seq Scan" and node.get("Relation Name") == table and node.get("Actual Loops", 0) > 0
        for node in plan_nodes(document)
    )
