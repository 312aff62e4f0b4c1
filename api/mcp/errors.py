"""The one place where store and provider errors become tool errors the model can act on.

Every tool is wrapped in :func:`tool_errors`. The text names what to do next and echoes at most
the handle the caller sent. A foreign handle and a made-up one produce the same text, and nothing
from the database, the driver, a provider's response body or a stack trace ever reaches the caller:
the SDK replaces any unanticipated exception with a generic "Error executing tool <name>".

A provider error's text depends on which provider and what the tool was doing with it (renewing
the access, reading the profile, revoking), which the exception itself does not know. So tools
name that step with :func:`provider_step` around the call; the translation still happens here.

Tools raise ``ToolError`` themselves only for verdicts of their own (an expired connect link, a
spent confirmation), and ``MCPError`` only where the protocol prescribes a JSON-RPC error code.

A database outage (:class:`~store.errors.Unavailable`) says "retry in a moment" and what can have happened:
nothing, or, when the connection died with a write in flight, that the change may or may not have been
saved, followed by why retrying *this* tool is safe (:data:`RETRY_SAFE`). The store has logged it once.
"""

import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import Literal, ParamSpec, TypeVar

from mcp.server.mcpserver.exceptions import ToolError

from api.oauth.client import OAuthFailure
from api.oauth.providers import ProviderUnavailable
from api.provider_config import ProviderConfig
from store.errors import Conflict, DecryptError, InvalidInput, NotFound, Unavailable

logger = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

Step = Literal["renew", "profile", "disconnect"]
"""What a tool was doing with a provider when it failed: renewing the access, reading the profile, revoking."""

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


class ProviderStepFailed(Exception):  # noqa: N818 - a verdict, like store.errors
    """``cause`` was raised while a tool was at ``step`` with ``provider``; :func:`tool_errors` words it."""

    def __init__(self, provider: ProviderConfig, step: Step, cause: Exception) -> None:
        super().__init__(step)
        self.provider = provider
        self.step = step
        self.cause = cause


@contextmanager
def provider_step(provider: ProviderConfig, step: Step) -> Iterator[None]:
    """Tag provider and vault errors raised inside the block with the provider and the step."""
    try:
        yield
    except DecryptError as exc:
        raise ProviderStepFailed(provider, step, exc) from exc
    except OAuthFailure as exc:
        # A failed revocation is reported in the result (upstream_revocation), never raised as this.
        if step == "disconnect":
            raise
        raise ProviderStepFailed(provider, step, exc) from exc


def _provider_text(failed: ProviderStepFailed) -> str:
    label, cause = failed.provider.label, failed.cause
    if isinstance(cause, DecryptError):
        # A key-ring problem on the server: the operator must see it, the caller gets what to do.
        logger.error("stored %s tokens do not open with TOKEN_ENCRYPTION_KEYS", failed.provider.name)
        if failed.step == "disconnect":
            return (
                f"The stored {label} credentials cannot be read, so they were not revoked; "
                "check the server's TOKEN_ENCRYPTION_KEYS."
            )
        return f"The stored {label} credentials cannot be read; use connection_disconnect and connect again."
    error = cause.error if isinstance(cause, OAuthFailure) else "failed"
    if failed.step == "profile":
        return f"{label} did not return your profile ({error}); try again later."
    if error == "refresh_in_progress":
        return (
            f"Another request is still renewing the {label} access ({label} is slow to answer); "
            "try again in a few seconds."
        )
    return f"Refreshing the {label} access failed ({error}); try again later."


def _sentence(exc: Exception) -> str:
    text = str(exc)
    return text[:1].upper() + text[1:] + "."


READS_ONLY = "this tool only reads, so nothing was changed: retry in a moment"
RETRY_SAFE = {
    "cart_create": "retrying with the same idempotency_key is safe: it returns the cart the first attempt "
    "created, if it did (without a key a retry may create a second cart: look at cart_list first)",
    "cart_set_item": "retrying is safe: cart_set_item sets an absolute quantity, so a repeat has the effect "
    "of one call (with expected_version, a saved first attempt makes the retry a version conflict: "
    "cart_view shows the cart)",
    "cart_delete": "retrying is safe: a repeat deletes the cart if it is still there, and deleted: false "
    "means the first attempt removed it",
    "cart_checkout": "retrying the same call (the same requestState and answer) is safe: one confirmation "
    "places at most one order, and the retry returns that order if the first attempt placed it",
    "connection_whoami": "retrying is safe: the retry reads your connection afresh (and offers a new connect "
    "link if one is needed)",
    "connection_disconnect": "retrying is safe: a repeat removes the tokens if they are still there "
    "(was_connected: false means the first attempt removed them)",
}
"""Why retrying each writing tool is safe after an outage that left its change in doubt."""
_READ_ONLY_TOOLS = frozenset(
    {"catalog_search", "cart_view", "cart_list", "order_view", "order_list", "connection_list"}
)


def unavailable_text(exc: Unavailable, tool: str | None) -> str:
    """The tool error for a database outage during ``tool``: the promise, then why a retry is safe."""
    if not exc.outcome_unknown:
        return _sentence(exc)
    if tool in _READ_ONLY_TOOLS:
        what = (
            "The database stopped answering" if exc.cause == "no_answer" else "The connection to the database was lost"
        )
        return f"{what} (a failover or restart may be under way); {READS_ONLY}."
    reason = RETRY_SAFE.get(tool or "", "look at the current state before repeating the change")
    return f"{_sentence(exc)} {reason[:1].upper()}{reason[1:]}."


Anticipated = NotFound | Conflict | InvalidInput | Unavailable | ProviderUnavailable | ProviderStepFailed
"""The exceptions a tool may raise that become tool errors; anything else is the SDK's generic error."""
_ANTICIPATED = (NotFound, Conflict, InvalidInput, Unavailable, ProviderUnavailable, ProviderStepFailed)


def as_tool_error(exc: Anticipated, *, tool: str | None = None) -> ToolError:
    """The tool error an anticipated ``exc`` raised by ``tool`` stands for."""
    if isinstance(exc, Unavailable):
        return ToolError(unavailable_text(exc, tool))
    if isinstance(exc, NotFound):
        return ToolError(not_found_text(exc.kind, exc.handle))
    if isinstance(exc, ProviderUnavailable):
        return ToolError(f"{exc}; try again later.")
    if isinstance(exc, ProviderStepFailed):
        return ToolError(_provider_text(exc))
    return ToolError(_sentence(exc))


def tool_errors(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Translate anticipated store and provider errors raised by a tool into :class:`ToolError`."""

    tool = fn.__name__  # every tool is registered under its function's name

    @wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except _ANTICIPATED as exc:
            raise as_tool_error(exc, tool=tool) from None

    return wrapper
