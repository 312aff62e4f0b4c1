"""Process logging: one handler and one format for every logger (uvicorn, Litestar, the SDK, httpx2, ours).

``LOG_FORMAT=text`` writes ``time level logger [request id]: message``, every field with its control
characters escaped (:func:`api.escaping.escape_controls`: a CR, LF or ANSI/OSC sequence in a request's
method name or a provider's error string cannot forge a line or drive a terminal); a traceback follows on
lines of its own, each indented, so a line that starts in the first column always starts a record.
``LOG_FORMAT=json`` writes one JSON object a line (``json`` escapes every control and non-ASCII character)
with the same facts as fields, plus whatever structured fields a record carries (each HTTP request's one
line, :mod:`api.edge`: ``client``, ``method``, ``path``, ``status``, ``duration_ms``, and ``mcp_method``,
``tool``, ``outcome``, ``principal`` from the MCP endpoint). ``LOG_LEVEL`` is the root level and every
logger defers to it.

A request's log call only stamps the record (its request id) and queues it: formatting and writing happen
on a writer thread (``QueueHandler`` + ``QueueListener``), not on the event loop. :func:`flush_logging`
(run when the server stops, and at exit) writes everything still queued; a crash loses at most what the
queue held.

Nothing logged may carry a secret: access lines lose their query strings (OAuth codes and states, a
bearer token someone sent as ``?access_token=``), and principals appear only as digests
(:func:`principal_digest`).
"""

import atexit
import collections
import hashlib
import hmac
import json
import logging
import logging.handlers
import queue
import re
import sys
import threading
import time
from contextvars import ContextVar
from typing import Any, Literal

from api.escaping import escape_controls
from store.crypto import derive_key
from store.principal import Principal

LogFormat = Literal["text", "json"]

#: The id of the HTTP request being handled (set by :class:`api.request_id.RequestIdMiddleware`).
REQUEST_ID: ContextVar[str | None] = ContextVar("coatcheck_request_id", default=None)

# Loggers that configure themselves (a level or a handler of their own) and so would not follow LOG_LEVEL.
_SELF_CONFIGURED = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi", "litestar", "mcp", "httpx2")
_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"
_STRUCTURED_FIELDS = (
    "tool",
    "outcome",
    "duration_ms",
    "principal",
    "mcp_method",
    "method",
    "path",
    "status",
    "client",
)
_ACCESS_ARGS = 5  # uvicorn: client, method, path with query, HTTP version, status
_DIGEST_LABEL = b"coatcheck log principal digest"
_DIGEST_CHARS = 16


class RedactQueryStrings(logging.Filter):
    """Replace the query string of every uvicorn access-log line with ``?[redacted]``."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str) and "?" in args[2]:
            record.args = (*args[:2], args[2].split("?", 1)[0] + "?[redacted]", *args[3:])
        return True


def install_access_log_redaction() -> None:
    """Attach :class:`RedactQueryStrings` to uvicorn's access logger once per process."""
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, RedactQueryStrings) for f in access.filters):
        access.addFilter(RedactQueryStrings())


class _RequestContext(logging.Filter):
    """Stamp each record with the current request id (``-`` outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get() or "-"
        return True


class TextFormatter(logging.Formatter):
    """``time level logger [request id]: message`` on one line, whatever the fields hold.

    Every interpolated field is escaped, since any of them may carry outside text (a logger name does
    not, but costs nothing to treat alike). An exception or stack follows on continuation lines indented
    by two spaces, its control characters escaped but its line breaks kept.
    """

    def __init__(self) -> None:
        super().__init__(_TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        fields = {
            "asctime": self.formatTime(record, self.datefmt),
            "levelname": escape_controls(record.levelname),
            "name": escape_controls(record.name),
            "request_id": escape_controls(str(getattr(record, "request_id", None) or REQUEST_ID.get() or "-")),
            "message": escape_controls(record.getMessage()),
        }
        line = _TEXT_FORMAT % fields
        blocks = []
        if record.exc_info:
            blocks.append(self.formatException(record.exc_info))
        elif record.exc_text:
            blocks.append(record.exc_text)
        if record.stack_info:
            blocks.append(self.formatStack(record.stack_info))
        for block in blocks:
            line += "\n" + "\n".join("  " + part for part in escape_controls(block, keep_newlines=True).split("\n"))
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, request id and the record's structured fields."""

    _second: tuple[int, str] = (-1, "")  # the last whole second formatted: strftime is most of the cost

    def _timestamp(self, created: float, msecs: float) -> str:
        whole = int(created)
        second, text = self._second
        if second != whole:
            text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
            self._second = (whole, text)
        return f"{text}.{int(msecs):03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self._timestamp(record.created, record.msecs),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", None) or REQUEST_ID.get(),
        }
        args = record.args
        if record.name == "uvicorn.access" and isinstance(args, tuple) and len(args) == _ACCESS_ARGS:
            entry.update(client=args[0], method=args[1], path=args[2], status=args[4])
        for name in _STRUCTURED_FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                entry[name] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, separators=(",", ":"))


# Argument types a queued record may keep unformatted: nothing the caller could change before it is written.
_IMMUTABLE_ARGS = frozenset({str, int, float, bool, type(None), bytes})


class _Enqueue(logging.handlers.QueueHandler):
    """Queues records for the writer thread as they are, leaving their formatting to it.

    The standard ``QueueHandler`` formats each record in the caller (on the event loop); here only
    arguments that could change before the writer gets to them are rendered at once.
    """

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        args = record.args
        if args and not (isinstance(args, tuple) and all(type(arg) in _IMMUTABLE_ARGS for arg in args)):
            record.msg, record.args = record.getMessage(), None
        return record


_LINGER_SECONDS = 0.02  # how long the writer lets a batch build up: lines reach stderr at most this late


class _BatchingStreamHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that writes what it formatted at :meth:`flush`, in one write (once per batch)."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._pending: list[str] = []
        self.batching = True

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._pending.append(self.format(record) + self.terminator)
        except RecursionError:
            raise
        except Exception:  # logging's own policy: report it and carry on
            self.handleError(record)
        if not self.batching:
            self.flush()

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            if self._pending:
                text, self._pending = "".join(self._pending), []
                self.stream.write(text)
            self.stream.flush()


class _LingeringQueue:
    """The queue between the handler and the writer thread, waking the writer once per batch.

    ``queue.SimpleQueue`` wakes the writer for every record: a futex call on the event loop and a GIL
    hand-over per line. Here a record is appended to a deque; only the first of a batch sets the event, and
    the writer lingers a moment before taking what has accumulated, then writes it all at once.
    """

    def __init__(self, drained: Any) -> None:
        self._items: collections.deque[logging.LogRecord | None] = collections.deque()
        self._ready = threading.Event()
        self._drained = drained  # called when the writer has taken everything (writes the batch)

    def put_nowait(self, item: logging.LogRecord | None) -> None:
        self._items.append(item)  # first, so a writer that clears the event below still finds it
        if not self._ready.is_set():
            self._ready.set()

    def get(self, block: bool = True) -> logging.LogRecord | None:
        while True:
            try:
                return self._items.popleft()
            except IndexError:
                pass
            self._drained()
            if not block:
                raise queue.Empty
            self._ready.wait()
            time.sleep(_LINGER_SECONDS)
            self._ready.clear()

    def get_nowait(self) -> logging.LogRecord | None:
        return self.get(block=False)


class _Writer:
    """The process's log pipeline: the queue handler on the root logger and the thread writing to stderr."""

    def __init__(self, output: _BatchingStreamHandler) -> None:
        self.output = output
        self.queue = _LingeringQueue(output.flush)
        self.enqueue = _Enqueue(self.queue)
        self.enqueue.addFilter(_RequestContext())  # the request id is the caller's: stamped before queueing
        self.listener = logging.handlers.QueueListener(self.queue, output)
        self.listener.start()
        self.running = True

    def stop(self) -> None:
        """Write what is queued, stop the thread, and let later records be written directly."""
        if not self.running:
            return
        self.running = False
        self.listener.stop()  # writes everything queued before it
        self.output.batching = False
        self.output.flush()
        root = logging.getLogger()
        if self.enqueue in root.handlers:
            self.output.addFilter(_RequestContext())
            root.addHandler(self.output)
            root.removeHandler(self.enqueue)
        while True:  # whatever another thread queued while the listener stopped
            try:
                record = self.queue.get_nowait()
            except queue.Empty:
                break
            if record is not None:  # the listener's sentinel
                self.output.handle(record)


_writer: list[_Writer] = []  # the current pipeline, once configure_logging has run


def flush_logging() -> None:
    """Write every queued record to stderr and switch to writing directly (idempotent; also run at exit)."""
    for writer in _writer:
        writer.stop()


def configure_logging(level: str, log_format: LogFormat = "text") -> None:
    """Send every logger's records to one stderr handler in ``log_format``, filtered at ``level``.

    Replaces whatever handlers the root logger had (``logging.basicConfig``, the SDK's, an earlier call).
    Records are written by a writer thread (see the module docstring).
    """
    handler = _BatchingStreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    flush_logging()
    if not _writer:
        atexit.register(flush_logging)
    _writer[:] = [_Writer(handler)]
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(_writer[0].enqueue)
    # No format here shows the caller's file and line, thread or process: skip collecting them per record
    # (the logging HOWTO's "Optimization" section).
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    root.setLevel(level.upper())
    for name in _SELF_CONFIGURED:
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.setLevel(logging.NOTSET)
        logger.propagate = True
    install_access_log_redaction()


def principal_digest_key(token_key_ring: list[bytes]) -> bytes:
    """The key of :func:`principal_digest`: :func:`store.crypto.derive_key` of the newest token key, own label."""
    return derive_key(token_key_ring[0], _DIGEST_LABEL)


def principal_digest(key: bytes, principal: Principal) -> str:
    """A short keyed digest naming ``principal`` in logs and spans without revealing who it is.

    Keyed, because subjects are often guessable (an email, a sequence number); stable for as long as the
    newest ``TOKEN_ENCRYPTION_KEYS`` key stays first.
    """
    message = f"{principal.issuer}\n{principal.subject}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()[:_DIGEST_CHARS]


_SAFE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def acceptable_request_id(value: str) -> bool:
    """Whether a client- or proxy-supplied ``X-Request-Id`` may be reused as is (no log injection)."""
    return _SAFE_REQUEST_ID.fullmatch(value) is not None
