"""Coatcheck behind the test-only token proxy, in its two profiles (tests/support/conformance/profiles.py)."""

from collections.abc import AsyncIterator

import pytest

from tests.support.auth_mode import McpTokens
from tests.support.conformance.profiles import CONFORMANCE_PROFILE, PRODUCTION_PROFILE, ProxiedServer, proxied_profile


@pytest.fixture(scope="module")
async def conformance_profile(
    server_env: dict[str, str], mcp_token: McpTokens, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[ProxiedServer]:
    """The production app plus the conformance fixtures, behind the token proxy."""
    async with proxied_profile(
        CONFORMANCE_PROFILE, server_env, mcp_token, tmp_path_factory.mktemp("conformance")
    ) as up:
        yield up


@pytest.fixture(scope="module")
async def production_profile(
    server_env: dict[str, str], mcp_token: McpTokens, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[ProxiedServer]:
    """``coatcheck serve`` exactly as deployed, behind the token proxy."""
    async with proxied_profile(PRODUCTION_PROFILE, server_env, mcp_token, tmp_path_factory.mktemp("production")) as up:
        yield up
