"""``mcp-remote`` (pinned in tests/support/npm/clients/package.json) bridges a stdio MCP client to Coatcheck over
HTTP: the official SDK's stdio client runs the cart flow through it, with the bearer token in a header
mcp-remote fills from an environment variable (so it is not on the command line)."""

import uuid
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.support.auth_mode import McpTokens
from tests.support.mcp_client import cart_with_first_product
from tests.support.node import NodeClients
from tests.support.server import RunningServer

BOUND = 90.0


async def test_the_sdk_stdio_client_runs_the_cart_flow_through_mcp_remote(
    clients: NodeClients, server: RunningServer, mcp_token: McpTokens, tmp_path: Path
) -> None:
    token = await mcp_token(f"remote-{uuid.uuid4().hex[:8]}", resource=server.mcp_url)
    bridge = StdioServerParameters(
        command=str(clients.node),
        args=[
            str(clients.mcp_remote),
            server.mcp_url,
            "--transport",
            "http-only",
            "--header",
            "Authorization:${AUTH_HEADER}",
        ],
        env=clients.env(tmp_path / "home", AUTH_HEADER=f"Bearer {token}"),
        cwd=str(tmp_path),
    )
    log_path = tmp_path / "mcp-remote.log"
    with anyio.fail_after(BOUND), log_path.open("w") as log:
        async with Client(stdio_client(bridge, errlog=log)) as client:
            assert client.protocol_version == "2026-07-28"
            cart_id, sku = await cart_with_first_product(client, quantity=2)
            viewed = await client.call_tool("cart_view", {"cart_id": cart_id})
            assert viewed.structured_content is not None
            assert [(i["sku"], i["quantity"]) for i in viewed.structured_content["items"]] == [(sku, 2)]
    assert token not in log_path.read_text(), "mcp-remote logged the bearer token"
