"""Connection tools: third-party accounts connected through URL-mode elicitation, tokens kept server-side.

``connection_whoami(provider)`` with no usable token answers ``input_required`` with one URL-mode
elicitation pointing at ``<PUBLIC_URL>/connect/<flow>`` and a plaintext ``requestState`` naming the flow
(the SDK seals it and binds it to the caller, this tool and its arguments). The user's ``accept`` only
means "I agreed to open the link": the retry reads the flow from the store (waiting up to
``CONNECT_WAIT_SECONDS`` for it to settle) and answers with the profile, asks again with the same link,
or ends with a tool error that says how to start over. Tokens never reach the client.
"""

import logging
from typing import Annotated, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import (
    CallToolResult,
    ElicitRequest,
    ElicitRequestURLParams,
    ElicitResult,
    InputRequiredResult,
    ToolAnnotations,
)
from pydantic import Field

from api.auth import current_principal
from api.mcp.annotations import READ_ONLY
from api.mcp.arguments import NO_CONTROL_CHARACTERS
from api.mcp.errors import provider_step, tool_errors
from api.mcp.lifespan import ToolContext, ToolDeps, deps
from api.mcp.results import compact
from api.mcp.rounds import RequestState, require_input_rounds
from api.mcp.schemas import ConnectionListOut, ConnectionOut, DisconnectOut, WhoamiOut
from api.oauth.client import Unauthorized
from api.oauth.service import Connections
from api.provider_config import ProviderConfig
from store.flows import Flow

logger = logging.getLogger(__name__)


ProviderName = Annotated[
    str,
    Field(
        description="A configured provider name, as listed by connection_list (e.g. 'demo')",
        max_length=64,
        pattern=NO_CONTROL_CHARACTERS,
    ),
]


class ConnectState(RequestState):
    """The plaintext requestState of a connect round: which flow the user was sent to."""

    kind: Literal["connect.v1"]
    provider: str
    flow: str = Field(min_length=1, max_length=100)


def input_key(provider: str) -> str:
    return f"connect_{provider}"


def _ask_to_connect(
    connections: Connections, provider: ProviderConfig, flow: Flow, *, again: bool
) -> InputRequiredResult:
    label = provider.label
    if again:
        message = (
            f"Still waiting for you to finish connecting your {label} account in the browser. If you closed "
            f"the page, open the link again; it is the same link as before."
        )
    else:
        message = (
            f"Connect your {label} account to Coatcheck: open this link, sign in, and allow access. "
            f"Coatcheck keeps the {label} credentials itself; they are never shown to the assistant."
        )
    return InputRequiredResult(
        input_requests={
            input_key(provider.name): ElicitRequest(
                params=ElicitRequestURLParams(message=message, url=connections.connect_url(flow))
            )
        },
        # Plaintext; the SDK's RequestStateBoundary seals it and binds it to the caller and arguments.
        request_state=ConnectState(kind="connect.v1", provider=provider.name, flow=flow.handle).dump(),
    )


def _settled_error(provider: ProviderConfig, flow: Flow | None) -> ToolError:
    label = provider.label
    again = "Call connection_whoami again to get a fresh link."
    if flow is None or flow.status == "expired":
        return ToolError(f"The link to connect {label} expired before the sign-in was finished. {again}")
    if flow.status == "denied":
        return ToolError(f"{label} reported that access was not granted, so nothing was connected. {again}")
    if flow.error == "cancelled":
        return ToolError(f"Connection cancelled: the link to connect {label} was withdrawn. {again}")
    return ToolError(f"Connecting {label} did not complete ({flow.error or 'failed'}). {again}")


def _configured(connections: Connections, name: str) -> ProviderConfig:
    provider = connections.registry.get(name)
    if provider is None:
        raise ToolError(connections.registry.unknown_text(name))
    return provider


@tool_errors
async def connection_list(ctx: ToolContext) -> Annotated[CallToolResult, ConnectionListOut]:
    """Every configured provider with the caller's connection to it."""
    connections, principal = deps(ctx).connections, current_principal()
    rows = {info.provider: info for info in await connections.list(principal)}
    out = []
    for provider in connections.registry.providers:
        info = rows.get(provider.name)
        if info is None:
            out.append(
                ConnectionOut(
                    provider=provider.name, status="not_connected", scopes=[], connected_at=None, expires_at=None
                )
            )
        else:
            out.append(
                ConnectionOut(
                    provider=provider.name,
                    status=info.status,
                    scopes=list(info.scopes),
                    connected_at=info.connected_at,
                    expires_at=info.expires_at,
                )
            )
    return compact(ConnectionListOut(connections=out))


@tool_errors
async def connection_whoami(
    provider: ProviderName, ctx: ToolContext
) -> Annotated[CallToolResult, WhoamiOut] | InputRequiredResult:
    """The caller's profile at ``provider``, or a connect link when there is no usable token."""
    connections = deps(ctx).connections
    config = _configured(connections, provider)
    principal = current_principal()
    state = ConnectState.load(ctx.request_state)
    if state is not None and state.provider != config.name:
        state = None
    if state is not None:
        # A retry after the user saw the link. Their answer is consent to open it, not completion:
        # only the store says whether the browser side finished.
        answer = (ctx.input_responses or {}).get(input_key(config.name))
        if isinstance(answer, ElicitResult) and answer.action in ("decline", "cancel"):
            await connections.cancel_flow(principal, state.flow)
            raise ToolError(
                f"Connection cancelled: you chose not to open the link to connect {config.label}. "
                "Call connection_whoami again if you change your mind."
            )
        flow = await connections.wait(principal, state.flow, connections.wait_seconds)
        if flow is not None and flow.status == "pending":
            return _ask_to_connect(connections, config, flow, again=True)
        if flow is None or flow.status != "connected":
            raise _settled_error(config, flow)
    with provider_step(config, "renew"):
        tokens = await connections.usable_tokens(principal, config)
    if tokens is not None:
        try:
            with provider_step(config, "profile"):
                profile = await connections.profile(config, tokens)
        except Unauthorized:
            # The provider no longer honours the token: connect again rather than fail forever.
            await connections.mark_needs_reauth(principal, config, "token_rejected")
        else:
            return compact(WhoamiOut(provider=config.name, profile=profile))
    require_input_rounds(
        ctx,
        "url",
        tool="connection_whoami",
        needs="URL-mode elicitation, to send you to a web page to connect the account",
        nothing_done="Nothing was connected.",
    )
    flow = await connections.flow_for(principal, config)
    logger.info("connection to %s requested; sending a connect link", config.name)
    return _ask_to_connect(connections, config, flow, again=False)


@tool_errors
async def connection_disconnect(ctx: ToolContext, provider: ProviderName) -> Annotated[CallToolResult, DisconnectOut]:
    """Revoke (where the provider can) and forget the caller's tokens for ``provider``."""
    connections = deps(ctx).connections
    config = _configured(connections, provider)
    principal = current_principal()
    with provider_step(config, "disconnect"):
        outcome = await connections.disconnect(principal, config)
    return compact(
        DisconnectOut(provider=config.name, was_connected=outcome.was_connected, upstream_revocation=outcome.revocation)
    )


def register_connection_tools(mcp: MCPServer[ToolDeps]) -> None:
    """Register ``connection_list``, ``connection_whoami`` and ``connection_disconnect`` on ``mcp``."""
    mcp.add_tool(
        connection_list,
        name="connection_list",
        description="List the third-party providers you can connect (for example 'demo') and your connection "
        "to each: status connected / needs_reauth / not_connected, granted scopes, when it was connected and "
        "when the current access token expires. Tokens are kept by the server and never shown.",
        annotations=READ_ONLY,
    )
    mcp.add_tool(
        connection_whoami,
        name="connection_whoami",
        description="Show your profile at a connected provider (fetched by the server with the stored token, "
        "refreshed when needed). If the account is not connected yet, you are given a link to open in your "
        "browser: sign in there and allow access, then this call completes. Needs an MCP 2026-07-28 client "
        "with URL elicitation to connect.",
        annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=True),
    )
    mcp.add_tool(
        connection_disconnect,
        name="connection_disconnect",
        description="Disconnect a provider: the server revokes its tokens at the provider (when the provider "
        "supports revocation) and forgets them. Safe to repeat.",
        annotations=ToolAnnotations(
            read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=True
        ),
    )
