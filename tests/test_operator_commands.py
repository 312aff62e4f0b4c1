"""The operator's command line, run as real processes against real databases and the real dev IdP:
``coatcheck migrate --check``, ``coatcheck audit`` and ``coatcheck connections revoke``."""

import asyncio
import json
import re
import subprocess
import textwrap
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, update

from api.cli import main as cli_main
from store.audit import AuditRepository
from store.crypto import TokenCipher
from store.db import Database
from store.migrations import downgrade, upgrade
from store.models import AuditEvent, table_of
from store.principal import Principal
from store.vault import TokenSet, VaultRepository
from tests.support.commands import coatcheck, coatcheck_python
from tests.support.devidp import DEMO_CLIENT_ID, DevIdP
from tests.support.leaks import assert_no_secrets
from tests.support.oauth import demo_provider_tokens, token_request
from tests.support.scratch import scratch_database
from tests.support.waiting import free_port

_audit = table_of(AuditEvent)
PREVIOUS_REVISION = "a1b2c3d40002"


# --- start-up -----------------------------------------------------------------------------------------------


def test_an_operator_command_loads_no_server_code() -> None:
    # Operator commands (migrate --check as a deploy gate, purge from cron) should not pay for the MCP SDK,
    # Litestar or the app: well over a second of imports per run on these machines.
    probe = textwrap.dedent(
        """
        import sys
        from api.cli import main
        try:
            main(["migrate", "--check"])
        except SystemExit:
            pass
        print(sorted(name for name in ("api.app", "mcp", "litestar", "uvicorn") if name in sys.modules))
        """
    )
    unreachable = f"postgresql://operator@127.0.0.1:{free_port()}/nowhere"
    done = coatcheck_python(probe, env={"DATABASE_URL": unreachable})
    assert "cannot read the schema revision" in done.stderr  # the command ran to its end
    assert done.stdout.strip() == "[]"


# --- migrate --check ------------------------------------------------------------------------------------------


def test_migrate_check_passes_at_head_fails_on_an_older_schema_and_changes_nothing(admin_database_url: str) -> None:
    with scratch_database(admin_database_url) as url:
        at_head = coatcheck("migrate", "--check", env={"DATABASE_URL": url})
        downgrade(url, PREVIOUS_REVISION)
        behind = coatcheck("migrate", "--check", env={"DATABASE_URL": url})
        still_behind = coatcheck("migrate", "--check", env={"DATABASE_URL": url})  # --check did not migrate
        upgrade(url)
        again = coatcheck("migrate", "--check", env={"DATABASE_URL": url})

    assert at_head.returncode == 0, at_head.stderr
    assert at_head.stdout.startswith("schema at head (")
    assert behind.returncode == 1
    assert f"database at {PREVIOUS_REVISION}" in behind.stderr
    assert "this code expects" in behind.stderr
    assert still_behind.returncode == 1
    assert again.returncode == 0


def test_migrate_check_on_an_unreachable_database_exits_2_without_echoing_the_url() -> None:
    url = f"postgresql://operator:hunter2-secret@127.0.0.1:{free_port()}/nowhere"
    result = coatcheck("migrate", "--check", env={"DATABASE_URL": url})
    assert result.returncode == 2
    assert "cannot read the schema revision" in result.stderr
    assert "hunter2" not in result.stderr + result.stdout


# --- audit ----------------------------------------------------------------------------------------------------


async def _write_events(url: str, alice: Principal, bob: Principal) -> None:
    database = Database.connect(url)
    try:
        async with database.transaction() as conn:
            audit = AuditRepository(conn)
            await audit.record(alice, "connect", provider="demo", outcome="requested")
            await audit.record(alice, "connect", provider="demo", outcome="connected")
            await audit.record(alice, "refresh", provider="demo", outcome="ok")
            await audit.record(bob, "connect", provider="demo", outcome="requested")
            await audit.record(alice, "disconnect", provider="demo", outcome="revoked", detail="operator")
            # The first event happened long ago.
            first = (await conn.execute(select(_audit.c.id).order_by(_audit.c.id).limit(1))).scalar_one()
            await conn.execute(
                update(_audit).where(_audit.c.id == first).values(created_at=datetime(2026, 1, 1, tzinfo=UTC))
            )
    finally:
        await database.dispose()


def test_audit_filters_by_subject_event_and_time_and_prints_json_lines_or_a_table(
    admin_database_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    alice = Principal("https://idp.example", "alice")
    bob = Principal("https://idp.example", "bob")
    with scratch_database(admin_database_url) as url:
        asyncio.run(_write_events(url, alice, bob))
        monkeypatch.setenv("DATABASE_URL", url)
        monkeypatch.chdir(tmp_path)  # no .env file here

        def audit(*argv: str) -> subprocess.CompletedProcess[str]:
            # In process (a subprocess per query would only add start-up time); the same main() as the script.
            capsys.readouterr()
            try:
                cli_main(["audit", *argv])
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else 1
            else:
                code = 0
            out, err = capsys.readouterr()
            return subprocess.CompletedProcess(["audit", *argv], code, out, err)

        everyone = audit("--format", "jsonl")
        alices = audit("--subject", "alice", "--issuer", alice.issuer, "--format", "jsonl")
        connects = audit("--subject", "alice", "--event", "connect", "--format", "jsonl")
        recent = audit("--subject", "alice", "--since", "2026-06-01", "--format", "jsonl")
        old = audit("--until", "1d", "--format", "jsonl")
        table = audit("--subject", "alice", "--event", "disconnect")
        nobody = audit("--subject", "carol")
        bad_time = audit("--since", "yesterday-ish")

    def events(result: subprocess.CompletedProcess[str]) -> list[dict[str, object]]:
        assert result.returncode == 0, result.stderr
        return [json.loads(line) for line in result.stdout.splitlines()]

    assert len(events(everyone)) == 5
    assert [(e["action"], e["outcome"]) for e in events(alices)] == [
        ("connect", "requested"),
        ("connect", "connected"),
        ("refresh", "ok"),
        ("disconnect", "revoked"),
    ]
    assert {e["subject"] for e in events(alices)} == {"alice"}
    assert [e["outcome"] for e in events(connects)] == ["requested", "connected"]
    assert [e["outcome"] for e in events(recent)] == ["connected", "ok", "revoked"]
    (first,) = events(old)
    assert first["created_at"] == "2026-01-01T00:00:00+00:00"
    assert set(first) == {"id", "created_at", "issuer", "subject", "action", "provider", "outcome", "detail"}
    header, row = table.stdout.splitlines()
    assert header.split() == ["created_at", "issuer", "subject", "action", "provider", "outcome", "detail"]
    assert row.split()[2:] == ["https://idp.example", "alice", "disconnect", "demo", "revoked", "operator"]
    assert nobody.returncode == 0
    assert [line.split() for line in nobody.stdout.splitlines()] == [header.split()]  # the header only
    assert "no audit events match" in nobody.stderr
    assert bad_time.returncode == 2
    assert "is not an ISO 8601 time" in bad_time.stderr


HOSTILE_SUBJECT = (
    "mallory\n2026-01-01 00:00:00  https://idp.example  alice  disconnect\x1b]0;owned\x07\x1b[2J\x9b31m\u2028"
)
_RAW_CONTROLS = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")


async def _record_hostile_event(url: str, principal: Principal) -> None:
    database = Database.connect(url)
    try:
        async with database.transaction() as conn:
            await AuditRepository(conn).record(principal, "connect", provider="demo", outcome="requested")
    finally:
        await database.dispose()


def test_audit_prints_a_stored_subject_with_control_characters_escaped_in_both_formats(database_url: str) -> None:
    principal = Principal(f"https://hostile-{uuid.uuid4().hex[:8]}.example", HOSTILE_SUBJECT)
    asyncio.run(_record_hostile_event(database_url, principal))
    env = {"DATABASE_URL": database_url}
    table = coatcheck("audit", "--issuer", principal.issuer, env=env)
    jsonl = coatcheck("audit", "--issuer", principal.issuer, "--format", "jsonl", env=env)
    assert table.returncode == jsonl.returncode == 0, table.stderr + jsonl.stderr
    for output in (table.stdout, jsonl.stdout):
        assert _RAW_CONTROLS.search(output) is None  # nothing reaches the terminal as a control
    header, row = table.stdout.splitlines()  # one event, one row: the newline forged none
    assert header.startswith("created_at")
    assert "mallory\\n2026-01-01" in row
    assert "\\x1b]0;owned\\x07\\x1b[2J\\x9b31m\\u2028" in row
    (line,) = jsonl.stdout.splitlines()
    assert json.loads(line)["subject"] == HOSTILE_SUBJECT  # escaped, yet the same value


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["--since", "99999999999d"], "--since"),
        (["--since", "999999999d"], "--since"),
        (["--since", "0001-01-01T00:00:00+14:00"], "--since"),
        (["--until", "9999-12-31T23:59:59-14:00"], "--until"),
        (["--limit", "99999999999999999999999"], "--limit"),
        (["--limit", "0"], "--limit"),
        (["--limit", "9" * 5000], "--limit"),
    ],
)
def test_audit_arguments_out_of_range_are_refused_in_one_sentence_with_exit_2(
    database_url: str, argv: list[str], names: str
) -> None:
    result = coatcheck("audit", *argv, env={"DATABASE_URL": database_url})
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"coatcheck audit: error: argument {names}: ")
    assert len(last) < 200


@pytest.mark.parametrize("command", [["audit"], ["connections", "revoke", "--issuer", "https://i", "--subject", "s"]])
def test_a_command_on_an_unreachable_database_says_so_in_one_sentence_with_exit_2_and_no_password(
    server_env: dict[str, str], command: list[str]
) -> None:
    url = f"postgresql://operator:hunter2-secret@127.0.0.1:{free_port()}/nowhere"
    result = coatcheck(*command, env={**server_env, "DATABASE_URL": url})
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip() == f"coatcheck: cannot use the database at {url.rsplit('@', 1)[1]}: connection refused"
    assert "hunter2" not in result.stderr + result.stdout


# --- connections revoke ---------------------------------------------------------------------------------------


async def _connect_for_real(
    devidp: DevIdP, public_url: str, secret: str, database: Database, keys: str, principal: Principal
) -> TokenSet:
    """Real tokens from the dev IdP's "demo" client (the code flow, without a browser), stored as a connection."""
    issued = await asyncio.to_thread(demo_provider_tokens, devidp, public_url, secret, principal.subject)
    tokens = TokenSet(
        access_token=issued["access_token"],
        refresh_token=issued["refresh_token"],
        expires_at=datetime.now(UTC) + timedelta(minutes=5),
        scopes=("openid", "profile", "email"),
    )
    async with database.transaction() as conn:
        await VaultRepository(conn, TokenCipher([k.encode() for k in keys.split(",")])).save(principal, "demo", tokens)
    return tokens


async def test_connections_revoke_revokes_upstream_forgets_the_tokens_and_audits_it_as_the_operator(
    devidp: DevIdP,
    database: Database,
    server_env: dict[str, str],
    public_url: str,
    token_encryption_keys: str,
    oauth_client_secrets: dict[str, str],
) -> None:
    principal = Principal(devidp.issuer, f"leaving-{uuid.uuid4().hex[:8]}")
    tokens = await _connect_for_real(
        devidp, public_url, oauth_client_secrets[DEMO_CLIENT_ID], database, token_encryption_keys, principal
    )
    before = (await devidp.stats())["revocations"]
    who = ("--issuer", principal.issuer, "--subject", principal.subject)

    revoked = await asyncio.to_thread(coatcheck, "connections", "revoke", *who, env=server_env)
    again = await asyncio.to_thread(coatcheck, "connections", "revoke", *who, env=server_env)
    named = await asyncio.to_thread(coatcheck, "connections", "revoke", *who, "--provider", "demo", env=server_env)
    unknown = await asyncio.to_thread(coatcheck, "connections", "revoke", *who, "--provider", "nope", env=server_env)

    assert revoked.returncode == 0, revoked.stderr
    assert revoked.stdout.strip() == "demo: revoked at the provider and forgotten"
    assert again.returncode == 0
    assert again.stdout.strip() == "no stored connections for this user"
    assert named.returncode == 0
    assert named.stdout.strip() == "demo: was not connected"
    assert unknown.returncode == 1
    assert "nope: not a configured provider" in unknown.stderr
    # Upstream: both tokens revoked, the refresh token no longer works.
    assert (await devidp.stats())["revocations"] >= before + 2
    refused = await asyncio.to_thread(
        token_request,
        devidp,
        {"grant_type": "refresh_token", "refresh_token": str(tokens.refresh_token)},
        (DEMO_CLIENT_ID, oauth_client_secrets[DEMO_CLIENT_ID]),
    )
    assert refused.status_code == 400
    assert refused.json()["error"] == "invalid_grant"
    # Locally: nothing stored; the audit trail says the operator did it.
    async with database.one_statement() as conn:
        assert await VaultRepository(conn, TokenCipher([b"x" * 32])).list(principal) == []
        rows = await conn.execute(
            select(_audit.c.action, _audit.c.outcome, _audit.c.detail)
            .where(_audit.c.principal_iss == principal.issuer, _audit.c.principal_sub == principal.subject)
            .order_by(_audit.c.id)
        )
        trail = [tuple(row) for row in rows]
    assert trail == [("disconnect", "revoked", "operator"), ("disconnect", "not_connected", "operator")]
    for run in (revoked, again, named, unknown):
        assert_no_secrets(run.stdout + run.stderr, [tokens.access_token, str(tokens.refresh_token)])
