"""Real HTTP servers on 127.0.0.1 for stand-ins (issuer metadata, JWKS, token and introspection endpoints).

:func:`serving` runs any handler class in a thread until the block ends; :func:`send_json` is the one way
the stand-ins answer with JSON; :func:`serve_json` is the GET-only server most tests need.
"""

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.support.waiting import free_port


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that keeps the test output free of its access lines."""

    def log_message(self, *_: object) -> None:
        pass


def send_json(handler: BaseHTTPRequestHandler, status: int, body: object) -> None:
    """Answer ``body`` as JSON with ``status``."""
    data = json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("content-type", "application/json")
    handler.send_header("content-length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler], port: int | None = None) -> Iterator[str]:
    """Serve ``handler`` on 127.0.0.1 (``port``, or a free one) in a thread; yields the base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", port if port is not None else free_port()), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def serve_json(answer: Callable[[str, str], dict[str, Any] | None]) -> Iterator[str]:
    """Serve ``answer(base_url, path)`` as JSON (``None``: 404) until the block ends; yields the base URL."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            body = answer(base, self.path)
            if body is None:
                self.send_response(404)
                self.end_headers()
                return
            send_json(self, 200, body)

    with serving(Handler, port) as url:
        yield url
