"""A deployment on real processes: 3 ``coatcheck serve`` replicas behind HAProxy, PgBouncer in front of PostgreSQL.

Migrations go straight to PostgreSQL (the scratch database is built by ``alembic upgrade head`` on a direct
connection); the replicas reach it only through PgBouncer in transaction-pooling mode with
``DB_POOLER_MODE=transaction`` (PgBouncer 1.18 does not track prepared statements). A dev IdP of its own
knows the balancer's URL as the public one, so the browser sign-in and the provider callbacks go through
HAProxy too.
"""

import asyncio
import secrets
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from store.db import Database
from store.demo import seed_demo_catalog
from tests.browser.conftest import browser_user, chromium  # noqa: F401  (fixtures for the connect step)
from tests.conftest import DEMO_CLIENT_ID, LOGIN_CLIENT_ID, demo_provider_config, devidp_clients
from tests.support import figures
from tests.support.devidp import DevIdP, start_devidp
from tests.support.haproxy import HAPROXY, Balancer, start_haproxy
from tests.support.pgbouncer import PGBOUNCER, RunningPgBouncer, run_pgbouncer
from tests.support.replicas import Replica
from tests.support.scratch import scratch_database
from tests.support.waiting import free_port

REPLICAS = ("r1", "r2", "r3")
DRAIN_SECONDS = 2.0  # several HAProxy check intervals (200 ms, fall 2)
POOL_SIZE, MAX_OVERFLOW = 5, 0  # per replica: 3 x 5 client connections share PgBouncer's server pool
BOUNCER_POOL = 5

def note(line: str) -> None:
    """A line for the "replicas behind HAProxy and PgBouncer" section of the terminal summary."""
    figures.note("Replicas behind HAProxy and PgBouncer (issue 11)", line)


@dataclass
class Deployment:
    """The running parts, for tests to drive and inspect."""

    balancer: Balancer
    bouncer: RunningPgBouncer
    idp: DevIdP
    replicas: dict[str, Replica]
    database_url: str  # direct, for the test's own checks

    @property
    def mcp_url(self) -> str:
        return f"{self.balancer.url}/mcp"

    def wait_all_up(self) -> None:
        for name in self.replicas:
            self.balancer.wait_for(name, "UP")

    async def tokens(self, prefix: str, count: int) -> list[str]:
        return [await self.idp.token(f"{prefix}-{n}", resource=self.mcp_url) for n in range(count)]


def _seed(url: str) -> None:
    async def run() -> None:
        database = Database.connect(url)
        try:
            await seed_demo_catalog(database)
        finally:
            await database.dispose()

    asyncio.run(run())


@pytest.fixture(scope="module")
def deployment(admin_database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    for binary in (HAPROXY, Path(PGBOUNCER)):
        if not binary.exists():
            pytest.fail(f"{binary} is missing: run .ci/system-packages (installs Debian's haproxy and pgbouncer)")
    assert shutil.which("node"), "the dev IdP needs Node.js"
    log_dir = tmp_path_factory.mktemp("replicas")
    replicas = {name: Replica(name, log_dir, port=free_port()) for name in REPLICAS}
    client_secrets = {LOGIN_CLIENT_ID: secrets.token_urlsafe(32), DEMO_CLIENT_ID: secrets.token_urlsafe(32)}
    with (
        scratch_database(admin_database_url) as database_url,
        run_pgbouncer(database_url, pool_size=BOUNCER_POOL) as bouncer,
        start_haproxy({name: r.port for name, r in replicas.items()}) as balancer,
    ):
        _seed(database_url)
        public_url = balancer.url
        clients = devidp_clients(public_url, client_secrets)
        with start_devidp(port=free_port(), resources=[f"{public_url}/mcp"], clients=clients) as idp:
            env = {
                "DATABASE_URL": bouncer.url,
                "DB_POOLER_MODE": "transaction",
                "PUBLIC_URL": public_url,
                "OIDC_ISSUER": idp.issuer,
                # One key ring for every replica: any of them opens what another sealed.
                "REQUEST_STATE_KEYS": secrets.token_urlsafe(32),
                "TOKEN_ENCRYPTION_KEYS": secrets.token_urlsafe(32),
                "OIDC_CLIENT_ID": LOGIN_CLIENT_ID,
                "OIDC_CLIENT_SECRET": client_secrets[LOGIN_CLIENT_ID],
                "PROVIDERS": demo_provider_config(idp.issuer),
                "DEMO_CLIENT_SECRET": client_secrets[DEMO_CLIENT_ID],
                "SHUTDOWN_DRAIN_SECONDS": str(DRAIN_SECONDS),
                "FORWARDED_ALLOW_IPS": "127.0.0.1",  # HAProxy's X-Forwarded-For names the client
                "DB_POOL_SIZE": str(POOL_SIZE),
                "DB_MAX_OVERFLOW": str(MAX_OVERFLOW),
            }
            for replica in replicas.values():
                replica.configure(env)
            try:
                with ThreadPoolExecutor(len(replicas)) as pool:
                    list(pool.map(Replica.start, replicas.values()))
                deployment = Deployment(balancer, bouncer, idp, replicas, database_url)
                deployment.wait_all_up()
                yield deployment
            finally:
                for replica in replicas.values():
                    replica.ensure_stopped()
