"""A request id for every HTTP request: in every log line it causes and in the ``X-Request-Id`` response header.

A well-formed ``X-Request-Id`` from the client or the proxy in front is kept, so one id follows a request
through the load balancer's logs and ours; anything else is replaced by a fresh random id.
"""

import os

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from api.logs import REQUEST_ID, acceptable_request_id

_HEADER = b"x-request-id"


def new_request_id() -> str:
    """16 random hex characters: unique enough to find one request among billions of log lines."""
    return os.urandom(8).hex()


def request_id_middleware(app: ASGIApp) -> ASGIApp:
    """Litestar middleware factory setting :data:`api.logs.REQUEST_ID` for the request it wraps."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await app(scope, receive, send)
            return
        supplied = next((value for name, value in scope["headers"] if name == _HEADER), None)
        decoded = supplied.decode("latin-1") if supplied is not None else ""
        request_id = decoded if decoded and acceptable_request_id(decoded) else new_request_id()
        REQUEST_ID.set(request_id)
        encoded = request_id.encode()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), (_HEADER, encoded)]
            await send(message)

        await app(scope, receive, send_with_id)

    return middleware
