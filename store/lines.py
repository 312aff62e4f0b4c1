"""A priced line, the shape carts and orders share."""

from dataclasses import dataclass


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
