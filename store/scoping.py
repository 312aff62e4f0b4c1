"""Every query names its principal: the one filter and the one set of bind parameters for it.

Statements are built once at import with :func:`owned_by`; each call binds
:func:`principal_params`. Keeping both here means no repository can spell the scope differently,
nor tell a malformed, an unknown and someone else's handle apart (:func:`owned_rows`).
"""

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Executable, Row, Table, and_, bindparam
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

from store.compiled import Compiled, fetch
from store.errors import NotFound
from store.handles import is_well_formed
from store.principal import Principal


def owned_by(table: Table) -> ColumnElement[bool]:
    """``principal_iss = :p_iss AND principal_sub = :p_sub`` on ``table`` (bind with :func:`principal_params`)."""
    return and_(table.c.principal_iss == bindparam("p_iss"), table.c.principal_sub == bindparam("p_sub"))


def principal_params(principal: Principal) -> dict[str, str]:
    """The bind values for :func:`owned_by` and for ``principal_iss``/``principal_sub`` columns on insert."""
    return {"p_iss": principal.issuer, "p_sub": principal.subject}


async def owned_rows(
    conn: AsyncConnection,
    stmt: Executable | Compiled,
    principal: Principal,
    *,
    kind: str,
    prefix: str,
    handle: str,
) -> Sequence[Row[*tuple[Any, ...]]]:
    """The rows ``stmt`` reads for the principal's ``kind`` behind ``handle`` (bound as ``p_handle``). One query.

    A :class:`~store.compiled.Compiled` statement runs on the driver (:func:`~store.compiled.fetch`); its rows
    read by attribute like SQLAlchemy's.

    Raises:
        NotFound: ``handle`` is malformed (no query is made), unknown, or someone else's: one outcome for all.
    """
    if not is_well_formed(handle, prefix):
        raise NotFound(kind, handle)
    params = {"p_handle": handle, **principal_params(principal)}
    rows = await fetch(conn, stmt, params) if isinstance(stmt, Compiled) else (await conn.execute(stmt, params)).all()
    if not rows:
        raise NotFound(kind, handle)
    return rows
