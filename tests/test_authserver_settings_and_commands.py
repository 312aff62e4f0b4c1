"""Authorization-server mode's settings at start-up, and the operator's ``coatcheck grants revoke``."""

import asyncio
import json
import os
import secrets
import uuid
from collections.abc import Callable

import pytest
from sqlalchemy import select

from api.settings import Settings, SettingsError
from store import authserver as store
from store.db import Database
from store.models import AuditEvent, table_of
from store.principal import Principal
from tests.support.commands import coatcheck

pytestmark = pytest.mark.sets_own_auth_mode

_audit = table_of(AuditEvent)
REQUIRED = {
    "DATABASE_URL": "postgresql://u@db:5432/coatcheck",
    "PUBLIC_URL": "https://coatcheck.example.com",
    "OIDC_ISSUER": "https://idp.example.com",
    "REQUEST_STATE_KEYS": secrets.token_urlsafe(32),
    "TOKEN_ENCRYPTION_KEYS": secrets.token_urlsafe(32),
    "OIDC_CLIENT_ID": "coatcheck-login",
    "OIDC_CLIENT_SECRET": secrets.token_urlsafe(32),
}


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for name in list(os.environ):
        if name in REQUIRED or name.startswith("AS_") or name == "AUTH_MODE":
            monkeypatch.delenv(name)
    for name, value in REQUIRED.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(os.path.dirname(__file__))  # no stray .env file
    return dict(REQUIRED)


def test_resource_server_mode_is_the_default_and_needs_no_signing_keys(env: dict[str, str]) -> None:
    settings = Settings.from_env()
    assert settings.auth_mode == "resource-server"
    assert settings.authorization_server_url == "https://idp.example.com"


def test_authorization_server_mode_without_signing_keys_stops_start_up_naming_the_variable(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTH_MODE", "authorization-server")
    with pytest.raises(SettingsError, match="AS_SIGNING_KEYS is not set"):
        Settings.from_env()


def test_a_weak_or_shared_signing_key_stops_start_up_without_echoing_it(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTH_MODE", "authorization-server")
    monkeypatch.setenv("AS_SIGNING_KEYS", "change-me-change-me-change-me-change-me")
    with pytest.raises(SettingsError, match="AS_SIGNING_KEYS: key #1 looks like a placeholder") as weak:
        Settings.from_env()
    assert "change-me" not in str(weak.value)
    monkeypatch.setenv("AS_SIGNING_KEYS", env["TOKEN_ENCRYPTION_KEYS"])
    with pytest.raises(SettingsError, match="AS_SIGNING_KEYS shares a key with another ring"):
        Settings.from_env()


def test_authorization_server_mode_names_coatcheck_as_the_issuer(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTH_MODE", "Authorization-Server")
    monkeypatch.setenv("AS_SIGNING_KEYS", secrets.token_urlsafe(32))
    settings = Settings.from_env()
    assert settings.auth_mode == "authorization-server"
    assert settings.authorization_server_url == "https://coatcheck.example.com"


@pytest.mark.parametrize(
    ("clients", "message"),
    [
        ("not json", "AS_CLIENTS is not valid JSON"),
        ('[{"redirect_uris": ["https://a.example/cb"]}]', "entry #1 needs a client_id"),
        ('[{"client_id": "a", "redirect_uris": ["http://a.example/cb"]}]', "neither https nor http on a loopback"),
        (
            '[{"client_id": "a", "redirect_uris": ["https://a.example/cb"], "client_secret_env": "NOPE"}]',
            "NOPE is not set",
        ),
        ('[{"client_id": "a", "redirect_uris": ["https://a.example/cb"], "colour": "red"}]', "unknown keys: colour"),
    ],
)
def test_a_bad_pre_registered_client_list_stops_start_up_naming_the_entry(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch, clients: str, message: str
) -> None:
    monkeypatch.delenv("NOPE", raising=False)
    monkeypatch.setenv("AS_CLIENTS", clients)
    with pytest.raises(SettingsError, match=message):
        Settings.from_env()


async def test_grants_revoke_revokes_a_users_grants_forgets_consent_and_audits_it_as_the_operator(
    database: Database, database_url: str, new_principal: Callable[[], Principal]
) -> None:
    owner, other = new_principal(), new_principal()
    client_id = f"client-{uuid.uuid4().hex[:8]}"
    async with database.transaction() as conn:
        grant = await store.create_grant(conn, owner, client_id=client_id, scopes=["mcp"], resource="https://x/mcp")
        untouched = await store.create_grant(conn, other, client_id=client_id, scopes=["mcp"], resource="https://x/mcp")
        await store.remember_consent(conn, owner, client_id, ["mcp"])
    who = ("--issuer", owner.issuer, "--subject", owner.subject, "--client", client_id)

    revoked = await asyncio.to_thread(coatcheck, "grants", "revoke", *who, env={"DATABASE_URL": database_url})
    by_id = await asyncio.to_thread(coatcheck, "grants", "revoke", "--grant", grant, env={"DATABASE_URL": database_url})
    neither = await asyncio.to_thread(coatcheck, "grants", "revoke", env={"DATABASE_URL": database_url})

    assert revoked.returncode == 0, revoked.stderr
    assert revoked.stdout.strip() == "revoked 1 grants"
    assert by_id.returncode == 1  # already revoked: nothing to do, and it says so
    assert "no live grant" in by_id.stderr
    assert neither.returncode == 2
    async with database.one_statement() as conn:
        assert await store.is_revoked(conn, grant)
        assert not await store.is_revoked(conn, untouched)
        assert await store.consented_scopes(conn, owner, client_id) is None
        trail = (
            await conn.execute(
                select(_audit.c.action, _audit.c.detail).where(
                    _audit.c.principal_iss == owner.issuer, _audit.c.principal_sub == owner.subject
                )
            )
        ).all()
    assert [tuple(row) for row in trail] == [("as_revoke", f"1 grants of client {client_id} by operator")]
    # The operator reads the same trail with `coatcheck audit`.
    read = await asyncio.to_thread(
        coatcheck,
        "audit",
        "--issuer",
        owner.issuer,
        "--subject",
        owner.subject,
        "--event",
        "as_revoke",
        "--format",
        "jsonl",
        env={"DATABASE_URL": database_url},
    )
    assert read.returncode == 0, read.stderr
    events = [json.loads(line) for line in read.stdout.splitlines()]
    assert [(e["action"], e["detail"]) for e in events] == [
        ("as_revoke", f"1 grants of client {client_id} by operator")
    ]
