"""Catalog and cart tables."""

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    func,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from store.models.base import Base


class Product(Base):
    """A catalog entry. Shared by everyone, so it carries no principal.

    Products are never deleted: retiring one sets ``active`` false (``coatcheck catalog import``), so the
    cart lines and their foreign key stay valid while search, cart_set_item and checkout leave it out.
    """

    __tablename__ = "product"
    __table_args__ = (
        CheckConstraint("unit_price_cents >= 0", name="price_not_negative"),
        CheckConstraint("currency ~ '^[A-Z]{3}$'", name="currency_iso"),
        # sku prefixes as a range scan whatever the database collation (store/catalog.py): byte order.
        # Alembic's comparison cannot see an index collation; tests/store/test_migrations.py checks it.
        # Served the previous release's case-sensitive prefix search; a contract migration drops it.
        Index("ix_product_sku_prefix", text('sku COLLATE "C"')),
        # The case-insensitive sku prefix of catalog_search, over the products still sold (migration c21e00000001).
        Index(
            "ix_product_sku_ci_prefix",
            text('lower(sku) COLLATE "C"'),
            text('sku COLLATE "C"'),
            postgresql_where=text("active"),
        ),
        # Substring search; needs pg_trgm, which the migration installs when the server offers it.
        Index(
            "ix_product_search_trgm",
            "sku",
            "name",
            postgresql_using="gin",
            postgresql_ops={"sku": "gin_trgm_ops", "name": "gin_trgm_ops"},
            info={"requires_extension": "pg_trgm"},  # absent where the server has no pg_trgm (tests skip it then)
        ),
    )

    sku: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(Text)
    unit_price_cents: Mapped[int] = mapped_column(Integer)
    currency: Mapped[str] = mapped_column(String(3))
    active: Mapped[bool] = mapped_column(Boolean, server_default=text("true"))


class Cart(Base):
    """A cart behind an opaque handle, owned by one principal."""

    __tablename__ = "cart"
    __table_args__ = (
        CheckConstraint("status IN ('open', 'checked_out')", name="status_known"),
        CheckConstraint("version >= 1", name="version_positive"),
        # An open cart without a slot would escape MAX_OPEN_CARTS (store/carts.py, cart_create).
        CheckConstraint("status <> 'open' OR open_slot IS NOT NULL", name="open_holds_slot"),
        # cart_list pages: keyset (created_at, handle) under the principal (store/paging.py).
        Index("ix_cart_principal_page", "principal_iss", "principal_sub", "created_at", "handle"),
        Index("ix_cart_updated_at", "updated_at"),  # the retention purge
        # MAX_OPEN_CARTS: each open cart holds one numbered slot of its owner (store/carts.py, cart_create).
        Index(
            "uq_cart_open_slot",
            "principal_iss",
            "principal_sub",
            "open_slot",
            unique=True,
            postgresql_where=text("status = 'open'"),
        ),
        Index(
            "uq_cart_idempotency_key",
            "principal_iss",
            "principal_sub",
            "idempotency_key",
            unique=True,
            postgresql_where=text("idempotency_key IS NOT NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    handle: Mapped[str] = mapped_column(String(64), unique=True)
    principal_iss: Mapped[str] = mapped_column(Text)
    principal_sub: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), server_default="open")
    version: Mapped[int] = mapped_column(Integer, server_default="1")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    # The client-chosen key of the cart_create that made this cart; honoured for IDEMPOTENCY_KEY_TTL_SECONDS.
    idempotency_key: Mapped[str | None] = mapped_column(String(100))
    # 1..MAX_OPEN_CARTS while the cart is open (never NULL then); unique among the owner's open carts.
    open_slot: Mapped[int | None] = mapped_column(Integer)


class CartItem(Base):
    """One line of a cart: an absolute quantity of one product."""

    __tablename__ = "cart_item"
    __table_args__ = (CheckConstraint("quantity BETWEEN 1 AND 999", name="quantity_range"),)

    cart_id: Mapped[int] = mapped_column(ForeignKey("cart.id", ondelete="CASCADE"), primary_key=True)
    sku: Mapped[str] = mapped_column(ForeignKey("product.sku"), primary_key=True, index=True)
    quantity: Mapped[int] = mapped_column(Integer)
