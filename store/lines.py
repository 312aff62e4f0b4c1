"""A priced line, the shape carts and orders share, and how both read and count lines."""

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Label, Row, func


@dataclass(frozen=True, slots=True)
class PricedLine:
    """One line of a cart (priced from the catalog now) or of an order (priced when it was placed)."""

    sku: str
    name: str
    quantity: int
    unit_price_cents: int

    @property
    def line_total_cents(self) -> int:
        """Quantity times unit price."""
        return self.quantity * self.unit_price_cents


@dataclass(frozen=True, slots=True)
class CartLine(PricedLine):
    """A cart line priced from the catalog now; ``available`` is false once its product is retired.

    An unavailable line keeps the product's name and last price, counts toward the line cap, can be removed
    (quantity 0), is left out of the cart's total, and stops a checkout until it is removed.
    """

    available: bool


def cart_lines(rows: Iterable[Row[*tuple[Any, ...]]]) -> list[CartLine]:
    """Like :func:`priced_lines`, for rows that also carry the product's ``active``."""
    return [
        CartLine(
            sku=row.sku,
            name=row.name,
            quantity=row.quantity,
            unit_price_cents=row.unit_price_cents,
            available=bool(row.active),
        )
        for row in rows
        if row.sku is not None
    ]


def priced_lines(rows: Iterable[Row[*tuple[Any, ...]]]) -> list[PricedLine]:
    """The lines of rows with ``sku``, ``name``, ``quantity``, ``unit_price_cents``, in order.

    The rows come from an outer join, so a row whose ``sku`` is NULL stands for "no lines" and is skipped.
    """
    return [
        PricedLine(sku=row.sku, name=row.name, quantity=row.quantity, unit_price_cents=row.unit_price_cents)
        for row in rows
        if row.sku is not None
    ]


def line_counts(sku: ColumnElement[Any], quantity: ColumnElement[Any]) -> tuple[Label[Any], Label[Any]]:
    """``line_count`` and ``item_count`` aggregated over lines (0 and 0 for none), as carts and orders list them."""
    return func.count(sku).label("line_count"), func.coalesce(func.sum(quantity), 0).label("item_count")
