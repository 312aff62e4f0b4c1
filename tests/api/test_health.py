"""Health endpoints: /healthz says the process is up, /readyz whether the database answers in time."""

import time

import httpx2

from tests.support.server import run_server
from tests.support.waiting import free_port


def test_readyz_reports_503_within_its_timeout_when_the_database_is_unreachable(
    server_env: dict[str, str],
) -> None:
    closed_port = free_port()  # nothing listens here
    env = {
        **server_env,
        "DATABASE_URL": f"postgresql://postgres@127.0.0.1:{closed_port}/nowhere",
        "READYZ_TIMEOUT_SECONDS": "1",
    }
    with run_server(env) as server:
        assert httpx2.get(f"{server.base_url}/healthz", timeout=5).json() == {"status": "ok"}
        started = time.monotonic()
        response = httpx2.get(f"{server.base_url}/readyz", timeout=10)
        elapsed = time.monotonic() - started
    assert response.status_code == 503
    assert response.json() == {"status": "database unreachable"}
    assert elapsed < 5
    assert "nowhere" not in response.text
