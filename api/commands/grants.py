"""``coatcheck grants revoke``: end what users authorised MCP clients to do (authorization-server mode).

Revokes one grant (``--grant``) or every live grant of one user (``--issuer`` and ``--subject``, optionally
``--client``), forgets the user's remembered consent for those clients, and audits each revocation under
the user with detail ``operator``. Every replica refuses the grants' access tokens within a second (the
``coatcheck_grant_revoked`` notification); their refresh tokens stop working at once. Needs only the
database (``DATABASE_URL``), not the server's secrets.
"""

import argparse
import sys

from api.commands.runner import load_settings, run_with_database
from api.settings import DatabaseSettings
from store import authserver as store
from store.audit import AuditRepository
from store.db import Database
from store.principal import Principal

ACTOR = "operator"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Which grants to revoke: one by id, or a user's (optionally one client's)."""
    parser.add_argument("--grant", help="one grant id (grt_…), as `coatcheck audit` or the database names it")
    parser.add_argument("--issuer", help="the user's upstream issuer (OIDC_ISSUER)")
    parser.add_argument("--subject", help="the user's upstream subject")
    parser.add_argument("--client", help="only this client_id (with --issuer and --subject)")


async def _revoke(database: Database, args: argparse.Namespace) -> int:
    async with database.transaction() as conn:
        audit = AuditRepository(conn)
        if args.grant:
            revoked = await store.revoke_grant(conn, args.grant, "operator")
            if revoked is None:
                print("no live grant with that id; nothing done", file=sys.stderr)
                return 1
            await audit.record(
                revoked.principal,
                "as_revoke",
                provider=None,
                outcome="revoked",
                detail=f"client {revoked.client_id} by {ACTOR}",
            )
            print(f"revoked 1 grant of client {revoked.client_id}")
            return 0
        principal = Principal(issuer=args.issuer, subject=args.subject)
        ids = await store.revoke_grants_of(conn, principal, client_id=args.client, reason="operator")
        if args.client is not None:
            await store.forget_consent(conn, principal, args.client)
        await audit.record(
            principal,
            "as_revoke",
            provider=None,
            outcome="revoked",
            detail=f"{len(ids)} grants{'' if args.client is None else f' of client {args.client}'} by {ACTOR}",
        )
    print(f"revoked {len(ids)} grants")
    return 0


def run(args: argparse.Namespace) -> int:
    """Revoke; exit 2 on bad arguments, 1 when ``--grant`` named no live grant, else 0."""
    if bool(args.grant) == bool(args.issuer or args.subject):
        print("coatcheck grants revoke: give --grant, or --issuer and --subject", file=sys.stderr)
        return 2
    if not args.grant and not (args.issuer and args.subject):
        print("coatcheck grants revoke: --issuer and --subject go together", file=sys.stderr)
        return 2
    return run_with_database(load_settings(DatabaseSettings), lambda database: _revoke(database, args))
