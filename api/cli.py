"""The ``coatcheck`` command: serve, migrate, seed-demo."""

import argparse
import asyncio
import logging
import sys

from api.settings import Settings, SettingsError

logger = logging.getLogger("coatcheck")


def _settings() -> Settings:
    try:
        return Settings.from_env()
    except SettingsError as exc:
        print(f"coatcheck: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _database_url_only() -> str:
    # migrate and seed-demo need only the database, not the server's secrets.
    from pydantic import ValidationError
    from pydantic_settings import BaseSettings, SettingsConfigDict

    from store.db import async_database_url

    class _DbSettings(BaseSettings):
        model_config = SettingsConfigDict(env_file=".env", extra="ignore")
        database_url: str

    try:
        return async_database_url(_DbSettings().database_url)  # type: ignore[call-arg]
    except (ValidationError, ValueError):
        print("coatcheck: DATABASE_URL is not set or is not a postgresql:// URL", file=sys.stderr)
        raise SystemExit(2) from None


def _serve(args: argparse.Namespace) -> None:
    import uvicorn

    from api.app import create_app

    settings = _settings()
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(settings)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=settings.log_level.lower(),
        timeout_graceful_shutdown=10,
        proxy_headers=False,
        server_header=False,
    )


def _migrate(_: argparse.Namespace) -> None:
    from store.schema import upgrade

    logging.basicConfig(level="INFO", format="%(message)s")
    upgrade(_database_url_only())


def _seed_demo(_: argparse.Namespace) -> None:
    from store.db import Database
    from store.demo import seed_demo_catalog

    async def run() -> int:
        database = Database.connect(_database_url_only())
        try:
            return await seed_demo_catalog(database)
        finally:
            await database.dispose()

    changed = asyncio.run(run())
    print(f"demo catalog loaded ({changed} products added or changed)")


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``coatcheck`` console script."""
    parser = argparse.ArgumentParser(prog="coatcheck", description="Coatcheck MCP server")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the HTTP server")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    serve.set_defaults(run=_serve)
    commands.add_parser("migrate", help="alembic upgrade head against DATABASE_URL").set_defaults(run=_migrate)
    commands.add_parser("seed-demo", help="load the demo catalog (idempotent)").set_defaults(run=_seed_demo)
    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()
