"""The identity settings of resource-server mode: the issuer as written, extra audiences, introspection."""

import os
import secrets

import pytest

from api.settings import Settings, SettingsError

REQUIRED = {
    "DATABASE_URL": "postgresql://u@db:5432/coatcheck",
    "PUBLIC_URL": "https://coatcheck.example.com",
    "OIDC_ISSUER": "https://tenant.auth0.com/",
    "REQUEST_STATE_KEYS": secrets.token_urlsafe(32),
    "TOKEN_ENCRYPTION_KEYS": secrets.token_urlsafe(32),
    "OIDC_CLIENT_ID": "coatcheck-login",
    "OIDC_CLIENT_SECRET": secrets.token_urlsafe(32),
}
INTROSPECTION = ("OIDC_INTROSPECTION_CLIENT_ID", "OIDC_INTROSPECTION_CLIENT_SECRET", "OIDC_INTROSPECTION_URL")


@pytest.fixture(autouse=True)
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: os.PathLike[str]) -> None:
    for name in list(os.environ):
        if name.startswith("OIDC_") or name in REQUIRED:
            monkeypatch.delenv(name)
    for name, value in REQUIRED.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)  # no stray .env file


@pytest.mark.parametrize(
    "issuer",
    ["https://tenant.auth0.com/", "https://sso.example.com/realms/coatcheck", "https://login.example.com/t/v2.0"],
)
def test_the_issuer_is_kept_exactly_as_written_trailing_slash_included(
    monkeypatch: pytest.MonkeyPatch, issuer: str
) -> None:
    monkeypatch.setenv("OIDC_ISSUER", issuer)
    assert Settings.from_env().oidc_issuer == issuer


def test_extra_audiences_are_a_comma_separated_list_and_default_to_none(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings.from_env().oidc_extra_audiences == []
    monkeypatch.setenv("OIDC_EXTRA_AUDIENCES", "00000000-1111-2222-3333-444444444444, api://coatcheck")
    assert Settings.from_env().oidc_extra_audiences == ["00000000-1111-2222-3333-444444444444", "api://coatcheck"]


def test_mcp_scopes_default_to_openid_and_take_an_apis_scope(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings.from_env().mcp_scopes == ["openid"]
    monkeypatch.setenv("MCP_SCOPES", "api://00000000-1111-2222-3333-444444444444/mcp,offline_access")
    assert Settings.from_env().mcp_scopes == ["api://00000000-1111-2222-3333-444444444444/mcp", "offline_access"]


def test_introspection_is_off_without_its_client_and_on_with_both_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert not Settings.from_env().introspection_enabled
    monkeypatch.setenv("OIDC_INTROSPECTION_CLIENT_ID", "coatcheck-introspection")
    monkeypatch.setenv("OIDC_INTROSPECTION_CLIENT_SECRET", secrets.token_urlsafe(32))
    settings = Settings.from_env()
    assert settings.introspection_enabled
    assert settings.oidc_introspection_url is None  # from discovery
    assert settings.oidc_introspection_cache_seconds == 60


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (
            {"OIDC_INTROSPECTION_CLIENT_ID": "coatcheck-introspection"},
            "OIDC_INTROSPECTION_CLIENT_ID is set but OIDC_INTROSPECTION_CLIENT_SECRET is not",
        ),
        (
            {"OIDC_INTROSPECTION_CLIENT_SECRET": secrets.token_urlsafe(32)},
            "OIDC_INTROSPECTION_CLIENT_SECRET is set but OIDC_INTROSPECTION_CLIENT_ID is not",
        ),
        (
            {"OIDC_INTROSPECTION_URL": "https://idp.example.com/introspect"},
            "OIDC_INTROSPECTION_URL is set but OIDC_INTROSPECTION_CLIENT_ID and OIDC_INTROSPECTION_CLIENT_SECRET",
        ),
        (
            {"OIDC_INTROSPECTION_CLIENT_ID": "c", "OIDC_INTROSPECTION_CLIENT_SECRET": "changeme-changeme-changeme"},
            "OIDC_INTROSPECTION_CLIENT_SECRET looks like a placeholder",
        ),
        (
            {
                "OIDC_INTROSPECTION_CLIENT_ID": "c",
                "OIDC_INTROSPECTION_CLIENT_SECRET": secrets.token_urlsafe(32),
                "OIDC_INTROSPECTION_URL": "idp.example.com/introspect",
            },
            "OIDC_INTROSPECTION_URL must be an absolute http(s) URL",
        ),
        ({"OIDC_EXTRA_AUDIENCES": "api://a,has space"}, "OIDC_EXTRA_AUDIENCES: entry #2 contains whitespace"),
        ({"MCP_SCOPES": 'openid,"quoted"'}, "MCP_SCOPES: entry #2 is not a valid scope token"),
    ],
)
def test_incomplete_or_weak_introspection_settings_stop_start_up_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, given: dict[str, str], message: str
) -> None:
    for name, value in given.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as caught:
        Settings.from_env()
    assert message in str(caught.value)
    secret = given.get("OIDC_INTROSPECTION_CLIENT_SECRET")
    if secret is not None:
        assert secret not in str(caught.value)
