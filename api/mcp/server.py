"""Build the SDK's ``MCPServer`` with Coatcheck's auth, request-state protection and tools."""

from datetime import timedelta
from typing import Literal, cast

from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer, RequestStateSecurity

from api.auth import JwtVerifier
from api.mcp import sdk_hooks
from api.mcp.capabilities import AdvertisedCapabilities
from api.mcp.cursors import CursorSigner
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


def build_mcp_server(
    settings: Settings, database: Database, verifier: JwtVerifier, connections: Connections
) -> MCPServer:
    """The production MCP server: every tool, auth required, requestState sealed under the shared ring."""
    advertised = AdvertisedCapabilities()
    mcp = MCPServer(
        SERVER_NAME,
        version=SERVER_VERSION,
        instructions=INSTRUCTIONS,
        token_verifier=verifier,
        auth=AuthSettings(
            issuer_url=settings.oidc_issuer,  # type: ignore[arg-type]  # pydantic coerces the str
            resource_server_url=settings.mcp_resource_url,  # type: ignore[arg-type]
            # The verifier checks the audience itself (with RFC 8707 case rules), so the SDK need not.
            validate_token_resource=False,
        ),
        request_state_security=RequestStateSecurity(
            keys=settings.state_key_ring, ttl=float(settings.request_state_ttl_seconds)
        ),
        log_level=cast(LogLevel, settings.log_level.upper()),
        middleware=[advertised],
    )
    advertised.bind(mcp)
    sdk_hooks.install(mcp)  # skip the SDK's no-op spans and empty Mcp-Param checks (api/mcp/sdk_hooks.py)
    cursors = CursorSigner(settings.state_key_ring)
    register_cart_tools(
        mcp,
        database,
        cursors=cursors,
        max_cart_lines=settings.max_cart_lines,
        max_open_carts=settings.max_open_carts,
        idempotency_key_ttl=timedelta(seconds=settings.idempotency_key_ttl_seconds),
    )
    register_order_tools(mcp, database, cursors=cursors)
    register_connection_tools(mcp, connections)
    return mcp
