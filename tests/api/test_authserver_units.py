"""Pieces of authorization-server mode on their own: resource-server mode is untouched by default, the
signing ring rotates with overlap, and the revoked-grant set follows the database within moments."""

import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta

import httpx2
import pytest
from sqlalchemy import event, text

from api.authserver.keys import SigningKeys
from api.authserver.revocation import RevokedGrants
from api.authserver.verifier import AuthorizationServerTokenVerifier
from store import authserver as store
from store.db import Database
from store.principal import Principal
from tests.support.authserver import authorization_server_env
from tests.support.devidp import DevIdP
from tests.support.inprocess import settings_from, started_app
from tests.support.scratch import scratch_database
from tests.support.waiting import eventually

pytestmark = pytest.mark.sets_own_auth_mode

ISSUER = "https://coatcheck.test"
RESOURCE = f"{ISSUER}/mcp"
OLD, NEW = b"old-signing-secret-" + b"o" * 20 + b"-0123456789", b"new-signing-secret-" + b"n" * 20 + b"-9876543210"


@pytest.mark.resource_server_only(reason="the session app in the default mode")
async def test_by_default_the_server_is_a_resource_server_with_no_authorization_endpoints(
    app_http: httpx2.AsyncClient, devidp: DevIdP
) -> None:
    prm = (await app_http.get("/.well-known/oauth-protected-resource/mcp")).json()
    assert prm["authorization_servers"] == [devidp.issuer]
    assert prm["scopes_supported"] == ["openid"]
    for path in ("/.well-known/oauth-authorization-server", "/.well-known/jwks.json", "/authorize", "/oauth/consent"):
        assert (await app_http.get(path)).status_code == 404, path


def _claims(grant_id: str, **changes: object) -> dict[str, object]:
    now = int(time.time())
    return {
        "iss": ISSUER,
        "aud": RESOURCE,
        "sub": "ann",
        "upstream_iss": "https://idp.test",
        "client_id": "c",
        "scope": "mcp",
        "gid": grant_id,
        "iat": now,
        "exp": now + 300,
        **changes,
    }


async def test_after_a_rotation_tokens_of_the_old_key_still_verify_and_the_jwks_lists_both(
    database: Database, database_url: str, new_principal: Callable[[], Principal]
) -> None:
    async with database.one_statement() as conn:
        grant = await store.create_grant(conn, new_principal(), client_id="c", scopes=["mcp"], resource=RESOURCE)
    revoked = RevokedGrants(database, database_url, window=timedelta(minutes=5), listen=False)
    before, during, after = SigningKeys([OLD]), SigningKeys([NEW, OLD]), SigningKeys([NEW])
    old_token = before.sign(_claims(grant))

    def verifier(keys: SigningKeys) -> AuthorizationServerTokenVerifier:
        return AuthorizationServerTokenVerifier(keys, issuer=ISSUER, resource=RESOURCE, revoked=revoked, leeway=0)

    verified = await verifier(during).verify_token(old_token)
    assert verified is not None
    assert verified.subject == "ann"
    assert verified.claims == {"iss": "https://idp.test", "gid": grant}  # the upstream principal
    assert during.current_kid != before.current_kid
    assert {key["kid"] for key in during.jwks()["keys"]} == {before.current_kid, after.current_kid}
    assert await verifier(during).verify_token(during.sign(_claims(grant))) is not None
    assert await verifier(after).verify_token(old_token) is None  # the old key is gone: its tokens too
    for wrong in ({"aud": "https://other.test/mcp"}, {"iss": "https://idp.test"}, {"exp": int(time.time()) - 5}):
        assert await verifier(during).verify_token(during.sign(_claims(grant, **wrong))) is None, wrong


async def test_the_revoked_set_hears_a_revocation_at_once_and_without_listening_asks_the_database(
    database: Database, database_url: str, new_principal: Callable[[], Principal]
) -> None:
    async with database.one_statement() as conn:
        grant = await store.create_grant(conn, new_principal(), client_id="c", scopes=["mcp"], resource=RESOURCE)
    listening = RevokedGrants(database, database_url, window=timedelta(minutes=5))
    asking = RevokedGrants(database, database_url, window=timedelta(minutes=5), listen=False)
    await listening.start()
    try:

        async def connected() -> bool:
            return listening.listening

        await eventually(connected, within=10, what="the revocation listener to connect")
        assert not await listening.is_revoked(grant)
        assert not await asking.is_revoked(grant)
        async with database.one_statement() as conn:
            await store.revoke_grant(conn, grant, "test")
        started = time.monotonic()

        async def heard() -> bool:
            return await listening.is_revoked(grant)

        await eventually(heard, within=1.0, what="the notification of the revocation", interval=0.005)
        assert time.monotonic() - started < 1.0
        assert await asking.is_revoked(grant)
        assert await asking.is_revoked(f"grt_{uuid.uuid4().hex}")  # unknown grants fail closed
    finally:
        await listening.stop()


@pytest.fixture
def own_database_url(admin_database_url: str) -> Iterator[str]:
    """A database of its own: the bound counts every registration of the deployment in the last minute."""
    with scratch_database(admin_database_url, prefix="coatcheck_dcr") as url:
        yield url


async def test_dynamic_registration_is_bounded_per_minute_across_the_deployment(
    own_database_url: str, server_env: dict[str, str]
) -> None:
    env = {**authorization_server_env(server_env), "DATABASE_URL": own_database_url, "AS_REGISTRATIONS_PER_MINUTE": "3"}
    async with started_app(settings_from(env)) as app, app.http(timeout=10) as http:
        answers = [await http.post("/register", json={"redirect_uris": [f"http://127.0.0.1:{n}/cb"]}) for n in range(4)]
    assert [answer.status_code for answer in answers] == [201, 201, 201, 400]
    assert answers[3].json()["error"] == "invalid_client_metadata"
    assert "too many clients registered in the last minute" in answers[3].json()["error_description"]


async def test_while_listening_a_token_check_costs_no_database_statement_and_without_it_one(
    database: Database, database_url: str, new_principal: Callable[[], Principal]
) -> None:
    async with database.one_statement() as conn:
        grant = await store.create_grant(conn, new_principal(), client_id="c", scopes=["mcp"], resource=RESOURCE)
    keys = SigningKeys([NEW])
    token = keys.sign(_claims(grant))
    listening = RevokedGrants(database, database_url, window=timedelta(minutes=5))
    asking = RevokedGrants(database, database_url, window=timedelta(minutes=5), listen=False)
    statements: list[str] = []

    def count(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        statements.append(statement)

    await listening.start()
    try:

        async def connected() -> bool:
            return listening.listening

        await eventually(connected, within=10, what="the revocation listener to connect")
        event.listen(database.sync_engine, "before_cursor_execute", count)
        try:
            for revoked in (listening, asking):
                verifier = AuthorizationServerTokenVerifier(
                    keys, issuer=ISSUER, resource=RESOURCE, revoked=revoked, leeway=0
                )
                assert await verifier.verify_token(token) is not None
                assert len(statements) == (0 if revoked is listening else 1)
                statements.clear()
        finally:
            event.remove(database.sync_engine, "before_cursor_execute", count)
    finally:
        await listening.stop()


async def test_a_revocation_while_the_listener_connection_is_killed_is_still_seen_within_a_second(
    database: Database, database_url: str, new_principal: Callable[[], Principal]
) -> None:
    async with database.one_statement() as conn:
        grant = await store.create_grant(conn, new_principal(), client_id="c", scopes=["mcp"], resource=RESOURCE)
    listening = RevokedGrants(database, database_url, window=timedelta(minutes=5))
    await listening.start()
    try:

        async def connected() -> bool:
            return listening.listening

        await eventually(connected, within=10, what="the revocation listener to connect")
        killed = listening.backend_pid
        async with database.one_statement() as conn:  # what a database restart or failover does to it
            await conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": killed})
            await store.revoke_grant(conn, grant, "test")
        started = time.monotonic()

        async def refused() -> bool:
            return await listening.is_revoked(grant)

        await eventually(refused, within=1.0, what="the revocation to be seen", interval=0.005)
        assert time.monotonic() - started < 1.0

        async def reconnected() -> bool:
            return listening.listening and listening.backend_pid != killed

        await eventually(reconnected, within=10, what="the listener to reconnect")
        assert await listening.is_revoked(grant)  # the reloaded set has it
    finally:
        await listening.stop()


async def test_with_metadata_documents_turned_off_the_metadata_says_so_and_a_document_client_id_is_refused(
    server_env: dict[str, str],
) -> None:
    # Where Coatcheck cannot reach a client's https host, advertising documents only makes such clients
    # (Claude Code among them) name one Coatcheck then fails to fetch; turned off, they register instead.
    env = {**authorization_server_env(server_env), "AS_CIMD_ENABLED": "false"}
    async with started_app(settings_from(env)) as app, app.http(timeout=10) as http:
        metadata = (await http.get("/.well-known/oauth-authorization-server")).json()
        refused = await http.get(
            "/authorize",
            params={
                "response_type": "code",
                "client_id": "https://client.example/oauth/metadata.json",
                "redirect_uri": "http://localhost:4321/callback",
                "code_challenge": "c" * 43,
                "code_challenge_method": "S256",
            },
        )
        registered = await http.post("/register", json={"redirect_uris": ["http://localhost:4321/callback"]})
    assert metadata["client_id_metadata_document_supported"] is False
    assert metadata["registration_endpoint"].endswith("/register")
    assert refused.status_code == 400
    assert refused.json()["error"] == "invalid_request"
    assert "does not accept client metadata documents (AS_CIMD_ENABLED=false)" in refused.json()["error_description"]
    assert registered.status_code == 201


async def test_a_loopback_redirect_uri_matches_at_any_port_and_every_other_part_must_match_exactly(
    server_env: dict[str, str],
) -> None:
    # RFC 8252 §7.3: a native client (Claude Code: http://localhost:<a free port>/callback) learns its port
    # only when it starts listening, so a loopback redirect URI must match at any port.
    env = authorization_server_env(server_env)
    async with started_app(settings_from(env)) as app, app.http(timeout=10) as http:
        registered = await http.post(
            "/register",
            json={"redirect_uris": ["http://localhost:4321/callback", "https://app.example/cb"]},
        )
        assert registered.status_code == 201, registered.text
        client_id = registered.json()["client_id"]

        async def authorize(redirect_uri: str) -> httpx2.Response:
            return await http.get(
                "/authorize",
                params={
                    "response_type": "code",
                    "client_id": client_id,
                    "redirect_uri": redirect_uri,
                    "code_challenge": "c" * 43,
                    "code_challenge_method": "S256",
                    "state": "s",
                },
            )

        answers = {
            uri: await authorize(uri)
            for uri in (
                "http://localhost:4321/callback",
                "http://localhost:53757/callback",
                "http://127.0.0.1:53757/callback",
                "http://localhost:53757/other",
                "http://localhost:53757/callback?x=1",
                "https://app.example:8443/cb",
            )
        }
    consent = f"{app.base_url}/oauth/consent?"
    for uri in ("http://localhost:4321/callback", "http://localhost:53757/callback"):
        assert answers[uri].status_code == 302, (uri, answers[uri].text)
        assert answers[uri].headers["location"].startswith(consent), uri
    for uri in (
        "http://127.0.0.1:53757/callback",
        "http://localhost:53757/other",
        "http://localhost:53757/callback?x=1",
        "https://app.example:8443/cb",
    ):
        assert answers[uri].status_code == 400, (uri, answers[uri].text)
        assert answers[uri].json()["error"] == "invalid_request", uri
        assert "not registered for client" in answers[uri].json()["error_description"], uri
