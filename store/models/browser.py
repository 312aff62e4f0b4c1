"""Browser sessions of ``/connect``: which signed-in browsers are still signed in."""

from datetime import datetime

from sqlalchemy import BigInteger, DateTime, Index, LargeBinary, Text, func
from sqlalchemy.orm import Mapped, mapped_column

from store.models.base import Base


class BrowserSession(Base):
    """One browser's sign-in at ``/connect``, from the sign-in until sign-out or ``expires_at``.

    The sealed session cookie names a random session id; only ``sha256(id)`` is stored (unique, so a
    request finds its row in one index probe). A cookie opens a session only while its row exists and has
    not expired, so deleting the row (sign-out) ends the session for every copy of the cookie, on every
    replica. Expired rows are purged by ``coatcheck purge``.
    """

    __tablename__ = "browser_session"
    __table_args__ = (Index("ix_browser_session_expires_at", "expires_at"),)  # the retention purge

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    session_digest: Mapped[bytes] = mapped_column(LargeBinary, unique=True)
    principal_iss: Mapped[str] = mapped_column(Text)
    principal_sub: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
