"""A real HTTP server on 127.0.0.1 that answers GETs with JSON, for issuer metadata and JWKS stand-ins."""

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.support.waiting import free_port


@contextmanager
def serve_json(answer: Callable[[str, str], dict[str, Any] | None]) -> Iterator[str]:
    """Serve ``answer(base_url, path)`` as JSON (``None``: 404) until the block ends; yields the base URL."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = answer(base, self.path)
            if body is None:
                self.send_response(404)
                self.end_headers()
                return
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield base
    finally:
        server.shutdown()
        server.server_close()
