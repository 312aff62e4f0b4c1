"""``coatcheck catalog import`` and ``export`` as real processes against a fresh database, and what the MCP
tools then make of the catalog: a 100 000-product CSV loaded, searched, partly retired, and a cart holding a
retired product walked through view, removal and checkout."""

import asyncio
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import pytest
from mcp import Client

from tests.support import figures
from tests.support.auth_mode import McpTokens
from tests.support.catalog_cli import coatcheck
from tests.support.databases import asyncpg_dsn
from tests.support.inprocess import settings_from, started_app
from tests.support.mcp_client import call_ok, text_of
from tests.support.mrtr import ScriptedUser, confirms
from tests.support.scratch import scratch_database

PRODUCTS = 100_000
HEADER = "sku,name,unit_price_cents,currency,active\n"


def _ok(result: subprocess.CompletedProcess[bytes]) -> str:
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode()


def _catalog_line(i: int) -> str:
    # Upper-case coat skus (the prefix group must find them by a lower-case prefix), lower-case hat skus, and a
    # name that needs CSV quoting now and then; written as the export writes it, in sku byte order.
    if i % 2:
        name = f'Coat ""{i}"", wool' if i % 1000 == 1 else f"Wool coat {i}"
        sku, name = f"COAT-{i:06d}", f'"{name}"' if "," in name else name
    else:
        sku, name = f"hat-{i:06d}", f"Knit hat {i}"
    return f"{sku},{name},{100 + i % 5000},USD,true\n"


@pytest.fixture(scope="module")
def fresh_database(admin_database_url: str) -> Iterator[str]:
    with scratch_database(admin_database_url, prefix="coatcheck_catalog") as url:
        yield url


async def _search(client: Client, query: str, limit: int = 5) -> list[str]:
    found = await call_ok(client, "catalog_search", {"query": query, "limit": limit})
    return [product["sku"] for product in found["products"]]


async def test_a_100000_product_csv_is_imported_searched_partly_retired_and_a_cart_with_a_retired_line_copes(
    fresh_database: str, tmp_path: Path, server_env: dict[str, str], mcp_token: McpTokens
) -> None:
    lines = sorted(_catalog_line(i) for i in range(1, PRODUCTS + 1))
    catalog = tmp_path / "catalog.csv"
    catalog.write_text(HEADER + "".join(lines), encoding="utf-8")

    dry = _ok(coatcheck("catalog", "import", str(catalog), "--dry-run", database_url=fresh_database))
    assert dry.splitlines()[0] == "added 100000, changed 0, unchanged 0, retired 0 (dry run: nothing was written)"
    assert _ok(coatcheck("catalog", "export", database_url=fresh_database)) == HEADER  # the dry run wrote nothing

    started = time.perf_counter()
    loaded = _ok(coatcheck("catalog", "import", str(catalog), database_url=fresh_database))
    seconds = time.perf_counter() - started
    assert loaded == "added 100000, changed 0, unchanged 0, retired 0\n"
    assert seconds < 60  # the bound, for a process that also starts Python and validates every line
    figures.note("Catalog import (issue 21)", f"coatcheck catalog import of {PRODUCTS} CSV lines: {seconds:.1f} s")
    exported = coatcheck("catalog", "export", database_url=fresh_database)
    assert exported.returncode == 0
    assert exported.stdout == catalog.read_bytes()  # byte for byte

    # Every tenth product leaves the file; --retire-missing retires exactly those.
    kept = tmp_path / "kept.csv"
    kept.write_text(HEADER + "".join(line for n, line in enumerate(lines) if n % 10), encoding="utf-8")
    retired_skus = [line.split(",", 1)[0] for n, line in enumerate(lines) if n % 10 == 0]
    gone, staying = retired_skus[1], lines[1].split(",", 1)[0]

    settings = settings_from({**server_env, "DATABASE_URL": fresh_database})
    async with started_app(settings) as app:
        token = await mcp_token(f"shop-{uuid.uuid4().hex[:8]}", resource=app.mcp_url, transport=app.transport())
        async with app.mcp_client(token, elicitation_callback=ScriptedUser(confirms(True))) as client:
            assert await _search(client, "coat-00001") == [f"COAT-00001{d}" for d in (1, 3, 5, 7, 9)]
            assert await _search(client, "KNIT HAT 99998") == ["hat-099998"]  # by name, in any case
            assert await _search(client, gone, 1) == [gone]
            cart_id = (await call_ok(client, "cart_create"))["cart_id"]
            await call_ok(client, "cart_set_item", {"cart_id": cart_id, "sku": gone, "quantity": 2})
            await call_ok(client, "cart_set_item", {"cart_id": cart_id, "sku": staying, "quantity": 1})

            retired = _ok(coatcheck("catalog", "import", str(kept), "--retire-missing", database_url=fresh_database))
            assert retired == "added 0, changed 0, unchanged 90000, retired 10000\n"

            assert await _search(client, gone, 1) == []
            viewed = await call_ok(client, "cart_view", {"cart_id": cart_id})
            gone_line = _line(viewed, gone)
            assert (gone_line["available"], gone_line["quantity"]) == (False, 2)
            assert gone_line["name"] == _name_in(lines, gone)  # the name as it was
            assert _line(viewed, staying)["available"] is True
            assert viewed["total_cents"] == _line(viewed, staying)["line_total_cents"]

            more = await client.call_tool("cart_set_item", {"cart_id": cart_id, "sku": gone, "quantity": 3})
            assert more.is_error
            assert "is no longer sold (retired from the catalog)" in text_of(more)
            refused = await client.call_tool("cart_checkout", {"cart_id": cart_id})
            assert refused.is_error
            assert f"no longer sold: {gone!r}" in text_of(refused)
            assert "remove it with cart_set_item quantity 0" in text_of(refused)

            removed = await call_ok(client, "cart_set_item", {"cart_id": cart_id, "sku": gone, "quantity": 0})
            assert [line["sku"] for line in removed["items"]] == [staying]
            placed = await client.call_tool("cart_checkout", {"cart_id": cart_id})
            assert not placed.is_error, text_of(placed)
            assert placed.structured_content is not None
            assert placed.structured_content["status"] == "placed"
            assert placed.structured_content["total_cents"] == removed["total_cents"]


def _line(cart: dict[str, Any], sku: str) -> dict[str, Any]:
    lines: list[dict[str, Any]] = [line for line in cart["items"] if line["sku"] == sku]
    assert len(lines) == 1, cart
    return lines[0]


def _name_in(lines: list[str], sku: str) -> str:
    (line,) = [line for line in lines if line.startswith(sku + ",")]
    return line.split(",")[1]


def test_bad_input_is_refused_with_every_problem_on_its_line_and_field_exit_2_and_nothing_written(
    fresh_database: str, tmp_path: Path
) -> None:
    before = _ok(coatcheck("catalog", "export", database_url=fresh_database))
    bad = tmp_path / "bad.csv"
    bad.write_bytes(
        (
            HEADER
            + "pin-1,Pin,100,USD,true\n"
            + "pin-1,Pin again,100,USD,true\n"  # duplicate sku
            + "pin-2,Pin,100,usd,true\n"  # bad currency
            + "pin-3,Pin,-100,USD,true\n"  # negative price
            + "pin-4,Pin,1.50,USD,true\n"  # not an integer
            + f"pin-5,{'n' * 201},100,USD,true\n"  # over-long field
            + "pin-6,Pin\x07,100,USD,true\n"  # control character
        ).encode()
        + "pin-7,Épingle,100,EUR,true\n".encode("latin-1")  # not UTF-8
    )
    refused = coatcheck("catalog", "import", str(bad), "--retire-missing", database_url=fresh_database)
    assert refused.returncode == 2
    assert refused.stdout == b""
    assert refused.stderr.decode().splitlines() == [
        f"coatcheck: {bad} was refused; nothing was written:",
        "  line 3, sku: 'pin-1' is also on line 2; list each sku once",
        "  line 4, currency: 'usd' is not an ISO 4217 currency code (three capital letters, such as USD)",
        "  line 5, unit_price_cents: -100 is negative; prices are 0 or more",
        "  line 6, unit_price_cents: '1.50' is a decimal; prices are whole minor units (cents) with no decimal "
        "point: write 150 for 1.50",
        "  line 7, name: is 201 characters long; at most 200",
        "  line 8, name: contains a control character (U+0007 at position 4); remove it",
        "  line 9, name: is not UTF-8 text (byte 0xC9 at position 1); save the file as UTF-8",
    ]
    empty = tmp_path / "empty.csv"
    empty.write_text(HEADER)
    nothing = coatcheck("catalog", "import", str(empty), "--retire-missing", database_url=fresh_database)
    assert nothing.returncode == 2
    assert "lists no products; --retire-missing would retire the whole catalog" in nothing.stderr.decode()
    unknown = coatcheck("catalog", "import", str(tmp_path / "shop.txt"), database_url=fresh_database)
    assert unknown.returncode == 2
    assert "pass --format csv or --format jsonl" in unknown.stderr.decode()
    missing = coatcheck("catalog", "import", str(tmp_path / "absent.csv"), database_url=fresh_database)
    assert (missing.returncode, missing.stderr.decode().strip()) == (
        2,
        f"coatcheck: cannot read {tmp_path / 'absent.csv'}: No such file or directory",
    )
    for result in (refused, nothing, unknown, missing):
        assert b"Traceback" not in result.stderr
    assert _ok(coatcheck("catalog", "export", database_url=fresh_database)) == before


def test_json_lines_from_standard_input_round_trip_byte_for_byte_with_retired_products(admin_database_url: str) -> None:
    document = (
        '{"sku":"SCARF-1","name":"Silk scarf ☂","unit_price_cents":4500,"currency":"EUR","active":true}\n'
        '{"sku":"hat-1","name":"Hat \\"Bowler\\"","unit_price_cents":0,"currency":"GBP","active":false}\n'
    ).encode()
    with scratch_database(admin_database_url) as url:
        loaded = _ok(coatcheck("catalog", "import", "-", "--format", "jsonl", database_url=url, stdin=document))
        jsonl = coatcheck("catalog", "export", "--format", "jsonl", database_url=url)
        csv = _ok(coatcheck("catalog", "export", database_url=url))
    assert loaded == "added 2, changed 0, unchanged 0, retired 0\n"
    assert jsonl.stdout == document
    assert csv == HEADER + "SCARF-1,Silk scarf ☂,4500,EUR,true\n" + 'hat-1,"Hat ""Bowler""",0,GBP,false\n'


async def test_an_import_that_cannot_lock_the_catalog_in_time_exits_1_and_writes_nothing(
    fresh_database: str, tmp_path: Path
) -> None:
    catalog = tmp_path / "one.csv"
    catalog.write_text(HEADER + "lock-1,Waiting product,100,USD,true\n")
    blocker = await asyncpg.connect(asyncpg_dsn(fresh_database))
    try:
        async with blocker.transaction():
            await blocker.execute("LOCK TABLE product IN SHARE ROW EXCLUSIVE MODE")  # another import, say
            waited = await asyncio.to_thread(coatcheck, "catalog", "import", str(catalog), database_url=fresh_database)
    finally:
        await blocker.close()
    assert waited.returncode == 1
    assert waited.stderr.decode().strip() == (
        "coatcheck: catalog import failed: the database did not answer in time (lock_timeout); nothing was "
        "changed, retry in a moment"
    )
    assert "lock-1" not in _ok(coatcheck("catalog", "export", database_url=fresh_database))
