"""The suite's auth-mode switch (``COATCHECK_TEST_AUTH_MODE``, tests/support/auth_mode.py) does what it says.

These run in either mode and check that mode's promise: the server really runs in it, the token really comes
from the issuer that mode names, and the principal is (dev IdP issuer, username) either way, so tests that
assert owners mean the same in both.
"""

import base64
import json
import uuid
from typing import Any

import pytest
from sqlalchemy import select

from store.db import Database
from store.models import Cart, table_of
from tests.support.auth_mode import MODE_VARIABLE, AuthMode, McpTokens, auth_mode_from
from tests.support.devidp import DevIdP
from tests.support.inprocess import InProcessApp
from tests.support.mcp_client import call_ok

_carts = table_of(Cart)


def _claims(token: str) -> dict[str, Any]:
    """The payload of a JWT the server has just accepted (read, not verified: the server verified it)."""
    payload = token.split(".")[1]
    claims: dict[str, Any] = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return claims


async def test_the_suites_tokens_come_from_the_runs_mode_and_own_carts_as_the_dev_idp_user(
    app: InProcessApp, mcp_token: McpTokens, devidp: DevIdP, database: Database, auth_mode: AuthMode
) -> None:
    username = f"mode-{uuid.uuid4().hex[:8]}"
    token = await mcp_token(username, resource=app.mcp_url, transport=app.transport())
    async with app.mcp_client(token) as client:
        cart_id = (await call_ok(client, "cart_create"))["cart_id"]
    async with database.one_statement() as conn:
        owner = (
            await conn.execute(select(_carts.c.principal_iss, _carts.c.principal_sub).where(_carts.c.handle == cart_id))
        ).one()
    assert tuple(owner) == (devidp.issuer, username)

    claims = _claims(token)
    async with app.http(timeout=10) as http:
        metadata = (await http.get("/.well-known/oauth-protected-resource/mcp")).json()
    if auth_mode == "authorization-server":
        assert metadata["authorization_servers"] == [app.base_url]
        assert claims["iss"] == app.base_url
        assert claims["upstream_iss"] == devidp.issuer
        assert claims["exp"] - claims["iat"] == 3600  # the longest AS_ACCESS_TOKEN_SECONDS, so one walk a user
        assert await mcp_token(username, resource=app.mcp_url, transport=app.transport()) == token  # cached
    else:
        assert metadata["authorization_servers"] == [devidp.issuer]
        assert claims["iss"] == devidp.issuer
    assert claims["sub"] == username


def test_the_switch_names_the_two_modes_and_refuses_anything_else() -> None:
    assert auth_mode_from({}) == "resource-server"
    assert auth_mode_from({MODE_VARIABLE: " Authorization-Server "}) == "authorization-server"
    with pytest.raises(ValueError, match=r"'resource-server' .* or 'authorization-server'"):
        auth_mode_from({MODE_VARIABLE: "as"})
