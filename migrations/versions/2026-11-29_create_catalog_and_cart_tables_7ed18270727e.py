"""create catalog and cart tables

Revision ID: 7ed18270727e
Revises:
Create Date: 2026-11-29 13:12:46.901462
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "7ed18270727e"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "cart",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("handle", sa.String(length=64), nullable=False),
        sa.Column("principal_iss", sa.Text(), nullable=False),
        sa.Column("principal_sub", sa.Text(), nullable=False),
        sa.Column("status", sa.String(length=16), server_default="open", nullable=False),
        sa.Column("version", sa.Integer(), server_default="1", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("status IN ('open', 'checked_out')", name=op.f("ck_cart_status_known")),
        sa.CheckConstraint("version >= 1", name=op.f("ck_cart_version_positive")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cart")),
        sa.UniqueConstraint("handle", name=op.f("uq_cart_handle")),
    )
    op.create_index("ix_cart_principal", "cart", ["principal_iss", "principal_sub", "created_at"], unique=False)
    op.create_table(
        "product",
        sa.Column("sku", sa.String(length=64), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("unit_price_cents", sa.Integer(), nullable=False),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.CheckConstraint("currency ~ '^[A-Z]{3}$'", name=op.f("ck_product_currency_iso")),
        sa.CheckConstraint("unit_price_cents >= 0", name=op.f("ck_product_price_not_negative")),
        sa.PrimaryKeyConstraint("sku", name=op.f("pk_product")),
    )
    op.create_table(
        "cart_item",
        sa.Column("cart_id", sa.BigInteger(), nullable=False),
        sa.Column("sku", sa.String(length=64), nullable=False),
        sa.Column("quantity", sa.Integer(), nullable=False),
        sa.CheckConstraint("quantity BETWEEN 1 AND 999", name=op.f("ck_cart_item_quantity_range")),
        sa.ForeignKeyConstraint(["cart_id"], ["cart.id"], name=op.f("fk_cart_item_cart_id_cart"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["sku"], ["product.sku"], name=op.f("fk_cart_item_sku_product")),
        sa.PrimaryKeyConstraint("cart_id", "sku", name=op.f("pk_cart_item")),
    )
    op.create_index(op.f("ix_cart_item_sku"), "cart_item", ["sku"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_cart_item_sku"), table_name="cart_item")
    op.drop_table("cart_item")
    op.drop_table("product")
    op.drop_index("ix_cart_principal", table_name="cart")
    op.drop_table("cart")
