"""The one shape of a list tool: a cursor in, one page read in one statement, the next cursor out.

The cursor is opened (and refused) before the database is touched, and the next one is sealed for the
same list and caller, so every list tool binds its cursors the same way (see :mod:`api.mcp.cursors`).
"""

from collections.abc import Callable
from typing import Protocol, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection

from api.auth import current_principal
from api.mcp.lifespan import ToolContext, deps
from store.paging import Page, Position
from store.principal import Principal

T = TypeVar("T")


class Listing(Protocol[T]):
    """A repository with a keyset-paged, principal-scoped ``list`` (``CartRepository``, ``OrderRepository``)."""

    async def list(self, principal: Principal, *, limit: int, after: Position | None) -> Page[T]: ...


async def list_page(
    ctx: ToolContext, tool: str, repository: Callable[[AsyncConnection], Listing[T]], *, limit: int, cursor: str | None
) -> tuple[list[T], str | None]:
    """The caller's page of ``tool``'s list that ``cursor`` names (``None``: the first), and the next page's cursor.

    Raises:
        ToolError: ``cursor`` was not issued by ``tool`` to this caller (:func:`~api.mcp.cursors.refused_cursor`).
    """
    tools, principal = deps(ctx), current_principal()
    after = None if cursor is None else tools.cursors.open(tool, principal, cursor)
    async with tools.database.one_statement() as conn:
        page = await repository(conn).list(principal, limit=limit, after=after)
    next_cursor = None if page.next is None else tools.cursors.seal(tool, principal, page.next)
    return page.items, next_cursor
