"""``coatcheck keys rotate`` end to end: a real process re-encrypts every stored token under the newest key."""

import asyncio
import os
import secrets
import subprocess
import sys
import tempfile
from datetime import timedelta

from store.crypto import TokenCipher
from store.db import Database
from store.flows import FlowRepository
from store.principal import Principal
from store.vault import TokenSet, VaultRepository
from tests.support.scratch import scratch_database

OLD = secrets.token_urlsafe(32)
NEW = secrets.token_urlsafe(32)
OWNERS = [Principal("https://issuer.test", f"rotating-{n}") for n in range(3)]


def _rotate(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in {"TOKEN_ENCRYPTION_KEYS", "DATABASE_URL"}}
    return subprocess.run(
        [sys.executable, "-m", "api.cli", "keys", "rotate"],
        env={**base, **env},
        cwd=tempfile.gettempdir(),  # no .env file there: only the variables given here count
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def _write_under_old_key(url: str) -> str:
    database = Database.connect(url)
    try:
        old = TokenCipher([OLD.encode()])
        async with database.transaction() as conn:
            for n, owner in enumerate(OWNERS):
                tokens = TokenSet(
                    access_token=f"at-{n}-SECRET", refresh_token=f"rt-{n}-SECRET", expires_at=None, scopes=()
                )
                await VaultRepository(conn, old).save(owner, "demo", tokens)
            flows = FlowRepository(conn, old)
            flow = await flows.begin(OWNERS[0], "demo", ttl=timedelta(minutes=10))
            await flows.attach_provider_state(
                flow.handle, state="state-SECRET", code_verifier="pkce-SECRET", nonce=None
            )
        return flow.handle
    finally:
        await database.dispose()


async def _read_with_new_key_only(url: str) -> tuple[list[tuple[str, str | None]], str]:
    database = Database.connect(url)
    try:
        new = TokenCipher([NEW.encode()])
        async with database.transaction() as conn:
            tokens = []
            for owner in OWNERS:
                locked = await VaultRepository(conn, new).read(owner, "demo")
                assert locked is not None
                tokens.append((locked.tokens.access_token, locked.tokens.refresh_token))
            consumed = await FlowRepository(conn, new).consume_state("state-SECRET")
            assert consumed is not None
        return tokens, consumed.code_verifier
    finally:
        await database.dispose()


def test_keys_rotate_reencrypts_every_token_and_flow_secret_so_the_new_key_alone_reads_them(
    admin_database_url: str,
) -> None:
    """First without the old key (nothing opens: exit 1), then with [new, old], then once more (nothing left)."""
    with scratch_database(admin_database_url) as url:
        asyncio.run(_write_under_old_key(url))

        premature = _rotate({"DATABASE_URL": url, "TOKEN_ENCRYPTION_KEYS": NEW})
        assert premature.returncode == 1
        assert "re-encrypted 0 rows" in premature.stdout
        assert "4 rows are sealed under keys not in TOKEN_ENCRYPTION_KEYS" in premature.stderr

        env = {"DATABASE_URL": url, "TOKEN_ENCRYPTION_KEYS": f"{NEW},{OLD}"}
        first = _rotate(env)
        assert first.returncode == 0, first.stderr
        assert "re-encrypted 4 rows" in first.stdout
        again = _rotate(env)
        assert again.returncode == 0, again.stderr
        assert "re-encrypted 0 rows" in again.stdout

        tokens, verifier = asyncio.run(_read_with_new_key_only(url))
    assert tokens == [(f"at-{n}-SECRET", f"rt-{n}-SECRET") for n in range(3)]
    assert verifier == "pkce-SECRET"
    for run in (premature, first, again):
        for output in (run.stdout, run.stderr):
            assert "SECRET" not in output
            assert NEW not in output
            assert OLD not in output


def test_keys_rotate_refuses_a_weak_or_missing_key_ring_without_echoing_it() -> None:
    weak = _rotate({"DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none", "TOKEN_ENCRYPTION_KEYS": "short-key"})
    assert weak.returncode == 2
    assert "TOKEN_ENCRYPTION_KEYS: key #1 is shorter than 32 bytes" in weak.stderr
    assert "short-key" not in weak.stderr
    missing = _rotate({"DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"})
    assert missing.returncode == 2
    assert "TOKEN_ENCRYPTION_KEYS is not set" in missing.stderr
