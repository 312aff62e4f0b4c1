"""``coatcheck serve --workers N``: N server processes sharing one listening socket, so every core is used.

One Python process runs its event loop on one core. This supervisor binds the socket once, then forks N
workers; each builds its own app (its own database pool, HTTP client and JWKS cache, its own log writer)
and serves the shared socket, and the kernel hands each new connection to one of them. The supervisor
itself creates no app, opens no database connection and starts no thread (a fork must not copy one).

* SIGTERM to the supervisor goes to every worker: each drains (``SHUTDOWN_DRAIN_SECONDS``) and shuts down
  as a single process does; the supervisor exits 0 once all have exited 0. A SIGINT from a terminal
  reaches the workers directly (they share its process group), so the supervisor does not pass it on.
* A worker that exits on its own (a start-up failure, a crash) takes the others down with it and the
  supervisor exits with that worker's status, for the orchestrator to restart the container: a worker is
  not restarted in place.

Budgets are per worker: each opens up to ``DB_POOL_SIZE`` connections and accepts up to
``MAX_CONNECTIONS`` (see docs/performance.md).
"""

import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable

logger = logging.getLogger("coatcheck.workers")


def _run_worker(serve: Callable[[list[socket.socket]], None], sock: socket.socket) -> int:
    """In a forked child: serve until shut down; the exit status of the worker."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    status = 1
    try:
        serve([sock])
        status = 0
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        logger.exception("worker %d failed", os.getpid())
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
    return status


def serve_workers(
    count: int, sock: socket.socket, serve: Callable[[list[socket.socket]], None], *, forked: Callable[[], None]
) -> int:
    """Fork ``count`` workers each running ``serve([sock])``; wait for them; the supervisor's exit status.

    ``forked`` runs in the supervisor once every worker is forked (it sets up the supervisor's logging).
    """
    workers: set[int] = set()
    stopping = False

    def stop_all(signum: int = signal.SIGTERM, frame: object = None) -> None:
        nonlocal stopping
        del frame
        stopping = True
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    for _ in range(count):
        pid = os.fork()
        if pid == 0:  # the worker
            os._exit(_run_worker(serve, sock))
        workers.add(pid)
    signal.signal(signal.SIGTERM, stop_all)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal's SIGINT reached the workers already
    forked()
    host, port = sock.getsockname()[:2]
    sock.close()  # the workers hold it
    logger.info(
        "serving http://%s:%d with %d workers: %s", host, port, count, ", ".join(str(pid) for pid in sorted(workers))
    )
    status = 0
    while workers:
        pid, wait_status = os.wait()  # PEP 475: resumed after a signal handler runs
        workers.discard(pid)
        code = os.waitstatus_to_exitcode(wait_status)
        if code != 0 and status == 0:
            status = code if code > 0 else 1
        if not stopping:
            logger.error("worker %d exited with status %d; stopping the other workers", pid, code)
            status = status or 1
            stop_all()
    return status
