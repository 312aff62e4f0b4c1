"""Store errors become short tool errors the model can act on.

The text names what to do next and echoes at most the handle the caller sent.
A foreign handle and a made-up one produce the same text, and nothing from the
database, the driver, or a stack trace ever reaches the caller: the SDK replaces
any unanticipated exception with a generic "Error executing tool <name>".
"""

from collections.abc import Awaitable, Callable
from functools import wraps
from typing import ParamSpec, TypeVar

from mcp.server.mcpserver.exceptions import ToolError

from store.errors import Conflict, InvalidInput, NotFound, Unavailable

P = ParamSpec("P")
R = TypeVar("R")

_HINTS = {
    "cart": "use cart_list to see your carts, or cart_create to start a new one",
    "order": "use order_list to see your orders",
}
_MAX_ECHO = 80


def not_found_text(kind: str, handle: str) -> str:
    """The one message for an unknown, malformed, or foreign handle."""
    shown = handle if len(handle) <= _MAX_ECHO else handle[:_MAX_ECHO] + "…"
    hint = _HINTS.get(kind, "check the id")
    return f"No {kind} with id {shown!r} exists for you; {hint}."


def tool_errors(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Translate anticipated store errors raised by a tool into :class:`ToolError`."""

    @wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except NotFound as exc:
            raise ToolError(not_found_text(exc.kind, exc.handle)) from None
        except (Conflict, InvalidInput, Unavailable) as exc:
            text = str(exc)
            raise ToolError(text[:1].upper() + text[1:] + ".") from None

    return wrapper
