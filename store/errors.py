"""Errors the store raises; `api/` turns them into protocol or HTTP answers.

Messages are written for the person or model calling a tool: they say what to do
next and never contain SQL, driver text, or another principal's data.
"""


class StoreError(Exception):
    """Base class for anticipated store failures."""


class NotFound(StoreError):  # noqa: N818 - reads as a verdict, like the HTTP status
    """The handle names nothing this principal owns (unknown and foreign look the same)."""

    def __init__(self, kind: str, handle: str) -> None:
        self.kind = kind
        self.handle = handle
        super().__init__(f"{kind} {handle!r} not found")


class Conflict(StoreError):  # noqa: N818
    """The request cannot be applied to the current state (version mismatch, closed cart, ...)."""


class InvalidInput(StoreError):  # noqa: N818
    """An argument is well-formed but refers to something unusable (unknown sku, bad quantity)."""


class DecryptError(StoreError):
    """A stored secret did not open: unknown key, tampered, or bound to another row.

    The message is a reason code; it never contains key material or plaintext.
    """


class InvalidGrant(StoreError):  # noqa: N818 - the OAuth error code it stands for
    """The provider refused a refresh token (OAuth ``invalid_grant``): the user must connect again."""


class Unavailable(StoreError):  # noqa: N818
    """The database could not serve the call in time (pool exhausted, statement or lock timeout); retry later.

    Nothing was written: the statement or transaction that timed out was rolled back.
    """
