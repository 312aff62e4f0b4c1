"""bounded lists, open-cart slots, cart_create idempotency keys, indexed catalog search

Revision ID: a1b2c3d40005
Revises: a1b2c3d40004
Create Date: 2026-12-01 09:00:00.000000

The trigram index needs the ``pg_trgm`` extension. Some servers do not ship it (embedded or
managed PostgreSQL without contrib, e.g. the ``pgserver`` wheel), and a role may not be allowed to
create it: then this migration still succeeds, without the index, and logs a warning;
``catalog_search`` keeps working by scanning, and ``/readyz`` reports the search as degraded.
Downgrading drops the index but not the extension, which other schemas may use.
"""

import logging
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

revision: str = "a1b2c3d40005"
down_revision: str | None = "a1b2c3d40004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

logger = logging.getLogger("alembic.runtime.migration")

TRIGRAM_EXTENSION = "pg_trgm"
TRIGRAM_INDEX = "ix_product_search_trgm"
TRIGRAM_INDEX_DDL = f"CREATE INDEX {TRIGRAM_INDEX} ON product USING gin (sku gin_trgm_ops, name gin_trgm_ops)"


def install_trigram_index(conn: Connection, extension: str = TRIGRAM_EXTENSION) -> bool:
    """Create the extension (if the server offers it and we may) and the trigram index; tell whether it did.

    ``extension`` is a parameter so a test can take the "not offered" branch on a server that has it.
    """
    offered = conn.execute(
        sa.text("SELECT EXISTS (SELECT FROM pg_available_extensions WHERE name = :name)"), {"name": extension}
    ).scalar_one()
    if not offered:
        logger.warning(
            "PostgreSQL does not offer the %s extension: catalog_search will scan the catalog (degraded)", extension
        )
        return False
    try:
        with conn.begin_nested():  # a refused CREATE EXTENSION must not abort the migration's transaction
            conn.execute(sa.text(f'CREATE EXTENSION IF NOT EXISTS "{extension}"'))
    except DBAPIError as exc:
        logger.warning(
            "could not create the %s extension (%s): catalog_search will scan the catalog (degraded)",
            extension,
            type(exc.orig).__name__,
        )
        return False
    conn.execute(sa.text(TRIGRAM_INDEX_DDL))
    return True


def upgrade() -> None:
    op.add_column("cart", sa.Column("idempotency_key", sa.String(length=100), nullable=True))
    op.drop_index("ix_cart_principal", table_name="cart")
    op.create_index(
        "ix_cart_principal_page", "cart", ["principal_iss", "principal_sub", "created_at", "handle"], unique=False
    )
    op.add_column("cart", sa.Column("open_slot", sa.Integer(), nullable=True))
    # Existing open carts take slots 1, 2, … per owner, oldest first (an owner already past the cap keeps
    # every cart and just cannot create more).
    op.execute(
        """
        UPDATE cart SET open_slot = numbered.slot
        FROM (SELECT id, row_number() OVER (PARTITION BY principal_iss, principal_sub ORDER BY created_at, id) AS slot
              FROM cart WHERE status = 'open') AS numbered
        WHERE cart.id = numbered.id
        """
    )
    op.create_index(
        "uq_cart_open_slot",
        "cart",
        ["principal_iss", "principal_sub", "open_slot"],
        unique=True,
        postgresql_where=sa.text("status = 'open'"),
    )
    op.create_index(
        "uq_cart_idempotency_key",
        "cart",
        ["principal_iss", "principal_sub", "idempotency_key"],
        unique=True,
        postgresql_where=sa.text("idempotency_key IS NOT NULL"),
    )
    op.drop_index("ix_orders_principal", table_name="orders")
    op.create_index(
        "ix_orders_principal_page", "orders", ["principal_iss", "principal_sub", "placed_at", "handle"], unique=False
    )
    # Byte order, so that [prefix, prefix-with-last-char-bumped) is exactly "starts with" in any database collation.
    op.create_index("ix_product_sku_prefix", "product", [sa.text('sku COLLATE "C"')], unique=False)
    if context.is_offline_mode():
        # A --sql script cannot ask the server what it offers; it assumes pg_trgm, as the models do.
        op.execute(f'CREATE EXTENSION IF NOT EXISTS "{TRIGRAM_EXTENSION}"')
        op.execute(TRIGRAM_INDEX_DDL)
    else:
        install_trigram_index(op.get_bind())


def downgrade() -> None:
    op.execute(f"DROP INDEX IF EXISTS {TRIGRAM_INDEX}")
    op.drop_index("ix_product_sku_prefix", table_name="product")
    op.drop_index("ix_orders_principal_page", table_name="orders")
    op.create_index("ix_orders_principal", "orders", ["principal_iss", "principal_sub", "placed_at"], unique=False)
    op.drop_index("uq_cart_idempotency_key", table_name="cart")
    op.drop_index("uq_cart_open_slot", table_name="cart")
    op.drop_column("cart", "open_slot")
    op.drop_index("ix_cart_principal_page", table_name="cart")
    op.create_index("ix_cart_principal", "cart", ["principal_iss", "principal_sub", "created_at"], unique=False)
    op.drop_column("cart", "idempotency_key")
