"""Install and locate the test-only Node tooling (a clean clone has no node_modules).

Each directory under ``tests/support/npm/`` is one npm package of exact pins, installed on first use
with ``npm install`` into its own ``node_modules`` (git-ignored). Lock files are never written
(``.npmrc``: ``package-lock=false``); the exact versions live in package.json.

* ``npm/conformance``: the pinned MCP conformance suite and a Node 22 binary (the suite needs Node 22;
  the machine's Node may be older).
* ``npm/interop``: the official TypeScript MCP client and ``ts_client.mjs``, the script that drives it.
* ``npm/clients``: Claude Code, MCP Inspector and mcp-remote, with a Node 22 binary (Claude Code and the
  Inspector need Node 22).

The dev IdP's own package (``devidp/``) is installed through :func:`ensure_installed` as well.
"""

import fcntl
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.support.prerequisites import missing

NPM_DIR = Path(__file__).resolve().parent / "npm"
NPM_INSTALL_TIMEOUT = 600.0

CONFORMANCE_DIR = NPM_DIR / "conformance"
CONFORMANCE_CLI = CONFORMANCE_DIR / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
CONFORMANCE_REQUIREMENTS = CONFORMANCE_DIR / "node_modules" / "@modelcontextprotocol" / "conformance" / "requirements"
CONFORMANCE_NODE22 = CONFORMANCE_DIR / "node_modules" / "node" / "bin" / "node"

INTEROP_DIR = NPM_DIR / "interop"
TS_CLIENT_SCRIPT = INTEROP_DIR / "ts_client.mjs"
TS_CLIENT_PACKAGE = INTEROP_DIR / "node_modules" / "@modelcontextprotocol" / "client" / "package.json"

CLIENTS_DIR = NPM_DIR / "clients"
_CLIENT_MODULES = CLIENTS_DIR / "node_modules"
CLIENTS_NODE22 = _CLIENT_MODULES / "node" / "bin" / "node"
CLAUDE = _CLIENT_MODULES / ".bin" / "claude"
INSPECTOR_CLI = _CLIENT_MODULES / "@modelcontextprotocol" / "inspector" / "clients" / "launcher" / "build" / "index.js"
MCP_REMOTE = _CLIENT_MODULES / "mcp-remote" / "dist" / "proxy.js"


class NodeToolsError(RuntimeError):
    """npm or node is missing, or ``npm install`` failed."""


def ensure_installed(directory: Path, *markers: Path) -> None:
    """Run ``npm install`` in ``directory`` unless every marker file already exists.

    Several pytest processes may start at once, so one installs while the others wait on a lock. The
    lock is named after the directory: ``coatcheck-devidp-npm-install.lock`` is the one ``coatcheck dev``
    takes for ``devidp/`` too.
    """
    if all(marker.exists() for marker in markers):
        return
    npm = shutil.which("npm")
    if npm is None:
        raise NodeToolsError(f"npm is not on PATH; installing {directory} needs Node.js 20+ and npm")
    lock_path = Path(tempfile.gettempdir()) / f"coatcheck-{directory.name}-npm-install.lock"
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if all(marker.exists() for marker in markers):
            return
        result = subprocess.run(
            # --prefer-offline: the versions are exact pins, so npm's cached metadata is as good as the
            # registry's (it still fetches what the cache lacks); saves ~5 s per package on a clean clone.
            [npm, "install", "--no-audit", "--no-fund", "--prefer-offline"],
            cwd=directory,
            capture_output=True,
            text=True,
            timeout=NPM_INSTALL_TIMEOUT,
            check=False,
        )
        missing = [str(marker) for marker in markers if not marker.exists()]
        if result.returncode != 0 or missing:
            raise NodeToolsError(
                f"npm install in {directory} failed (exit code {result.returncode}; missing: {missing})\n"
                f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"
            )


def system_node() -> Path:
    """The ``node`` on PATH (Node.js 20+)."""
    node = shutil.which("node")
    if node is None:
        raise NodeToolsError("node is not on PATH; this needs Node.js 20+")
    return Path(node)


def pinned_version(directory: Path, package: str) -> str:
    """The exact version ``directory``'s package.json pins for ``package``."""
    dependencies: dict[str, str] = json.loads((directory / "package.json").read_text())["dependencies"]
    return dependencies[package]


def ensure_conformance_suite() -> Path:
    """Install the pinned suite and Node 22 if needed; return the Node 22 binary."""
    ensure_installed(CONFORMANCE_DIR, CONFORMANCE_CLI, CONFORMANCE_NODE22)
    return CONFORMANCE_NODE22


def ensure_typescript_client() -> Path:
    """Install the pinned TypeScript client if needed; return the Node binary to run ``TS_CLIENT_SCRIPT`` with."""
    ensure_installed(INTEROP_DIR, TS_CLIENT_PACKAGE)
    return system_node()


@dataclass(frozen=True)
class NodeClients:
    """Where the installed third-party clients are, and an environment whose ``node`` is Node 22."""

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
    """Install the pinned clients if needed; if npm cannot, skip the calling test with the reason (fail it in CI).

    See tests/support/prerequisites.py.
    """
    try:
        ensure_installed(CLIENTS_DIR, CLIENTS_NODE22, CLAUDE, INSPECTOR_CLI, MCP_REMOTE)
    except NodeToolsError as exc:
        missing(f"the pinned Node MCP clients cannot be installed on this machine: {exc}")
    return NodeClients(node=CLIENTS_NODE22, claude=CLAUDE, inspector=INSPECTOR_CLI, mcp_remote=MCP_REMOTE)


def pinned_client_version(package: str) -> str:
    """The exact version ``tests/support/npm/clients/package.json`` pins for ``package``."""
    return pinned_version(CLIENTS_DIR, package)
