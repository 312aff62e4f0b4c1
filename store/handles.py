"""Opaque, prefixed, URL-safe handles with 192 bits of randomness.

A handle names a row; it authorises nothing. The principal does.
"""

import re
import secrets

_RANDOM_BYTES = 24  # 192 bits; token_urlsafe encodes 24 bytes as exactly 32 characters
_BODY = re.compile(r"[A-Za-z0-9_-]{32}")


def new_handle(prefix: str) -> str:
    """Mint a fresh handle such as ``cart_3q2…``."""
    return f"{prefix}_{secrets.token_urlsafe(_RANDOM_BYTES)}"


def is_well_formed(handle: str, prefix: str) -> bool:
    """Tell whether ``handle`` could have been minted by :func:`new_handle` with ``prefix``.

    Malformed handles are rejected before any query, with the same outcome as an
    unknown one.
    """
    head, sep, body = handle.partition("_")
    return sep == "_" and head == prefix and _BODY.fullmatch(body) is not None
