"""What every multi-round tool checks before it asks the user anything (MCP 2026-07-28 MRTR).

The SDK capability-checks only ``Resolve``-driven questions; a hand-rolled ``InputRequiredResult``
is sent as is. So a tool that builds one calls :func:`require_input_rounds` first:

* a 2025-11-25 request cannot receive ``input_required`` (the SDK would answer -32603) and the
  stateless legacy leg has no channel for a pushed ``elicitation/create``: a tool error it can show;
* a 2026-07-28 client that did not declare the elicitation mode gets -32021 with the capability it
  lacks, as the spec requires ("Servers MUST NOT send an inputRequests the client has not declared").

It also holds the base of the plaintext ``requestState`` models (the SDK has already verified the seal).
"""

from typing import Any, Literal, Self

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from mcp.types import (
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    ClientCapabilities,
    ElicitationCapability,
    FormElicitationCapability,
    MissingRequiredClientCapabilityErrorData,
    UrlElicitationCapability,
)
from mcp.types.version import is_version_at_least
from pydantic import BaseModel, ConfigDict, ValidationError

MULTI_ROUND_TRIP_VERSION = "2026-07-28"


def require_input_rounds(
    ctx: Context[Any, Any], mode: Literal["form", "url"], *, tool: str, needs: str, nothing_done: str
) -> None:
    """Refuse a client that cannot be asked anything in ``mode``: first the protocol version, then the capability.

    ``needs`` completes "``tool`` needs an MCP client that speaks protocol 2026-07-28 (``needs``)";
    ``nothing_done`` tells the user what the refused call left as it was.

    Raises:
        ToolError: the client speaks a protocol older than 2026-07-28.
        MCPError: -32021, the client did not declare elicitation in ``mode``.
    """
    _require_multi_round_trip(ctx, tool=tool, needs=needs, nothing_done=nothing_done)
    _require_elicitation(ctx, mode, tool=tool)


def _require_multi_round_trip(ctx: Context[Any, Any], *, tool: str, needs: str, nothing_done: str) -> None:
    version = ctx.protocol_version
    if version is None or not is_version_at_least(version, MULTI_ROUND_TRIP_VERSION):
        raise ToolError(
            f"{tool} needs an MCP client that speaks protocol {MULTI_ROUND_TRIP_VERSION} ({needs}); this client "
            f"speaks {version or 'an older one'}. Update the client and try again. {nothing_done}"
        )


def _require_elicitation(ctx: Context[Any, Any], mode: Literal["form", "url"], *, tool: str) -> None:
    # A bare ``elicitation: {}`` declares form mode only; URL mode must be named.
    capabilities = ctx.client_capabilities
    elicitation = capabilities.elicitation if capabilities is not None else None
    if elicitation is not None:
        if mode == "url" and elicitation.url is not None:
            return
        if mode == "form" and (elicitation.form is not None or elicitation.url is None):
            return
    wanted = (
        ElicitationCapability(url=UrlElicitationCapability())
        if mode == "url"
        else ElicitationCapability(form=FormElicitationCapability())
    )
    raise MCPError(
        code=MISSING_REQUIRED_CLIENT_CAPABILITY,
        message=f"Client did not declare the {mode} elicitation capability required by {tool}",
        data=MissingRequiredClientCapabilityErrorData(
            required_capabilities=ClientCapabilities(elicitation=wanted)
        ).model_dump(by_alias=True, mode="json", exclude_none=True),
    )


class RequestState(BaseModel):
    """A tool's plaintext ``requestState``: the SDK seals it on the way out and verifies the echo.

    The seal proves this server minted it for this caller, tool and arguments, but a state minted by an
    older or newer server version may have another shape, so it is still validated, strictly (no
    coercion: ``"1"`` is not a number, ``true`` is not 1). Subclasses name their ``kind``.
    """

    model_config = ConfigDict(strict=True, frozen=True)

    def dump(self) -> str:
        """The compact JSON the SDK seals into the wire ``requestState``."""
        return self.model_dump_json()

    @classmethod
    def load(cls, raw: str | None) -> Self | None:
        """The state in ``raw`` if it has this shape and kind; ``None`` means start over."""
        if not raw:
            return None
        try:
            return cls.model_validate_json(raw)
        except ValidationError:
            return None
