"""Serving an app over HTTP the way production does: uvicorn, the read deadlines, the SIGTERM drain.

Both ``coatcheck serve`` (:mod:`api.cli`) and ``coatcheck dev`` (:mod:`api.commands.dev`) serve through
:func:`run_http_server`; it lives here, below both, so neither imports the other.
"""

import contextlib
from typing import TYPE_CHECKING

from api.settings import Settings

if TYPE_CHECKING:
    import socket

    from litestar import Litestar


def configure_logging(settings: Settings) -> None:
    """Root logging for the server process: one handler, ``LOG_FORMAT``, ``LOG_LEVEL`` for every logger."""
    from api.logs import configure_logging as configure

    configure(settings.log_level, settings.log_format)


def _exit_after_sigterm(signum: int, frame: object) -> None:
    # uvicorn restores the handler it found, then re-raises the SIGTERM it handled: landing here means the
    # shutdown it ran has finished, so the process ends normally (exit status 0, not -15). Outside uvicorn's
    # own handling (the instant before it starts) a SIGTERM also just ends the process.
    del signum, frame
    raise SystemExit(0)


def run_http_server(
    app: "Litestar", settings: Settings, *, host: str, port: int, sockets: "list[socket.socket] | None" = None
) -> None:
    """Serve ``app`` with uvicorn the way production does (also used by the test-only conformance profile).

    ``sockets``: already-bound listening sockets to serve instead of binding ``host``:``port`` (a worker of
    ``serve --workers``, :mod:`api.workers`).

    On SIGTERM ``/readyz`` turns 503 for ``SHUTDOWN_DRAIN_SECONDS`` while requests are still served
    (``api.draining``); then uvicorn stops accepting, lets in-flight requests run for up to
    ``SHUTDOWN_TIMEOUT_SECONDS``, then cancels them and runs the app's shutdown; the process then exits 0.
    Slow clients are cut off by :mod:`api.http_guard`; ``MAX_CONNECTIONS`` caps open connections plus
    requests in progress (beyond it, requests get 503).
    """
    import signal

    import uvicorn

    from api.draining import Drain, DrainingServer
    from api.gc_policy import serving_policy
    from api.http_guard import guarded_protocol
    from api.logs import flush_logging

    configure_logging(settings)
    serving_policy()  # start-up objects out of every GC pass (the p99), fewer young passes (api/gc_policy.py)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http=guarded_protocol(
            header_timeout=settings.header_read_timeout_seconds,
            body_timeout=settings.body_read_timeout_seconds,
            max_header_bytes=settings.max_request_header_bytes,
        ),
        log_config=None,  # configure_logging owns every handler and format
        access_log=False,  # the edge writes each request's one line (api/edge.py), uvicorn none of its own
        log_level=settings.log_level.lower(),
        timeout_graceful_shutdown=settings.shutdown_timeout_seconds,
        timeout_keep_alive=settings.keep_alive_timeout_seconds,
        limit_concurrency=settings.max_connections,
        proxy_headers=bool(settings.forwarded_allow_ips),
        forwarded_allow_ips=settings.forwarded_allow_ips or None,
        server_header=False,
    )
    drain = app.state.get("drain")
    server = DrainingServer(config, drain if isinstance(drain, Drain) else Drain(0))
    signal.signal(signal.SIGTERM, _exit_after_sigterm)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            server.run(sockets=sockets)
    finally:
        flush_logging()  # every line still queued is written before the process ends
    if not server.started:
        raise SystemExit(3)  # uvicorn's own start-up failure status (port in use, lifespan failed)
