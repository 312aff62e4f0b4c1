"""Build the SDK's ``MCPServer`` with Coatcheck's auth, request-state protection and tools."""

from datetime import timedelta
from typing import Literal, NamedTuple, cast

from mcp.server.auth.provider import TokenVerifier
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer, RequestStateSecurity

from api.mcp import sdk_hooks
from api.mcp.capabilities import AdvertisedCapabilities
from api.mcp.cursors import CursorSigner
from api.mcp.lifespan import ToolDeps, lifespan_yielding
from api.mcp.tools_carts import register_cart_tools
from api.mcp.tools_connections import register_connection_tools
from api.mcp.tools_orders import register_order_tools
from api.oauth.service import Connections
from api.settings import Settings
from store.db import Database

SERVER_NAME = "coatcheck"
SERVER_VERSION = "0.1.0"
INSTRUCTIONS = (
    "Coatcheck keeps carts, orders and connected third-party accounts for the signed-in user. Tools return "
    "handles (cart_…, ord_…); pass a handle back as an argument on later calls. Handles are private to the "
    "user. cart_checkout asks the user to confirm before ordering; connection_whoami may ask the user to open "
    "a link to connect an account; the credentials stay on the server."
)

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


class BuiltServer(NamedTuple):
    """The production MCP server and the names of its tools that only use the store."""

    mcp: MCPServer[ToolDeps]
    store_tools: frozenset[str]
    """Tools that send no notification and wait on nothing but the database: they can be answered inline
    (:mod:`api.mcp.lanes`). The connection tools wait on providers and are not among them."""


def build_mcp_server(
    settings: Settings, database: Database, verifier: TokenVerifier, connections: Connections
) -> BuiltServer:
    """The production MCP server: every tool, auth required, requestState sealed under the shared ring.

    The tools reach ``database``, the cursor signer and ``connections`` through the server's lifespan.
    """
    tool_deps = ToolDeps(
        database=database,
        cursors=CursorSigner(settings.state_key_ring),
        connections=connections,
        max_cart_lines=settings.max_cart_lines,
        max_open_carts=settings.max_open_carts,
        idempotency_key_ttl=timedelta(seconds=settings.idempotency_key_ttl_seconds),
    )
    advertised = AdvertisedCapabilities()
    mcp: MCPServer[ToolDeps] = MCPServer(
        SERVER_NAME,
        version=SERVER_VERSION,
        instructions=INSTRUCTIONS,
        token_verifier=verifier,
        auth=AuthSettings(
            issuer_url=settings.authorization_server_url,  # type: ignore[arg-type]  # pydantic coerces the str
            resource_server_url=settings.mcp_resource_url,  # type: ignore[arg-type]
            # The verifier checks the audience itself (with RFC 8707 case rules), so the SDK need not.
            validate_token_resource=False,
        ),
        request_state_security=RequestStateSecurity(
            keys=settings.state_key_ring, ttl=float(settings.request_state_ttl_seconds)
        ),
        log_level=cast(LogLevel, settings.log_level.upper()),
        middleware=[advertised],
        lifespan=lifespan_yielding(tool_deps),
    )
    advertised.bind(mcp)
    sdk_hooks.install(mcp)  # skip the SDK's no-op spans and empty Mcp-Param checks (api/mcp/sdk_hooks.py)
    cart_tools = register_cart_tools(
        mcp,
        max_cart_lines=tool_deps.max_cart_lines,
        max_open_carts=tool_deps.max_open_carts,
        idempotency_key_ttl=tool_deps.idempotency_key_ttl,
    )
    order_tools = register_order_tools(mcp)
    register_connection_tools(mcp)
    return BuiltServer(mcp, cart_tools | order_tools)
