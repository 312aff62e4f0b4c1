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

from sqlalchemy import ColumnElement, Select, bindparam, tuple_

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


def keyset_pages(
    page: Select[Any], at: ColumnElement[Any], handle: ColumnElement[Any]
) -> tuple[Select[Any], Select[Any]]:
    """The first page of ``page`` and the page after a position: newest first by ``(at, handle)``.

    ``page`` is the owner-scoped select of the list's columns; the limit binds ``p_limit`` and the
    position ``p_after_at`` / ``p_after_handle``.
    """
    first = page.order_by(at.desc(), handle.desc()).limit(bindparam("p_limit"))
    after = first.where(tuple_(at, handle) < tuple_(bindparam("p_after_at"), bindparam("p_after_handle")))
    return first, after
