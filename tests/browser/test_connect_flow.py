"""Connecting the "demo" provider end to end: the SDK client, the real dev IdP, headless Chromium, PostgreSQL.

The dev IdP plays both parts: the MCP authorization server (Coatcheck's browser sign-in uses it too) and the
third-party "demo" provider, a separate confidential client whose userinfo endpoint is the profile.
"""

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client import ClientRequestContext
from mcp.types import (
    CallToolResult,
    ElicitRequest,
    ElicitRequestParams,
    ElicitRequestURLParams,
    ElicitResult,
    InputRequiredResult,
)
from sqlalchemy import func, select, update

from api.oauth.browser_sessions import BrowserSessions
from api.oauth.session import CookieJar
from store.crypto import TokenCipher
from store.db import Database
from store.models import AuditEvent, OAuthFlow, ProviderConnection, table_of
from store.principal import Principal
from store.vault import TokenSet
from tests.support.auth_mode import McpTokens
from tests.support.browser import BrowserUser, BrowserUserFactory, Landing, LinkOpener
from tests.support.devidp import DEMO_CLIENT_ID, LOGIN_CLIENT_ID, DevIdP, devidp_clients, start_devidp
from tests.support.mcp_client import McpClientFactory, connect, text_of
from tests.support.mrtr import another_instance
from tests.support.server import RunningServer, run_server
from tests.support.vault import stored_tokens
from tests.support.waiting import free_port

WHOAMI = {"provider": "demo"}
KEY = "connect_demo"

_flows = table_of(OAuthFlow)
_connections = table_of(ProviderConnection)
_audit = table_of(AuditEvent)


def _fresh(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


async def _connect_in_browser(wire_mcp_client: McpClientFactory, person: BrowserUser) -> tuple[CallToolResult, Landing]:
    """``connection_whoami`` through the SDK's automatic loop, with ``person`` completing the link."""
    opener = LinkOpener(person)
    async with wire_mcp_client(person.username, elicitation_callback=opener) as client:
        result = await client.call_tool("connection_whoami", WHOAMI)
    return result, await opener.landing()


async def _round_one(client: Client) -> tuple[InputRequiredResult, str]:
    """Round 1 through the manual loop: the sealed state and the connect link."""
    first = await client.session.call_tool("connection_whoami", WHOAMI, allow_input_required=True)
    assert isinstance(first, InputRequiredResult), first
    assert first.input_requests is not None
    assert first.request_state is not None
    request = first.input_requests[KEY]
    assert isinstance(request, ElicitRequest)
    assert isinstance(request.params, ElicitRequestURLParams)
    return first, request.params.url


async def _retry(client: Client, previous: InputRequiredResult, action: str = "accept") -> Any:
    return await client.session.call_tool(
        "connection_whoami",
        WHOAMI,
        input_responses={KEY: ElicitResult(action=action)},  # type: ignore[arg-type]
        request_state=previous.request_state,
        allow_input_required=True,
    )


def _profile_subject(result: CallToolResult | InputRequiredResult) -> str:
    """The ``sub`` of the provider profile a finished ``connection_whoami`` returned."""
    assert isinstance(result, CallToolResult), result
    assert not result.is_error, text_of(result)
    assert result.structured_content is not None
    subject: str = result.structured_content["profile"]["sub"]
    return subject


async def _never_called(_context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
    raise AssertionError(f"unexpected elicitation {params!r}")


def _principal(devidp: DevIdP, username: str) -> Principal:
    return Principal(issuer=devidp.issuer, subject=username)


async def _stored_tokens(database: Database, keys: str, principal: Principal) -> TokenSet | None:
    """``principal``'s demo tokens, read with the server's ``TOKEN_ENCRYPTION_KEYS``."""
    return await stored_tokens(database, TokenCipher([key.encode() for key in keys.split(",")]), principal)


async def _audit_outcomes(database: Database, principal: Principal) -> list[tuple[str, str]]:
    async with database.one_statement() as conn:
        rows = await conn.execute(
            select(_audit.c.action, _audit.c.outcome)
            .where(_audit.c.principal_iss == principal.issuer, _audit.c.principal_sub == principal.subject)
            .order_by(_audit.c.id)
        )
        return [(action, outcome) for action, outcome in rows]


async def _flow_row(database: Database, handle: str) -> dict[str, Any]:
    async with database.one_statement() as conn:
        row = (await conn.execute(select(_flows).where(_flows.c.handle == handle))).mappings().one()
        return dict(row)


def _handle(url: str) -> str:
    return url.rsplit("/", 1)[-1]


@asynccontextmanager
async def _client_to(
    server: RunningServer, mcp_token: McpTokens, resource: str, username: str
) -> AsyncIterator[Client]:
    token = await mcp_token(username, resource=resource)
    async with connect(server.mcp_url, token, elicitation_callback=_never_called) as client:
        yield client


# --------------------------------------------------------------------------------------------------------------


async def test_alice_connects_demo_in_her_browser_and_the_retried_call_returns_her_profile(
    wire_mcp_client: McpClientFactory, browser_user: BrowserUserFactory, server: RunningServer, tmp_path: Path
) -> None:
    alice = await browser_user("alice")
    result, landing = await _connect_in_browser(wire_mcp_client, alice)

    assert not result.is_error, text_of(result)
    assert result.structured_content is not None
    assert result.structured_content["provider"] == "demo"
    assert result.structured_content["profile"]["sub"] == "alice"
    assert landing.url.startswith(f"{server.base_url}/oauth/callback?")
    assert landing.status == 200
    assert "Connected — return to your assistant" in landing.text
    assert alice.sign_ins == 1  # one sign-in at the IdP; the provider step rode on that IdP session
    # The page is inert and uncacheable, and says nothing secret.
    assert landing.headers["cache-control"] == "no-store"
    assert landing.headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in landing.headers["content-security-policy"]
    assert landing.headers["referrer-policy"] == "no-referrer"
    await landing.page.screenshot(path=tmp_path / "connected.png")  # looked at by a person once

    # Connected now: a later call answers at once, and the list shows the connection without tokens.
    async with wire_mcp_client("alice", elicitation_callback=_never_called) as client:
        again = await client.call_tool("connection_whoami", WHOAMI)
        listed = await client.call_tool("connection_list", {})
    assert _profile_subject(again) == "alice"
    assert listed.structured_content is not None
    (demo,) = listed.structured_content["connections"]
    assert demo["provider"] == "demo"
    assert demo["status"] == "connected"
    assert set(demo) == {"provider", "status", "scopes", "connected_at", "expires_at"}
    assert "openid" in demo["scopes"]
    assert demo["connected_at"]
    assert demo["expires_at"]


async def test_mallory_opening_alices_link_is_refused_and_nothing_is_stored_and_alice_can_still_use_it(
    wire_mcp_client: McpClientFactory,
    browser_user: BrowserUserFactory,
    database: Database,
    devidp: DevIdP,
    token_encryption_keys: str,
) -> None:
    alice_name = _fresh("alice")
    alice = _principal(devidp, alice_name)
    async with wire_mcp_client(alice_name, elicitation_callback=_never_called) as client:
        first, url = await _round_one(client)

        mallory = await browser_user(_fresh("mallory"))
        refused = await mallory.open(url)
        assert refused.status == 403
        assert "This link belongs to someone else" in refused.text
        assert refused.headers["cache-control"] == "no-store"
        assert 'coatcheck-session=""; HttpOnly; Max-Age=0' in refused.headers["set-cookie"]  # signed out
        # Nothing was stored or even started upstream: no provider state on the flow, no connection row.
        flow = await _flow_row(database, _handle(url))
        assert flow["status"] == "pending"
        assert flow["state_digest"] is None
        assert flow["secrets_enc"] is None
        assert await _stored_tokens(database, token_encryption_keys, alice) is None
        assert ("subject_mismatch", "refused") in await _audit_outcomes(database, alice)
        # Editing the link cannot make it anyone else's either: another handle is simply unknown.
        edited = await mallory.open(url[:-4] + "AAAA")
        assert edited.status == 404

        # The link still works for alice.
        person = await browser_user(alice_name)
        landing = await person.open(url)
        assert landing.status == 200, landing.text
        done = await _retry(client, first)
    assert _profile_subject(done) == alice_name


async def test_a_callback_replayed_with_its_used_state_is_refused_and_changes_nothing(
    wire_mcp_client: McpClientFactory, browser_user: BrowserUserFactory, server: RunningServer
) -> None:
    person = await browser_user(_fresh("replayer"))
    result, landing = await _connect_in_browser(wire_mcp_client, person)
    assert not result.is_error, text_of(result)
    (callback,) = landing.visited_path("/oauth/callback")

    replay = await person.open(callback)
    assert replay.status == 400
    assert "already used" in replay.text
    assert "Traceback" not in replay.html
    # Still connected as before.
    async with wire_mcp_client(person.username, elicitation_callback=_never_called) as client:
        again = await client.call_tool("connection_whoami", WHOAMI)
    assert not again.is_error, text_of(again)


async def test_a_callback_replayed_without_the_owners_session_is_refused_and_leaves_her_flow_usable(
    wire_mcp_client: McpClientFactory,
    browser_user: BrowserUserFactory,
    database: Database,
    devidp: DevIdP,
    token_encryption_keys: str,
) -> None:
    """Whoever learns the callback URL (a proxy log, a shoulder) replays it first, with no cookie or their own."""
    alice_name = _fresh("owner")
    alice = await browser_user(alice_name)
    await devidp.set_authorization_fault("hold", client_id=DEMO_CLIENT_ID)  # alice pauses at the provider
    try:
        async with wire_mcp_client(alice_name, elicitation_callback=_never_called) as client:
            first, url = await _round_one(client)
            at_provider = await alice.open(url)
            assert at_provider.url.startswith(f"{devidp.issuer}/auth?")
            callback = f"{_base(url)}/oauth/callback"
            replay = {"code": "stolen-or-made-up", "state": httpx2.URL(at_provider.url).params["state"]}

            jar = CookieJar(
                [key.encode() for key in token_encryption_keys.split(",")],
                secure=False,
                session_seconds=900,
                login_seconds=600,
            )
            # Mallory signed in on her own (a real, live browser session), then replays alice's callback.
            mallory_user = Principal(issuer=devidp.issuer, subject=_fresh("mallory"))
            mallory = await BrowserSessions(jar, database).start(mallory_user)
            async with httpx2.AsyncClient(timeout=15.0, follow_redirects=False) as attacker:
                cookieless = await attacker.get(callback, params=replay)
            signed_in = {mallory.key: mallory.value or ""}
            async with httpx2.AsyncClient(timeout=15.0, follow_redirects=False, cookies=signed_in) as attacker:
                wrong_user = await attacker.get(callback, params=replay)
            for refused in (cookieless, wrong_user):
                assert refused.status_code == 403, refused.text
                assert "This link belongs to someone else" in refused.text
            flow = await _flow_row(database, _handle(url))
            assert (flow["status"], flow["state_consumed_at"], flow["error"]) == ("pending", None, None)
            assert flow["secrets_enc"] is not None  # the PKCE verifier is still there for the real callback
            assert ("subject_mismatch", "refused") in await _audit_outcomes(database, _principal(devidp, alice_name))

            await devidp.set_authorization_fault("ok")
            landing = await alice.open(at_provider.url)  # alice carries on at the provider
            assert landing.status == 200, landing.text
            assert "Connected" in landing.text
            done = await _retry(client, first)
    finally:
        await devidp.set_authorization_fault("ok")
    assert _profile_subject(done) == alice_name


async def test_an_expired_flow_stops_link_callback_and_retry_with_clear_messages(
    wire_mcp_client: McpClientFactory, browser_user: BrowserUserFactory, database: Database, devidp: DevIdP
) -> None:
    username = _fresh("slowpoke")
    person = await browser_user(username)
    await devidp.set_authorization_fault("hold", client_id=DEMO_CLIENT_ID)  # the user walks away at the provider
    async with wire_mcp_client(username, elicitation_callback=_never_called) as client:
        first, url = await _round_one(client)
        at_provider = await person.open(url)
        assert at_provider.url.startswith(f"{devidp.issuer}/auth?")
        state = httpx2.URL(at_provider.url).params["state"]
        async with database.one_statement() as conn:
            await conn.execute(
                update(_flows)
                .where(_flows.c.handle == _handle(url))
                .values(expires_at=func.now() - timedelta(seconds=1))
            )

        late = await person.open(f"{_base(url)}/oauth/callback?code=whatever&state={state}")
        assert late.status == 400
        assert "expired" in late.text
        stale_link = await person.open(url)
        assert stale_link.status == 404
        retried = await _retry(client, first)
    assert isinstance(retried, CallToolResult)
    assert retried.is_error
    assert "expired" in text_of(retried)
    assert "connection_whoami again" in text_of(retried)


async def test_a_provider_that_denies_access_ends_the_flow_as_denied(
    wire_mcp_client: McpClientFactory, browser_user: BrowserUserFactory, database: Database, devidp: DevIdP
) -> None:
    username = _fresh("refuser")
    person = await browser_user(username)
    await devidp.set_authorization_fault("deny", client_id=DEMO_CLIENT_ID)  # the user clicks "no" at the provider
    async with wire_mcp_client(username, elicitation_callback=_never_called) as client:
        first, url = await _round_one(client)
        landing = await person.open(url)
        retried = await _retry(client, first)

    assert landing.status == 403
    assert "Demo provider was not connected" in landing.text
    assert isinstance(retried, CallToolResult)
    assert retried.is_error
    assert "access was not granted" in text_of(retried)
    assert (await _flow_row(database, _handle(url)))["status"] == "denied"
    assert ("connect", "denied") in await _audit_outcomes(database, _principal(devidp, username))


async def test_a_failing_code_exchange_ends_the_flow_as_failed_with_a_readable_page(
    wire_mcp_client: McpClientFactory, browser_user: BrowserUserFactory, database: Database, devidp: DevIdP
) -> None:
    username = _fresh("unlucky")
    person = await browser_user(username)
    async with wire_mcp_client(username, elicitation_callback=_never_called) as client:
        first, url = await _round_one(client)
        # Sign in to Coatcheck first (that uses the IdP's token endpoint too) and stop at the provider...
        await devidp.set_authorization_fault("hold", client_id=DEMO_CLIENT_ID)
        await person.open(url)
        await devidp.set_authorization_fault("ok")
        # ...then open the link again with the provider's token endpoint refusing every code.
        await devidp.set_fault("error")
        try:
            landing = await person.open(url)
        finally:
            await devidp.set_fault("ok")
        retried = await _retry(client, first)

    assert landing.status == 400
    assert "Connecting Demo provider failed" in landing.text
    assert "Traceback" not in landing.html
    assert isinstance(retried, CallToolResult)
    assert retried.is_error
    assert "did not complete (invalid_grant)" in text_of(retried)
    assert (await _flow_row(database, _handle(url)))["status"] == "failed"


async def test_a_retry_while_the_user_is_still_in_the_browser_waits_then_asks_again_with_the_same_link(
    server_env: dict[str, str],
    public_url: str,
    mcp_token: McpTokens,
    browser_user: BrowserUserFactory,
    database: Database,
    server: RunningServer,
) -> None:
    username = _fresh("dawdler")
    with another_instance(server_env, public_url=public_url, CONNECT_WAIT_SECONDS="1") as quick:
        async with _client_to(quick, mcp_token, server.mcp_url, username) as client:
            first, url = await _round_one(client)
            started = asyncio.get_running_loop().time()
            pending = await _retry(client, first)
            waited = asyncio.get_running_loop().time() - started
            assert isinstance(pending, InputRequiredResult), pending
            assert pending.input_requests is not None
            request = pending.input_requests[KEY]
            assert isinstance(request, ElicitRequest)
            assert isinstance(request.params, ElicitRequestURLParams)
            assert request.params.url == url  # the same flow, not a second one
            assert "Still waiting" in request.params.message
            assert waited >= 1.0

            landing = await (await browser_user(username)).open(url)
            assert landing.status == 200
            done = await _retry(client, pending)
    assert isinstance(done, CallToolResult)
    assert not done.is_error, done
    async with database.one_statement() as conn:
        flows = (
            await conn.execute(select(func.count()).select_from(_flows).where(_flows.c.principal_sub == username))
        ).scalar_one()
    assert flows == 1


async def test_no_token_or_code_appears_in_logs_tool_results_or_pages(
    wire_mcp_client: McpClientFactory,
    browser_user: BrowserUserFactory,
    database: Database,
    devidp: DevIdP,
    server: RunningServer,
    token_encryption_keys: str,
) -> None:
    person = await browser_user(_fresh("quiet"))
    result, landing = await _connect_in_browser(wire_mcp_client, person)
    (callback,) = landing.visited_path("/oauth/callback")
    code = httpx2.URL(callback).params["code"]
    state = httpx2.URL(callback).params["state"]
    async with wire_mcp_client(person.username, elicitation_callback=_never_called) as client:
        listed = await client.call_tool("connection_list", {})
        again = await client.call_tool("connection_whoami", WHOAMI)
    tokens = await _stored_tokens(database, token_encryption_keys, _principal(devidp, person.username))
    assert tokens is not None
    assert tokens.refresh_token is not None

    secrets = {"access token": tokens.access_token, "refresh token": tokens.refresh_token, "code": code, "state": state}
    places = {
        "server log": server.log_text_so_far(),
        "dev IdP log": devidp.log_text(),
        "tool results": json.dumps([r.model_dump(mode="json") for r in (result, listed, again)]),
        "connected page": landing.html,
    }
    for what, value in secrets.items():
        for where, text in places.items():
            assert value not in text, f"{what} found in {where}"
    assert "/oauth/callback?[redacted]" in server.log_text()  # the access log keeps the path, drops the query


async def test_two_instances_refreshing_an_expired_token_at_once_reach_the_provider_exactly_once(
    wire_mcp_client: McpClientFactory,
    browser_user: BrowserUserFactory,
    database: Database,
    devidp: DevIdP,
    mcp_token: McpTokens,
    server: RunningServer,
    server_env: dict[str, str],
    public_url: str,
) -> None:
    person = await browser_user(_fresh("racer"))
    result, _ = await _connect_in_browser(wire_mcp_client, person)
    assert not result.is_error, text_of(result)
    with another_instance(server_env, public_url=public_url) as second:
        async with database.one_statement() as conn:
            await conn.execute(
                update(_connections)
                .where(_connections.c.principal_sub == person.username)
                .values(expires_at=func.now() - timedelta(minutes=1))
            )
        await devidp.reset_stats()
        async with (
            _client_to(server, mcp_token, server.mcp_url, person.username) as one,
            _client_to(second, mcp_token, server.mcp_url, person.username) as two,
        ):
            results = await asyncio.gather(
                one.call_tool("connection_whoami", WHOAMI), two.call_tool("connection_whoami", WHOAMI)
            )
    stats = await devidp.stats()
    assert stats["refresh_requests"] == 1, stats
    for outcome in results:
        assert _profile_subject(outcome) == person.username
    assert ("refresh", "ok") in await _audit_outcomes(database, _principal(devidp, person.username))


async def test_disconnect_revokes_upstream_forgets_locally_and_is_idempotent(
    wire_mcp_client: McpClientFactory,
    browser_user: BrowserUserFactory,
    database: Database,
    devidp: DevIdP,
    token_encryption_keys: str,
    oauth_client_secrets: dict[str, str],
) -> None:
    person = await browser_user(_fresh("leaver"))
    result, _ = await _connect_in_browser(wire_mcp_client, person)
    assert not result.is_error, text_of(result)
    principal = _principal(devidp, person.username)
    tokens = await _stored_tokens(database, token_encryption_keys, principal)
    assert tokens is not None
    assert tokens.refresh_token is not None
    before = (await devidp.stats())["revocations"]

    async with wire_mcp_client(person.username, elicitation_callback=_never_called) as client:
        first = await client.call_tool("connection_disconnect", WHOAMI)
        second = await client.call_tool("connection_disconnect", WHOAMI)
        listed = await client.call_tool("connection_list", {})

    assert first.structured_content == {"provider": "demo", "was_connected": True, "upstream_revocation": "revoked"}
    assert second.structured_content == {
        "provider": "demo",
        "was_connected": False,
        "upstream_revocation": "nothing_to_revoke",
    }
    assert (await devidp.stats())["revocations"] >= before + 1
    assert await _stored_tokens(database, token_encryption_keys, principal) is None
    assert listed.structured_content is not None
    assert listed.structured_content["connections"][0]["status"] == "not_connected"
    # The refresh token is dead at the provider too.
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(10.0)) as http:
        refused = await http.post(
            f"{devidp.issuer}/token",
            data={"grant_type": "refresh_token", "refresh_token": tokens.refresh_token},
            auth=(DEMO_CLIENT_ID, oauth_client_secrets[DEMO_CLIENT_ID]),
        )
    assert refused.status_code == 400
    assert refused.json()["error"] == "invalid_grant"
    outcomes = await _audit_outcomes(database, principal)
    assert ("disconnect", "revoked") in outcomes
    assert ("disconnect", "not_connected") in outcomes


async def test_a_token_copied_into_another_users_row_does_not_open_and_a_new_first_key_still_reads_old_rows(
    wire_mcp_client: McpClientFactory,
    browser_user: BrowserUserFactory,
    database: Database,
    mcp_token: McpTokens,
    server: RunningServer,
    server_env: dict[str, str],
    public_url: str,
    token_encryption_keys: str,
) -> None:
    victim = await browser_user(_fresh("victim"))
    thief = await browser_user(_fresh("thief"))
    for person in (victim, thief):
        result, _ = await _connect_in_browser(wire_mcp_client, person)
        assert not result.is_error, text_of(result)

    # Rotation: an instance whose ring has a new first key still reads rows sealed under the old one.
    new_first = ",".join([uuid.uuid4().hex + uuid.uuid4().hex, token_encryption_keys])
    with another_instance(server_env, public_url=public_url, TOKEN_ENCRYPTION_KEYS=new_first) as rotated:
        async with _client_to(rotated, mcp_token, server.mcp_url, victim.username) as client:
            read = await client.call_tool("connection_whoami", WHOAMI)
    assert _profile_subject(read) == victim.username

    # A ciphertext moved into another row is bound to its own row and principal: it does not open there.
    async with database.transaction() as conn:
        stolen = (
            await conn.execute(
                select(_connections.c.access_token_enc).where(_connections.c.principal_sub == victim.username)
            )
        ).scalar_one()
        await conn.execute(
            update(_connections).where(_connections.c.principal_sub == thief.username).values(access_token_enc=stolen)
        )
    async with wire_mcp_client(thief.username, elicitation_callback=_never_called) as client:
        moved = await client.call_tool("connection_whoami", WHOAMI)
    assert moved.is_error
    assert "cannot be read" in text_of(moved)
    assert victim.username not in text_of(moved)


def _base(url: str) -> str:
    parsed = httpx2.URL(url)
    return f"{parsed.scheme}://{parsed.netloc.decode()}"


@pytest.fixture(autouse=True)
async def _faults_are_off(devidp: DevIdP) -> AsyncIterator[None]:
    yield
    await devidp.set_fault("ok")
    await devidp.set_authorization_fault("ok")


async def test_the_compose_shape_works_browser_and_server_reach_the_idp_under_different_names(
    database_url: str,
    request_state_keys: str,
    token_encryption_keys: str,
    oauth_client_secrets: dict[str, str],
    browser_user: BrowserUserFactory,
) -> None:
    # As in compose.yaml: the browser knows the IdP as localhost, the server as another name (here 127.0.0.1),
    # so the login uses OIDC_ISSUER_INTERNAL_URL and the provider has explicit endpoints.
    idp_port, app_port = free_port(), free_port()
    public, internal = f"http://localhost:{idp_port}", f"http://127.0.0.1:{idp_port}"
    app_url = f"http://127.0.0.1:{app_port}"
    providers = {
        "demo": {
            "display_name": "Demo provider",
            "issuer": public,
            "authorization_endpoint": f"{public}/auth",
            "token_endpoint": f"{internal}/token",
            "userinfo_endpoint": f"{internal}/me",
            "revocation_endpoint": f"{internal}/token/revocation",
            "client_id": DEMO_CLIENT_ID,
            "client_secret_env": "DEMO_CLIENT_SECRET",
            "scopes": ["openid", "profile", "email"],
        }
    }
    clients = devidp_clients(app_url, oauth_client_secrets)
    with (
        start_devidp(
            port=idp_port, resources=[f"{app_url}/mcp"], clients=clients, env={"DEVIDP_ISSUER": public}
        ) as idp,
        run_server(
            {
                "DATABASE_URL": database_url,
                "OIDC_ISSUER": public,
                "OIDC_ISSUER_INTERNAL_URL": internal,
                "REQUEST_STATE_KEYS": request_state_keys,
                "TOKEN_ENCRYPTION_KEYS": token_encryption_keys,
                "OIDC_CLIENT_ID": LOGIN_CLIENT_ID,
                "OIDC_CLIENT_SECRET": oauth_client_secrets[LOGIN_CLIENT_ID],
                "PROVIDERS": json.dumps(providers),
                "DEMO_CLIENT_SECRET": oauth_client_secrets[DEMO_CLIENT_ID],
            },
            port=app_port,
            public_url=app_url,
        ) as app,
    ):
        person = await browser_user(_fresh("composer"))
        opener = LinkOpener(person)
        token = await idp.token(person.username, resource=app.mcp_url)
        async with connect(app.mcp_url, token, elicitation_callback=opener) as client:
            result = await client.call_tool("connection_whoami", WHOAMI)
        landing = await opener.landing()
        sign_in_hosts = {httpx2.URL(url).host for url in landing.visited if "/interaction/" in url}
    assert landing.status == 200, landing.text
    assert sign_in_hosts == {"localhost"}
    assert _profile_subject(result) == person.username
