"""Order tables: an immutable snapshot of a cart at the moment it was checked out."""

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    func,
)
from sqlalchemy.orm import Mapped, mapped_column

from store.models.base import Base


class Order(Base):
    """A placed order behind an opaque handle (``ord_…``), owned by one principal.

    ``checkout_nonce`` is the random identifier sealed into the confirmation round's
    requestState. It is unique per principal and written in the same transaction as the
    order, which is what makes that requestState single-use. ``cart_id`` is unique, so a
    cart yields at most one order; it becomes NULL if the cart is deleted later, while
    ``cart_handle`` keeps the name the user knew it by.
    """

    __tablename__ = "orders"  # "order" is an SQL keyword; the plural spares every hand-written query the quoting
    __table_args__ = (
        CheckConstraint("status IN ('placed')", name="status_known"),
        CheckConstraint("total_cents >= 0", name="total_not_negative"),
        CheckConstraint("currency ~ '^[A-Z]{3}$'", name="currency_iso"),
        UniqueConstraint("principal_iss", "principal_sub", "checkout_nonce", name="uq_orders_checkout_nonce"),
        # order_list pages: keyset (placed_at, handle) under the principal (store/paging.py).
        Index("ix_orders_principal_page", "principal_iss", "principal_sub", "placed_at", "handle"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    handle: Mapped[str] = mapped_column(String(64), unique=True)
    principal_iss: Mapped[str] = mapped_column(Text)
    principal_sub: Mapped[str] = mapped_column(Text)
    cart_id: Mapped[int | None] = mapped_column(ForeignKey("cart.id", ondelete="SET NULL"), unique=True)
    cart_handle: Mapped[str] = mapped_column(String(64))
    checkout_nonce: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16), server_default="placed")
    total_cents: Mapped[int] = mapped_column(BigInteger)
    currency: Mapped[str] = mapped_column(String(3))
    placed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class OrderLine(Base):
    """One line of an order: name and unit price copied from the catalog when the order was placed.

    No foreign key to ``product``: the catalog may change or drop a product, the order must not.
    """

    __tablename__ = "order_line"
    __table_args__ = (
        CheckConstraint("quantity >= 1", name="quantity_positive"),
        CheckConstraint("unit_price_cents >= 0", name="price_not_negative"),
    )

    order_id: Mapped[int] = mapped_column(ForeignKey("orders.id", ondelete="CASCADE"), primary_key=True)
    sku: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(Text)
    quantity: Mapped[int] = mapped_column(Integer)
    unit_price_cents: Mapped[int] = mapped_column(Integer)
