"""Retention: delete, in short batches, rows that no request can use any more.

What goes, and when (each cut-off is an age on the database clock, chosen by the caller):

* ``oauth_flow``: a flow whose link expired longer ago than the replay window. Its link stopped
  working at ``expires_at``, and the last ``requestState`` naming it was sealed before then, so
  after ``expires_at`` + the requestState lifetime no retried call can ask about it. Finished
  flows go the same way (they finish before they expire).
* ``audit_event``: entries older than the audit retention.
* ``browser_session``: ``/connect`` sign-ins past their ``expires_at``: no cookie opens them any more
  (the cookie carries the same expiry), so their rows only say that nobody signed out.
* ``cart`` (and its ``cart_item`` lines): carts not written to for the cart retention, open or
  checked out. Orders stay: ``orders.cart_id`` is set to NULL by the foreign key, and an order
  keeps its cart handle, lines and prices, so ``order_view`` does not need the cart. A replayed
  checkout confirmation finds its order by its nonce on ``orders`` (never purged), so it still
  answers with the same order after the cart is gone.

Each batch is one statement: it picks up to ``limit`` rows with ``FOR UPDATE SKIP LOCKED`` and
deletes them. A row that a request (or another purge) holds is skipped, never waited for, so
several replicas may purge at once and each row is deleted by exactly one of them.
"""

from datetime import timedelta
from typing import Literal

from sqlalchemy import CTE, Integer, Interval, Select, bindparam, delete, func, literal_column, select
from sqlalchemy.ext.asyncio import AsyncConnection

from store.models import AuditEvent, BrowserSession, Cart, CartItem, OAuthFlow, table_of

__all__ = ["PURGEABLE", "Purgeable", "purge_batch"]

Purgeable = Literal["oauth_flow", "audit_event", "browser_session", "cart"]
PURGEABLE: tuple[Purgeable, ...] = ("oauth_flow", "audit_event", "browser_session", "cart")

_flow = table_of(OAuthFlow)
_audit = table_of(AuditEvent)
_browser = table_of(BrowserSession)
_cart = table_of(Cart)
_item = table_of(CartItem)
_CUTOFF = func.now() - bindparam("p_age", type_=Interval())


def _doomed(table_name: Purgeable) -> CTE:
    table, column = {
        "oauth_flow": (_flow, _flow.c.expires_at),
        "audit_event": (_audit, _audit.c.created_at),
        "browser_session": (_browser, _browser.c.expires_at),
        "cart": (_cart, _cart.c.updated_at),
    }[table_name]
    # The age column is indexed, so each batch is one short range scan however large the table is.
    return (
        select(table.c.id)
        .where(column < _CUTOFF)
        .limit(bindparam("p_limit"))
        .with_for_update(skip_locked=True)
        .cte("doomed")
    )


def _simple_purge(table_name: Purgeable) -> Select[int, int]:
    table = {"oauth_flow": _flow, "audit_event": _audit, "browser_session": _browser}[table_name]
    doomed = _doomed(table_name)
    deleted = delete(table).where(table.c.id.in_(select(doomed.c.id))).returning(table.c.id).cte("deleted")
    return select(func.count(), literal_column("0", Integer)).select_from(deleted)


def _cart_purge() -> Select[int, int]:
    doomed = _doomed("cart")
    # The lines are deleted alongside (the cascade would too) so that they can be counted.
    lines = delete(_item).where(_item.c.cart_id.in_(select(doomed.c.id))).returning(_item.c.cart_id).cte("lines")
    carts = delete(_cart).where(_cart.c.id.in_(select(doomed.c.id))).returning(_cart.c.id).cte("carts")
    return select(
        select(func.count()).select_from(carts).scalar_subquery(),
        select(func.count()).select_from(lines).scalar_subquery(),
    )


_PURGE = {
    "oauth_flow": _simple_purge("oauth_flow"),
    "audit_event": _simple_purge("audit_event"),
    "browser_session": _simple_purge("browser_session"),
    "cart": _cart_purge(),
}


async def purge_batch(conn: AsyncConnection, table: Purgeable, *, older_than: timedelta, limit: int) -> tuple[int, int]:
    """Delete up to ``limit`` rows of ``table`` older than ``older_than``. One statement.

    Returns (rows deleted, dependent rows deleted with them: ``cart_item`` lines for ``cart``,
    else 0). Fewer than ``limit`` does not mean none are left: rows locked by someone else were
    skipped. Run it as its own (autocommit) statement so that its row locks last only that long.

    Raises:
        ValueError: ``limit`` is not positive or ``older_than`` is negative.
    """
    if limit < 1:
        raise ValueError("limit must be positive")
    if older_than < timedelta(0):
        raise ValueError("older_than must not be negative")
    deleted, dependent = (await conn.execute(_PURGE[table], {"p_age": older_than, "p_limit": limit})).one()
    return int(deleted), int(dependent)
