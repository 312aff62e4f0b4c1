"""create orders and order lines

Revision ID: a1b2c3d40002
Revises: 7ed18270727e
Create Date: 2026-11-29 18:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "a1b2c3d40002"
down_revision: str | None = "7ed18270727e"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "orders",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("handle", sa.String(length=64), nullable=False),
        sa.Column("principal_iss", sa.Text(), nullable=False),
        sa.Column("principal_sub", sa.Text(), nullable=False),
        sa.Column("cart_id", sa.BigInteger(), nullable=True),
        sa.Column("cart_handle", sa.String(length=64), nullable=False),
        sa.Column("checkout_nonce", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), server_default="placed", nullable=False),
        sa.Column("total_cents", sa.BigInteger(), nullable=False),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("placed_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("status IN ('placed')", name=op.f("ck_orders_status_known")),
        sa.CheckConstraint("total_cents >= 0", name=op.f("ck_orders_total_not_negative")),
        sa.CheckConstraint("currency ~ '^[A-Z]{3}$'", name=op.f("ck_orders_currency_iso")),
        sa.ForeignKeyConstraint(["cart_id"], ["cart.id"], name=op.f("fk_orders_cart_id_cart"), ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_orders")),
        sa.UniqueConstraint("handle", name=op.f("uq_orders_handle")),
        sa.UniqueConstraint("cart_id", name=op.f("uq_orders_cart_id")),
        sa.UniqueConstraint("principal_iss", "principal_sub", "checkout_nonce", name="uq_orders_checkout_nonce"),
    )
    op.create_index("ix_orders_principal", "orders", ["principal_iss", "principal_sub", "placed_at"], unique=False)
    op.create_table(
        "order_line",
        sa.Column("order_id", sa.BigInteger(), nullable=False),
        sa.Column("sku", sa.String(length=64), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("quantity", sa.Integer(), nullable=False),
        sa.Column("unit_price_cents", sa.Integer(), nullable=False),
        sa.CheckConstraint("quantity >= 1", name=op.f("ck_order_line_quantity_positive")),
        sa.CheckConstraint("unit_price_cents >= 0", name=op.f("ck_order_line_price_not_negative")),
        sa.ForeignKeyConstraint(
            ["order_id"], ["orders.id"], name=op.f("fk_order_line_order_id_orders"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("order_id", "sku", name=op.f("pk_order_line")),
    )


def downgrade() -> None:
    op.drop_table("order_line")
    op.drop_index("ix_orders_principal", table_name="orders")
    op.drop_table("orders")
