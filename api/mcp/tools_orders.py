"""Checkout in two rounds (MCP 2026-07-28 multi round-trip requests) and the order tools.

``cart_checkout`` never holds a connection open while the user decides:

* Round 1 prices the cart (one read) and returns ``input_required`` with one form
  elicitation (a boolean ``confirm``) plus a plaintext ``requestState`` naming what was
  offered: cart version, total, currency and a random nonce. The SDK's
  ``RequestStateBoundary`` seals it (AES-GCM under the shared key ring, bound to the
  principal, this tool and its arguments, with a TTL) and verifies the echo before this
  code runs, so whatever state reaches the tool was minted here for this caller and cart.
* Round 2 (the retry with ``inputResponses`` and the echoed state) places the order only
  on ``accept`` with ``confirm: true``. The nonce is stored on the order in the same
  transaction, so the state authorises one order: a retried final round gets that order
  back, any other use of the state is refused. See docs/checkout.md.

Nothing a round depends on lives in process memory, so the rounds may land on different
instances that share the database and the key ring.
"""

import logging
import secrets
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import (
    CallToolResult,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitResult,
    InputRequiredResult,
    InputResponses,
    TextContent,
    ToolAnnotations,
)
from pydantic import Field

from api.auth import current_principal
from api.mcp.annotations import READ_ONLY
from api.mcp.arguments import CartId, Cursor, OrderId, PageSize
from api.mcp.errors import tool_errors
from api.mcp.lifespan import ToolContext, ToolDeps, deps
from api.mcp.listing import list_page
from api.mcp.results import compact
from api.mcp.rounds import RequestState, require_input_rounds
from api.mcp.schemas import CheckoutOut, OrderListOut, OrderOut, OrderSummaryOut
from store.orders import MAX_NONCE_LENGTH, CheckoutQuote, OrderReceipt, OrderRepository
from store.paging import DEFAULT_PAGE_SIZE

logger = logging.getLogger(__name__)

CONFIRM_KEY = "confirm"
_NONCE_BYTES = 16  # 128 bits: unguessable, and unique per principal with overwhelming probability

CONFIRM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        CONFIRM_KEY: {
            "type": "boolean",
            "title": "Place the order",
            "description": "Yes places the order and closes the cart; no cancels the checkout.",
        }
    },
    "required": [CONFIRM_KEY],
}


class ConfirmationState(RequestState):
    """The plaintext requestState of the confirmation round: what the user was asked to pay for.

    It carries only what round 1 established. The wire names are short and must stay stable: a state
    minted before an upgrade may be echoed to the upgraded server.
    """

    kind: Literal["checkout.confirm.v1"]
    cart: str
    version: int
    lines: int
    items: int
    total: int
    currency: str
    nonce: str = Field(min_length=1, max_length=MAX_NONCE_LENGTH)

    @classmethod
    def offering(cls, quote: CheckoutQuote, nonce: str) -> "ConfirmationState":
        """The state for asking the user to confirm ``quote``."""
        return cls(
            kind="checkout.confirm.v1",
            cart=quote.cart_handle,
            version=quote.version,
            lines=quote.line_count,
            items=quote.item_count,
            total=quote.total_cents,
            currency=quote.currency,
            nonce=nonce,
        )

    @property
    def quote(self) -> CheckoutQuote:
        """What the user was offered."""
        return CheckoutQuote(
            cart_handle=self.cart,
            version=self.version,
            line_count=self.lines,
            item_count=self.items,
            total_cents=self.total,
            currency=self.currency,
        )


def money(cents: int, currency: str) -> str:
    """``14800, "USD"`` → ``"USD 148.00"`` (every catalog currency has two minor digits)."""
    return f"{currency} {cents // 100}.{cents % 100:02d}"


def _offer(quote: CheckoutQuote) -> str:
    noun = "item" if quote.item_count == 1 else "items"
    return f"{quote.item_count} {noun}, total {money(quote.total_cents, quote.currency)}"


def ask_to_confirm(quote: CheckoutQuote, *, changed: bool) -> InputRequiredResult:
    """The confirmation round: one form question and the state that authorises exactly one order."""
    if changed:
        message = f"Your cart changed since you were asked. Place the order now? {_offer(quote)}."
    else:
        message = f"Place the order? {_offer(quote)}."
    state = ConfirmationState.offering(quote, secrets.token_urlsafe(_NONCE_BYTES))
    return InputRequiredResult(
        input_requests={
            CONFIRM_KEY: ElicitRequest(params=ElicitRequestFormParams(message=message, requested_schema=CONFIRM_SCHEMA))
        },
        request_state=state.dump(),  # plaintext; the SDK's RequestStateBoundary seals it on the way out
    )


def consented(responses: InputResponses | None) -> bool:
    """Only ``accept`` with ``confirm`` exactly ``true`` is consent; anything else cancels."""
    answer = (responses or {}).get(CONFIRM_KEY)
    return (
        isinstance(answer, ElicitResult)
        and answer.action == "accept"
        and answer.content is not None
        and answer.content.get(CONFIRM_KEY) is True
    )


def _placed(receipt: OrderReceipt) -> CallToolResult:
    out = CheckoutOut.model_validate(receipt)
    text = f"Order {receipt.handle} placed: total {money(receipt.total_cents, receipt.currency)}."
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=out.model_dump(mode="json"))


def _cancelled(quote: CheckoutQuote) -> CallToolResult:
    out = CheckoutOut(order_id=None, total_cents=quote.total_cents, currency=quote.currency, status="cancelled")
    return CallToolResult(
        content=[TextContent(type="text", text="Checkout cancelled.")], structured_content=out.model_dump(mode="json")
    )


@tool_errors
async def cart_checkout(
    cart_id: CartId, ctx: ToolContext
) -> Annotated[CallToolResult, CheckoutOut] | InputRequiredResult:
    """Round 1 asks the user to confirm the priced cart; round 2 places the order on consent."""
    require_input_rounds(
        ctx,
        "form",
        tool="cart_checkout",
        needs="it asks the user to confirm the order with a multi round-trip request",
        nothing_done="Nothing was ordered and the cart is unchanged.",
    )
    database, principal = deps(ctx).database, current_principal()
    state = ConfirmationState.load(ctx.request_state)
    if state is not None and state.cart != cart_id:  # the SDK binds arguments too; this is belt and braces
        state = None

    if state is None:  # round 1: price the cart and ask (one read, no BEGIN/COMMIT)
        async with database.one_statement() as conn:
            quote = await OrderRepository(conn).quote(principal, cart_id)
        return ask_to_confirm(quote, changed=False)

    if not consented(ctx.input_responses):
        async with database.one_statement() as conn:
            used = await OrderRepository(conn).placed_with(principal, state.nonce)
        if used is not None:
            # The same state with a different answer: that confirmation is spent.
            raise ToolError(
                f"This confirmation was already used to place order {used.handle} and cannot be used "
                "again; use order_view to see the order."
            )
        return _cancelled(state.quote)

    async with database.autocommit() as conn:  # a read, then a self-validating write: two round trips
        outcome = await OrderRepository(conn).place(principal, state.quote, nonce=state.nonce)
    if isinstance(outcome, CheckoutQuote):  # the cart or its prices moved: consent covered another total
        return ask_to_confirm(outcome, changed=True)
    logger.info("checkout of cart %s confirmed: order %s", cart_id, outcome.handle)
    return _placed(outcome)


@tool_errors
async def order_view(ctx: ToolContext, order_id: OrderId) -> Annotated[CallToolResult, OrderOut]:
    """The order with the prices paid."""
    principal = current_principal()
    async with deps(ctx).database.one_statement() as conn:
        order = await OrderRepository(conn).view(principal, order_id)
    return compact(OrderOut.model_validate(order))


@tool_errors
async def order_list(
    ctx: ToolContext, limit: PageSize = DEFAULT_PAGE_SIZE, cursor: Cursor | None = None
) -> Annotated[CallToolResult, OrderListOut]:
    """One page of the caller's orders, newest first."""
    orders, next_cursor = await list_page(ctx, "order_list", OrderRepository, limit=limit, cursor=cursor)
    summaries = [OrderSummaryOut.model_validate(order) for order in orders]
    return compact(OrderListOut(orders=summaries, next_cursor=next_cursor))


def register_order_tools(mcp: MCPServer[ToolDeps]) -> frozenset[str]:
    """Register ``cart_checkout``, ``order_view`` and ``order_list`` on ``mcp`` and return their names."""
    mcp.add_tool(
        cart_checkout,
        name="cart_checkout",
        description="Check out a cart. The user is asked to confirm the item count and total; only their "
        "confirmation places the order, which closes the cart (it can no longer be changed). Returns the order "
        "handle (order_id, ord_…) and total, or status 'cancelled' if the user declined. Retrying the final "
        "call returns the same order. Needs an MCP 2026-07-28 client with form elicitation.",
        annotations=ToolAnnotations(
            read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False
        ),
    )
    mcp.add_tool(
        order_view,
        name="order_view",
        description="Show an order: its lines with the prices paid, total, status and the cart it came from.",
        annotations=READ_ONLY,
    )
    mcp.add_tool(
        order_list,
        name="order_list",
        description=f"List your orders, newest first, with line and item counts and totals; {DEFAULT_PAGE_SIZE} "
        "per page by default. Pass next_cursor back as cursor for the next page (null: no more).",
        annotations=READ_ONLY,
    )
    return frozenset({"cart_checkout", "order_view", "order_list"})
