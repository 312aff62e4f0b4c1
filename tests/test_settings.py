"""Start-up configuration: required settings, weak secrets, and the error text an operator sees."""

import os
import secrets
import subprocess
import sys

import pytest

from api.settings import DatabaseSettings, RetentionSettings, Settings, SettingsError, VaultKeySettings

GOOD_KEY = secrets.token_urlsafe(32)
REQUIRED = {
    "DATABASE_URL": "postgresql://u@db:5432/coatcheck",
    "PUBLIC_URL": "http://localhost:8000/",
    "OIDC_ISSUER": "http://localhost:9400",
    "REQUEST_STATE_KEYS": GOOD_KEY,
    "TOKEN_ENCRYPTION_KEYS": secrets.token_urlsafe(32),
    "OIDC_CLIENT_ID": "coatcheck-login",
    "OIDC_CLIENT_SECRET": secrets.token_urlsafe(32),
}


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for name in list(os.environ):
        if name in REQUIRED or name in {"ALLOWED_HOSTS", "ALLOWED_ORIGINS"}:
            monkeypatch.delenv(name)
    for name, value in REQUIRED.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(os.path.dirname(__file__))  # no stray .env file
    return dict(REQUIRED)


def test_the_four_required_settings_are_enough_and_urls_are_normalised(env: dict[str, str]) -> None:
    settings = Settings.from_env()
    assert settings.database_url == "postgresql+asyncpg://u@db:5432/coatcheck"
    assert settings.public_url == "http://localhost:8000"
    assert settings.mcp_resource_url == "http://localhost:8000/mcp"
    assert settings.state_key_ring == [GOOD_KEY.encode()]
    assert settings.request_state_ttl_seconds == 600


def test_comma_separated_lists_are_split(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALLOWED_HOSTS", "mcp.example.com, proxy.internal:8443")
    monkeypatch.setenv("REQUEST_STATE_KEYS", f"{GOOD_KEY},{secrets.token_urlsafe(40)}")
    settings = Settings.from_env()
    assert settings.allowed_hosts == ["mcp.example.com", "proxy.internal:8443"]
    assert len(settings.state_key_ring) == 2


@pytest.mark.parametrize("missing", sorted(REQUIRED))
def test_a_missing_required_setting_is_named(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    monkeypatch.delenv(missing)
    with pytest.raises(SettingsError, match=f"{missing} is not set"):
        Settings.from_env()


@pytest.mark.parametrize(
    ("keys", "complaint"),
    [
        ("too-short-but-random-x7Qz", "key #1 is shorter than 32 bytes"),
        ("a" * 40, "key #1 looks like a placeholder"),
        ("change-me-change-me-change-me-change-me", "key #1 looks like a placeholder"),
        (f"{GOOD_KEY},short", "key #2 is shorter than 32 bytes"),
        (f"{GOOD_KEY},{GOOD_KEY}", "lists the same key twice"),
        (" , ", "is empty"),
    ],
)
def test_a_weak_request_state_key_stops_start_up_without_echoing_it(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch, keys: str, complaint: str
) -> None:
    monkeypatch.setenv("REQUEST_STATE_KEYS", keys)
    with pytest.raises(SettingsError) as caught:
        Settings.from_env()
    message = str(caught.value)
    assert "REQUEST_STATE_KEYS" in message
    assert complaint in message
    for key in keys.split(","):
        if len(key.strip()) > 8:
            assert key.strip() not in message


@pytest.mark.parametrize("variable", ["REQUEST_STATE_KEYS", "TOKEN_ENCRYPTION_KEYS"])
@pytest.mark.parametrize(
    "weak",
    ["abcdefghij" * 4, "correcthorsebatterystaple-correct", "ThisIsMyVeryLongSigningKeyForCoatcheck2026!"],
    ids=["repeated-pattern", "passphrase", "camel-case-words"],
)
def test_a_guessable_key_in_either_ring_stops_start_up_without_echoing_it(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch, variable: str, weak: str
) -> None:
    monkeypatch.setenv(variable, f"{secrets.token_urlsafe(32)},{weak}")
    with pytest.raises(SettingsError) as caught:
        Settings.from_env()
    message = str(caught.value)
    assert f"{variable}: key #2 is too guessable" in message
    assert "128 needed" in message
    assert weak not in message
    assert weak[:12] not in message


def test_keys_from_the_standard_generators_are_accepted(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    generated = [secrets.token_urlsafe(32), secrets.token_hex(32), secrets.token_urlsafe(48)]
    monkeypatch.setenv("REQUEST_STATE_KEYS", ",".join(generated))
    assert Settings.from_env().state_key_ring == [key.encode() for key in generated]


def test_the_same_key_in_both_rings_stops_start_up_naming_both_positions(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = secrets.token_urlsafe(32)
    monkeypatch.setenv("REQUEST_STATE_KEYS", f"{secrets.token_urlsafe(32)},{shared}")
    monkeypatch.setenv("TOKEN_ENCRYPTION_KEYS", shared)
    with pytest.raises(SettingsError) as caught:
        Settings.from_env()
    message = str(caught.value)
    assert "TOKEN_ENCRYPTION_KEYS: key #1 is also REQUEST_STATE_KEYS key #2" in message
    assert shared not in message
    assert shared[-16:] not in message


@pytest.mark.parametrize("weak", ["coatcheck-login-client-password", "abcdefghij" * 4])
def test_a_guessable_oidc_client_secret_stops_start_up_without_echoing_it(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch, weak: str
) -> None:
    monkeypatch.setenv("OIDC_CLIENT_SECRET", weak)
    with pytest.raises(SettingsError) as caught:
        Settings.from_env()
    assert "OIDC_CLIENT_SECRET" in str(caught.value)
    assert weak not in str(caught.value)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DATABASE_URL", "mysql://u@db/coatcheck"),
        ("PUBLIC_URL", "localhost:8000"),
        ("PUBLIC_URL", "https://example.com/?x=1"),
        ("OIDC_ISSUER", "not a url"),
    ],
)
def test_a_malformed_url_is_named(env: dict[str, str], monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError, match=name):
        Settings.from_env()


def test_serve_exits_with_a_message_naming_the_variable_when_a_secret_is_missing(env: dict[str, str]) -> None:
    child_env = {k: v for k, v in os.environ.items() if k != "REQUEST_STATE_KEYS"}
    result = subprocess.run(
        [sys.executable, "-m", "api.cli", "serve", "--port", "1"],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "REQUEST_STATE_KEYS is not set" in result.stderr


def test_the_pool_is_fixed_size_with_a_bounded_wait_and_direct_mode_by_default(env: dict[str, str]) -> None:
    settings = Settings.from_env()
    assert (settings.db_pool_size, settings.db_max_overflow, settings.db_pool_timeout_seconds) == (10, 0, 5.0)
    assert (settings.db_statement_timeout_ms, settings.db_lock_timeout_ms) == (15000, 5000)
    assert settings.db_pooler_mode == "none"


def test_db_pooler_mode_accepts_transaction_and_refuses_anything_else(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DB_POOLER_MODE", " Transaction ")
    assert Settings.from_env().db_pooler_mode == "transaction"
    monkeypatch.setenv("DB_POOLER_MODE", "session")
    with pytest.raises(SettingsError, match="DB_POOLER_MODE: Input should be 'none' or 'transaction'"):
        Settings.from_env()


@pytest.mark.parametrize("lock_timeout", ["15000", "20000"])
def test_a_lock_timeout_not_below_the_statement_timeout_stops_start_up_naming_both(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch, lock_timeout: str
) -> None:
    monkeypatch.setenv("DB_STATEMENT_TIMEOUT_MS", "15000")
    monkeypatch.setenv("DB_LOCK_TIMEOUT_MS", lock_timeout)
    with pytest.raises(SettingsError, match=r"DB_LOCK_TIMEOUT_MS \(\d+\) must be below DB_STATEMENT_TIMEOUT_MS"):
        Settings.from_env()


def test_each_key_ring_is_checked_once_when_the_settings_load(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import api.settings

    checked: list[str] = []
    check = api.settings.check_secret_ring

    def counting(name: str, raw: str) -> list[bytes]:
        checked.append(name)
        return check(name, raw)

    monkeypatch.setattr(api.settings, "check_secret_ring", counting)
    settings = Settings.from_env()
    for _ in range(3):
        assert settings.state_key_ring == [GOOD_KEY.encode()]
        assert settings.token_key_ring == [env["TOKEN_ENCRYPTION_KEYS"].encode()]
    assert sorted(checked) == ["REQUEST_STATE_KEYS", "TOKEN_ENCRYPTION_KEYS"]


def test_the_database_settings_need_only_database_url_and_name_a_bad_one(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in env:
        if name != "DATABASE_URL":
            monkeypatch.delenv(name)
    assert DatabaseSettings.from_env().database_url == "postgresql+asyncpg://u@db:5432/coatcheck"
    assert RetentionSettings.from_env().audit_retention_days == 90
    monkeypatch.setenv("DATABASE_URL", "mysql://u@db/c")
    with pytest.raises(SettingsError, match="DATABASE_URL must be a postgresql://"):
        DatabaseSettings.from_env()


def test_the_vault_key_settings_refuse_a_weak_ring_without_the_server_secrets(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REQUEST_STATE_KEYS")
    monkeypatch.delenv("OIDC_CLIENT_SECRET")
    assert VaultKeySettings.from_env().token_key_ring == [env["TOKEN_ENCRYPTION_KEYS"].encode()]
    monkeypatch.setenv("TOKEN_ENCRYPTION_KEYS", "short-key")
    with pytest.raises(SettingsError) as caught:
        VaultKeySettings.from_env()
    assert "TOKEN_ENCRYPTION_KEYS: key #1 is shorter than 32 bytes" in str(caught.value)
    assert "short-key" not in str(caught.value)


def test_providers_are_read_once_at_start_up_with_their_client_secret_from_the_named_variable(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = secrets.token_urlsafe(24)
    monkeypatch.setenv("ACME_CLIENT_SECRET", secret)
    monkeypatch.setenv(
        "PROVIDERS",
        '{"acme": {"issuer": "https://idp.example.com", "client_id": "coatcheck", '
        '"client_secret_env": "ACME_CLIENT_SECRET", "scopes": ["openid"]}}',
    )
    settings = Settings.from_env()
    monkeypatch.delenv("ACME_CLIENT_SECRET")  # nothing reads the environment after start-up
    (acme,) = settings.provider_configs
    assert acme.name == "acme"
    assert acme.client_secret is not None
    assert acme.client_secret.get_secret_value() == secret


def test_both_provider_sources_at_once_stop_start_up(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: "os.PathLike[str]"
) -> None:
    path = os.path.join(tmp_path, "providers.json")
    with open(path, "w") as file:
        file.write("{}")
    monkeypatch.setenv("PROVIDERS_FILE", path)
    monkeypatch.setenv("PROVIDERS", "{}")
    with pytest.raises(SettingsError, match="set PROVIDERS_FILE or PROVIDERS, not both"):
        Settings.from_env()


@pytest.mark.parametrize(
    "origin",
    ["https://*.example.com", "https://app.example.com:443", "http://app.example.com:80", "https://u@app.example.com"],
)
def test_a_cors_origin_that_no_browser_would_send_stops_start_up(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch, origin: str
) -> None:
    monkeypatch.setenv("CORS_ALLOWED_ORIGINS", origin)
    with pytest.raises(SettingsError, match="CORS_ALLOWED_ORIGINS: entry #1 is not an origin"):
        Settings.from_env()


def test_cors_origins_are_kept_in_the_form_browsers_send(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORS_ALLOWED_ORIGINS", "HTTPS://App.Example.com, http://localhost:5173")
    assert Settings.from_env().cors_allowed_origins == ["https://app.example.com", "http://localhost:5173"]
