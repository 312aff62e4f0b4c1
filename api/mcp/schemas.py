"""Tool result shapes: the only place that knows what a tool's structured output looks like.

Models that mirror a store dataclass are built with ``Model.model_validate(value)``: they read its
attributes (``from_attributes``), and a field the wire names after the tool (``cart_id``) also accepts
the store's name (``handle``) through ``AliasChoices``. The wire name comes first, so it is the one the
published output schema shows.
"""

from datetime import datetime
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from store.carts import CartStatus
from store.orders import OrderStatus


class _FromStore(BaseModel):
    model_config = ConfigDict(from_attributes=True)


def _also(store_name: str, wire_name: str) -> AliasChoices:
    return AliasChoices(wire_name, store_name)


class ProductOut(_FromStore):
    """A catalog product."""

    sku: str
    name: str
    unit_price_cents: int
    currency: str


class CatalogSearchOut(_FromStore):
    """Products matching a search: sku-prefix matches first, each group in sku order."""

    products: list[ProductOut]
    more: bool = Field(
        default=False, description="Other products match too: raise limit (up to 100) or narrow the query"
    )


class CartCreated(BaseModel):
    """The handle of a new cart; pass it to the other cart tools."""

    cart_id: str = Field(description="Opaque cart handle, e.g. cart_3q2F…")


class LineOut(_FromStore):
    """One priced line of a cart (current catalog price) or an order (price when placed)."""

    sku: str
    name: str
    quantity: int
    unit_price_cents: int
    line_total_cents: int


class CartLineOut(LineOut):
    """One line of a cart, priced from the catalog now."""

    available: bool = Field(
        description="false: the product is no longer sold (retired); the line keeps its name and last price, "
        "is not in total_cents, and must be removed (quantity 0) before checkout"
    )


class CartOut(_FromStore):
    """A cart with its lines. ``version`` increases on every change."""

    cart_id: str = Field(validation_alias=_also("handle", "cart_id"))
    version: int
    status: CartStatus = Field(description="open or checked_out")
    items: list[CartLineOut]
    total_cents: int = Field(description="Sum over the available lines")
    currency: str | None = Field(description="ISO 4217 code of the items; null while the cart is empty")


class CartSummaryOut(_FromStore):
    """A cart as listed."""

    cart_id: str = Field(validation_alias=_also("handle", "cart_id"))
    version: int
    status: CartStatus
    line_count: int
    item_count: int = Field(description="Sum of quantities over all lines")
    total_cents: int
    currency: str | None
    created_at: datetime


class CartListOut(BaseModel):
    """One page of the caller's carts, newest first."""

    carts: list[CartSummaryOut]
    next_cursor: str | None = Field(
        default=None, description="Pass as cursor to get the next (older) page; null on the last page"
    )


class CartDeleted(BaseModel):
    """The cart is gone; ``deleted`` tells whether this call removed it."""

    cart_id: str
    deleted: bool = Field(
        description="true: this call deleted the cart; false: you have no such cart (already deleted, "
        "or never yours), so there was nothing to delete"
    )


class CheckoutOut(_FromStore):
    """The outcome of cart_checkout: a placed order, or a checkout the user cancelled (no order)."""

    order_id: str | None = Field(
        description="Opaque order handle (ord_…); null when the checkout was cancelled",
        validation_alias=_also("handle", "order_id"),
    )
    total_cents: int
    currency: str = Field(description="ISO 4217 code")
    status: Literal["placed", "cancelled"]


class OrderOut(_FromStore):
    """An order with its lines. Orders never change after they are placed."""

    order_id: str = Field(validation_alias=_also("handle", "order_id"))
    cart_id: str = Field(
        description="The cart the order was placed from", validation_alias=_also("cart_handle", "cart_id")
    )
    status: OrderStatus = Field(description="placed")
    items: list[LineOut]
    item_count: int = Field(description="Sum of quantities over all lines")
    total_cents: int
    currency: str
    placed_at: datetime


class OrderSummaryOut(_FromStore):
    """An order as listed."""

    order_id: str = Field(validation_alias=_also("handle", "order_id"))
    cart_id: str = Field(validation_alias=_also("cart_handle", "cart_id"))
    status: OrderStatus
    line_count: int
    item_count: int = Field(description="Sum of quantities over all lines")
    total_cents: int
    currency: str
    placed_at: datetime


class OrderListOut(BaseModel):
    """One page of the caller's orders, newest first."""

    orders: list[OrderSummaryOut]
    next_cursor: str | None = Field(
        default=None, description="Pass as cursor to get the next (older) page; null on the last page"
    )


class ConnectionOut(BaseModel):
    """One configured provider and the caller's connection to it. Never any token."""

    provider: str
    status: Literal["connected", "needs_reauth", "not_connected"] = Field(
        description="needs_reauth: the provider no longer accepts the stored grant; connect again"
    )
    scopes: list[str]
    connected_at: datetime | None
    expires_at: datetime | None = Field(description="When the current access token expires (it is refreshed)")


class ConnectionListOut(BaseModel):
    connections: list[ConnectionOut]


class WhoamiOut(BaseModel):
    """The caller's profile at the provider, as its userinfo endpoint returned it."""

    provider: str
    profile: dict[str, Any]


class DisconnectOut(BaseModel):
    provider: str
    was_connected: bool
    upstream_revocation: Literal["revoked", "not_supported", "failed", "nothing_to_revoke"] = Field(
        description="revoked: the provider confirmed (RFC 7009); failed: revoke it at the provider yourself"
    )
