"""The upstream sign-in settings of authorization-server mode (``UPSTREAM_KIND``, ``UPSTREAM_*``) at start-up,
and how a plain OAuth 2.0 provider's user-info answer becomes the subject."""

import os
import secrets

import pytest

from api.oauth.login import LoginFailed
from api.oauth.userinfo_login import subject_of
from api.settings import Settings, SettingsError

BASE = {
    "DATABASE_URL": "postgresql://u@db:5432/coatcheck",
    "PUBLIC_URL": "https://coatcheck.example.com",
    "REQUEST_STATE_KEYS": secrets.token_urlsafe(32),
    "TOKEN_ENCRYPTION_KEYS": secrets.token_urlsafe(32),
    "OIDC_CLIENT_ID": "Iv1.0123456789abcdef",
    "OIDC_CLIENT_SECRET": secrets.token_urlsafe(32),
}
GITHUB = {
    "AUTH_MODE": "authorization-server",
    "AS_SIGNING_KEYS": secrets.token_urlsafe(32),
    "UPSTREAM_KIND": "oauth2",
    "UPSTREAM_ISSUER": "https://github.com",
    "UPSTREAM_AUTHORIZATION_URL": "https://github.com/login/oauth/authorize",
    "UPSTREAM_TOKEN_URL": "https://github.com/login/oauth/access_token",
    "UPSTREAM_USERINFO_URL": "https://api.github.com/user",
}


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name in BASE or name in GITHUB or name.startswith(("AS_", "UPSTREAM_", "OIDC_")):
            monkeypatch.delenv(name)
    for name, value in BASE.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(os.path.dirname(__file__))  # no stray .env file


def _set(monkeypatch: pytest.MonkeyPatch, values: dict[str, str]) -> None:
    for name, value in values.items():
        monkeypatch.setenv(name, value)


@pytest.mark.usefixtures("env")
def test_a_github_shaped_upstream_needs_no_oidc_issuer_and_names_its_principals_by_the_upstream_issuer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _set(monkeypatch, GITHUB)
    settings = Settings.from_env()
    assert settings.upstream_kind == "oauth2"
    assert settings.oidc_issuer == ""
    assert settings.upstream_issuer == "https://github.com"
    assert settings.upstream_subject_claim == "id"
    assert settings.upstream_scopes == ""


@pytest.mark.usefixtures("env")
def test_an_oauth2_upstream_in_resource_server_mode_stops_start_up_saying_why(monkeypatch: pytest.MonkeyPatch) -> None:
    _set(monkeypatch, {**GITHUB, "AUTH_MODE": "resource-server"})
    with pytest.raises(SettingsError, match="UPSTREAM_KIND=oauth2 needs AUTH_MODE=authorization-server"):
        Settings.from_env()


@pytest.mark.usefixtures("env")
def test_an_oauth2_upstream_without_its_urls_stops_start_up_naming_each_missing_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _set(monkeypatch, {k: v for k, v in GITHUB.items() if k not in ("UPSTREAM_TOKEN_URL", "UPSTREAM_ISSUER")})
    with pytest.raises(SettingsError, match="UPSTREAM_KIND=oauth2 needs UPSTREAM_ISSUER, UPSTREAM_TOKEN_URL"):
        Settings.from_env()


@pytest.mark.usefixtures("env")
def test_an_oidc_issuer_beside_an_oauth2_upstream_is_refused_rather_than_silently_ignored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _set(monkeypatch, {**GITHUB, "OIDC_ISSUER": "https://idp.example.com"})
    with pytest.raises(SettingsError, match="OIDC_ISSUER is set but UPSTREAM_KIND=oauth2"):
        Settings.from_env()


@pytest.mark.usefixtures("env")
def test_an_openid_upstream_still_needs_oidc_issuer_and_takes_no_oauth2_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SettingsError, match="OIDC_ISSUER is not set"):
        Settings.from_env()
    _set(
        monkeypatch,
        {"OIDC_ISSUER": "https://idp.example.com", "UPSTREAM_USERINFO_URL": GITHUB["UPSTREAM_USERINFO_URL"]},
    )
    with pytest.raises(SettingsError, match="UPSTREAM_USERINFO_URL set but UPSTREAM_KIND is oidc"):
        Settings.from_env()


@pytest.mark.usefixtures("env")
@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("UPSTREAM_TOKEN_URL", "ftp://github.com/token", "UPSTREAM_TOKEN_URL must be an absolute http\\(s\\) URL"),
        ("UPSTREAM_USERINFO_URL", "https://u:p@api.github.com/user", "UPSTREAM_USERINFO_URL must be an absolute"),
        ("UPSTREAM_ISSUER", "github", "UPSTREAM_ISSUER must be an absolute http\\(s\\) URL"),
        ("UPSTREAM_SUBJECT_CLAIM", "user id", "UPSTREAM_SUBJECT_CLAIM must be printable words"),
        ("UPSTREAM_SCOPES", 'read:user "x"', "UPSTREAM_SCOPES must be printable words"),
        ("UPSTREAM_KIND", "saml", "UPSTREAM_KIND"),
    ],
)
def test_a_malformed_upstream_setting_stops_start_up_naming_it(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str
) -> None:
    _set(monkeypatch, {**GITHUB, name: value})
    with pytest.raises(SettingsError, match=message) as raised:
        Settings.from_env()
    assert BASE["OIDC_CLIENT_SECRET"] not in str(raised.value)


def test_a_numeric_user_id_becomes_its_decimal_string_and_a_string_stays_as_written() -> None:
    assert subject_of({"id": 583231, "login": "octocat"}, "id") == "583231"
    assert subject_of({"sub": "user-7"}, "sub") == "user-7"


@pytest.mark.parametrize(
    ("profile", "reason"),
    [
        ({"login": "octocat"}, "has no 'id'"),
        ({"id": True}, "is not an identifier"),
        ({"id": 1.5}, "is not an identifier"),
        ({"id": -1}, "is not an identifier"),
        ({"id": ""}, "is not an identifier"),
        ({"id": {"value": 1}}, "is not an identifier"),
    ],
)
def test_a_user_info_answer_without_a_usable_id_fails_the_sign_in_saying_why(
    profile: dict[str, object], reason: str
) -> None:
    with pytest.raises(LoginFailed, match=reason):
        subject_of(profile, "id")
