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
    """The database could not serve the call right now; the same call may be retried in a moment.

    ``cause`` is a word from :data:`UNAVAILABLE_CAUSES` (for logs and metrics). ``outcome_unknown`` tells the
    two promises apart: ``False`` means nothing was written (the pool was exhausted, a timeout rolled the
    statement back, no connection could be opened, the server was read-only, or a transaction died before
    its COMMIT); ``True`` means the connection died while a statement that commits on its own was in
    flight, so its change may or may not have been saved, and only a retry that is safe to repeat is safe.
    """

    def __init__(self, message: str, *, cause: str, outcome_unknown: bool = False) -> None:
        super().__init__(message)
        self.cause = cause
        self.outcome_unknown = outcome_unknown


UNAVAILABLE_CAUSES = (
    "pool_timeout",
    "statement_timeout",
    "lock_timeout",
    "refused",
    "connect_failed",
    "no_writable_host",
    "read_only",
    "connection_lost",
    "no_answer",
)
"""Why the database was unavailable: the closed set of :attr:`Unavailable.cause` values.

``pool_timeout``: every pooled connection was busy. ``statement_timeout``/``lock_timeout``: the server
cancelled the statement. ``refused``: the server refused a new connection (too many clients, starting up).
``connect_failed``: no connection could be opened (refused, cut, or no answer within the connect timeout).
``no_writable_host``: every host of a multi-host URL is a standby (``target_session_attrs``). ``read_only``:
the server is a standby or read-only (SQLSTATE 25006). ``connection_lost``: the connection died or the
server ended the session (57P01, 57P02, class 08) with work in progress. ``no_answer``: the server stopped
answering a statement within the client-side bound (``command_timeout``).
"""
