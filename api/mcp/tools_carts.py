"""Catalog and cart tools. Each call is one statement or one transaction, scoped to the caller's principal."""

from datetime import timedelta
from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, ToolAnnotations
from pydantic import Field

from api.auth import current_principal
from api.mcp.annotations import READ_ONLY
from api.mcp.arguments import INT32_MAX, CartId, Cursor, IdempotencyKey, PageSize, SearchQuery, Sku
from api.mcp.errors import tool_errors
from api.mcp.lifespan import ToolContext, ToolDeps, deps
from api.mcp.listing import list_page
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
from store.paging import DEFAULT_PAGE_SIZE

MAX_SEARCH_RESULTS = 100


def _duration(ttl: timedelta) -> str:
    seconds = int(ttl.total_seconds())
    return f"{seconds // 3600} h" if seconds % 3600 == 0 else f"{seconds // 60} min"


@tool_errors
async def catalog_search(
    ctx: ToolContext,
    query: SearchQuery = "",
    limit: Annotated[int, Field(description=f"1..{MAX_SEARCH_RESULTS}", le=INT32_MAX)] = 20,
) -> Annotated[CallToolResult, CatalogSearchOut]:
    """Products matching ``query``, sku-prefix matches first; ``limit`` is clamped to 1..100."""
    limit = max(1, min(limit, MAX_SEARCH_RESULTS))
    async with deps(ctx).database.one_statement() as conn:
        found = await search_products(conn, query, limit)
    return compact(CatalogSearchOut.model_validate(found))


@tool_errors
async def cart_create(
    ctx: ToolContext, idempotency_key: IdempotencyKey | None = None
) -> Annotated[CallToolResult, CartCreated]:
    """A new empty cart (or, for a repeated ``idempotency_key``, the cart it made before)."""
    tools, principal = deps(ctx), current_principal()
    # One statement that retries itself after a lost race; see CartRepository.create.
    async with tools.database.autocommit() as conn:
        handle = await CartRepository(conn).create(
            principal,
            idempotency_key=idempotency_key,
            max_open=tools.max_open_carts,
            key_ttl=tools.idempotency_key_ttl,
        )
    return compact(CartCreated(cart_id=handle))


@tool_errors
async def cart_set_item(
    ctx: ToolContext,
    cart_id: CartId,
    sku: Sku,
    # Enforced up to the int32 range here; 1000..2**31-1 gets the store's friendlier message.
    quantity: Annotated[
        int, Field(ge=-INT32_MAX - 1, le=INT32_MAX, json_schema_extra={"minimum": 0, "maximum": MAX_QUANTITY})
    ],
    expected_version: Annotated[int, Field(ge=1, le=INT32_MAX)] | None = None,
) -> Annotated[CallToolResult, CartOut]:
    """Set the quantity of ``sku`` in the cart (0 removes the line) and return the cart."""
    tools, principal = deps(ctx), current_principal()
    # One self-validating statement on the happy path; see CartRepository.set_item.
    async with tools.database.autocommit() as conn:
        cart = await CartRepository(conn).set_item(
            principal, cart_id, sku, quantity, expected_version, max_lines=tools.max_cart_lines
        )
    return compact(CartOut.model_validate(cart))


@tool_errors
async def cart_view(ctx: ToolContext, cart_id: CartId) -> Annotated[CallToolResult, CartOut]:
    """The cart with its priced lines."""
    principal = current_principal()
    async with deps(ctx).database.one_statement() as conn:
        cart = await CartRepository(conn).view(principal, cart_id)
    return compact(CartOut.model_validate(cart))


@tool_errors
async def cart_list(
    ctx: ToolContext, limit: PageSize = DEFAULT_PAGE_SIZE, cursor: Cursor | None = None
) -> Annotated[CallToolResult, CartListOut]:
    """One page of the caller's carts, newest first."""
    carts, next_cursor = await list_page(ctx, "cart_list", CartRepository, limit=limit, cursor=cursor)
    return compact(CartListOut(carts=[CartSummaryOut.model_validate(cart) for cart in carts], next_cursor=next_cursor))


@tool_errors
async def cart_delete(ctx: ToolContext, cart_id: CartId) -> Annotated[CallToolResult, CartDeleted]:
    """Delete the cart; ``deleted`` tells whether this call removed it."""
    principal = current_principal()
    async with deps(ctx).database.one_statement() as conn:
        deleted = await CartRepository(conn).delete(principal, cart_id)
    return compact(CartDeleted(cart_id=cart_id, deleted=deleted))


def register_cart_tools(
    mcp: MCPServer[ToolDeps],
    *,
    max_cart_lines: int = MAX_CART_LINES,
    max_open_carts: int = DEFAULT_MAX_OPEN_CARTS,
    idempotency_key_ttl: timedelta = DEFAULT_IDEMPOTENCY_KEY_TTL,
) -> frozenset[str]:
    """Register the catalog and cart tools on ``mcp`` and return their names; the limits only word the
    descriptions."""
    mcp.add_tool(
        catalog_search,
        name="catalog_search",
        description="Search the products on sale by sku or name (case-insensitive substring). Products whose "
        "sku starts with the query (in any case) come first; each group is in sku order. An empty query lists "
        "products in sku order. `more` says that more products match than were returned (then the non-prefix matches "
        "shown are some of them): narrow the query or raise limit.",
        annotations=READ_ONLY,
    )
    mcp.add_tool(
        cart_create,
        name="cart_create",
        description="Create an empty cart and return its handle (cart_id). Pass the handle to the other "
        "cart tools. Carts are private to you and are kept until you delete them. Pass an idempotency_key "
        "of your choice to make retries safe: the same key returns the same cart "
        f"(for {_duration(idempotency_key_ttl)}). At most {max_open_carts} open carts.",
        annotations=ToolAnnotations(
            read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False
        ),
    )
    mcp.add_tool(
        cart_set_item,
        name="cart_set_item",
        description="Set the quantity of one product in a cart to an absolute value (0 removes the line), "
        "so retrying the call has the same effect as calling it once. Returns the updated cart. "
        "Pass expected_version (from cart_view) to refuse the change if someone else changed the cart. "
        f"A cart holds at most {max_cart_lines} different products. A product no longer sold cannot be added; "
        "its line can still be removed.",
        annotations=ToolAnnotations(
            read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False
        ),
    )
    mcp.add_tool(
        cart_view,
        name="cart_view",
        description="Show a cart: its lines with prices, total, status and version. A line with available: "
        "false holds a product no longer sold: remove it (cart_set_item quantity 0) before checking out.",
        annotations=READ_ONLY,
    )
    mcp.add_tool(
        cart_list,
        name="cart_list",
        description=f"List your carts, newest first, with line and item counts and totals; {DEFAULT_PAGE_SIZE} "
        "per page by default. Pass next_cursor back as cursor for the next page (null: no more).",
        annotations=READ_ONLY,
    )
    mcp.add_tool(
        cart_delete,
        name="cart_delete",
        description="Delete a cart and its lines. Safe to repeat: deleted is true when this call removed the "
        "cart, false when you have no such cart (already deleted, or never yours).",
        annotations=ToolAnnotations(
            read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False
        ),
    )
    return frozenset({"catalog_search", "cart_create", "cart_set_item", "cart_view", "cart_list", "cart_delete"})
