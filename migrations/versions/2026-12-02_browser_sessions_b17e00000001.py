"""browser sessions: sign-out at /connect ends the session server-side

Revision ID: b17e00000001
Revises: a1b2c3d40006
Create Date: 2026-12-02 07:00:00.000000

A new table only, so older replicas keep working while this rolls out; a browser signed in through an
older replica has no row and simply signs in again at its next ``/connect`` link.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "b17e00000001"
down_revision: str | None = "a1b2c3d40006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "browser_session",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("session_digest", sa.LargeBinary(), nullable=False),
        sa.Column("principal_iss", sa.Text(), nullable=False),
        sa.Column("principal_sub", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_browser_session")),
        sa.UniqueConstraint("session_digest", name=op.f("uq_browser_session_session_digest")),
    )
    op.create_index("ix_browser_session_expires_at", "browser_session", ["expires_at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_browser_session_expires_at", table_name="browser_session")
    op.drop_table("browser_session")
