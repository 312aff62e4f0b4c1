"""Install and locate the test-only Node tooling (a clean clone has no node_modules).

``tests/conformance/package.json`` pins the conformance suite and a Node 22 binary (the suite needs
Node 22; the machine's Node may be older). ``tests/interop/package.json`` pins the TypeScript MCP
client. Both are installed on first use with ``npm install``; lock files are never written
(``.npmrc``: ``package-lock=false``), the exact versions live in package.json.
"""

import fcntl
import shutil
import subprocess
import tempfile
from pathlib import Path

CONFORMANCE_DIR = Path(__file__).resolve().parent
INTEROP_DIR = CONFORMANCE_DIR.parent / "interop"
NPM_INSTALL_TIMEOUT = 600.0

CONFORMANCE_CLI = CONFORMANCE_DIR / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
CONFORMANCE_REQUIREMENTS = CONFORMANCE_DIR / "node_modules" / "@modelcontextprotocol" / "conformance" / "requirements"
NODE22 = CONFORMANCE_DIR / "node_modules" / "node" / "bin" / "node"
TS_CLIENT_PACKAGE = INTEROP_DIR / "node_modules" / "@modelcontextprotocol" / "client" / "package.json"


class NodeToolsError(RuntimeError):
    """npm is missing or ``npm install`` failed."""


def ensure_installed(directory: Path, *markers: Path) -> None:
    """Run ``npm install`` in ``directory`` unless every marker file already exists.

    Several pytest processes may start at once, so one installs while the others wait on a lock.
    """
    if all(marker.exists() for marker in markers):
        return
    npm = shutil.which("npm")
    if npm is None:
        raise NodeToolsError("npm is not on PATH; the conformance and interop tests need Node.js 20+ and npm")
    lock_path = Path(tempfile.gettempdir()) / f"coatcheck-npm-install-{directory.name}.lock"
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if all(marker.exists() for marker in markers):
            return
        result = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund"],
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


def ensure_conformance_suite() -> Path:
    """Install the pinned suite and Node 22 if needed; return the Node 22 binary."""
    ensure_installed(CONFORMANCE_DIR, CONFORMANCE_CLI, NODE22)
    return NODE22


def ensure_typescript_client() -> Path:
    """Install the pinned TypeScript client if needed; return the Node binary to run it with."""
    ensure_installed(INTEROP_DIR, TS_CLIENT_PACKAGE)
    node = shutil.which("node")
    if node is None:
        raise NodeToolsError("node is not on PATH; the interop test needs Node.js 20+")
    return Path(node)
