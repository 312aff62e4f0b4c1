"""products can be retired; sku prefixes match case-insensitively (the expand step)

Revision ID: c21e00000001
Revises: a1b2c3d40006
Create Date: 2026-12-02 07:00:00.000000

``product.active``: a retired product (``false``) is kept, so every cart line and its foreign key
``fk_cart_item_sku_product`` (NO ACTION) stay valid, but it is no longer found, added or checked out
(``coatcheck catalog import``, docs/catalog.md). The column has a constant default, so adding it only
writes the catalog: no table rewrite. ``lock_timeout`` bounds how long the ALTER waits for its brief
ACCESS EXCLUSIVE lock, so a long transaction on ``product`` makes the migration fail (run it again)
instead of queueing every request behind it.

``ix_product_sku_ci_prefix`` serves the sku-prefix group of ``catalog_search`` case-insensitively: a range
of ``lower(sku)`` in byte order (``COLLATE "C"``), ``sku`` in byte order breaking ties, active products
only. It is built ``CONCURRENTLY`` (outside the migration's transaction: no lock that blocks writers), after
dropping an invalid leftover of an interrupted earlier build (the column is added only if a stopped
earlier run has not added it already, so the migration can simply be run again). ``ix_product_sku_prefix``
stays for replicas still running the previous release; a later contract migration drops it
(docs/deployment.md).

Downgrading drops the index (concurrently) and the column: retired products become active again.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "c21e00000001"
down_revision: str | None = "b17e00000001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CI_PREFIX_INDEX = "ix_product_sku_ci_prefix"
LOCK_TIMEOUT = "5s"


def upgrade() -> None:
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    # IF NOT EXISTS: a run stopped during the index build below has committed the column already (but not the
    # revision), so running the migration again must pass over it.
    op.add_column(
        "product",
        sa.Column("active", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        if_not_exists=True,
    )
    with op.get_context().autocommit_block():
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {CI_PREFIX_INDEX}")
        op.create_index(
            CI_PREFIX_INDEX,
            "product",
            [sa.text('lower(sku) COLLATE "C"'), sa.text('sku COLLATE "C"')],
            unique=False,
            postgresql_where=sa.text("active"),
            postgresql_concurrently=True,
        )


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {CI_PREFIX_INDEX}")
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    op.drop_column("product", "active", if_exists=True)
