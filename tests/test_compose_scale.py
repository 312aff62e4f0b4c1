"""compose.scale.yaml (replicas, HAProxy, PgBouncer) agrees with the code and with what tests/deploy proves.

No Docker engine runs on CI machines, so this is static, except that the real HAProxy checks its config.
"""

import configparser
import re
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from pydantic_core import PydanticUndefined

from api.settings import Settings
from tests.support.haproxy import HAPROXY, haproxy_config

ROOT = Path(__file__).resolve().parents[1]
HAPROXY_CFG = ROOT / "deploy" / "haproxy.cfg"
PGBOUNCER_DIR = ROOT / "deploy" / "pgbouncer"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded = yaml.safe_load((ROOT / "compose.scale.yaml").read_text())
    assert isinstance(loaded, dict)
    return loaded


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    return dict(compose["services"])


def _env(service: dict[str, Any]) -> dict[str, str]:
    environment = service.get("environment", {})
    assert isinstance(environment, dict), "use the mapping form for environment"
    return {str(k): str(v) for k, v in environment.items()}


def _pgbouncer_ini() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(comment_prefixes=(";", "#"), interpolation=None)
    parser.read_string((PGBOUNCER_DIR / "pgbouncer.ini").read_text())
    return parser


def _directives(config: str) -> set[str]:
    return {" ".join(line.split()) for line in config.splitlines() if line.strip() and not line.strip().startswith("#")}


def test_the_replicas_settings_validate_and_every_replica_shares_one_configuration(
    services: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    app = services["app"]
    env = _env(app)
    required = {
        name.upper()
        for name, field in Settings.model_fields.items()
        if field.default is PydanticUndefined and field.default_factory is None
    }
    assert required <= set(env), f"missing in compose.scale app: {required - set(env)}"
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = Settings(**{k.lower(): v for k, v in env.items()})
    assert settings.db_pooler_mode == "transaction"
    assert settings.shutdown_drain_seconds > 0
    assert app["deploy"]["replicas"] >= 2
    assert "ports" not in app, "replicas are reached through the balancer only"


def test_the_balancer_publishes_the_public_url_and_checks_readyz_on_every_replica(services: dict[str, Any]) -> None:
    lb = services["lb"]
    assert re.fullmatch(r"haproxy:2\.\d+", lb["image"])
    public = urlsplit(_env(services["app"])["PUBLIC_URL"])
    assert f"{public.port}:8000" in lb["ports"]
    assert "./deploy/haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro" in lb["volumes"]
    config = HAPROXY_CFG.read_text()
    assert "bind :8000" in config
    template = re.search(r"server-template app (\d+) app:(\d+)", config)
    assert template is not None
    assert int(template[1]) >= services["app"]["deploy"]["replicas"]
    assert template[2] == services["app"]["command"][services["app"]["command"].index("--port") + 1]


def test_the_drain_outlasts_the_health_checks_and_the_grace_period_covers_drain_and_shutdown(
    services: dict[str, Any],
) -> None:
    env = _env(services["app"])
    checks = re.search(r"default-server check inter (\d+)s fall (\d+)", HAPROXY_CFG.read_text())
    assert checks is not None
    assert float(env["SHUTDOWN_DRAIN_SECONDS"]) > int(checks[1]) * int(checks[2])
    grace = int(str(services["app"]["stop_grace_period"]).removesuffix("s"))
    assert grace > float(env["SHUTDOWN_DRAIN_SECONDS"]) + float(env["SHUTDOWN_TIMEOUT_SECONDS"])


def test_the_compose_balancer_config_has_every_behaviour_the_replica_test_proves() -> None:
    proven = _directives(haproxy_config(port=1, servers={"r1": 2}, admin_socket=Path("/x"), check_interval_ms=200))
    shipped = _directives(HAPROXY_CFG.read_text())
    for directive in (
        "retries 3",
        "option redispatch 1",
        "option http-server-close",
        "http-request set-header X-Forwarded-For %[src]",
        "timeout check 3s",
        "balance roundrobin",
        "option httpchk GET /readyz",
        "http-check expect status 200",
        "http-response set-header X-Coatcheck-Replica %[srv_name]",
    ):
        assert directive in proven, directive
        assert directive in shipped, directive


def test_haproxy_accepts_the_shipped_config() -> None:
    if not HAPROXY.exists():
        pytest.fail(f"{HAPROXY} is missing: run .ci/system-packages")
    check = subprocess.run([str(HAPROXY), "-c", "-f", str(HAPROXY_CFG)], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr


def test_replicas_go_through_pgbouncer_in_transaction_mode_and_migrations_straight_to_postgres(
    services: dict[str, Any],
) -> None:
    ini = _pgbouncer_ini()
    assert ini["pgbouncer"]["pool_mode"] == "transaction"
    app_url = urlsplit(_env(services["app"])["DATABASE_URL"])
    assert (app_url.hostname, app_url.port) == ("pgbouncer", int(ini["pgbouncer"]["listen_port"]))
    database = app_url.path.lstrip("/")
    upstream = dict(part.split("=", 1) for part in ini["databases"][database].split())
    db_env = _env(services["db"])
    assert (upstream["host"], upstream["port"], upstream["dbname"]) == ("db", "5432", db_env["POSTGRES_DB"])
    migrate_url = urlsplit(_env(services["migrate"])["DATABASE_URL"])
    assert (migrate_url.hostname, migrate_url.port) == ("db", 5432)
    # PgBouncer logs in to PostgreSQL with the client's user and the password in its auth file.
    users = dict(re.findall(r'"([^"]+)" "([^"]*)"', (PGBOUNCER_DIR / "userlist.txt").read_text()))
    assert users == {db_env["POSTGRES_USER"]: db_env["POSTGRES_PASSWORD"]}
    assert (app_url.username, app_url.password) == (db_env["POSTGRES_USER"], db_env["POSTGRES_PASSWORD"])
    # The image is Debian bookworm's package: PgBouncer 1.18, the version tests/deploy runs.
    dockerfile = (PGBOUNCER_DIR / "Dockerfile").read_text()
    assert "FROM debian:bookworm-slim" in dockerfile
    assert "pgbouncer" in dockerfile
    assert services["pgbouncer"]["build"] == "./deploy/pgbouncer"


def test_start_order_waits_for_pgbouncer_and_the_migration(services: dict[str, Any]) -> None:
    depends = services["app"]["depends_on"]
    assert depends["pgbouncer"]["condition"] == "service_healthy"
    assert depends["migrate"]["condition"] == "service_completed_successfully"
    assert services["pgbouncer"]["depends_on"]["db"]["condition"] == "service_healthy"
    assert "healthcheck" in services["pgbouncer"]


def test_the_scale_file_uses_the_same_dev_secrets_and_idp_clients_as_compose_yaml(services: dict[str, Any]) -> None:
    single = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    for name in ("REQUEST_STATE_KEYS", "TOKEN_ENCRYPTION_KEYS", "OIDC_CLIENT_SECRET", "PROVIDERS", "PUBLIC_URL"):
        assert _env(services["app"])[name] == _env(single["app"])[name], name
    assert _env(services["idp"]) == _env(single["idp"])
    assert services["idp"]["healthcheck"] == single["idp"]["healthcheck"]
    assert services["app"]["depends_on"]["idp"] == single["app"]["depends_on"]["idp"]
    text = (ROOT / "compose.scale.yaml").read_text()
    assert "DEVELOPMENT ONLY" in text
    assert "DEV-ONLY secret" in text
