"""Coatcheck as the MCP clients' authorization server: clients, consents, grants, codes and refresh tokens.

Nothing here holds a usable secret in the clear. Authorization codes and refresh tokens are stored as
``sha256`` digests only; a dynamically registered client's secret is sealed by ``store.crypto.TokenCipher``.
A *grant* is one authorization a principal gave one client (one code, then its chain of refresh tokens:
the refresh-token family). Revoking the grant ends the family and every access token that names it.
"""

from datetime import datetime

from sqlalchemy import (
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    LargeBinary,
    String,
    Text,
    func,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import Mapped, mapped_column

from store.models.base import Base


class AsClient(Base):
    """A client registered dynamically (RFC 7591) or fetched from its metadata document (CIMD), as a cache.

    Clients pre-registered in settings are not stored. ``metadata_json`` is the client's RFC 7591 metadata
    without any secret; ``secret_enc`` is the sealed secret of a confidential DCR client. A CIMD row is a
    cache entry: ``fresh_until`` is when it must be fetched again.
    """

    __tablename__ = "as_client"
    __table_args__ = (
        CheckConstraint("kind IN ('dynamic', 'cimd')", name="kind_known"),
        Index("ix_as_client_created_at", "created_at"),  # the registration rate bound
    )

    client_id: Mapped[str] = mapped_column(Text, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    metadata_json: Mapped[dict[str, object]] = mapped_column(JSONB)
    secret_enc: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    fresh_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class AsConsent(Base):
    """A principal's remembered consent for one client and the scopes it covers."""

    __tablename__ = "as_consent"

    principal_iss: Mapped[str] = mapped_column(Text, primary_key=True)
    principal_sub: Mapped[str] = mapped_column(Text, primary_key=True)
    client_id: Mapped[str] = mapped_column(Text, primary_key=True)
    scopes: Mapped[list[str]] = mapped_column(ARRAY(Text))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class AsGrant(Base):
    """One authorization of one client by one principal: its code, refresh-token family and access tokens."""

    __tablename__ = "as_grant"
    __table_args__ = (
        Index("ix_as_grant_principal", "principal_iss", "principal_sub", "client_id"),
        Index("ix_as_grant_revoked_at", "revoked_at"),  # each replica's revoked set at start-up
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    principal_iss: Mapped[str] = mapped_column(Text)
    principal_sub: Mapped[str] = mapped_column(Text)
    client_id: Mapped[str] = mapped_column(Text)
    scopes: Mapped[list[str]] = mapped_column(ARRAY(Text))
    resource: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    revoked_reason: Mapped[str | None] = mapped_column(String(32))


class AsAuthorizationCode(Base):
    """An authorization code (its digest): single use (``used_at``), short-lived (``expires_at``)."""

    __tablename__ = "as_authorization_code"
    __table_args__ = (Index("ix_as_authorization_code_expires_at", "expires_at"),)

    code_hash: Mapped[bytes] = mapped_column(LargeBinary, primary_key=True)
    grant_id: Mapped[str] = mapped_column(String(64), ForeignKey("as_grant.id", ondelete="CASCADE"))
    client_id: Mapped[str] = mapped_column(Text)
    redirect_uri: Mapped[str] = mapped_column(Text)
    code_challenge: Mapped[str] = mapped_column(String(128))
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class AsRefreshToken(Base):
    """A refresh token (its digest). Rotated at every use: ``used_at`` set means it was spent."""

    __tablename__ = "as_refresh_token"
    __table_args__ = (Index("ix_as_refresh_token_grant_id", "grant_id"),)

    token_hash: Mapped[bytes] = mapped_column(LargeBinary, primary_key=True)
    grant_id: Mapped[str] = mapped_column(String(64), ForeignKey("as_grant.id", ondelete="CASCADE"))
    client_id: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


__all__ = ["AsAuthorizationCode", "AsClient", "AsConsent", "AsGrant", "AsRefreshToken"]
