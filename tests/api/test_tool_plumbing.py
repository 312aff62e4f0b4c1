"""The tool plumbing that needs no server: request-state payloads and the one error translation."""

import pytest
from mcp.server.mcpserver.exceptions import ToolError

from api.mcp.errors import Step, provider_step, tool_errors
from api.mcp.tools_connections import ConnectState
from api.mcp.tools_orders import ConfirmationState
from api.oauth.client import OAuthFailure
from api.provider_config import ProviderConfig
from store.errors import DecryptError, NotFound
from store.orders import CheckoutQuote

QUOTE = CheckoutQuote(cart_handle="cart_abc", version=3, line_count=2, item_count=5, total_cents=14800, currency="USD")
DEMO = ProviderConfig(
    name="demo",
    display_name="Demo",
    issuer=None,
    client_id="coatcheck",
    authorization_endpoint="https://demo.example/authorize",
    token_endpoint="https://demo.example/token",
)


def test_a_confirmation_state_round_trips_through_its_wire_json() -> None:
    raw = ConfirmationState.offering(QUOTE, "nonce-1").dump()

    state = ConfirmationState.load(raw)

    assert state is not None
    assert state.quote == QUOTE
    assert state.nonce == "nonce-1"
    # The wire names are what older and newer servers read: they must not drift.
    assert raw == (
        '{"kind":"checkout.confirm.v1","cart":"cart_abc","version":3,"lines":2,"items":5,'
        '"total":14800,"currency":"USD","nonce":"nonce-1"}'
    )


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('"version":3', '"version":true'),  # a boolean is not a number
        ('"version":3', '"version":"3"'),  # no coercion from text
        ('"nonce":"nonce-1"', '"nonce":""'),  # an empty nonce authorises nothing
        ('"kind":"checkout.confirm.v1"', '"kind":"connect.v1"'),  # another tool's state
        (',"currency":"USD"', ""),  # a field missing
    ],
)
def test_a_confirmation_state_of_another_shape_means_start_over(old: str, new: str) -> None:
    raw = ConfirmationState.offering(QUOTE, "nonce-1").dump()
    assert old in raw

    assert ConfirmationState.load(raw.replace(old, new)) is None


@pytest.mark.parametrize("raw", [None, "", "not json", "[]", '{"kind":"connect.v1","provider":"demo","flow":""}'])
def test_a_connect_state_that_is_not_one_this_tool_minted_means_start_over(raw: str | None) -> None:
    assert ConnectState.load(raw) is None


async def test_a_store_error_becomes_the_tool_error_text_that_names_the_next_step() -> None:
    @tool_errors
    async def view() -> None:
        raise NotFound("cart", "cart_nope")

    with pytest.raises(ToolError, match=r"^No cart with id 'cart_nope' exists for you; use cart_list"):
        await view()


@pytest.mark.parametrize(
    ("step", "cause", "text"),
    [
        ("renew", DecryptError("unknown_key"), "The stored Demo credentials cannot be read; use connection_disconnect"),
        ("disconnect", DecryptError("unknown_key"), "The stored Demo credentials cannot be read, so they were not"),
        ("renew", OAuthFailure("server_error"), "Refreshing the Demo access failed (server_error); try again later."),
        ("renew", OAuthFailure("refresh_in_progress"), "Another request is still renewing the Demo access"),
        ("profile", OAuthFailure("server_error"), "Demo did not return your profile (server_error); try again later."),
    ],
)
async def test_a_provider_error_is_worded_for_the_step_it_interrupted(step: Step, cause: Exception, text: str) -> None:
    @tool_errors
    async def tool() -> None:
        with provider_step(DEMO, step):
            raise cause

    with pytest.raises(ToolError) as caught:
        await tool()
    assert str(caught.value).startswith(text)
    assert "unknown_key" not in str(caught.value)


async def test_a_failed_revocation_is_not_reworded_as_a_failed_refresh() -> None:
    @tool_errors
    async def tool() -> None:
        with provider_step(DEMO, "disconnect"):
            raise OAuthFailure("server_error")

    with pytest.raises(OAuthFailure):
        await tool()
