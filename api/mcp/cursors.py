"""Opaque list cursors, bound to the principal and the list they page.

A cursor carries the position where a page ended (``store.paging.Position``: the last row's timestamp
and handle, both already shown to the caller) plus a 128-bit HMAC-SHA256 tag over that position, the
list's name and the caller's ``(issuer, subject)``. The key is derived from each ``REQUEST_STATE_KEYS``
secret by :func:`store.crypto.derive_key` under its own info string (so it is not the requestState key);
the first key tags, every key verifies, so rotating the ring keeps cursors valid on every instance.

A cursor from another user, for another list, tampered with, or not a cursor at all fails the same
check and is refused with the same tool error: it never pages through anybody's data but the caller's.
(The store query is scoped to the caller anyway; the tag makes the refusal explicit.)
"""

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from mcp.server.mcpserver.exceptions import ToolError

from store.crypto import derive_key
from store.paging import Position
from store.principal import Principal

_KDF_INFO = b"coatcheck list cursor v1"
_TAG_BYTES = 16
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _b64u(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _b64u_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def refused_cursor(tool: str) -> ToolError:
    """The one error for any cursor this server did not issue to this caller for ``tool``."""
    return ToolError(
        f"This cursor was not issued to you by {tool} (it belongs to another user or list, or is damaged); "
        f"call {tool} without a cursor to start from the newest."
    )


class CursorSigner:
    """Seals and opens list cursors under a key ring (newest first)."""

    def __init__(self, ring: Sequence[bytes]) -> None:
        if not ring:
            raise ValueError("a cursor key ring needs at least one key")
        self._keys = [derive_key(key, _KDF_INFO) for key in ring]

    def __repr__(self) -> str:
        return f"CursorSigner(<{len(self._keys)} keys>)"

    @staticmethod
    def _tag(key: bytes, tool: str, principal: Principal, payload: bytes) -> bytes:
        bound = json.dumps([tool, principal.issuer, principal.subject], separators=(",", ":")).encode() + b"\n"
        return hmac.new(key, bound + payload, hashlib.sha256).digest()[:_TAG_BYTES]

    def seal(self, tool: str, principal: Principal, position: Position) -> str:
        """The cursor for the page after ``position`` of ``tool``'s list, for ``principal`` only."""
        micros = (position.at - _EPOCH) // _MICROSECOND
        payload = f"{micros}.{position.handle}".encode()
        return f"{_b64u(payload)}.{_b64u(self._tag(self._keys[0], tool, principal, payload))}"

    def open(self, tool: str, principal: Principal, cursor: str) -> Position:
        """The position a cursor names.

        Raises:
            ToolError: the cursor was not issued by ``tool`` to ``principal`` under a current key.
        """
        body, _, tag_text = cursor.partition(".")
        try:
            payload, tag = _b64u_decode(body), _b64u_decode(tag_text)
        except (binascii.Error, ValueError):
            raise refused_cursor(tool) from None
        if len(tag) != _TAG_BYTES or not any(
            hmac.compare_digest(tag, self._tag(key, tool, principal, payload)) for key in self._keys
        ):
            raise refused_cursor(tool)
        micros, _, handle = payload.decode().partition(".")
        return Position(at=_EPOCH + int(micros) * _MICROSECOND, handle=handle)
