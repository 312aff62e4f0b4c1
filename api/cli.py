"""The ``coatcheck`` command: serve, migrate, seed-demo, keys rotate, purge, audit, connections revoke, dev."""

import argparse
import contextlib
import logging
import sys
from typing import TYPE_CHECKING

from api.commands import purge as purge_command
from api.commands.runner import load_settings, run_with_database
from api.settings import DatabaseSettings, Settings, VaultKeySettings

if TYPE_CHECKING:
    import socket

    from litestar import Litestar

logger = logging.getLogger("coatcheck")


def _settings() -> Settings:
    return load_settings(Settings)


def _database_url_only() -> str:
    # migrate needs only the database, not the server's secrets.
    return load_settings(DatabaseSettings).database_url


def configure_logging(settings: Settings) -> None:
    """Root logging for the server process: one handler, ``LOG_FORMAT``, ``LOG_LEVEL`` for every logger."""
    from api.logs import configure_logging as configure

    configure(settings.log_level, settings.log_format)


def _worker_count(value: str) -> int:
    count = int(value) if value.isdigit() else 0
    if not 1 <= count <= 64:
        raise argparse.ArgumentTypeError("must be a whole number from 1 to 64")
    return count


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
    from api.gc_policy import freeze_startup_objects
    from api.http_guard import guarded_protocol
    from api.logs import flush_logging

    configure_logging(settings)
    freeze_startup_objects()  # keeps start-up objects out of every GC pass (the p99; see api/gc_policy.py)
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


def _serve(args: argparse.Namespace) -> None:
    settings = _settings()
    if args.workers == 1:
        _serve_one(args, settings)
        return
    import uvicorn

    from api.workers import serve_workers

    # Bound once, before the fork, so every worker accepts on the same socket. The supervisor configures
    # its logging only after forking: a fork must not copy the log writer's thread.
    sock = uvicorn.Config(app=_serve, host=args.host, port=args.port).bind_socket()  # (app: unused here)
    status = serve_workers(
        args.workers,
        sock,
        lambda sockets: _serve_one(args, settings, sockets),
        forked=lambda: configure_logging(settings),
    )
    raise SystemExit(status)


def _serve_one(args: argparse.Namespace, settings: Settings, sockets: "list[socket.socket] | None" = None) -> None:
    from api.app import create_app
    from api.tracing import TracingConfigError, configure_tracing

    configure_logging(settings)
    try:
        tracer_provider = configure_tracing(settings)
    except TracingConfigError as exc:
        print(f"coatcheck: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    app = create_app(settings, purge_every=args.purge_every, tracer_provider=tracer_provider)
    try:
        run_http_server(app, settings, host=args.host, port=args.port, sockets=sockets)
    finally:
        if tracer_provider is not None:
            tracer_provider.shutdown()  # flush the spans still queued for export


def _migrate(args: argparse.Namespace) -> None:
    from store.migrations import upgrade

    if args.check:
        from api.commands.migrate import check_schema

        raise SystemExit(check_schema(_database_url_only()))
    logging.basicConfig(level="INFO", format="%(message)s")
    upgrade(_database_url_only())


def _audit(args: argparse.Namespace) -> None:
    from api.commands.audit import run

    raise SystemExit(run(args))


def _connections_revoke(args: argparse.Namespace) -> None:
    from api.commands.connections import run

    raise SystemExit(run(args, _settings()))


def _seed_demo(_: argparse.Namespace) -> None:
    from store.demo import seed_demo_catalog

    # seed-demo needs only the database, not the server's secrets.
    changed = run_with_database(load_settings(DatabaseSettings), seed_demo_catalog)
    print(f"demo catalog loaded ({changed} products added or changed)")


def _keys_rotate(_: argparse.Namespace) -> None:
    from store.crypto import TokenCipher
    from store.db import Database
    from store.key_rotation import count_stale, reencrypt_all

    # keys rotate needs only the token key ring and the database, not the server's other secrets.
    settings = load_settings(VaultKeySettings)
    cipher = TokenCipher(settings.token_key_ring)
    logging.basicConfig(level="INFO", format="%(levelname)s %(name)s: %(message)s")

    async def rotate(database: Database) -> tuple[int, int]:
        # A connection outside a transaction: each batch commits on its own, so row locks stay short.
        async with database.transactional_connection() as conn:
            done = await reencrypt_all(conn, cipher)
            stale = await count_stale(conn, cipher)
            await conn.rollback()
            return done, stale

    done, stale = run_with_database(settings, rotate)
    print(f"re-encrypted {done} rows under the newest key")
    if stale:
        print(f"coatcheck: {stale} rows are sealed under keys not in TOKEN_ENCRYPTION_KEYS", file=sys.stderr)
        raise SystemExit(1)


def _dev(args: argparse.Namespace) -> None:
    from api.commands.dev import main as dev_main

    dev_main(args)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``coatcheck`` console script."""
    parser = argparse.ArgumentParser(prog="coatcheck", description="Coatcheck MCP server")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the HTTP server")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    serve.add_argument(
        "--purge-every",
        type=purge_command.parse_duration,
        default=None,
        metavar="DURATION",
        help="also run `coatcheck purge` in the background every DURATION (e.g. 1h); off by default",
    )
    serve.add_argument(
        "--workers",
        type=_worker_count,
        default=1,
        metavar="N",
        help="server processes sharing the port (default 1); each has its own DB_POOL_SIZE pool (docs/performance.md)",
    )
    serve.set_defaults(run=_serve)
    migrate = commands.add_parser("migrate", help="alembic upgrade head against DATABASE_URL")
    migrate.add_argument("--check", action="store_true", help="change nothing; exit 1 unless the schema is at head")
    migrate.set_defaults(run=_migrate)
    commands.add_parser("seed-demo", help="load the demo catalog (idempotent)").set_defaults(run=_seed_demo)
    keys = commands.add_parser("keys", help="manage the token encryption keys").add_subparsers(
        dest="keys_command", required=True
    )
    keys.add_parser(
        "rotate", help="re-encrypt every stored token under the first TOKEN_ENCRYPTION_KEYS key"
    ).set_defaults(run=_keys_rotate)
    from api.commands import audit as audit_command
    from api.commands import connections as connections_command

    audit = commands.add_parser("audit", help="print audit events (filters; JSON lines or a table)")
    audit_command.add_arguments(audit)
    audit.set_defaults(run=_audit)
    connections = commands.add_parser("connections", help="act on users' third-party connections").add_subparsers(
        dest="connections_command", required=True
    )
    revoke = connections.add_parser("revoke", help="revoke a user's connections upstream and forget them (audited)")
    connections_command.add_arguments(revoke)
    revoke.set_defaults(run=_connections_revoke)
    purge_command.register(commands)
    dev = commands.add_parser(
        "dev", help="DEVELOPMENT ONLY: PostgreSQL, the dev IdP, migrate, seed and serve in one command"
    )
    from api.commands.dev import add_arguments as add_dev_arguments

    add_dev_arguments(dev)
    dev.set_defaults(run=_dev)
    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()
