"""compose.yaml agrees with the code (no Docker engine runs on CI machines, so this is checked statically)."""

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml  # type: ignore[import-untyped]
from pydantic_core import PydanticUndefined

from api.cli import main as cli_main
from api.settings import Settings

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded = yaml.safe_load((ROOT / "compose.yaml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def _env(service: dict[str, Any]) -> dict[str, str]:
    environment = service.get("environment", {})
    assert isinstance(environment, dict), "use the mapping form for environment"
    return {str(k): str(v) for k, v in environment.items()}


def _cli_subcommands() -> set[str]:
    seen: set[str] = set()

    def capture(argv: list[str]) -> None:
        try:
            cli_main([*argv, "--help"])
        except SystemExit as exit_:
            if exit_.code == 0:
                seen.add(argv[0])

    for name in ("serve", "migrate", "seed-demo", "no-such-command"):
        capture([name])
    return seen


def _coatcheck_commands(service: dict[str, Any]) -> list[list[str]]:
    command = service.get("command", [])
    text = " ".join(command) if isinstance(command, list) else str(command)
    return [m.split() for m in re.findall(r"coatcheck ([a-z-]+(?: --?[a-z-]+ \S+)*)", text)]


def test_every_coatcheck_command_in_compose_exists(compose: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    available = _cli_subcommands()
    capsys.readouterr()
    assert {"serve", "migrate", "seed-demo"} <= available
    used = [cmd for service in compose["services"].values() for cmd in _coatcheck_commands(service)]
    assert {cmd[0] for cmd in used} == {"serve", "migrate", "seed-demo"}
    for cmd in used:
        assert cmd[0] in available, cmd


def test_the_app_service_sets_every_required_setting_and_they_validate(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    app_env = _env(compose["services"]["app"])
    required = {
        name.upper()
        for name, field in Settings.model_fields.items()
        if field.default is PydanticUndefined and field.default_factory is None
    }
    assert required <= set(app_env), f"missing in compose app: {required - set(app_env)}"
    for name, value in app_env.items():  # provider secrets are read from the environment by name
        monkeypatch.setenv(name, value)
    fields: dict[str, Any] = {k.lower(): v for k, v in app_env.items()}  # strings, as from the environment
    settings = Settings(**fields)
    assert settings.mcp_resource_url == "http://localhost:8000/mcp"


def test_published_ports_match_the_public_urls(compose: dict[str, Any]) -> None:
    services = compose["services"]
    app_env, idp_env = _env(services["app"]), _env(services["idp"])
    public = urlsplit(app_env["PUBLIC_URL"])
    assert f"{public.port}:8000" in services["app"]["ports"]
    assert "--port" in services["app"]["command"]
    assert services["app"]["command"][services["app"]["command"].index("--port") + 1] == "8000"
    issuer = urlsplit(idp_env["DEVIDP_ISSUER"])
    assert f"{issuer.port}:{issuer.port}" in services["idp"]["ports"]
    assert app_env["OIDC_ISSUER"] == idp_env["DEVIDP_ISSUER"]
    assert f"{app_env['PUBLIC_URL']}/mcp" in idp_env["DEVIDP_RESOURCES"].split(",")
    internal = urlsplit(app_env["OIDC_ISSUER_INTERNAL_URL"])
    assert internal.hostname in services
    assert internal.port == issuer.port


def test_services_start_in_dependency_order_and_share_one_database(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert services["app"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert services["app"]["depends_on"]["db"]["condition"] == "service_healthy"
    assert services["migrate"]["depends_on"]["db"]["condition"] == "service_healthy"
    # The README's token command needs the IdP answering, not just started (it used to exit on a bad volume).
    assert services["app"]["depends_on"]["idp"]["condition"] == "service_healthy"
    assert "healthcheck" in services["db"]
    assert "healthcheck" in services["idp"]
    assert _env(services["migrate"])["DATABASE_URL"] == _env(services["app"])["DATABASE_URL"]
    db_env = _env(services["db"])
    url = urlsplit(_env(services["app"])["DATABASE_URL"])
    assert (url.hostname, url.username, url.password, url.path.lstrip("/")) == (
        "db",
        db_env["POSTGRES_USER"],
        db_env["POSTGRES_PASSWORD"],
        db_env["POSTGRES_DB"],
    )


def test_build_contexts_exist(compose: dict[str, Any]) -> None:
    for service in compose["services"].values():
        if "build" in service:
            context = ROOT / str(service["build"])
            assert (context / "Dockerfile").is_file(), context


def test_dev_only_secrets_are_labelled() -> None:
    text = (ROOT / "compose.yaml").read_text()
    assert "DEVELOPMENT ONLY" in text
    assert "DEV-ONLY secret" in text


def test_the_dev_idp_knows_coatchecks_login_client_and_every_provider_client(compose: dict[str, Any]) -> None:
    services = compose["services"]
    app_env, idp_env = _env(services["app"]), _env(services["idp"])
    clients = {client["client_id"]: client for client in json.loads(idp_env["DEVIDP_CLIENTS"])}
    public_url = app_env["PUBLIC_URL"]
    login = clients[app_env["OIDC_CLIENT_ID"]]
    assert login["client_secret"] == app_env["OIDC_CLIENT_SECRET"]
    assert login["redirect_uris"] == [f"{public_url}/oauth/login/callback"]
    # Where the dev IdP sends the browser back after signing out there (RP-initiated logout).
    assert login["post_logout_redirect_uris"] == [f"{public_url}/connect/signout"]
    for name, provider in json.loads(app_env["PROVIDERS"]).items():
        client = clients[provider["client_id"]]
        assert client["client_secret"] == app_env[provider["client_secret_env"]], name
        assert client["redirect_uris"] == [f"{public_url}/oauth/callback"], name
        # The browser follows the authorization endpoint (published port); the server uses the compose name.
        assert urlsplit(provider["authorization_endpoint"]).hostname == "localhost", name
        for server_side in ("token_endpoint", "userinfo_endpoint", "revocation_endpoint"):
            assert urlsplit(provider[server_side]).hostname in services, (name, server_side)
