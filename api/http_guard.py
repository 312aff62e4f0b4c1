"""Read deadlines for uvicorn's HTTP/1.1 protocol, so a slow client cannot hold a connection open.

uvicorn bounds idle keep-alive connections but not a request that is still arriving: with httptools a
client may trickle its headers or its body for ever (slowloris). :func:`guarded_protocol` returns a
subclass of uvicorn's httptools protocol that adds two deadlines and a size cap:

* the request line and headers must be complete within ``header_timeout`` seconds of the connection
  opening (or of the first byte of the next request on a kept-alive connection), and may not exceed
  ``max_header_bytes``;
* the body must be complete within ``body_timeout`` seconds of the headers, or, for a request queued
  behind another on a pipelined connection (HTTP/1.1 pipelining), of the moment its turn comes: uvicorn
  stops reading while a request waits in its pipeline, so its clock starts when reading resumes for it.
  Bytes of a body still arriving after its request was answered are read and discarded by uvicorn, and
  each of them would reset its keep-alive timer; the body deadline stays armed through them, so a
  trickle cannot hold the connection however it is timed.

A request that misses a deadline gets ``408 Request Timeout`` (``431`` for oversized headers) unless it
was answered already, and its connection is closed. The app then sees ``http.disconnect``. Hooks are
uvicorn's own parser callbacks; tests/api/test_http_guard.py proves the behaviour on real sockets, so
an incompatible uvicorn release fails there.
"""

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

logger = logging.getLogger(__name__)

_TIMEOUT_RESPONSE = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
_TOO_LARGE_RESPONSE = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with header and body read deadlines (configure via :func:`guarded_protocol`)."""

    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_header_bytes: int = 64 * 1024

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_deadline: asyncio.TimerHandle | None = None
        self._header_bytes = 0
        self._request_bytes_seen = False
        self._refused = False  # the parser may still call back with the rest of the chunk; ignore it
        # The request whose body is still arriving while it waits in uvicorn's pipeline: its body deadline
        # is armed when uvicorn starts it (on_response_complete of the one before).
        self._queued_body: object | None = None

    # -- deadlines ----------------------------------------------------------------------------------

    def _arm(self, seconds: float, stage: str) -> None:
        self._disarm()
        self._read_deadline = self.loop.call_later(seconds, self._missed_deadline, stage)

    def _disarm(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None

    def _missed_deadline(self, stage: str) -> None:
        self._read_deadline = None
        if self.transport.is_closing():
            return
        logger.info("closed a connection whose request %s did not arrive in time", stage)
        self._refuse(_TIMEOUT_RESPONSE, answered=stage == "body" and self.cycle.response_started)

    def _refuse(self, response: bytes, *, answered: bool = False) -> None:
        """Close the connection, first sending ``response`` unless the request was ``answered`` already.

        An app may answer before reading the body (a 401, a 413); the rest of that body is still read and
        discarded by uvicorn, so the body deadline also ends such a connection, without a second response.
        """
        self._refused = True
        if self._request_bytes_seen and not answered:
            self.transport.write(response)
        self.transport.close()

    # -- uvicorn's protocol hooks -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.header_timeout, "headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        self._request_bytes_seen = True
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_bytes = 0
        if self._read_deadline is None:  # the next request on a kept-alive connection
            self._arm(self.header_timeout, "headers")

    def on_url(self, url: bytes) -> None:
        if self._within_header_limit(len(url)):
            super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._within_header_limit(len(name) + len(value)):
            super().on_header(name, value)

    def _within_header_limit(self, count: int) -> bool:
        if self._refused:
            return False
        self._header_bytes += count
        if self._header_bytes <= self.max_header_bytes:
            return True
        self._disarm()
        logger.info("closed a connection whose request headers exceeded %d bytes", self.max_header_bytes)
        self._refuse(_TOO_LARGE_RESPONSE)
        return False

    def on_headers_complete(self) -> None:
        self._disarm()
        if self._refused:
            return
        super().on_headers_complete()
        if self.pipeline and self.pipeline[0][0] is self.cycle:
            # Queued behind an unanswered request: uvicorn paused reading, so its body's clock starts
            # when its turn comes (on_response_complete), not now.
            self._queued_body = self.cycle
        else:
            self._arm(self.body_timeout, "body")

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._disarm()
        self._queued_body = None
        if not self._refused:
            super().on_message_complete()

    def on_response_complete(self) -> None:
        self._request_bytes_seen = False
        starting = self.pipeline[-1][0] if self.pipeline else None  # the queued request uvicorn starts next
        super().on_response_complete()
        if starting is not None and starting is self._queued_body and not self.transport.is_closing():
            # Its body is still arriving: from now on it gets the same deadline as any other body.
            self._queued_body = None
            self._request_bytes_seen = True
            self._arm(self.body_timeout, "body")


def guarded_protocol(*, header_timeout: float, body_timeout: float, max_header_bytes: int) -> type[HttpToolsProtocol]:
    """A :class:`GuardedHttpToolsProtocol` subclass with these limits, to pass as uvicorn's ``http=``."""
    return type(
        "ConfiguredGuardedHttpToolsProtocol",
        (GuardedHttpToolsProtocol,),
        {"header_timeout": header_timeout, "body_timeout": body_timeout, "max_header_bytes": max_header_bytes},
    )
