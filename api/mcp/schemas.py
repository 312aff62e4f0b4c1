"""Tool result shapes: the only place that knows what a tool's structured output looks like."""

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from store.carts import CartSummary, CartView
from store.catalog import ProductRow
from store.lines import PricedLine
from store.orders import OrderReceipt, OrderSummary, OrderView


class ProductOut(BaseModel):
    """A catalog product."""

    sku: str
    name: str
    unit_price_cents: int
    currency: str

    @classmethod
    def of(cls, row: ProductRow) -> "ProductOut":
        return cls(sku=row.sku, name=row.name, unit_price_cents=row.unit_price_cents, currency=row.currency)


class CatalogSearchOut(BaseModel):
    """Products matching a search: sku-prefix matches first, each group in sku order."""

    products: list[ProductOut]
    more: bool = Field(
        default=False, description="Other products match too: raise limit (up to 100) or narrow the query"
    )


class CartCreated(BaseModel):
    """The handle of a new cart; pass it to the other cart tools."""

    cart_id: str = Field(description="Opaque cart handle, e.g. cart_3q2F…")


class LineOut(BaseModel):
    """One priced line of a cart (current catalog price) or an order (price when placed)."""

    sku: str
    name: str
    quantity: int
    unit_price_cents: int
    line_total_cents: int

    @classmethod
    def of(cls, line: PricedLine) -> "LineOut":
        return cls(
            sku=line.sku,
            name=line.name,
            quantity=line.quantity,
            unit_price_cents=line.unit_price_cents,
            line_total_cents=line.line_total_cents,
        )


class CartOut(BaseModel):
    """A cart with its lines. ``version`` increases on every change."""

    cart_id: str
    version: int
    status: str = Field(description="open or checked_out")
    items: list[LineOut]
    total_cents: int
    currency: str | None = Field(description="ISO 4217 code of the items; null while the cart is empty")

    @classmethod
    def of(cls, cart: CartView) -> "CartOut":
        return cls(
            cart_id=cart.handle,
            version=cart.version,
            status=cart.status,
            items=[LineOut.of(line) for line in cart.items],
            total_cents=cart.total_cents,
            currency=cart.currency,
        )


class CartSummaryOut(BaseModel):
    """A cart as listed."""

    cart_id: str
    version: int
    status: str
    line_count: int
    item_count: int = Field(description="Sum of quantities over all lines")
    total_cents: int
    currency: str | None
    created_at: datetime

    @classmethod
    def of(cls, cart: CartSummary) -> "CartSummaryOut":
        return cls(
            cart_id=cart.handle,
            version=cart.version,
            status=cart.status,
            line_count=cart.line_count,
            item_count=cart.item_count,
            total_cents=cart.total_cents,
            currency=cart.currency,
            created_at=cart.created_at,
        )


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


class CheckoutOut(BaseModel):
    """The outcome of cart_checkout: a placed order, or a checkout the user cancelled (no order)."""

    order_id: str | None = Field(description="Opaque order handle (ord_…); null when the checkout was cancelled")
    total_cents: int
    currency: str = Field(description="ISO 4217 code")
    status: Literal["placed", "cancelled"]

    @classmethod
    def of(cls, receipt: OrderReceipt) -> "CheckoutOut":
        return cls(order_id=receipt.handle, total_cents=receipt.total_cents, currency=receipt.currency, status="placed")


class OrderOut(BaseModel):
    """An order with its lines. Orders never change after they are placed."""

    order_id: str
    cart_id: str = Field(description="The cart the order was placed from")
    status: str = Field(description="placed")
    items: list[LineOut]
    item_count: int = Field(description="Sum of quantities over all lines")
    total_cents: int
    currency: str
    placed_at: datetime

    @classmethod
    def of(cls, order: OrderView) -> "OrderOut":
        return cls(
            order_id=order.handle,
            cart_id=order.cart_handle,
            status=order.status,
            items=[LineOut.of(line) for line in order.items],
            item_count=order.item_count,
            total_cents=order.total_cents,
            currency=order.currency,
            placed_at=order.placed_at,
        )


class OrderSummaryOut(BaseModel):
    """An order as listed."""

    order_id: str
    cart_id: str
    status: str
    line_count: int
    item_count: int = Field(description="Sum of quantities over all lines")
    total_cents: int
    currency: str
    placed_at: datetime

    @classmethod
    def of(cls, order: OrderSummary) -> "OrderSummaryOut":
        return cls(
            order_id=order.handle,
            cart_id=order.cart_handle,
            status=order.status,
            line_count=order.line_count,
            item_count=order.item_count,
            total_cents=order.total_cents,
            currency=order.currency,
            placed_at=order.placed_at,
        )


class OrderListOut(BaseModel):
    """One page of the caller's orders, newest first."""

    orders: list[OrderSummaryOut]
    next_cursor: str | None = Field(
        default=None, description="Pass as cursor to get the next (older) page; null on the last page"
    )
