"""A test-only reverse proxy that adds a bearer token to every request it forwards.

The conformance suite sends no credentials, while Coatcheck refuses every MCP request without a
valid access token. Rather than switch auth off in the server, the tests put this proxy in front
of it: the server keeps its whole production stack (token verification, Host/Origin checks,
request-state sealing) and the proxy plays a signed-in client.

Everything else passes through unchanged, in particular the ``Host`` and ``Origin`` headers, so
DNS-rebinding checks are decided by Coatcheck, and responses stream back as they arrive, so SSE
(progress, ``subscriptions/listen``) behaves as it does without the proxy. The one normalisation:
surrounding whitespace in header values is dropped (it is not part of the value, RFC 9110 5.5, and
the HTTP library refuses to send it); tests/api/test_transport_hardening.py covers that case
against the server directly. Each forwarded exchange is appended to ``PROXY_EXCHANGE_LOG``
(JSON lines) so tests can see what the server itself answered.

Run::

    PROXY_UPSTREAM=http://127.0.0.1:8000 PROXY_BEARER_TOKEN_FILE=token.txt \
        python -m tests.support.conformance.token_proxy --port N
"""

import argparse
import json
import os
from pathlib import Path
from typing import Any

import anyio
import httpx2
import uvicorn

_HOP_BY_HOP = {
    b"connection",
    b"keep-alive",
    b"proxy-authenticate",
    b"proxy-authorization",
    b"te",
    b"trailer",
    b"transfer-encoding",
    b"upgrade",
    b"content-length",
}


class TokenProxy:
    """ASGI app: forward to ``upstream`` with ``Authorization: Bearer <token>``, streaming the response."""

    def __init__(self, upstream: str, token_file: Path, exchange_log: Path | None) -> None:
        self._upstream = upstream.rstrip("/")
        # Read at every request: the test writes the token once the server is up (in authorization-server
        # mode the server itself issues it); while the file is empty nothing is added.
        self._token_file = token_file
        self._exchange_log = exchange_log
        self._http = httpx2.AsyncClient(timeout=httpx2.Timeout(60.0, read=None), follow_redirects=False)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body.extend(message.get("body", b""))
            if not message.get("more_body", False):
                break
        # Surrounding whitespace is not part of a field value (RFC 9110 5.5); h11 refuses to send it.
        headers = [
            (key.decode("latin-1"), value.decode("latin-1").strip(" \t"))
            for key, value in scope["headers"]
            if key not in _HOP_BY_HOP and key != b"authorization"
        ]
        token = self._token_file.read_text().strip()
        if token:
            headers.append(("Authorization", f"Bearer {token}"))
        query = scope.get("query_string", b"").decode("latin-1")
        url = self._upstream + scope["raw_path"].decode("latin-1").split("?")[0] + (f"?{query}" if query else "")
        request = self._http.build_request(scope["method"], url, headers=headers, content=bytes(body))
        try:
            response = await self._http.send(request, stream=True)
        except httpx2.HTTPError as exc:
            await send({"type": "http.response.start", "status": 502, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": f"upstream: {type(exc).__name__}".encode()})
            return
        self._record(scope, response.status_code)
        async with anyio.create_task_group() as tasks:

            async def cancel_on_disconnect() -> None:
                # A client that hangs up (e.g. ends a subscriptions/listen stream) must end the
                # upstream request too, or the server would keep serving a stream nobody reads.
                while (await receive())["type"] != "http.disconnect":
                    pass
                tasks.cancel_scope.cancel()

            tasks.start_soon(cancel_on_disconnect)
            try:
                await self._relay(response, send)
            finally:
                tasks.cancel_scope.cancel()
                with anyio.CancelScope(shield=True):
                    await response.aclose()

    async def _relay(self, response: httpx2.Response, send: Any) -> None:
        headers = [
            (key.encode("latin-1"), value.encode("latin-1"))
            for key, value in response.headers.multi_items()
            if key.lower().encode() not in _HOP_BY_HOP
        ]
        await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
        try:
            async for chunk in response.aiter_raw():
                if chunk:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except httpx2.HTTPError:
            pass  # the upstream stream broke off; end ours the same way
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _record(self, scope: dict[str, Any], status: int) -> None:
        if self._exchange_log is None:
            return
        headers = {key.decode("latin-1"): value.decode("latin-1") for key, value in scope["headers"]}
        entry = {
            "method": scope["method"],
            "path": scope["path"],
            "host": headers.get("host"),
            "origin": headers.get("origin"),
            "mcp_method": headers.get("mcp-method"),
            "status": status,
        }
        with self._exchange_log.open("a") as log:
            log.write(json.dumps(entry) + "\n")

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self._http.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return


def main() -> None:
    parser = argparse.ArgumentParser(description="Bearer-token-injecting reverse proxy (test-only)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    exchange_log = os.environ.get("PROXY_EXCHANGE_LOG")
    app = TokenProxy(
        os.environ["PROXY_UPSTREAM"],
        Path(os.environ["PROXY_BEARER_TOKEN_FILE"]),
        Path(exchange_log) if exchange_log else None,
    )
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        server_header=False,
        date_header=False,
        proxy_headers=False,
    )


if __name__ == "__main__":
    main()
