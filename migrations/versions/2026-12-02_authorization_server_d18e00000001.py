"""authorization-server mode: clients, consents, grants, authorization codes and refresh tokens

Revision ID: d18e00000001
Revises: a1b2c3d40006
Create Date: 2026-12-02 07:00:00.000000

New tables only (nothing existing changes), so it is safe to run while older replicas serve. A trigger
announces every revoked grant on the channel ``coatcheck_grant_revoked`` (``pg_notify`` is delivered at
commit), whichever statement revoked it: the replicas' revoked-grant sets listen there (api/authserver).
Downgrading drops the tables, which signs every MCP client of authorization-server mode out.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "d18e00000001"
down_revision: str | None = "c21e00000001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "as_client",
        sa.Column("client_id", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("metadata_json", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("secret_enc", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("fresh_until", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("kind IN ('dynamic', 'cimd')", name=op.f("ck_as_client_kind_known")),
        sa.PrimaryKeyConstraint("client_id", name=op.f("pk_as_client")),
    )
    op.create_index("ix_as_client_created_at", "as_client", ["created_at"])
    op.create_table(
        "as_consent",
        sa.Column("principal_iss", sa.Text(), nullable=False),
        sa.Column("principal_sub", sa.Text(), nullable=False),
        sa.Column("client_id", sa.Text(), nullable=False),
        sa.Column("scopes", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("principal_iss", "principal_sub", "client_id", name=op.f("pk_as_consent")),
    )
    op.create_table(
        "as_grant",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("principal_iss", sa.Text(), nullable=False),
        sa.Column("principal_sub", sa.Text(), nullable=False),
        sa.Column("client_id", sa.Text(), nullable=False),
        sa.Column("scopes", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("resource", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_reason", sa.String(length=32), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_as_grant")),
    )
    op.create_index("ix_as_grant_principal", "as_grant", ["principal_iss", "principal_sub", "client_id"])
    op.create_index("ix_as_grant_revoked_at", "as_grant", ["revoked_at"])
    op.create_table(
        "as_authorization_code",
        sa.Column("code_hash", sa.LargeBinary(), nullable=False),
        sa.Column("grant_id", sa.String(length=64), nullable=False),
        sa.Column("client_id", sa.Text(), nullable=False),
        sa.Column("redirect_uri", sa.Text(), nullable=False),
        sa.Column("code_challenge", sa.String(length=128), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("used_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["grant_id"],
            ["as_grant.id"],
            name=op.f("fk_as_authorization_code_grant_id_as_grant"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("code_hash", name=op.f("pk_as_authorization_code")),
    )
    op.create_index("ix_as_authorization_code_expires_at", "as_authorization_code", ["expires_at"])
    op.create_table(
        "as_refresh_token",
        sa.Column("token_hash", sa.LargeBinary(), nullable=False),
        sa.Column("grant_id", sa.String(length=64), nullable=False),
        sa.Column("client_id", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("used_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["grant_id"], ["as_grant.id"], name=op.f("fk_as_refresh_token_grant_id_as_grant"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("token_hash", name=op.f("pk_as_refresh_token")),
    )
    op.create_index("ix_as_refresh_token_grant_id", "as_refresh_token", ["grant_id"])
    op.execute(
        """
        CREATE FUNCTION as_grant_announce_revocation() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('coatcheck_grant_revoked', NEW.id);
            RETURN NULL;
        END $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER as_grant_revoked AFTER UPDATE OF revoked_at ON as_grant
        FOR EACH ROW WHEN (OLD.revoked_at IS NULL AND NEW.revoked_at IS NOT NULL)
        EXECUTE FUNCTION as_grant_announce_revocation()
        """
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER as_grant_revoked ON as_grant")
    op.execute("DROP FUNCTION as_grant_announce_revocation()")
    op.drop_index("ix_as_refresh_token_grant_id", table_name="as_refresh_token")
    op.drop_table("as_refresh_token")
    op.drop_index("ix_as_authorization_code_expires_at", table_name="as_authorization_code")
    op.drop_table("as_authorization_code")
    op.drop_index("ix_as_grant_revoked_at", table_name="as_grant")
    op.drop_index("ix_as_grant_principal", table_name="as_grant")
    op.drop_table("as_grant")
    op.drop_table("as_consent")
    op.drop_index("ix_as_client_created_at", table_name="as_client")
    op.drop_table("as_client")
