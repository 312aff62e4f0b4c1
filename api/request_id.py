"""A request id for every HTTP request: in every log line it causes and in the ``X-Request-Id`` response header.

A well-formed ``X-Request-Id`` from the client or the proxy in front is kept, so one id follows a request
through the load balancer's logs and ours; anything else is replaced by a fresh random id. The edge
(:class:`api.edge.Edge`) sets it for each request.
"""

import os

from api.logs import acceptable_request_id

REQUEST_ID_HEADER = b"x-request-id"


def new_request_id() -> str:
    """16 random hex characters: unique enough to find one request among billions of log lines."""
    return os.urandom(8).hex()


def request_id_for(supplied: bytes | None) -> str:
    """The id of a request whose ``X-Request-Id`` header was ``supplied`` (``None``: it sent none)."""
    if supplied:
        decoded = supplied.decode("latin-1")
        if acceptable_request_id(decoded):
            return decoded
    return new_request_id()
