"""The hot statements, compiled once by SQLAlchemy and run on asyncpg under SQLAlchemy's pooled connection.

SQLAlchemy builds every statement and owns the pool; what a tool call's lone statement skips is the
per-call work of ``AsyncConnection.execute`` (a greenlet switch, the execution context, the cursor adapter,
the result object). :class:`Compiled` compiles a statement once for the asyncpg dialect (``$n`` placeholders,
the bind names in their order); :func:`fetch` binds the values positionally and runs it on the asyncpg
connection under the pooled one (see docs/performance.md, the store's hot path, for the figures).

What SQLAlchemy would do around an ``execute`` still happens: ``before_cursor_execute`` and
``after_cursor_execute`` listeners (the tracing spans, the tests' statement recorders) see the SQL, and a
failure reaches the ``handle_error`` listeners, so a connection the failover shapes of
:mod:`store.outages` mark as a disconnect leaves the pool (and every pooled connection opened before it) as
it would after ``execute``. The unit of work (:mod:`store.db`) translates the driver's errors as it
translates SQLAlchemy's.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, cast

from asyncpg import Record  # type: ignore[import-untyped]
from sqlalchemy import Executable
from sqlalchemy.dialects.postgresql.asyncpg import dialect as asyncpg_dialect
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ClauseElement

from store.outages import is_failover_disconnect

_DIALECT = asyncpg_dialect()  # type: ignore[no-untyped-call]


class AttributeRecord(Record):  # type: ignore[misc]
    """An asyncpg row that also reads its columns as attributes (``row.sku``), as SQLAlchemy's ``Row`` does.

    So the repositories read a row the same way whichever path produced it.
    """

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _learn_columns(record_class: type[AttributeRecord], columns: Iterable[str]) -> None:
    """Make ``columns`` properties of ``record_class``: read in C, not through ``__getattr__``.

    ``__getattr__`` only runs after the ordinary lookup has failed, so each read built and discarded an
    ``AttributeError`` first (~1.4 µs against ~0.2 µs here; a ``cart_view`` reads about twenty). A name the
    record already has (``keys``, ``get``, …) keeps its meaning, as it did before.
    """
    for name in columns:
        if not hasattr(record_class, name):
            setattr(record_class, name, property(itemgetter(name)))


class Compiled:
    """A SQLAlchemy statement compiled once for asyncpg: its SQL and the bind names in ``$n`` order.

    Only for statements whose values and columns need no conversion on the way (``str``, ``int``, ``bool``,
    ``None``, ``timedelta``, timestamps): a statement with a bind processor (JSON, enums, …) is refused here.
    """

    __slots__ = ("columns_learnt", "defaults", "names", "record_class", "sql", "statement")

    def __init__(self, statement: Executable) -> None:
        compiled = cast(SQLCompiler, cast(ClauseElement, statement).compile(dialect=_DIALECT))
        if any(processor is not None for processor in compiled._bind_processors.values()):
            raise ValueError("a statement whose values need conversion must run through SQLAlchemy")
        self.statement = statement
        self.sql: str = compiled.string
        self.names: tuple[str, ...] = tuple(compiled.positiontup or ())
        # Values the statement carries itself (a literal SQLAlchemy turned into a bind, such as a LIMIT 1).
        self.defaults: dict[str, object] = {
            name: bind.effective_value
            for name, bind in compiled.binds.items()
            if name in self.names and not bind.required
        }
        # A row class of its own, whose columns become properties once its first rows name them (as
        # PostgreSQL names them; text statements declare none to SQLAlchemy). The same class throughout:
        # asyncpg caches a prepared statement per record class, and a new one would prepare it again.
        self.record_class: type[AttributeRecord] = type("Row", (AttributeRecord,), {"__slots__": ()})
        self.columns_learnt = False

    def args(self, params: Mapping[str, object]) -> list[object]:
        """The values for ``$1``, ``$2``, … from ``params`` (by bind name) and the statement's own."""
        if self.defaults:
            params = {**self.defaults, **params}
        return [params[name] for name in self.names]


class _Context:
    """The execution context listeners are handed (a listener may keep its own state on it, as tracing does)."""

    def __init__(self, statement: str, parameters: Sequence[object]) -> None:
        self.statement = statement
        self.parameters = parameters


@dataclass(slots=True)
class _Failure:
    """What a ``handle_error`` listener reads of a failed statement (SQLAlchemy's ``ExceptionContext`` subset)."""

    connection: Connection
    original_exception: BaseException
    execution_context: _Context
    statement: str
    parameters: Sequence[object]
    is_disconnect: bool
    engine: Any = None
    dialect: Any = None
    cursor: None = None
    sqlalchemy_exception: None = None
    chained_exception: None = None
    invalidate_pool_on_disconnect: bool = True
    is_pre_ping: bool = False


def _direct(sync: Connection) -> bool:
    """Whether a statement may bypass SQLAlchemy on ``sync`` without changing what commits when.

    Yes in the units of work that run in autocommit or inside the explicit ``BEGIN`` sent on the driver
    (pooler mode ``transaction``); no once SQLAlchemy itself has begun a transaction on the connection (its
    ``BEGIN`` would only be sent with its own next statement), nor on a connection switched out of autocommit.
    """
    if sync.in_transaction():
        return False
    return bool(sync.get_execution_options().get("isolation_level", "AUTOCOMMIT") == "AUTOCOMMIT")


async def fetch(conn: AsyncConnection, statement: Compiled, params: Mapping[str, object]) -> Sequence[Any]:
    """The rows ``statement`` returns with ``params`` bound, run on the driver (or through SQLAlchemy where it must).

    Rows read by attribute either way (:class:`AttributeRecord` or SQLAlchemy's ``Row``).
    """
    sync = conn.sync_connection
    if sync is None or not _direct(sync):
        result = await conn.execute(statement.statement, dict(params))
        return result.all() if result.returns_rows else []
    args = statement.args(params)
    fairy = sync.connection
    driver = fairy.driver_connection
    # SQLAlchemy's own "any listeners?" check, as before each execute: without listeners nothing more is built.
    context = _Context(statement.sql, args) if sync._has_events or sync.engine._has_events else None
    if context is not None:
        sync.dispatch.before_cursor_execute(sync, None, statement.sql, args, context, False)
    try:
        rows: list[Any] = await driver.fetch(statement.sql, *args, record_class=statement.record_class)  # type: ignore[union-attr]
    except Exception as exc:
        await _failed(conn, sync, fairy, context or _Context(statement.sql, args), exc)
        raise
    if rows and not statement.columns_learnt:
        _learn_columns(statement.record_class, rows[0].keys())
        statement.columns_learnt = True
    if context is not None:
        sync.dispatch.after_cursor_execute(sync, None, statement.sql, args, context, False)
    return rows


async def _failed(conn: AsyncConnection, sync: Connection, fairy: Any, context: _Context, exc: Exception) -> None:
    """What SQLAlchemy does when a statement fails: tell ``handle_error`` listeners, drop a lost connection."""
    failure = _Failure(
        connection=sync,
        original_exception=exc,
        execution_context=context,
        statement=context.statement,
        parameters=context.parameters,
        is_disconnect=is_failover_disconnect(exc),
        engine=sync.engine,
        dialect=sync.dialect,
    )
    if sync._has_events or sync.engine._has_events:
        for listener in sync.dispatch.handle_error:
            listener(failure)
    if failure.is_disconnect:
        # As SQLAlchemy after a disconnect: every pooled connection opened before this one is replaced at its
        # next checkout (a switchover leaves them all on the old primary), and this one leaves the pool now.
        sync.engine.pool._invalidate(fairy, exc, _checkin=False)
        await conn.invalidate(exc)
