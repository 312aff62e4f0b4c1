"""How a database failure becomes :class:`~store.errors.Unavailable`, and which failures retire a connection.

A failover, a restart or a frozen server shows up in many shapes: a pool timeout, a refused or cut connect,
asyncpg's ``TargetServerAttributeNotMatched`` (no host of a multi-host URL is writable), SQLSTATE 25006 from a
primary that came back as a standby, 57P01/57P02/class 08 when the server ends the session, a socket that
dies with a statement in flight, or no answer within the client-side ``command_timeout``. Each becomes one
:class:`Unavailable` whose text makes the right promise:

* **nothing was changed** where nothing can have committed: the failure came before the unit of work had a
  connection, the statement was refused or cancelled by the server, or the connection died inside an
  explicit transaction before its COMMIT (PostgreSQL rolls it back);
* **the change may or may not have been saved** where a statement that commits on its own (autocommit) or
  a COMMIT was in flight when the connection died: the server may have committed it and lost only the reply.

:func:`mark_failover_disconnects` makes SQLAlchemy treat the failover shapes as disconnects, so the connection
is dropped instead of going back to the pool, and every pooled connection opened before it is replaced at
its next checkout (a switchover leaves all of them on the old primary). The translation runs only on the
error path: a call that succeeds pays nothing for it.
"""

import logging
import socket
from collections.abc import Callable
from enum import Enum
from typing import Any

from asyncpg.exceptions import (  # type: ignore[import-untyped]
    InterfaceError,
    InternalClientError,
    PostgresError,
    TargetServerAttributeNotMatched,
)
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from store.errors import Unavailable

logger = logging.getLogger("store.db")

# SQLSTATEs after which nothing was written and the same call may simply be retried.
_TIMED_OUT = {"57014": "statement_timeout", "55P03": "lock_timeout"}
_REFUSED = {"53300": "too many clients", "57P03": "not accepting connections yet"}
READ_ONLY = "25006"
# The server ended the session: terminated (57P01, also a fast shutdown), crashed (57P02), or any
# connection exception (class 08). Like a closed socket, the connection is gone.
_SESSION_ENDED = frozenset({"57P01", "57P02"})

#: The exceptions a unit of work translates (anything else is a bug and propagates): SQLAlchemy's, and the
#: driver's own, which escape unwrapped from connecting and from the statements sent on the raw connection
#: (the explicit transaction's BEGIN/COMMIT and the hot statements of :mod:`store.compiled`).
DATABASE_ERRORS: tuple[type[BaseException], ...] = (
    PoolTimeoutError,
    DBAPIError,
    OSError,  # refused, reset, and TimeoutError (asyncpg's connect timeout and command_timeout)
    InterfaceError,  # "another operation is in progress", "connection is closed"
    InternalClientError,  # TargetServerAttributeNotMatched; "another operation is in progress"
    PostgresError,  # a server error (SQLSTATE) or lost connection (class 08) of a statement run on the driver
)


class Phase(Enum):
    """Where in a unit of work a failure happened, which decides what may have committed."""

    CONNECTING = "connecting"  # drawing a connection (and, behind a transaction pooler, sending BEGIN)
    RUNNING = "running"  # the block's statements
    ENDING = "ending"  # COMMIT (explicit transactions) or handing the connection back


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc``, SQLAlchemy's DBAPI-level exception and the driver's exception beneath it."""
    found = [exc]
    inner = getattr(exc, "orig", None)
    if isinstance(inner, BaseException):
        found.append(inner)
        if inner.__cause__ is not None:
            found.append(inner.__cause__)
    elif exc.__cause__ is not None:
        found.append(exc.__cause__)
    return found


def _sqlstate(chain: list[BaseException]) -> str:
    for exc in chain:
        state = getattr(exc, "sqlstate", None)
        if isinstance(state, str) and state:
            return state
    return ""


def _lost(chain: list[BaseException], sqlstate: str) -> bool:
    """Whether the connection is gone (or in an unknown state), whatever the server did with the statement."""
    if sqlstate in _SESSION_ENDED or sqlstate.startswith("08"):
        return True
    for exc in chain:
        if isinstance(exc, DBAPIError) and exc.connection_invalidated:
            return True
        # asyncpg's bare InterfaceError is a closed or busy connection; its subclasses (DataError for a bad
        # argument, unsupported features) are the caller's mistakes and stay errors.
        if isinstance(exc, OSError) or type(exc) is InterfaceError:
            return True
        if isinstance(exc, InternalClientError) and not isinstance(exc, TargetServerAttributeNotMatched):
            return True  # "cannot switch to state …; another operation is in progress": state unknown
    return False


def is_failover_disconnect(exc: BaseException) -> bool:
    """Whether a connection that raised ``exc`` must leave the pool: it reached a server that cannot take
    writes (25006), the server ended the session (57P01, 57P02, class 08), or it stopped answering within
    ``command_timeout`` (the connection then waits on a cancel that may never complete)."""
    chain = _chain(exc)
    sqlstate = _sqlstate(chain)
    if sqlstate == READ_ONLY:
        return True
    return _lost(chain, sqlstate)


def mark_failover_disconnects(context: ExceptionContext) -> None:
    """SQLAlchemy ``handle_error`` listener: count the failover shapes as disconnects.

    SQLAlchemy then invalidates the connection and, because ``invalidate_pool_on_disconnect`` stays true,
    every pooled connection opened before it; so recovery never depends on a proxy cutting sessions to a
    demoted primary. Only statements on a connection are marked (a failed connect has nothing to discard).
    """
    if context.is_disconnect or context.connection is None:
        return
    if is_failover_disconnect(context.original_exception):
        context.is_disconnect = True


_NOTHING = "nothing was changed, retry in a moment"
_MAYBE = "so the change may or may not have been saved; retry in a moment"


def translate(exc: BaseException, phase: Phase, *, commits_each_statement: bool) -> Unavailable | None:
    """The :class:`Unavailable` that ``exc``, raised at ``phase`` of a unit of work, stands for, or ``None``.

    ``commits_each_statement`` says whether the unit's statements commit on their own (autocommit), so a
    statement in flight when the connection died may have committed; in an explicit transaction only a
    COMMIT in flight may have.
    """
    if isinstance(exc, PoolTimeoutError):
        return Unavailable(f"the server is busy: every database connection is in use; {_NOTHING}", cause="pool_timeout")
    chain = _chain(exc)
    sqlstate = _sqlstate(chain)
    if sqlstate in _TIMED_OUT:
        return Unavailable(
            f"the database did not answer in time ({_TIMED_OUT[sqlstate]}); {_NOTHING}", cause=_TIMED_OUT[sqlstate]
        )
    if sqlstate in _REFUSED:
        # Only a new connection can be refused; with a fixed pool that is warm-up or a restart.
        return Unavailable(f"the database refused a connection ({_REFUSED[sqlstate]}); {_NOTHING}", cause="refused")
    if sqlstate == READ_ONLY:
        # The server refused the write: nothing of this statement (nor of its transaction) was written.
        return Unavailable(
            f"the database is read-only right now (a failover may be under way); {_NOTHING}", cause="read_only"
        )
    if any(isinstance(e, TargetServerAttributeNotMatched) for e in chain):
        return Unavailable(
            f"no database server is accepting writes right now (a failover may be under way); {_NOTHING}",
            cause="no_writable_host",
        )
    if not _lost(chain, sqlstate):
        return None
    timed_out = any(isinstance(e, TimeoutError) for e in chain)
    if phase is Phase.CONNECTING:
        reason = "did not answer a new connection in time" if timed_out else "cannot be reached right now"
        return Unavailable(
            f"the database {reason} (a failover or restart may be under way); {_NOTHING}",
            cause="connect_failed",
        )
    cause = "no_answer" if timed_out else "connection_lost"
    what = "stopped answering" if timed_out else "connection was lost"
    subject = f"the database {what}" if timed_out else f"the {what}"
    in_doubt = commits_each_statement or phase is Phase.ENDING
    if not in_doubt:
        return Unavailable(
            f"{subject} before the change was committed (a failover or restart may be under way); {_NOTHING}",
            cause=cause,
        )
    return Unavailable(
        f"{subject} while the change was being made (a failover or restart may be under way), {_MAYBE}",
        cause=cause,
        outcome_unknown=True,
    )


def describe(exc: BaseException) -> str:
    """The driver-level shape of ``exc`` for a log line: exception classes and SQLSTATE, never message text.

    Messages may carry host names, bound values or a DSN; the class and the SQLSTATE say what happened.
    """
    chain = _chain(exc)
    name = type(chain[-1]).__name__  # the driver's own exception: SQLAlchemy's wrappers say nothing more
    sqlstate = _sqlstate(chain)
    return f"{name} SQLSTATE {sqlstate}" if sqlstate else name


def report(unavailable: Unavailable, exc: BaseException, observer: Callable[[str], None] | None) -> None:
    """One WARNING line (no traceback, no message text) and the observer's count for one failed unit of work."""
    promise = "outcome unknown" if unavailable.outcome_unknown else "nothing changed"
    logger.warning(
        "database unavailable (%s, %s): %s",
        unavailable.cause,
        promise,
        describe(exc),
        extra={"db_cause": unavailable.cause},
    )
    if observer is not None:
        observer(unavailable.cause)


def set_keepalives(dbapi_connection: Any, *, idle_s: int, interval_s: int, count: int, user_timeout_ms: int) -> None:
    """Turn on TCP keepalives (and, on Linux, ``TCP_USER_TIMEOUT``) on a new connection's socket.

    Local socket options: no round trip. A peer that vanished (a crashed host, a partition) then closes an
    idle pooled connection within about ``idle_s + interval_s * count`` seconds, and unacknowledged data
    within ``user_timeout_ms``, instead of the kernel's two hours. A frozen server process on a live host
    still acknowledges at the TCP level: ``command_timeout`` is what bounds that case.
    """
    transport = getattr(dbapi_connection.driver_connection, "_transport", None)
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return  # a Unix socket has no keepalives to set
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (
        ("TCP_KEEPIDLE", idle_s),
        ("TCP_KEEPINTVL", interval_s),
        ("TCP_KEEPCNT", count),
        ("TCP_USER_TIMEOUT", user_timeout_ms),
    ):
        if hasattr(socket, option):  # Linux has all four; other systems some
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
