"""create provider connections, oauth flows and the audit trail

Revision ID: a1b2c3d40003
Revises: a1b2c3d40002
Create Date: 2026-11-29 20:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "a1b2c3d40003"
down_revision: str | None = "a1b2c3d40002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "provider_connection",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("principal_iss", sa.Text(), nullable=False),
        sa.Column("principal_sub", sa.Text(), nullable=False),
        sa.Column("provider", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("scopes", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("token_type", sa.String(length=32), nullable=False),
        sa.Column("access_token_enc", sa.Text(), nullable=False),
        sa.Column("refresh_token_enc", sa.Text(), nullable=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("connected_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("refreshed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("status IN ('connected', 'needs_reauth')", name=op.f("ck_provider_connection_status_known")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_provider_connection")),
        sa.UniqueConstraint("principal_iss", "principal_sub", "provider", name="uq_provider_connection_principal"),
    )
    op.create_table(
        "oauth_flow",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("handle", sa.String(length=64), nullable=False),
        sa.Column("principal_iss", sa.Text(), nullable=False),
        sa.Column("principal_sub", sa.Text(), nullable=False),
        sa.Column("provider", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("state_digest", sa.LargeBinary(), nullable=True),
        sa.Column("secrets_enc", sa.Text(), nullable=True),
        sa.Column("state_consumed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("error", sa.String(length=64), nullable=True),
        sa.CheckConstraint(
            "status IN ('pending', 'connected', 'denied', 'failed')", name=op.f("ck_oauth_flow_status_known")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_oauth_flow")),
        sa.UniqueConstraint("handle", name=op.f("uq_oauth_flow_handle")),
        sa.UniqueConstraint("state_digest", name=op.f("uq_oauth_flow_state_digest")),
    )
    op.create_index(
        "ix_oauth_flow_principal",
        "oauth_flow",
        ["principal_iss", "principal_sub", "provider", "created_at"],
        unique=False,
    )
    op.create_table(
        "audit_event",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("principal_iss", sa.Text(), nullable=True),
        sa.Column("principal_sub", sa.Text(), nullable=True),
        sa.Column("action", sa.String(length=32), nullable=False),
        sa.Column("provider", sa.String(length=64), nullable=True),
        sa.Column("outcome", sa.String(length=32), nullable=False),
        sa.Column("detail", sa.String(length=200), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("action ~ '^[a-z][a-z_]{0,31}$'", name=op.f("ck_audit_event_action_code")),
        sa.CheckConstraint("outcome ~ '^[a-z][a-z_]{0,31}$'", name=op.f("ck_audit_event_outcome_code")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_event")),
    )
    op.create_index(
        "ix_audit_event_principal", "audit_event", ["principal_iss", "principal_sub", "created_at"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_audit_event_principal", table_name="audit_event")
    op.drop_table("audit_event")
    op.drop_index("ix_oauth_flow_principal", table_name="oauth_flow")
    op.drop_table("oauth_flow")
    op.drop_table("provider_connection")
