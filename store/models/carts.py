"""Catalog and cart tables."""

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
    func,
)
from sqlalchemy.orm import Mapped, mapped_column

from store.models.base import Base


class Product(Base):
    """A catalog entry. Shared by everyone, so it carries no principal."""

    __tablename__ = "product"
    __table_args__ = (
        CheckConstraint("unit_price_cents >= 0", name="price_not_negative"),
        CheckConstraint("currency ~ '^[A-Z]{3}$'", name="currency_iso"),
    )

    sku: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(Text)
    unit_price_cents: Mapped[int] = mapped_column(Integer)
    currency: Mapped[str] = mapped_column(String(3))


class Cart(Base):
    """A cart behind an opaque handle, owned by one principal."""

    __tablename__ = "cart"
    __table_args__ = (
        CheckConstraint("status IN ('open', 'checked_out')", name="status_known"),
        CheckConstraint("version >= 1", name="version_positive"),
        Index("ix_cart_principal", "principal_iss", "principal_sub", "created_at"),
        Index("ix_cart_updated_at", "updated_at"),  # the retention purge
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    handle: Mapped[str] = mapped_column(String(64), unique=True)
    principal_iss: Mapped[str] = mapped_column(Text)
    principal_sub: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), server_default="open")
    version: Mapped[int] = mapped_column(Integer, server_default="1")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class CartItem(Base):
    """One line of a cart: an absolute quantity of one product."""

    __tablename__ = "cart_item"
    __table_args__ = (CheckConstraint("quantity BETWEEN 1 AND 999", name="quantity_range"),)

    cart_id: Mapped[int] = mapped_column(ForeignKey("cart.id", ondelete="CASCADE"), primary_key=True)
    sku: Mapped[str] = mapped_column(ForeignKey("product.sku"), primary_key=True, index=True)
    quantity: Mapped[int] = mapped_column(Integer)
