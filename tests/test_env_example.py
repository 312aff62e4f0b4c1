"""``.env.example`` names every required setting, and filled in with generated secrets it is a valid configuration."""

import secrets
from pathlib import Path

import pytest

from api.settings import Settings

EXAMPLE = Path(__file__).resolve().parents[1] / ".env.example"


def _assignments() -> dict[str, str]:
    pairs = {}
    for line in EXAMPLE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            pairs[name.strip()] = value.strip()
    return pairs


def test_the_example_sets_every_required_setting_and_leaves_every_secret_empty() -> None:
    required = {name.upper() for name, field in Settings.model_fields.items() if field.is_required()}
    assignments = _assignments()
    assert required <= set(assignments), required - set(assignments)
    for secret in ("OIDC_CLIENT_SECRET", "REQUEST_STATE_KEYS", "TOKEN_ENCRYPTION_KEYS"):
        assert assignments[secret] == "", f"{secret} must not ship a value"


def test_the_example_with_generated_secrets_validates(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)  # no stray .env
    for name in Settings.model_fields:
        monkeypatch.delenv(name.upper(), raising=False)
    values = _assignments()
    for secret in ("OIDC_CLIENT_SECRET", "REQUEST_STATE_KEYS", "TOKEN_ENCRYPTION_KEYS"):
        values[secret] = secrets.token_urlsafe(32)
    settings = Settings.from_env(**{name.lower(): value for name, value in values.items()})
    assert settings.mcp_resource_url == "http://localhost:8000/mcp"
