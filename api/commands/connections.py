"""``coatcheck connections revoke``: end one user's connections for them (revoke upstream, forget, audit).

It runs the same code path as the ``connection_disconnect`` tool (``Connections.disconnect``): the stored
tokens are deleted, then revoked at the provider's revocation endpoint (RFC 7009, refresh token first),
and each step is audited under the user's principal with detail ``operator``.
"""

import argparse
import sys

import httpx2

from api.commands.runner import run_with_database
from api.database import database_from
from api.settings import Settings
from store.db import Database
from store.errors import DecryptError
from store.principal import Principal
from store.vault import VaultRepository

ACTOR = "operator"
_EXPLAIN = {
    "revoked": "revoked at the provider and forgotten",
    "not_supported": "forgotten (the provider has no revocation endpoint)",
    "failed": "forgotten, but revoking at the provider FAILED (revoke it there by hand)",
    "nothing_to_revoke": "was not connected",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The principal (and optionally one provider) whose connections to revoke."""
    parser.add_argument("--issuer", required=True, help="the user's issuer (OIDC_ISSUER of their MCP tokens)")
    parser.add_argument("--subject", required=True, help="the user's subject (sub)")
    parser.add_argument("--provider", help="only this provider (default: every provider the user is connected to)")


async def _revoke(settings: Settings, database: Database, principal: Principal, only: str | None) -> int:
    # Imported here: the connection service brings authlib and Litestar, which `coatcheck --help` and the
    # other commands (this module registers its arguments for all of them) should not pay for.
    from api.oauth.setup import build_connections

    http = httpx2.AsyncClient(timeout=httpx2.Timeout(10.0), follow_redirects=False)
    try:
        connections = build_connections(settings, database, http)
        registry = connections.registry
        if only is not None:
            names = [only]
        else:
            async with database.one_statement() as conn:
                names = [info.provider for info in await VaultRepository(conn, connections.cipher).list(principal)]
            if not names:
                print("no stored connections for this user")
                return 0
        status = 0
        for name in names:
            provider = registry.get(name)
            if provider is None:
                print(f"{name}: not a configured provider; nothing done", file=sys.stderr)
                status = 1
                continue
            try:
                outcome = await connections.disconnect(principal, provider, by=ACTOR)
            except DecryptError:
                print(
                    f"{name}: the stored tokens do not open with TOKEN_ENCRYPTION_KEYS; nothing done", file=sys.stderr
                )
                status = 1
                continue
            print(f"{name}: {_EXPLAIN[outcome.revocation]}")
            if outcome.revocation == "failed":
                status = 1
        return status
    finally:
        await http.aclose()


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Revoke and forget; exit 1 if any provider could not be revoked or is unknown, else 0."""
    principal = Principal(issuer=args.issuer, subject=args.subject)
    # The server's pool settings and DB_POOLER_MODE: this runs the server's own disconnect path.
    return run_with_database(
        settings, lambda database: _revoke(settings, database, principal, args.provider), open_database=database_from
    )
