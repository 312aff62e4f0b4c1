"""Keyset pagination for the per-principal lists (carts, orders).

A page is read with ``WHERE (created, handle) < (:after_at, :after_handle) ORDER BY created DESC,
handle DESC LIMIT :n + 1`` on an index that starts with the principal, so every page costs the same
at the start and deep in the list, and rows inserted while a client pages never shift or repeat
what it already saw (new rows sort first). The position is the last row's timestamp and handle:
both are already visible to the caller, so a position reveals nothing new. ``api/`` binds
positions to the principal before they leave the server (see ``api/mcp/cursors.py``).
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from sqlalchemy import Column, ColumnElement, Row, Select, bindparam, select, true, tuple_
from sqlalchemy.ext.asyncio import AsyncConnection

from store.principal import Principal
from store.scoping import principal_params

T = TypeVar("T")

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 200


@dataclass(frozen=True, slots=True)
class Position:
    """Where a page ended: the timestamp and handle of its last row (the next page starts after it)."""

    at: datetime
    handle: str


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a list, newest first; ``next`` is ``None`` on the last page."""

    items: list[T]
    next: Position | None


def page_of(rows: Sequence[T], limit: int, position_of: Callable[[T], Position]) -> Page[T]:
    """Cut ``limit + 1`` fetched rows into a page: the extra row only tells that there is more."""
    items = list(rows[:limit])
    more = len(rows) > limit
    return Page(items=items, next=position_of(items[-1]) if more and items else None)


def check_page_size(limit: int) -> int:
    """Refuse a page size outside 1..MAX_PAGE_SIZE (the tools' input schema already does)."""
    if not 1 <= limit <= MAX_PAGE_SIZE:
        raise ValueError(f"limit must be between 1 and {MAX_PAGE_SIZE}")
    return limit


@dataclass(frozen=True, slots=True)
class KeysetList:
    """A principal's newest-first list as two statements: its first page, and the page after a position.

    Both bind the principal (``p_iss`` / ``p_sub``), ``p_limit`` and, for ``after``, ``p_after_at`` /
    ``p_after_handle``; :meth:`page` binds them. Each row has a ``handle`` and the timestamp ``at_key``.
    """

    first: Select[Any]
    after: Select[Any]
    at_key: str

    async def page(
        self,
        conn: AsyncConnection,
        principal: Principal,
        *,
        limit: int,
        after: Position | None,
        item: Callable[[Row[*tuple[Any, ...]]], T],
    ) -> Page[T]:
        """The page of ``limit`` items after ``after`` (``None``: the first page), each made by ``item``. One query."""
        params: dict[str, object] = {**principal_params(principal), "p_limit": limit + 1}
        if after is None:
            result = await conn.execute(self.first, params)
        else:
            result = await conn.execute(self.after, {**params, "p_after_at": after.at, "p_after_handle": after.handle})
        rows = page_of(result.all(), limit, lambda row: Position(at=row._mapping[self.at_key], handle=row.handle))
        return Page(items=[item(row) for row in rows.items], next=rows.next)


def keyset_list(
    page: Select[Any],
    *,
    row_id: Column[Any],
    at: Column[Any],
    handle: Column[Any],
    totals: Callable[[ColumnElement[Any]], Select[Any]],
) -> KeysetList:
    """The newest-first list of ``page``'s rows by ``(at, handle)``, each with its ``totals``.

    ``page`` is the owner-scoped select of the list's columns, ``row_id`` among them. The keyset page is
    cut first (one index range of ``limit + 1`` entries), then ``totals(id)``, an aggregate over one row's
    lines correlated on its id, runs for just those rows. Rows carry ``page``'s columns except ``row_id``,
    then the columns of ``totals``.
    """
    ordered = page.order_by(at.desc(), handle.desc()).limit(bindparam("p_limit"))
    after = ordered.where(tuple_(at, handle) < tuple_(bindparam("p_after_at"), bindparam("p_after_handle")))

    def with_totals(rows: Select[Any]) -> Select[Any]:
        listed = rows.cte("listed")
        per_row = totals(listed.c[row_id.key]).lateral("totals")
        shown = [column for column in listed.c if column.key != row_id.key]
        return (
            select(*shown, *per_row.c)
            .select_from(listed.join(per_row, true()))
            .order_by(listed.c[at.key].desc(), listed.c[handle.key].desc())
        )

    return KeysetList(first=with_totals(ordered), after=with_totals(after), at_key=at.key)
