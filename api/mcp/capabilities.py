"""Advertise only what the server has: no ``prompts`` or ``resources`` capability while none are registered.

``MCPServer`` always installs prompt and resource handlers, and the SDK derives the advertised capabilities
from installed handlers, so ``server/discover`` and ``initialize`` would announce prompts and resources (with
``subscribe``) that Coatcheck does not have. This middleware, on the SDK's public ``middleware`` seam, checks
what is actually registered at call time: with nothing registered, the capability is left out of both
answers and its methods get ``-32601 Method not found``, as for any method a server does not serve. A server
that registers prompts or resources (the conformance fixtures do) advertises them as before.
"""

from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import METHOD_NOT_FOUND

_CAPABILITY_ANSWERS = frozenset({"initialize", "server/discover"})
_PROMPT_METHODS = frozenset({"prompts/list", "prompts/get"})
_RESOURCE_METHODS = frozenset(
    {"resources/list", "resources/templates/list", "resources/read", "resources/subscribe", "resources/unsubscribe"}
)


class AdvertisedCapabilities:
    """Server middleware that hides the prompt and resource capabilities of ``server`` while it has none.

    Bind it to the server it is installed on with :meth:`bind` (the server is built with its middleware).
    """

    def __init__(self) -> None:
        self._server: MCPServer | None = None

    def bind(self, server: MCPServer) -> None:
        """The server whose registered prompts and resources decide what is advertised."""
        self._server = server

    async def _absent(self) -> set[str]:
        if self._server is None:
            return set()
        absent = set()
        if not await self._server.list_prompts():
            absent.add("prompts")
        if not await self._server.list_resources() and not await self._server.list_resource_templates():
            absent.add("resources")
        return absent

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        method = ctx.method
        if method in _PROMPT_METHODS or method in _RESOURCE_METHODS:
            kind = "prompts" if method in _PROMPT_METHODS else "resources"
            if kind in await self._absent():
                raise MCPError(code=METHOD_NOT_FOUND, message="Method not found", data=method)
            return await call_next(ctx)
        result = await call_next(ctx)
        if method not in _CAPABILITY_ANSWERS or not isinstance(result, dict):
            return result
        capabilities = result.get("capabilities")
        absent = await self._absent()
        if not isinstance(capabilities, dict) or not absent.intersection(capabilities):
            return result
        return {**result, "capabilities": {k: v for k, v in capabilities.items() if k not in absent}}
