"""Checkout and orders, always scoped to the owning principal.

Checking out is two steps the caller runs in separate transactions (and, in an MCP
deployment, possibly on different server instances):

1. :meth:`OrderRepository.quote` prices the cart as it is now. One read, no lock, no write.
2. :meth:`OrderRepository.place` turns a quote the user confirmed into an order in two
   statements, each committing on its own: it re-reads the cart and either returns a fresh
   quote (the cart or its prices moved since the quote) or places the order with one
   statement that closes the cart only if it is still open at the version just read.

Exactly-once comes from PostgreSQL, not from process memory. The confirmation carries a
random ``nonce`` that is stored on the order (unique per principal) in the same statement
that creates it, and ``orders.cart_id`` is unique. The placing statement is a
compare-and-swap on the cart's version and status, and it takes the cart row lock that
cart_set_item and cart_delete take too: of concurrent placements for one cart exactly one
closes it; the others write nothing, read again, and see the winner's order, which they
either return (same nonce: a retry of the same confirmation) or refuse (another
confirmation). The unique constraints back this up.
"""

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import (
    BigInteger,
    Integer,
    Row,
    String,
    Text,
    bindparam,
    cast,
    exists,
    func,
    insert,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncConnection

from store.carts import CART_LINES, CART_PREFIX, PRICED_LINE_COLUMNS, CartStatus
from store.compiled import Compiled
from store.errors import Conflict, InvalidInput, NotFound
from store.handles import is_well_formed, new_handle
from store.lines import CartLine, PricedLine, cart_lines, line_counts, priced_lines
from store.models import Cart, CartItem, Order, OrderLine, Product, table_of
from store.paging import DEFAULT_PAGE_SIZE, Page, Position, keyset_list
from store.principal import Principal
from store.scoping import owned_by, owned_rows, principal_params

ORDER_PREFIX = "ord"
MAX_NONCE_LENGTH = 64
# A placement that loses its compare-and-swap to a concurrent change reads again this often.
_PLACE_ATTEMPTS = 10

_cart = table_of(Cart)
_item = table_of(CartItem)
_product = table_of(Product)
_order = table_of(Order)
_line = table_of(OrderLine)


OrderStatus = Literal["placed"]
"""Orders never change once placed; the type leaves room for later states."""


@dataclass(frozen=True, slots=True)
class CheckoutQuote:
    """What the user is asked to confirm: one version of a cart, priced at one moment."""

    cart_handle: str
    version: int
    line_count: int
    item_count: int
    total_cents: int
    currency: str

    def same_offer(self, other: "CheckoutQuote") -> bool:
        """Tell whether ``other`` asks the user to pay for the same thing (same cart version, same total)."""
        return (self.cart_handle, self.version, self.total_cents, self.currency) == (
            other.cart_handle,
            other.version,
            other.total_cents,
            other.currency,
        )


@dataclass(frozen=True, slots=True)
class OrderReceipt:
    """The outcome of a placement: the order and what it costs."""

    handle: str
    total_cents: int
    currency: str
    status: OrderStatus


@dataclass(frozen=True, slots=True)
class OrderView:
    """An order with its lines."""

    handle: str
    cart_handle: str
    status: OrderStatus
    items: list[PricedLine]
    item_count: int
    total_cents: int
    currency: str
    placed_at: datetime


@dataclass(frozen=True, slots=True)
class OrderSummary:
    """An order as listed: counts and total, no lines."""

    handle: str
    cart_handle: str
    status: OrderStatus
    line_count: int
    item_count: int
    total_cents: int
    currency: str
    placed_at: datetime


def _summary(row: Row[*tuple[Any, ...]]) -> OrderSummary:
    return OrderSummary(
        handle=row.handle,
        cart_handle=row.cart_handle,
        status=row.status,
        line_count=row.line_count,
        item_count=int(row.item_count),
        total_cents=row.total_cents,
        currency=row.currency,
        placed_at=row.placed_at,
    )


@dataclass(frozen=True, slots=True)
class _CartSnapshot:
    """A cart, its lines priced from the catalog, and the order already placed from it (if any)."""

    cart_id: int
    version: int
    status: CartStatus
    lines: list[CartLine]
    currency: str
    order: OrderReceipt | None
    order_nonce: str | None

    def quote(self, handle: str) -> CheckoutQuote:
        return CheckoutQuote(
            cart_handle=handle,
            version=self.version,
            line_count=len(self.lines),
            item_count=sum(line.quantity for line in self.lines),
            total_cents=sum(line.line_total_cents for line in self.lines),
            currency=self.currency,
        )


# Statements are built once; each call only binds values. Parameter names carry a p_ prefix so they
# never collide with the column names an INSERT or UPDATE reserves for its own values.
_OWNS_CART = owned_by(_cart)
_OWNS_ORDER = owned_by(_order)

_SNAPSHOT = (
    select(
        _cart.c.id,
        _cart.c.version,
        _cart.c.status,
        *PRICED_LINE_COLUMNS,
        _order.c.handle.label("order_handle"),
        _order.c.checkout_nonce,
        _order.c.total_cents.label("order_total_cents"),
        _order.c.currency.label("order_currency"),
        _order.c.status.label("order_status"),
    )
    .select_from(CART_LINES.outerjoin(_order, _order.c.cart_id == _cart.c.id))
    .where(_cart.c.handle == bindparam("p_cart"), _OWNS_CART)
    .order_by(_item.c.sku)
)
# Closes the cart only if it is still open at the version the snapshot read. Every line change bumps
# the version, so an unchanged version proves the lines are the ones read: the order gets exactly
# what the user confirmed, or nothing is written at all. A product retired since the read (which bumps
# no version) stops it too; the retry then finds the line unavailable.
_RETIRED_LINE = exists().where(
    _item.c.cart_id == _cart.c.id, _item.c.sku == _product.c.sku, _product.c.active.is_(False)
)
_CLOSED = (
    update(_cart)
    .where(
        _cart.c.id == bindparam("p_cart_id"),
        _cart.c.version == bindparam("p_version"),
        _cart.c.status == "open",
        ~_RETIRED_LINE,
    )
    .values(status="checked_out", version=_cart.c.version + 1, updated_at=func.now())
    .returning(_cart.c.id)
    .cte("closed")
)
_NEW_ORDER = (
    insert(_order)
    .from_select(
        [
            "handle",
            "principal_iss",
            "principal_sub",
            "cart_id",
            "cart_handle",
            "checkout_nonce",
            "total_cents",
            "currency",
        ],
        select(
            bindparam("p_order", type_=String),
            bindparam("p_iss", type_=Text),
            bindparam("p_sub", type_=Text),
            _CLOSED.c.id,
            bindparam("p_cart", type_=String),
            bindparam("p_nonce", type_=String),
            bindparam("p_total", type_=BigInteger),
            bindparam("p_currency", type_=String),
        ),
    )
    .returning(_order.c.id)
    .cte("new_order")
)
# The lines travel as four parallel arrays, so one prepared statement serves carts of any size. All four
# are text[], the one array type whose codec asyncpg has built in: for any other it first introspects the
# type, and its introspection turns `jit` off with a session-level set_config that outlives the transaction
# (behind a transaction pooler, on a server connection other clients share). The numbers are cast in SQL.
_PRICED = (
    func.unnest(
        bindparam("p_skus", type_=ARRAY(Text)),
        bindparam("p_names", type_=ARRAY(Text)),
        cast(bindparam("p_quantities", type_=ARRAY(Text)), ARRAY(Integer)),
        cast(bindparam("p_prices", type_=ARRAY(Text)), ARRAY(Integer)),
    )
    .table_valued("sku", "name", "quantity", "unit_price_cents")
    .render_derived(name="priced")
)
_NEW_LINES = (
    insert(_line)
    .from_select(
        ["order_id", "sku", "name", "quantity", "unit_price_cents"],
        select(
            _NEW_ORDER.c.id, _PRICED.c.sku, _PRICED.c.name, _PRICED.c.quantity, _PRICED.c.unit_price_cents
        ).select_from(_NEW_ORDER.join(_PRICED, true())),
    )
    .cte("new_lines")
)
# The closed cart, the order and its lines in one statement; each insert feeds on the row before it,
# so a cart that moved on yields no order and no lines.
_PLACE = select(_NEW_ORDER.c.id).add_cte(_CLOSED, _NEW_LINES)

_PLACED_WITH = select(_order.c.handle, _order.c.total_cents, _order.c.currency, _order.c.status).where(
    _OWNS_ORDER, _order.c.checkout_nonce == bindparam("p_nonce")
)

_VIEW = (
    select(
        _order.c.cart_handle,
        _order.c.status,
        _order.c.total_cents,
        _order.c.currency,
        _order.c.placed_at,
        _line.c.sku,
        _line.c.name,
        _line.c.quantity,
        _line.c.unit_price_cents,
    )
    .select_from(_order.outerjoin(_line, _line.c.order_id == _order.c.id))
    .where(_order.c.handle == bindparam("p_handle"), _OWNS_ORDER)
    .order_by(_line.c.sku)
)
_VIEW_SQL = Compiled(_VIEW)  # order_view's lone statement, run on the driver (store/compiled.py)

# One page of the principal's orders (keyset on the index (iss, sub, placed_at, handle)), then the line
# counts of just those orders.
_LIST = keyset_list(
    select(
        _order.c.id,
        _order.c.handle,
        _order.c.cart_handle,
        _order.c.status,
        _order.c.total_cents,
        _order.c.currency,
        _order.c.placed_at,
    ).where(_OWNS_ORDER),
    row_id=_order.c.id,
    at=_order.c.placed_at,
    handle=_order.c.handle,
    totals=lambda order_id: select(*line_counts(_line.c.sku, _line.c.quantity)).where(_line.c.order_id == order_id),
)


def _already_checked_out(order_handle: str | None) -> Conflict:
    named = f" (order {order_handle})" if order_handle else ""
    return Conflict(
        f"this cart is already checked out{named}; use order_view to see the order, or cart_create to start a new cart"
    )


def _empty_cart() -> InvalidInput:
    return InvalidInput("the cart is empty; add items with cart_set_item first, then check out")


_MAX_NAMED_LINES = 10


def _refuse_unavailable(lines: list[CartLine]) -> None:
    """Refuse a checkout of a cart holding retired products, naming the lines to remove."""
    gone = [line for line in lines if not line.available]
    if not gone:
        return
    named = ", ".join(f"{line.sku!r} ({line.name})" for line in gone[:_MAX_NAMED_LINES])
    if len(gone) > _MAX_NAMED_LINES:
        named += f" and {len(gone) - _MAX_NAMED_LINES} more (cart_view lists them)"
    noun = "product that is" if len(gone) == 1 else "products that are"
    raise InvalidInput(
        f"this cart holds {len(gone)} {noun} no longer sold: {named}; remove "
        f"{'it' if len(gone) == 1 else 'them'} with cart_set_item quantity 0, then check out again"
    )


class OrderRepository:
    """Checkout and order operations on one connection (inside the caller's transaction)."""

    def __init__(self, conn: AsyncConnection) -> None:
        self._conn = conn

    async def _snapshot(self, principal: Principal, cart_handle: str) -> _CartSnapshot | None:
        """The cart, its priced lines and its order, in one query."""
        rows = (await self._conn.execute(_SNAPSHOT, {"p_cart": cart_handle, **principal_params(principal)})).all()
        if not rows:
            return None
        first = rows[0]
        order = None
        if first.order_handle is not None:
            order = OrderReceipt(
                handle=first.order_handle,
                total_cents=first.order_total_cents,
                currency=first.order_currency,
                status=first.order_status,
            )
        return _CartSnapshot(
            cart_id=first.id,
            version=first.version,
            status=first.status,
            lines=cart_lines(rows),
            # cart_set_item keeps one currency per cart, so the first line's speaks for all ("": no lines).
            currency=next((row.currency for row in rows if row.currency is not None), ""),
            order=order,
            order_nonce=first.checkout_nonce,
        )

    async def quote(self, principal: Principal, cart_handle: str) -> CheckoutQuote:
        """Price the cart for confirmation. One query; writes nothing.

        Raises:
            NotFound: the handle names no cart of this principal.
            Conflict: the cart is already checked out (the message names its order).
            InvalidInput: the cart is empty, or holds retired products (the message names them).
        """
        if not is_well_formed(cart_handle, CART_PREFIX):
            raise NotFound("cart", cart_handle)
        snapshot = await self._snapshot(principal, cart_handle)
        if snapshot is None:
            raise NotFound("cart", cart_handle)
        if snapshot.status != "open":
            raise _already_checked_out(snapshot.order.handle if snapshot.order else None)
        if not snapshot.lines:
            raise _empty_cart()
        _refuse_unavailable(snapshot.lines)
        return snapshot.quote(cart_handle)

    async def place(
        self, principal: Principal, confirmed: CheckoutQuote, *, nonce: str
    ) -> OrderReceipt | CheckoutQuote:
        """Place the order the user confirmed, exactly once per ``nonce``.

        Returns the new order's receipt; the same receipt again when this ``nonce`` already
        placed it (a retried confirmation); or a fresh :class:`CheckoutQuote`, writing
        nothing, when the cart or its total changed since ``confirmed`` was shown.

        Two statements (a read, then the placing compare-and-swap), each correct on its own, so
        they need no transaction around them; a placement that lost a race reads again.

        Raises:
            NotFound: the handle names no cart of this principal (and no order came from this nonce).
            Conflict: the cart was checked out by another confirmation (the message names its order).
            InvalidInput: the cart is empty or holds retired products, or the nonce is unusable.
        """
        _check_nonce(nonce)
        cart_handle = confirmed.cart_handle
        if not is_well_formed(cart_handle, CART_PREFIX):
            raise NotFound("cart", cart_handle)
        for _ in range(_PLACE_ATTEMPTS):
            snapshot = await self._snapshot(principal, cart_handle)
            if snapshot is None:
                # The cart may have been deleted after this very confirmation placed its order.
                placed = await self.placed_with(principal, nonce)
                if placed is None:
                    raise NotFound("cart", cart_handle)
                return placed
            if snapshot.status != "open":
                if snapshot.order is not None and snapshot.order_nonce == nonce:
                    return snapshot.order
                raise _already_checked_out(snapshot.order.handle if snapshot.order else None)
            if not snapshot.lines:
                raise _empty_cart()
            _refuse_unavailable(snapshot.lines)
            current = snapshot.quote(cart_handle)
            if not current.same_offer(confirmed):
                return current
            receipt = await self._insert(principal, snapshot, current, nonce)
            if receipt is not None:
                return receipt
        raise Conflict("the cart kept changing during checkout; call cart_checkout again")

    async def _insert(
        self, principal: Principal, snapshot: _CartSnapshot, quote: CheckoutQuote, nonce: str
    ) -> OrderReceipt | None:
        """Close the cart and create the order and its lines in one statement, if the cart is unchanged.

        The lines come from the snapshot rather than a second read of the catalog, so the stored
        lines always add up to the stored total. ``None``: the cart moved on since the snapshot.
        """
        handle = new_handle(ORDER_PREFIX)
        lines = snapshot.lines
        placed = await self._conn.execute(
            _PLACE,
            {
                "p_order": handle,
                **principal_params(principal),
                "p_cart_id": snapshot.cart_id,
                "p_version": snapshot.version,
                "p_cart": quote.cart_handle,
                "p_nonce": nonce,
                "p_total": quote.total_cents,
                "p_currency": quote.currency,
                "p_skus": [line.sku for line in lines],
                "p_names": [line.name for line in lines],
                "p_quantities": [str(line.quantity) for line in lines],
                "p_prices": [str(line.unit_price_cents) for line in lines],
            },
        )
        if placed.scalar_one_or_none() is None:
            return None
        return OrderReceipt(handle=handle, total_cents=quote.total_cents, currency=quote.currency, status="placed")

    async def placed_with(self, principal: Principal, nonce: str) -> OrderReceipt | None:
        """The order this principal placed with ``nonce``, if any. One query."""
        _check_nonce(nonce)
        row = (await self._conn.execute(_PLACED_WITH, {"p_nonce": nonce, **principal_params(principal)})).one_or_none()
        if row is None:
            return None
        return OrderReceipt(handle=row.handle, total_cents=row.total_cents, currency=row.currency, status=row.status)

    async def view(self, principal: Principal, handle: str) -> OrderView:
        """The order with its lines, in one query.

        Raises:
            NotFound: the handle names no order of this principal.
        """
        rows = await owned_rows(self._conn, _VIEW_SQL, principal, kind="order", prefix=ORDER_PREFIX, handle=handle)
        first = rows[0]
        lines = priced_lines(rows)
        return OrderView(
            handle=handle,
            cart_handle=first.cart_handle,
            status=first.status,
            items=lines,
            item_count=sum(line.quantity for line in lines),
            total_cents=first.total_cents,
            currency=first.currency,
            placed_at=first.placed_at,
        )

    async def list(
        self, principal: Principal, *, limit: int = DEFAULT_PAGE_SIZE, after: Position | None = None
    ) -> Page[OrderSummary]:
        """One page of the principal's orders, newest first, with line and item counts. One query.

        ``after`` is the ``next`` position of the previous page; the cost depends on ``limit`` only.
        """
        return await _LIST.page(self._conn, principal, limit=limit, after=after, item=_summary)


def _check_nonce(nonce: str) -> None:
    if not nonce or len(nonce) > MAX_NONCE_LENGTH:
        raise InvalidInput("the checkout confirmation is unusable; call cart_checkout again")
