"""Catalog and cart tools. Each call is one transaction, scoped to the caller's principal."""

from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations
from pydantic import Field

from api.auth import current_principal
from api.mcp.errors import tool_errors
from api.mcp.schemas import (
    CartCreated,
    CartDeleted,
    CartListOut,
    CartOut,
    CartSummaryOut,
    CatalogSearchOut,
    ProductOut,
)
from store.carts import MAX_CART_LINES, MAX_QUANTITY, CartRepository
from store.catalog import search_products
from store.db import Database

MAX_SEARCH_RESULTS = 100

CartId = Annotated[str, Field(description="A cart handle returned by cart_create (cart_…)", max_length=200)]


def register_cart_tools(mcp: MCPServer, database: Database, *, max_cart_lines: int = MAX_CART_LINES) -> None:
    """Register the catalog and cart tools on ``mcp``."""

    @mcp.tool(
        name="catalog_search",
        description="Search the product catalog by sku or name (case-insensitive substring). "
        "An empty query lists products in sku order.",
        annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False),
    )
    @tool_errors
    async def catalog_search(
        query: Annotated[str, Field(max_length=200)] = "",
        limit: Annotated[int, Field(description=f"1..{MAX_SEARCH_RESULTS}")] = 20,
    ) -> CatalogSearchOut:
        limit = max(1, min(limit, MAX_SEARCH_RESULTS))
        async with database.one_statement() as conn:
            rows = await search_products(conn, query, limit)
        return CatalogSearchOut(products=[ProductOut.of(row) for row in rows])

    @mcp.tool(
        name="cart_create",
        description="Create an empty cart and return its handle (cart_id). Pass the handle to the other "
        "cart tools. Carts are private to you and are kept until you delete them.",
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False),
    )
    @tool_errors
    async def cart_create() -> CartCreated:
        principal = current_principal()
        async with database.one_statement() as conn:
            handle = await CartRepository(conn).create(principal)
        return CartCreated(cart_id=handle)

    @mcp.tool(
        name="cart_set_item",
        description="Set the quantity of one product in a cart to an absolute value (0 removes the line), "
        "so retrying the call has the same effect as calling it once. Returns the updated cart. "
        "Pass expected_version (from cart_view) to refuse the change if someone else changed the cart.",
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True),
    )
    @tool_errors
    async def cart_set_item(
        cart_id: CartId,
        sku: Annotated[str, Field(max_length=64)],
        quantity: Annotated[int, Field(json_schema_extra={"minimum": 0, "maximum": MAX_QUANTITY})],
        expected_version: int | None = None,
    ) -> CartOut:
        principal = current_principal()
        # One self-validating statement on the happy path; see CartRepository.set_item.
        async with database.autocommit() as conn:
            cart = await CartRepository(conn).set_item(
                principal, cart_id, sku, quantity, expected_version, max_lines=max_cart_lines
            )
        return CartOut.of(cart)

    @mcp.tool(
        name="cart_view",
        description="Show a cart: its lines with prices, total, status and version.",
        annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False),
    )
    @tool_errors
    async def cart_view(cart_id: CartId) -> CartOut:
        principal = current_principal()
        async with database.one_statement() as conn:
            cart = await CartRepository(conn).view(principal, cart_id)
        return CartOut.of(cart)

    @mcp.tool(
        name="cart_list",
        description="List your carts, newest first, with line and item counts and totals.",
        annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False),
    )
    @tool_errors
    async def cart_list() -> CartListOut:
        principal = current_principal()
        async with database.one_statement() as conn:
            carts = await CartRepository(conn).list(principal)
        return CartListOut(carts=[CartSummaryOut.of(cart) for cart in carts])

    @mcp.tool(
        name="cart_delete",
        description="Delete a cart and its lines.",
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=False),
    )
    @tool_errors
    async def cart_delete(cart_id: CartId) -> CartDeleted:
        principal = current_principal()
        async with database.one_statement() as conn:
            await CartRepository(conn).delete(principal, cart_id)
        return CartDeleted(cart_id=cart_id, deleted=True)
