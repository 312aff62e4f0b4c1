"""The pinned Node MCP clients (tests/support/node.py), installed on first use."""

import pytest

from tests.support.node import NodeClients, node_clients


@pytest.fixture(scope="module")
def clients() -> NodeClients:
    """Claude Code, MCP Inspector and mcp-remote with a Node 22 to run them (skips if npm cannot install them)."""
    return node_clients()
