"""refresh lease on provider connections; indexes for the retention purge

Revision ID: a1b2c3d40004
Revises: a1b2c3d40003
Create Date: 2026-12-01 09:00:00.000000

The lease lets one instance refresh a stored token without holding a row lock (or a pooled
connection) across the provider's token endpoint. The indexes serve ``coatcheck purge``: each
batch finds its oldest rows by one range scan instead of reading the table.

``orders.cart_id`` already references ``cart`` with ``ON DELETE SET NULL`` and orders carry
``cart_handle`` and their own lines, so purging a checked-out cart leaves its order intact.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "a1b2c3d40004"
down_revision: str | None = "a1b2c3d40003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("provider_connection", sa.Column("refresh_lease_id", sa.String(length=32), nullable=True))
    op.add_column("provider_connection", sa.Column("refresh_lease_until", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_oauth_flow_expires_at", "oauth_flow", ["expires_at"], unique=False)
    op.create_index("ix_audit_event_created_at", "audit_event", ["created_at"], unique=False)
    op.create_index("ix_cart_updated_at", "cart", ["updated_at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_cart_updated_at", table_name="cart")
    op.drop_index("ix_audit_event_created_at", table_name="audit_event")
    op.drop_index("ix_oauth_flow_expires_at", table_name="oauth_flow")
    op.drop_column("provider_connection", "refresh_lease_until")
    op.drop_column("provider_connection", "refresh_lease_id")
