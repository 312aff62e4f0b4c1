"""A real HTTP server on 127.0.0.1 publishing client metadata documents, and misbehaving on request."""

import contextlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from tests.support.json_server import QuietHandler, serving
from tests.support.waiting import free_port


@dataclass
class DocumentServer:
    """What it serves: ``documents`` by path (the JSON's ``client_id`` is filled in as the URL), plus
    ``/redirect`` (a 302), ``/huge`` (1 MiB), ``/slow`` (answers after ``slow_seconds``)."""

    base_url: str
    documents: dict[str, dict[str, object]] = field(default_factory=dict)
    cache_control: dict[str, str] = field(default_factory=dict)
    slow_seconds: float = 10.0
    hits: dict[str, int] = field(default_factory=dict)

    def url(self, path: str) -> str:
        return f"{self.base_url}{path}"


@contextmanager
def serve_documents() -> Iterator[DocumentServer]:
    port = free_port()
    served = DocumentServer(base_url=f"http://127.0.0.1:{port}")
    stop = threading.Event()

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            served.hits[self.path] = served.hits.get(self.path, 0) + 1
            if self.path == "/redirect":
                self.send_response(302)
                self.send_header("location", served.url("/client.json"))
                self.end_headers()
                return
            if self.path == "/slow":
                stop.wait(served.slow_seconds)
            if self.path == "/huge":
                body = b"[" + b"0," * (512 * 1024) + b"0]"
            elif self.path in served.documents:
                body = json.dumps({"client_id": served.url(self.path), **served.documents[self.path]}).encode()
            elif self.path == "/slow":
                body = b"{}"
            else:
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            if self.path in served.cache_control:
                self.send_header("cache-control", served.cache_control[self.path])
            self.end_headers()
            with contextlib.suppress(OSError):  # the fetcher may give up on purpose
                self.wfile.write(body)

    with serving(Handler, port):
        try:
            yield served
        finally:
            stop.set()
