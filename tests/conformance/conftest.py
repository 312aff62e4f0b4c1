"""Coatcheck behind the test-only token proxy, in its two profiles, for the conformance suite.

* ``conformance_profile``: ``python -m tests.conformance.serve_profile`` = the production app factory
  plus the fixture tools the suite calls by name, served exactly like ``coatcheck serve``.
* ``production_profile``: ``coatcheck serve`` itself (``python -m api.cli serve``).

Both sit behind ``tests/conformance/token_proxy.py`` (see ``profiles.py``).
"""

import sys
from collections.abc import AsyncIterator

import pytest

from tests.conformance.profiles import ProxiedServer, proxy_token, run_behind_token_proxy
from tests.support.devidp import DevIdP
from tests.support.waiting import free_port


@pytest.fixture(scope="module")
async def conformance_profile(
    server_env: dict[str, str], devidp: DevIdP, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[ProxiedServer]:
    """The production app plus the conformance fixtures, behind the token proxy."""
    proxy_port = free_port()
    token = await proxy_token(devidp, f"http://127.0.0.1:{proxy_port}")
    command = [sys.executable, "-m", "tests.conformance.serve_profile"]
    with run_behind_token_proxy(
        command, server_env, token=token, proxy_port=proxy_port, workdir=tmp_path_factory.mktemp("conformance")
    ) as running:
        yield running


@pytest.fixture(scope="module")
async def production_profile(
    server_env: dict[str, str], devidp: DevIdP, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[ProxiedServer]:
    """``coatcheck serve`` exactly as deployed, behind the token proxy."""
    proxy_port = free_port()
    token = await proxy_token(devidp, f"http://127.0.0.1:{proxy_port}")
    command = [sys.executable, "-m", "api.cli", "serve"]
    with run_behind_token_proxy(
        command, server_env, token=token, proxy_port=proxy_port, workdir=tmp_path_factory.mktemp("production")
    ) as running:
        yield running
