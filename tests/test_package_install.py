"""A non-editable install works without the source tree: build the wheel, install it into a fresh virtualenv,
then migrate, seed and serve from an empty working directory.

The install uses pip's cache (no network once warm) and the exact pins of ``constraints.txt``.
"""

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from sqlalchemy.engine import make_url

from tests.support.databases import create_database, drop_database
from tests.support.devidp import DevIdP
from tests.support.waiting import free_port, wait_until

REPO = Path(__file__).resolve().parents[1]
INSTALL_TIMEOUT = 600


def _run(command: list[str], *, cwd: Path, env: dict[str, str], timeout: float = INSTALL_TIMEOUT) -> str:
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert result.returncode == 0, f"{command} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A fresh virtualenv with the built wheel installed; yields its bin directory and a clean environment."""
    root = tmp_path_factory.mktemp("wheel")
    # No PYTHONPATH and no source tree on the path: what runs must come from the wheel.
    env = {key: value for key, value in os.environ.items() if key not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    pip = [sys.executable, "-m", "pip"]
    _run([*pip, "wheel", "--no-deps", "-q", "-w", str(root / "dist"), str(REPO)], cwd=root, env=env)
    wheels = list((root / "dist").glob("coatcheck-*.whl"))
    assert len(wheels) == 1, wheels
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=root, env=env)
    _run(
        # --no-compile: byte-compiling ~80 packages is a third of the install, and imports compile what they use.
        [
            str(venv / "bin" / "pip"),
            "install",
            "-q",
            "--no-compile",
            str(wheels[0]),
            "-c",
            str(REPO / "constraints.txt"),
        ],
        cwd=root,
        env=env,
    )
    return venv / "bin", env


@contextmanager
def _serving(coatcheck: str, env: dict[str, str], *, cwd: Path, port: int) -> Iterator[None]:
    """``coatcheck serve`` from the virtualenv, until the block ends; fails with its log if it never gets ready."""
    base_url = f"http://127.0.0.1:{port}"
    log = cwd / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [coatcheck, "serve", "--host", "127.0.0.1", "--port", str(port)],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        def ready() -> bool:
            assert process.poll() is None, log.read_text()
            try:
                return httpx2.get(f"{base_url}/readyz", timeout=1.0).status_code == 200
            except httpx2.HTTPError:
                return False

        wait_until(ready, timeout=60, what="the wheel-installed server to be ready")
        yield
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture
def empty_database_url(admin_database_url: str) -> Iterator[str]:
    name = f"coatcheck_wheel_{uuid.uuid4().hex[:10]}"
    asyncio.run(create_database(admin_database_url, name))
    yield make_url(admin_database_url).set(database=name).render_as_string(hide_password=False)
    asyncio.run(drop_database(admin_database_url, name))


def test_the_installed_package_imports_from_site_packages_and_carries_its_migrations(
    installed: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    bin_dir, env = installed
    out = _run(
        [
            str(bin_dir / "python"),
            "-c",
            "import api, store, migrations; from store.migrations import migrations_directory; "
            "print(api.__file__); print(store.__file__); print(migrations_directory())",
        ],
        cwd=tmp_path,
        env=env,
    )
    api_file, store_file, migrations_dir = out.strip().splitlines()
    site_packages = str(bin_dir.parent / "lib")
    for path in (api_file, store_file, migrations_dir):
        assert path.startswith(site_packages), f"{path} is not inside the virtualenv"
        assert not path.startswith(str(REPO)), f"{path} comes from the source tree"
    assert sorted(p.name for p in (Path(migrations_dir) / "versions").glob("*.py")) == sorted(
        p.name for p in (REPO / "migrations" / "versions").glob("*.py")
    )


async def test_a_wheel_install_migrates_seeds_and_serves_tools_from_an_empty_directory(
    installed: tuple[Path, dict[str, str]],
    tmp_path: Path,
    empty_database_url: str,
    devidp: DevIdP,
    request_state_keys: str,
    token_encryption_keys: str,
) -> None:
    bin_dir, base_env = installed
    coatcheck = str(bin_dir / "coatcheck")
    env = {**base_env, "DATABASE_URL": empty_database_url}
    migrated = _run([coatcheck, "migrate"], cwd=tmp_path, env=env, timeout=120)
    assert "Running upgrade  -> " in migrated, migrated
    seeded = _run([coatcheck, "seed-demo"], cwd=tmp_path, env=env, timeout=120)
    assert "demo catalog loaded" in seeded

    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    serve_env = {
        **env,
        "PUBLIC_URL": base_url,
        "OIDC_ISSUER": devidp.issuer,
        "REQUEST_STATE_KEYS": request_state_keys,
        "TOKEN_ENCRYPTION_KEYS": token_encryption_keys,
        "OIDC_CLIENT_ID": "coatcheck-login",
        "OIDC_CLIENT_SECRET": "wheel-test-" + uuid.uuid4().hex,
    }
    with _serving(coatcheck, serve_env, cwd=tmp_path, port=port):
        # The session's dev IdP lists another resource; `audience` names this server's instead.
        token = await devidp.token("wheel-user", resource=devidp.resources[0], audience=f"{base_url}/mcp")
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30.0))
        async with http, Client(streamable_http_client(f"{base_url}/mcp", http_client=http)) as client:
            found = await client.call_tool("catalog_search", {"query": ""})
            assert not found.is_error, found
            assert found.structured_content is not None
            assert found.structured_content["products"], "the demo catalog is empty"
