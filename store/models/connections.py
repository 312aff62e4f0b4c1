"""Connections to third-party providers: the token vault, the OAuth flows that fill it, and their audit trail."""

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    Index,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    func,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Mapped, mapped_column

from store.models.base import Base


class ProviderConnection(Base):
    """One principal's tokens for one provider.

    ``access_token_enc`` and ``refresh_token_enc`` are sealed by ``store.crypto.TokenCipher`` with
    associated data naming this table, the row id, the principal, the provider and the column.
    ``needs_reauth`` keeps the (dead) tokens so a disconnect can still revoke them upstream.

    ``refresh_lease_id``/``refresh_lease_until`` coordinate refreshes across instances
    (``store.token_refresh``): a set id with a future ``until`` means one instance is refreshing;
    no id with a future ``until`` means the last refresh failed and nobody retries before then.
    """

    __tablename__ = "provider_connection"
    __table_args__ = (
        CheckConstraint("status IN ('connected', 'needs_reauth')", name="status_known"),
        UniqueConstraint("principal_iss", "principal_sub", "provider", name="uq_provider_connection_principal"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    principal_iss: Mapped[str] = mapped_column(Text)
    principal_sub: Mapped[str] = mapped_column(Text)
    provider: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))
    scopes: Mapped[list[str]] = mapped_column(ARRAY(Text))
    token_type: Mapped[str] = mapped_column(String(32))
    access_token_enc: Mapped[str] = mapped_column(Text)
    refresh_token_enc: Mapped[str | None] = mapped_column(Text)
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    connected_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    refreshed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    refresh_lease_id: Mapped[str | None] = mapped_column(String(32))
    refresh_lease_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class OAuthFlow(Base):
    """A URL-mode connect flow, bound to the principal that started it.

    ``state_digest`` is ``sha256(state)`` of the latest authorization request (unique, so a
    callback finds its flow in one index probe); ``secrets_enc`` holds that request's PKCE
    verifier and OIDC nonce, sealed with associated data naming this table and the handle, and is
    cleared once the state is consumed or the flow finishes. ``expired`` is not stored: a
    ``pending`` flow past ``expires_at`` reads as expired.
    """

    __tablename__ = "oauth_flow"
    __table_args__ = (
        CheckConstraint("status IN ('pending', 'connected', 'denied', 'failed')", name="status_known"),
        Index("ix_oauth_flow_principal", "principal_iss", "principal_sub", "provider", "created_at"),
        Index("ix_oauth_flow_expires_at", "expires_at"),  # the retention purge
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    handle: Mapped[str] = mapped_column(String(64), unique=True)
    principal_iss: Mapped[str] = mapped_column(Text)
    principal_sub: Mapped[str] = mapped_column(Text)
    provider: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))
    state_digest: Mapped[bytes | None] = mapped_column(LargeBinary, unique=True)
    secrets_enc: Mapped[str | None] = mapped_column(Text)
    state_consumed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    error: Mapped[str | None] = mapped_column(String(64))


class AuditEvent(Base):
    """Who did what to which connection, when, and how it ended. Never a secret.

    The principal is nullable for events no principal can be named for; a subject mismatch is
    recorded under the flow owner's principal.
    """

    __tablename__ = "audit_event"
    __table_args__ = (
        CheckConstraint("action ~ '^[a-z][a-z_]{0,31}$'", name="action_code"),
        CheckConstraint("outcome ~ '^[a-z][a-z_]{0,31}$'", name="outcome_code"),
        Index("ix_audit_event_principal", "principal_iss", "principal_sub", "created_at"),
        Index("ix_audit_event_created_at", "created_at"),  # the retention purge
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    principal_iss: Mapped[str | None] = mapped_column(Text)
    principal_sub: Mapped[str | None] = mapped_column(Text)
    action: Mapped[str] = mapped_column(String(32))
    provider: Mapped[str | None] = mapped_column(String(64))
    outcome: Mapped[str] = mapped_column(String(32))
    detail: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
