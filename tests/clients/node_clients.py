"""The pinned Node MCP clients of ``tests/clients/package.json`` (Claude Code, MCP Inspector, mcp-remote).

Installed on first use with ``npm install`` into ``tests/clients/node_modules`` (git-ignored; no lock file,
exact versions in package.json), together with a Node 22 binary from npm, since Claude Code and the
Inspector need Node 22 and the machine's Node may be 20. A client that cannot be installed makes its test
skip with the reason; it never passes without running.
"""

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conformance.node_tools import NodeToolsError, ensure_installed

CLIENTS_DIR = Path(__file__).resolve().parent
MODULES = CLIENTS_DIR / "node_modules"
NODE22 = MODULES / "node" / "bin" / "node"
CLAUDE = MODULES / ".bin" / "claude"
INSPECTOR_CLI = MODULES / "@modelcontextprotocol" / "inspector" / "clients" / "launcher" / "build" / "index.js"
MCP_REMOTE = MODULES / "mcp-remote" / "dist" / "proxy.js"


@dataclass(frozen=True)
class NodeClients:
    """Where the installed clients are, and an environment whose ``node`` is Node 22."""

    node: Path
    claude: Path
    inspector: Path
    mcp_remote: Path

    def env(self, home: Path, **extra: str) -> dict[str, str]:
        """The caller's environment with Node 22 first on PATH and HOME (config, OAuth state) at ``home``."""
        home.mkdir(parents=True, exist_ok=True)
        return {
            **os.environ,
            "PATH": f"{self.node.parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / ".config"),
            **extra,
        }


def node_clients() -> NodeClients:
    """Install the pinned clients if needed; skip the calling test, with the reason, if npm cannot."""
    try:
        ensure_installed(CLIENTS_DIR, NODE22, CLAUDE, INSPECTOR_CLI, MCP_REMOTE)
    except NodeToolsError as exc:
        pytest.skip(f"the pinned Node MCP clients cannot be installed on this machine: {exc}")
    return NodeClients(node=NODE22, claude=CLAUDE, inspector=INSPECTOR_CLI, mcp_remote=MCP_REMOTE)


def pinned_version(package: str) -> str:
    """The exact version ``tests/clients/package.json`` pins for ``package``."""
    import json

    dependencies: dict[str, str] = json.loads((CLIENTS_DIR / "package.json").read_text())["dependencies"]
    return dependencies[package]
