"""Catalog and cart tools. Each call is one transaction, scoped to the caller's principal."""

from datetime import timedelta
from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, ToolAnnotations
from pydantic import Field

from api.auth import current_principal
from api.mcp.arguments import INT32_MAX, CartId, Cursor, IdempotencyKey, PageSize, SearchQuery, Sku
from api.mcp.cursors import CursorSigner
from api.mcp.errors import tool_errors
from api.mcp.results import compact
from api.mcp.schemas import (
    CartCreated,
    CartDeleted,
    CartListOut,
    CartOut,
    CartSummaryOut,
    CatalogSearchOut,
)
from store.carts import (
    DEFAULT_IDEMPOTENCY_KEY_TTL,
    DEFAULT_MAX_OPEN_CARTS,
    MAX_CART_LINES,
    MAX_QUANTITY,
    CartRepository,
)
from store.catalog import search_products
from store.db import Database
from store.paging import DEFAULT_PAGE_SIZE

MAX_SEARCH_RESULTS = 100


def _duration(ttl: timedelta) -> str:
    seconds = int(ttl.total_seconds())
    return f"{seconds // 3600} h" if seconds % 3600 == 0 else f"{seconds // 60} min"


def register_cart_tools(
    mcp: MCPServer,
    database: Database,
    *,
    cursors: CursorSigner,
    max_cart_lines: int = MAX_CART_LINES,
    max_open_carts: int = DEFAULT_MAX_OPEN_CARTS,
    idempotency_key_ttl: timedelta = DEFAULT_IDEMPOTENCY_KEY_TTL,
) -> None:
    """Register the catalog and cart tools on ``mcp``."""

    @mcp.tool(
        name="catalog_search",
        description="Search the product catalog by sku or name (case-insensitive substring). Products whose "
        "sku starts with the query come first; each group is in sku order. An empty query lists products in "
        "sku order. `more` says that more products match than were returned (then the non-prefix matches "
        "shown are some of them): narrow the query or raise limit.",
        annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False),
    )
    @tool_errors
    async def catalog_search(
        query: SearchQuery = "",
        limit: Annotated[int, Field(description=f"1..{MAX_SEARCH_RESULTS}", le=INT32_MAX)] = 20,
    ) -> Annotated[CallToolResult, CatalogSearchOut]:
        limit = max(1, min(limit, MAX_SEARCH_RESULTS))
        async with database.one_statement() as conn:
            found = await search_products(conn, query, limit)
        return compact(CatalogSearchOut.model_validate(found))

    @mcp.tool(
        name="cart_create",
        description="Create an empty cart and return its handle (cart_id). Pass the handle to the other "
        "cart tools. Carts are private to you and are kept until you delete them. Pass an idempotency_key "
        "of your choice to make retries safe: the same key returns the same cart "
        f"(for {_duration(idempotency_key_ttl)}). At most {max_open_carts} open carts.",
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False),
    )
    @tool_errors
    async def cart_create(idempotency_key: IdempotencyKey | None = None) -> Annotated[CallToolResult, CartCreated]:
        principal = current_principal()
        # One statement that retries itself after a lost race; see CartRepository.create.
        async with database.autocommit() as conn:
            handle = await CartRepository(conn).create(
                principal, idempotency_key=idempotency_key, max_open=max_open_carts, key_ttl=idempotency_key_ttl
            )
        return compact(CartCreated(cart_id=handle))

    @mcp.tool(
        name="cart_set_item",
        description="Set the quantity of one product in a cart to an absolute value (0 removes the line), "
        "so retrying the call has the same effect as calling it once. Returns the updated cart. "
        "Pass expected_version (from cart_view) to refuse the change if someone else changed the cart. "
        f"A cart holds at most {max_cart_lines} different products.",
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True),
    )
    @tool_errors
    async def cart_set_item(
        cart_id: CartId,
        sku: Sku,
        # Enforced up to the int32 range here; 1000..2**31-1 gets the store's friendlier message.
        quantity: Annotated[
            int, Field(ge=-INT32_MAX - 1, le=INT32_MAX, json_schema_extra={"minimum": 0, "maximum": MAX_QUANTITY})
        ],
        expected_version: Annotated[int, Field(ge=1, le=INT32_MAX)] | None = None,
    ) -> Annotated[CallToolResult, CartOut]:
        principal = current_principal()
        # One self-validating statement on the happy path; see CartRepository.set_item.
        async with database.autocommit() as conn:
            cart = await CartRepository(conn).set_item(
                principal, cart_id, sku, quantity, expected_version, max_lines=max_cart_lines
            )
        return compact(CartOut.model_validate(cart))

    @mcp.tool(
        name="cart_view",
        description="Show a cart: its lines with prices, total, status and version.",
        annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False),
    )
    @tool_errors
    async def cart_view(cart_id: CartId) -> Annotated[CallToolResult, CartOut]:
        principal = current_principal()
        async with database.one_statement() as conn:
            cart = await CartRepository(conn).view(principal, cart_id)
        return compact(CartOut.model_validate(cart))

    @mcp.tool(
        name="cart_list",
        description=f"List your carts, newest first, with line and item counts and totals; {DEFAULT_PAGE_SIZE} "
        "per page by default. Pass next_cursor back as cursor for the next page (null: no more).",
        annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False),
    )
    @tool_errors
    async def cart_list(
        limit: PageSize = DEFAULT_PAGE_SIZE, cursor: Cursor | None = None
    ) -> Annotated[CallToolResult, CartListOut]:
        principal = current_principal()
        after = None if cursor is None else cursors.open("cart_list", principal, cursor)
        async with database.one_statement() as conn:
            page = await CartRepository(conn).list(principal, limit=limit, after=after)
        next_cursor = None if page.next is None else cursors.seal("cart_list", principal, page.next)
        carts = [CartSummaryOut.model_validate(cart) for cart in page.items]
        return compact(CartListOut(carts=carts, next_cursor=next_cursor))

    @mcp.tool(
        name="cart_delete",
        description="Delete a cart and its lines. Safe to repeat: deleted is true when this call removed the "
        "cart, false when you have no such cart (already deleted, or never yours).",
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True),
    )
    @tool_errors
    async def cart_delete(cart_id: CartId) -> Annotated[CallToolResult, CartDeleted]:
        principal = current_principal()
        async with database.one_statement() as conn:
            deleted = await CartRepository(conn).delete(principal, cart_id)
        return compact(CartDeleted(cart_id=cart_id, deleted=deleted))
