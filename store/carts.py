"""Carts and their lines, always scoped to the owning principal.

Writes are absolute (a line is *set* to a quantity) and bump the cart's ``version``,
so a retried call has the effect of one call and concurrent editors can use
optimistic concurrency. A handle that is malformed, unknown, or owned by someone
else raises the same :class:`~store.errors.NotFound` (``delete`` answers ``False`` for all
three, so a retried delete succeeds). Creating is capped per principal and can be made
idempotent with a client-chosen key; listing is by keyset pages (``store/paging.py``).
"""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import Row, bindparam, delete, func, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from store.compiled import Compiled, fetch
from store.errors import Conflict, InvalidInput, NotFound
from store.handles import is_well_formed, new_handle
from store.lines import CartLine, cart_lines, line_counts
from store.models import Cart, CartItem, Product, table_of
from store.paging import DEFAULT_PAGE_SIZE, Page, Position, keyset_list
from store.principal import Principal
from store.scoping import owned_by, owned_rows, principal_params

CART_PREFIX = "cart"
MAX_QUANTITY = 999
DEFAULT_MAX_OPEN_CARTS = 100
DEFAULT_IDEMPOTENCY_KEY_TTL = timedelta(hours=24)
MAX_CART_LINES = 100
# A write that loses a compare-and-swap to a concurrent writer re-reads and tries again this often.
_WRITE_ATTEMPTS = 10

_cart = table_of(Cart)
_item = table_of(CartItem)
_product = table_of(Product)


CartStatus = Literal["open", "checked_out"]
"""``checked_out``: an order was placed from the cart, which can no longer change."""


@dataclass(frozen=True, slots=True)
class CartView:
    """A cart with its lines and total (of the available lines: what a checkout would charge)."""

    handle: str
    version: int
    status: CartStatus
    items: list[CartLine]
    total_cents: int
    currency: str | None


@dataclass(frozen=True, slots=True)
class CartSummary:
    """A cart as listed: counts and total, no lines."""

    handle: str
    version: int
    status: CartStatus
    line_count: int
    item_count: int
    total_cents: int
    currency: str | None
    created_at: datetime


def _view_of(handle: str, status: CartStatus, rows: Sequence[Row[*tuple[Any, ...]]]) -> CartView:
    """The cart read as rows of its priced lines (one row with a NULL sku for an empty cart)."""
    lines = cart_lines(rows)
    return CartView(
        handle=handle,
        version=rows[0].version,
        status=status,
        items=lines,
        total_cents=sum(line.line_total_cents for line in lines if line.available),
        # Every write keeps a cart to one currency, so any line's speaks for all.
        currency=next((row.currency for row in rows if row.currency is not None), None),
    )


def _summary(row: Row[*tuple[Any, ...]]) -> CartSummary:
    return CartSummary(
        handle=row.handle,
        version=row.version,
        status=row.status,
        line_count=row.line_count,
        item_count=int(row.item_count),
        total_cents=int(row.total_cents),
        currency=row.currency,
        created_at=row.created_at,
    )


# A cart with its lines priced from the catalog now (an empty cart still yields one row, its line columns
# NULL), as cart_view shows it and checkout prices it: read what :func:`~store.lines.priced_lines` needs.
CART_LINES = _cart.outerjoin(_item, _item.c.cart_id == _cart.c.id).outerjoin(_product, _product.c.sku == _item.c.sku)
PRICED_LINE_COLUMNS = (
    _item.c.sku,
    _product.c.name,
    _item.c.quantity,
    _product.c.unit_price_cents,
    _product.c.currency,
    _product.c.active,
)

# The hot statements are built once; each call only binds values (no per-call construction).
_OWNED = owned_by(_cart)
_VIEW = (
    select(_cart.c.version, _cart.c.status, *PRICED_LINE_COLUMNS)
    .select_from(CART_LINES)
    .where(_cart.c.handle == bindparam("p_handle"), _OWNED)
    .order_by(_item.c.sku)
)
# cart_set_item in one statement (autocommit: one round trip). Every sub-statement sees the snapshot
# taken when the statement starts, so the reply is assembled from that snapshot (the other lines) plus
# the line being written. The version bump is a compare-and-swap on the version read in the same
# snapshot: if a concurrent writer committed after the snapshot (the UPDATE then waited for the row
# lock), the recheck fails, nothing is written, and set_item reads again. So what the checks and the
# reply saw is exactly the cart the write applied to. The checks cost O(1) in the number of lines:
# one other line's currency stands for all (every write keeps a cart to one currency), the line being
# set is found by its primary key, and the cap counts the lines the reply lists anyway. `chosen` and
# `others` join the product, which is always there: products are never deleted, only retired (active
# false), and fk_cart_item_sku_product refuses to delete one any cart line names (tests/store/test_carts.py).
# So a retired product's line is still listed, counted toward the cap and removable (quantity 0 needs
# `chosen`); only a quantity above 0 needs the product to be on sale.
_SET_ITEM = text(
    """
WITH args AS (
    SELECT CAST(:p_handle AS varchar) AS handle, CAST(:p_iss AS text) AS iss, CAST(:p_sub AS text) AS sub,
           CAST(:p_sku AS varchar) AS sku, CAST(:p_quantity AS integer) AS quantity,
           CAST(:p_expected AS integer) AS expected, CAST(:p_max_lines AS integer) AS max_lines
), target AS (
    SELECT cart.id, cart.version, cart.status FROM cart, args
    WHERE cart.handle = args.handle AND cart.principal_iss = args.iss AND cart.principal_sub = args.sub
), chosen AS (
    SELECT product.sku, product.name, product.unit_price_cents, product.currency, product.active
    FROM product, args WHERE product.sku = args.sku
), others AS (
    SELECT item.sku, product.name, item.quantity, product.unit_price_cents, product.currency, product.active
    FROM target
    JOIN cart_item AS item ON item.cart_id = target.id
    JOIN product ON product.sku = item.sku
    CROSS JOIN args
    WHERE item.sku <> args.sku
), allowed AS (
    SELECT target.id, target.version FROM target, chosen, args
    WHERE target.status = 'open'
      AND (args.expected IS NULL OR target.version = args.expected)
      AND (args.quantity = 0 OR chosen.active)
      AND (args.quantity = 0 OR NOT EXISTS (
            SELECT FROM (SELECT currency FROM others LIMIT 1) AS one_other WHERE one_other.currency <> chosen.currency))
      AND (args.quantity = 0
           OR EXISTS (SELECT FROM cart_item WHERE cart_item.cart_id = target.id AND cart_item.sku = args.sku)
           OR (SELECT count(*) FROM others) < args.max_lines)
), bumped AS (
    UPDATE cart SET version = cart.version + 1, updated_at = now()
    FROM allowed WHERE cart.id = allowed.id AND cart.version = allowed.version
    RETURNING cart.id, cart.version
), upserted AS (
    INSERT INTO cart_item (cart_id, sku, quantity)
    SELECT bumped.id, args.sku, args.quantity FROM bumped, args WHERE args.quantity > 0
    ON CONFLICT (cart_id, sku) DO UPDATE SET quantity = excluded.quantity
    RETURNING cart_id
), removed AS (
    DELETE FROM cart_item USING bumped, args
    WHERE cart_item.cart_id = bumped.id AND cart_item.sku = args.sku AND args.quantity = 0
    RETURNING cart_item.cart_id
)
SELECT bumped.version, line.sku, line.name, line.quantity, line.unit_price_cents, line.currency, line.active
FROM bumped LEFT JOIN (
    SELECT sku, name, quantity, unit_price_cents, currency, active FROM others
    UNION ALL
    SELECT chosen.sku, chosen.name, args.quantity, chosen.unit_price_cents, chosen.currency, chosen.active
    FROM chosen, args WHERE args.quantity > 0
) AS line ON true
ORDER BY line.sku
"""
)
# Only after a refused write: why it was refused, as the cart is now.
_WHY_NOT_SET = text(
    """
WITH chosen AS (SELECT sku, currency, active FROM product WHERE sku = CAST(:p_sku AS varchar))
SELECT cart.status, cart.version,
       EXISTS (SELECT FROM chosen) AS known,
       EXISTS (SELECT FROM chosen WHERE chosen.active) AS sold,
       EXISTS (SELECT FROM cart_item AS item JOIN product ON product.sku = item.sku, chosen
               WHERE item.cart_id = cart.id AND item.sku <> chosen.sku AND product.currency <> chosen.currency)
           AS mixed_currency,
       EXISTS (SELECT FROM cart_item WHERE cart_item.cart_id = cart.id AND cart_item.sku = CAST(:p_sku AS varchar))
           AS has_line,
       (SELECT count(*) FROM cart_item WHERE cart_item.cart_id = cart.id) AS line_count
FROM cart
WHERE cart.handle = CAST(:p_handle AS varchar)
  AND cart.principal_iss = CAST(:p_iss AS text) AND cart.principal_sub = CAST(:p_sub AS text)
"""
)
# One page of the principal's carts (keyset on the index (iss, sub, created_at, handle)), then the
# counts and totals of just those carts: the cost is one index range of limit + 1 entries plus their lines.
_LIST = keyset_list(
    select(_cart.c.id, _cart.c.handle, _cart.c.version, _cart.c.status, _cart.c.created_at).where(_OWNED),
    row_id=_cart.c.id,
    at=_cart.c.created_at,
    handle=_cart.c.handle,
    totals=lambda cart_id: (
        select(
            *line_counts(_item.c.sku, _item.c.quantity),
            # Of the available lines, as cart_view's total (a retired product's line is not charged).
            func.coalesce(func.sum(_item.c.quantity * _product.c.unit_price_cents).filter(_product.c.active), 0).label(
                "total_cents"
            ),
            func.min(_product.c.currency).label("currency"),
        )
        .select_from(_item.join(_product, _product.c.sku == _item.c.sku))
        .where(_item.c.cart_id == cart_id)
    ),
)
# cart_create in one statement (autocommit: one round trip). An open cart holds one of its owner's
# MAX_OPEN_CARTS numbered slots, and a unique index over the open carts' slots (uq_cart_open_slot, partial
# on status = 'open', so checking out or deleting a cart frees its slot) is what enforces the cap: two
# concurrent creates that pick the same free slot cannot both commit, and the loser, after DO NOTHING,
# tries again on a fresh snapshot. With no free slot the cap is reached. The idempotency key is unique
# per principal too (uq_cart_idempotency_key), so racing retries of one key make one cart.
_CREATE = text(
    """
WITH args AS (
    SELECT CAST(:p_iss AS text) AS iss, CAST(:p_sub AS text) AS sub, CAST(:p_handle AS varchar) AS handle,
           CAST(:p_key AS varchar) AS key, CAST(:p_ttl AS interval) AS ttl, CAST(:p_max_open AS integer) AS max_open
), reused AS (
    SELECT cart.handle FROM cart, args
    WHERE cart.principal_iss = args.iss AND cart.principal_sub = args.sub
      AND cart.idempotency_key = args.key AND cart.created_at > now() - args.ttl
), free_slot AS (
    SELECT slot FROM args, generate_series(1, args.max_open) AS slot
    WHERE NOT EXISTS (
        SELECT FROM cart
        WHERE cart.principal_iss = args.iss AND cart.principal_sub = args.sub
          AND cart.status = 'open' AND cart.open_slot = slot)
    ORDER BY slot
    LIMIT 1
), created AS (
    INSERT INTO cart (handle, principal_iss, principal_sub, idempotency_key, open_slot)
    SELECT args.handle, args.iss, args.sub, args.key, free_slot.slot FROM args, free_slot
    WHERE NOT EXISTS (SELECT FROM reused)
    ON CONFLICT DO NOTHING
    RETURNING cart.handle
)
SELECT (SELECT handle FROM reused) AS reused, (SELECT handle FROM created) AS created,
       EXISTS (SELECT FROM free_slot) AS below_cap
"""
)
# Only after a create lost a race or hit an expired key: a key past its TTL no longer names its cart.
_FORGET_EXPIRED_KEY = text(
    """
UPDATE cart SET idempotency_key = NULL
WHERE principal_iss = CAST(:p_iss AS text) AND principal_sub = CAST(:p_sub AS text)
  AND idempotency_key = CAST(:p_key AS varchar) AND created_at <= now() - CAST(:p_ttl AS interval)
"""
)
_DELETE = delete(_cart).where(_cart.c.handle == bindparam("p_handle"), _OWNED).returning(_cart.c.id)
# What the one-statement tools run: compiled once for asyncpg and executed on the driver (store/compiled.py).
_VIEW_SQL = Compiled(_VIEW)
_SET_ITEM_SQL = Compiled(_SET_ITEM)
_CREATE_SQL = Compiled(_CREATE)
_DELETE_SQL = Compiled(_DELETE)


class CartRepository:
    """Cart operations on one connection (inside the caller's transaction)."""

    def __init__(self, conn: AsyncConnection) -> None:
        self._conn = conn

    async def create(
        self,
        principal: Principal,
        *,
        idempotency_key: str | None = None,
        max_open: int = DEFAULT_MAX_OPEN_CARTS,
        key_ttl: timedelta = DEFAULT_IDEMPOTENCY_KEY_TTL,
    ) -> str:
        """Create an empty open cart and return its handle: one statement, safe in autocommit.

        With ``idempotency_key``, the cart this principal created with the same key within ``key_ttl``
        (and has not deleted) is returned instead of a new one, so a retried create makes one cart.

        Raises:
            Conflict: the principal already has ``max_open`` open carts, or too many creates raced.
        """
        params: dict[str, object] = {
            **principal_params(principal),
            "p_handle": new_handle(CART_PREFIX),
            "p_key": idempotency_key,
            "p_ttl": key_ttl,
            "p_max_open": max_open,
        }
        for _ in range(_WRITE_ATTEMPTS):
            reused, created, below_cap = (await fetch(self._conn, _CREATE_SQL, params))[0]
            if reused is not None:
                return str(reused)
            if created is not None:
                return str(created)
            if not below_cap:
                raise Conflict(
                    f"you already have {max_open} open carts, the most allowed; check out or delete one "
                    "(cart_list shows them, cart_delete removes one) before creating another"
                )
            # Lost a race for the slot or the key (the next try sees the winner), or the key had expired.
            if idempotency_key is not None:
                await self._conn.execute(_FORGET_EXPIRED_KEY, params)
        raise Conflict("too many carts are being created at once; call cart_list, then retry")

    async def view(self, principal: Principal, handle: str) -> CartView:
        """The cart with its lines, in one query.

        Raises:
            NotFound: the handle names no cart of this principal.
        """
        rows = await owned_rows(self._conn, _VIEW_SQL, principal, kind="cart", prefix=CART_PREFIX, handle=handle)
        return _view_of(handle, rows[0].status, rows)

    async def set_item(
        self,
        principal: Principal,
        handle: str,
        sku: str,
        quantity: int,
        expected_version: int | None = None,
        *,
        max_lines: int = MAX_CART_LINES,
    ) -> CartView:
        """Set the line for ``sku`` to ``quantity`` (0 removes it) and return the updated cart.

        One statement: the version bump (which takes the cart's row lock, so concurrent writers
        serialise), the checks, the upsert or removal and the reply. A refused write costs one more
        query to say why; a write that lost a race with a concurrent writer is tried again.

        Raises:
            NotFound: the handle names no cart of this principal.
            Conflict: the cart is checked out, or its version is not ``expected_version``.
            InvalidInput: unknown sku, a retired product (unless ``quantity`` is 0), quantity out of range,
                a currency other than the cart's, or a new line beyond ``max_lines``.
        """
        if not 0 <= quantity <= MAX_QUANTITY:
            raise InvalidInput(f"quantity must be between 0 and {MAX_QUANTITY}; use 0 to remove the item")
        if not is_well_formed(handle, CART_PREFIX):
            raise NotFound("cart", handle)
        params: dict[str, object] = {
            "p_handle": handle,
            **principal_params(principal),
            "p_sku": sku,
            "p_quantity": quantity,
            "p_expected": expected_version,
            "p_max_lines": max_lines,
        }
        for _ in range(_WRITE_ATTEMPTS):
            rows = await fetch(self._conn, _SET_ITEM_SQL, params)
            if rows:
                return _view_of(handle, "open", rows)
            await self._explain_refused(params, expected_version, max_lines)
        raise Conflict("the cart is being changed by several calls at once; call cart_view, then retry")

    async def _explain_refused(self, params: dict[str, object], expected_version: int | None, max_lines: int) -> None:
        """Raise why the write was refused; return if nothing stands in its way now (it lost a race)."""
        why = (await self._conn.execute(_WHY_NOT_SET, params)).one_or_none()
        if why is None:
            raise NotFound("cart", str(params["p_handle"]))
        status, version, known, sold, mixed_currency, has_line, line_count = why
        sku, quantity = params["p_sku"], params["p_quantity"]
        if status != "open":
            raise Conflict("this cart is checked out and can no longer be changed; create a new cart with cart_create")
        if expected_version is not None and version != expected_version:
            raise Conflict(
                f"the cart changed: it is at version {version}, not {expected_version}; "
                "call cart_view to see the current contents, then retry with that version"
            )
        if not known:
            raise InvalidInput(f"unknown sku {sku!r}; use catalog_search to find products")
        if quantity and not sold:
            fix = "remove its line with quantity 0" if has_line else "use catalog_search to find products on sale"
            raise InvalidInput(f"{sku!r} is no longer sold (retired from the catalog), so it cannot be added; {fix}")
        if quantity and mixed_currency:
            raise InvalidInput(
                f"{sku!r} is priced in another currency than the items already in this cart; use a separate cart"
            )
        if quantity and not has_line and line_count >= max_lines:
            raise InvalidInput(
                f"this cart already has {line_count} lines, the most a cart may hold ({max_lines}); "
                "remove a line (quantity 0), or put the item in another cart with cart_create"
            )

    async def list(
        self, principal: Principal, *, limit: int = DEFAULT_PAGE_SIZE, after: Position | None = None
    ) -> Page[CartSummary]:
        """One page of the principal's carts, newest first, with line and item counts and totals.

        ``after`` is the ``next`` position of the previous page. Each page is one statement whose cost
        depends on ``limit``, not on how many carts this or any other principal has.
        """
        return await _LIST.page(self._conn, principal, limit=limit, after=after, item=_summary)

    async def delete(self, principal: Principal, handle: str) -> bool:
        """Delete the cart and its lines; tell whether this call deleted it.

        ``False`` means there is no such cart of this principal now: already deleted, never created, or
        someone else's. These are deliberately indistinguishable, so a retried delete succeeds and a
        foreign handle reveals nothing.
        """
        if not is_well_formed(handle, CART_PREFIX):
            return False
        return bool(await fetch(self._conn, _DELETE_SQL, {"p_handle": handle, **principal_params(principal)}))
