"""Statements compiled once and run on the driver keep the unit of work's meaning.

A compiled statement commits when its unit does, whichever unit and pooler mode it runs in; it reads the same
rows as SQLAlchemy's ``execute``; and a statement whose values need conversion is refused up front.
"""

import uuid

import pytest
from sqlalchemy import ARRAY, Integer, bindparam, select, text

from store.carts import _VIEW_SQL
from store.compiled import Compiled, fetch
from store.db import POOLER_MODES, Database, PoolerMode
from store.principal import Principal


class RollBackError(Exception):
    """Raised inside a unit of work to make it roll back."""


@pytest.mark.parametrize("pooler_mode", POOLER_MODES)
async def test_a_compiled_write_inside_a_transaction_is_rolled_back_with_it(
    database_url: str, pooler_mode: PoolerMode
) -> None:
    database = Database.connect(database_url, pool_size=1, pooler_mode=pooler_mode)
    tag = uuid.uuid4().hex
    write = Compiled(text("INSERT INTO compiled_probe (tag) VALUES (:tag)"))
    try:
        async with database.one_statement() as conn:
            await conn.execute(text("CREATE TABLE IF NOT EXISTS compiled_probe (tag text)"))

        async def write_then_fail() -> None:
            async with database.transaction() as conn:
                await fetch(conn, write, {"tag": tag})
                raise RollBackError

        with pytest.raises(RollBackError):
            await write_then_fail()
        async with database.one_statement() as conn:
            await fetch(conn, write, {"tag": f"{tag}-kept"})
        async with database.one_statement() as conn:
            found = (
                await conn.execute(text("SELECT tag FROM compiled_probe WHERE tag LIKE :t"), {"t": f"{tag}%"})
            ).all()
        assert [row.tag for row in found] == [f"{tag}-kept"]
    finally:
        await database.dispose()


async def test_a_compiled_read_returns_the_rows_execute_returns_read_by_attribute(database: Database) -> None:
    principal = Principal(issuer="https://compiled.example", subject=uuid.uuid4().hex)
    params = {"p_handle": "cart_nonexistent", "p_iss": principal.issuer, "p_sub": principal.subject}
    async with database.one_statement() as conn:
        assert await fetch(conn, _VIEW_SQL, params) == []
    listed = select(text("sku, unit_price_cents FROM product")).order_by(text("sku")).limit(bindparam("p_limit"))
    async with database.one_statement() as conn:
        direct = await fetch(conn, Compiled(listed), {"p_limit": 3})
        through = (await conn.execute(listed, {"p_limit": 3})).all()
    assert [tuple(row) for row in direct] == [tuple(row) for row in through]
    assert len(direct) == 3
    assert [row.sku for row in direct] == [row.sku for row in through]
    with pytest.raises(AttributeError):
        _ = direct[0].no_such_column


async def test_a_compiled_statement_reads_its_columns_as_attributes_on_every_call_and_keeps_the_record_methods(
    database: Database,
) -> None:
    # After its first rows the statement reads columns through properties of its own record class (the same
    # class, so asyncpg's prepared statement is reused); the answers must be those of the first call, and a
    # column named like a record method keeps the method.
    statement = Compiled(text("SELECT sku, unit_price_cents, 'k' AS keys FROM product ORDER BY sku LIMIT 2"))
    calls = []
    row_class = statement.record_class
    for _ in range(2):
        async with database.one_statement() as conn:
            rows = await fetch(conn, statement, {})
        calls.append([(row.sku, row.unit_price_cents, row["keys"], list(row.keys())) for row in rows])
        with pytest.raises(AttributeError):
            _ = rows[0].no_such_column
    assert calls[0] == calls[1]
    assert calls[0][0][2:] == ("k", ["sku", "unit_price_cents", "keys"])
    assert statement.record_class is row_class
    assert {"sku", "unit_price_cents"} <= set(vars(row_class))


def test_a_statement_whose_values_need_conversion_is_refused() -> None:
    with pytest.raises(ValueError, match="must run through SQLAlchemy"):
        Compiled(select(bindparam("p_numbers", type_=ARRAY(Integer))))
