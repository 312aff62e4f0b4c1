"""The ``coatcheck`` command: serve, migrate, seed-demo, catalog, keys rotate, purge, audit, connections revoke,
grants revoke, dev."""

import argparse
import logging
import sys
from typing import TYPE_CHECKING

from api.commands import catalog as catalog_command
from api.commands import purge as purge_command
from api.commands.runner import load_settings, run_with_database
from api.serving import configure_logging, run_http_server
from api.settings import DatabaseSettings, Settings, VaultKeySettings

if TYPE_CHECKING:
    import socket

logger = logging.getLogger("coatcheck")


def _settings() -> Settings:
    return load_settings(Settings)


def _database_url_only() -> str:
    # migrate needs only the database, not the server's secrets.
    return load_settings(DatabaseSettings).database_url


def _worker_count(value: str) -> int:
    count = int(value) if value.isdigit() else 0
    if not 1 <= count <= 64:
        raise argparse.ArgumentTypeError("must be a whole number from 1 to 64")
    return count


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


def _grants_revoke(args: argparse.Namespace) -> None:
    from api.commands.grants import run

    raise SystemExit(run(args))


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
    catalog_command.register(commands)
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
    from api.commands import grants as grants_command

    grants = commands.add_parser(
        "grants", help="act on what users authorised MCP clients to do (authorization-server mode)"
    ).add_subparsers(dest="grants_command", required=True)
    revoke_grants = grants.add_parser("revoke", help="revoke grants on every replica within a second (audited)")
    grants_command.add_arguments(revoke_grants)
    revoke_grants.set_defaults(run=_grants_revoke)
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
