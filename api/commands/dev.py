"""``coatcheck dev``: the whole development stack in one command, without Docker. DEVELOPMENT ONLY.

In order: PostgreSQL (``DATABASE_URL`` if set, else an embedded server with its data in the data directory),
the development identity provider (``devidp/``, Node 20+; ``npm install`` on first run), ``migrate``,
``seed-demo``, then ``serve`` in this process. Secrets are generated on first run and kept in the data
directory (``secrets.json``, mode 0600), as are the dev IdP's signing keys, so a second run reuses the
data, the keys and therefore the tokens already handed out. Ctrl-C (or SIGTERM) stops the server, then the
dev IdP, then the embedded PostgreSQL; a ``DATABASE_URL`` server is left alone.
"""

import argparse
import asyncio
import contextlib
import errno
import fcntl
import json
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2

from api.commands.embedded_postgres import EmbeddedPostgresError, require_embedded_postgres, start_embedded_postgres

DEFAULT_DATA_DIR = ".coatcheck-dev"
DATABASE_NAME = "coatcheck"
LOGIN_CLIENT_ID = "coatcheck-login"
DEMO_CLIENT_ID = "coatcheck-demo"
MIN_NODE_MAJOR = 20
INSPECTOR_VERSION = "2.12.0"
DEVIDP_STARTUP_SECONDS = 30.0
NPM_INSTALL_SECONDS = 600
_SECRET_NAMES = ("REQUEST_STATE_KEYS", "TOKEN_ENCRYPTION_KEYS", "OIDC_CLIENT_SECRET", "DEMO_CLIENT_SECRET")


class DevError(Exception):
    """A prerequisite is missing or a part of the stack would not start; the message says what to do."""


def _say(message: str = "") -> None:
    print(f"coatcheck dev: {message}" if message else "", flush=True)


def devidp_directory() -> Path:
    """``devidp/`` of the checkout this package runs from, or of the working directory."""
    for candidate in (Path(__file__).resolve().parents[2] / "devidp", Path.cwd() / "devidp"):
        if (candidate / "server.mjs").is_file():
            return candidate
    raise DevError(
        "devidp/ (the development identity provider) was not found: run `coatcheck dev` from a Coatcheck "
        "checkout (git clone …, then pip install -e '.[dev]')"
    )


def check_node() -> str:
    """The ``node`` binary, if it is Node.js 20 or newer."""
    node = shutil.which("node")
    hint = (
        f"coatcheck dev needs Node.js {MIN_NODE_MAJOR} or newer (with npm) for the development identity "
        "provider: install it from https://nodejs.org or your package manager (e.g. apt install nodejs npm)"
    )
    if node is None or shutil.which("npm") is None:
        raise DevError(f"{'node' if node is None else 'npm'} is not on PATH. {hint}")
    version = subprocess.run(  # noqa: S603 - the node found on PATH, fixed arguments
        [node, "--version"], capture_output=True, text=True, timeout=30, check=False
    ).stdout
    match = re.match(r"v(\d+)\.", version.strip())
    if match is None or int(match.group(1)) < MIN_NODE_MAJOR:
        raise DevError(f"found Node.js {version.strip() or 'of unknown version'}. {hint}")
    return node


def _open_own_file(path: Path) -> int:
    """A read descriptor on ``path``, which must be a regular file owned by this user and no symbolic link.

    ``O_NOFOLLOW`` and ``fstat`` on the open descriptor, so nothing can swap the file between the check and
    the use: a link planted in the data directory would otherwise have its target chmodded and read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise DevError(
                f"{path} is a symbolic link; coatcheck dev does not follow links in its data directory: "
                "remove it (a new one is generated) or use another --data-dir"
            ) from None
        raise DevError(f"cannot open {path}: {exc.strerror}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
        os.close(fd)
        what = "not a regular file" if not stat.S_ISREG(info.st_mode) else "not owned by the user running coatcheck dev"
        raise DevError(f"{path} is {what}; coatcheck dev refuses to use it: remove it or use another --data-dir")
    return fd


def check_data_dir(data_dir: Path) -> None:
    """Refuse a data directory (already resolved) that another user owns: they could plant files in it."""
    info = data_dir.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise DevError(f"{data_dir} is not a directory owned by the user running coatcheck dev; use another --data-dir")


def load_or_create_secrets(path: Path) -> tuple[dict[str, str], bool]:
    """The development secrets in ``path`` (mode 0600), generated on first use; and whether they were new.

    Raises:
        DevError: ``path`` is a symbolic link, not a regular file, not owned by this user, or not ours.
    """
    if os.path.lexists(path):
        with os.fdopen(_open_own_file(path)) as stored_file:
            os.fchmod(stored_file.fileno(), 0o600)
            try:
                stored = json.loads(stored_file.read())
            except (ValueError, UnicodeDecodeError):
                stored = None
        if isinstance(stored, dict) and all(isinstance(stored.get(name), str) for name in _SECRET_NAMES):
            return {name: stored[name] for name in _SECRET_NAMES}, False
        raise DevError(f"{path} is not a secrets file written by coatcheck dev: move it away and run again")
    generated = {name: f"dev-only-{secrets.token_urlsafe(32)}" for name in _SECRET_NAMES}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(generated, out, indent=2)
    return generated, True


def ensure_devidp_installed(directory: Path, log_path: Path) -> None:
    """``npm install`` in ``devidp/`` on first run (exact versions from its package.json, no lock file)."""
    marker = directory / "node_modules" / "oidc-provider" / "package.json"
    if marker.exists():
        return
    # The test suite installs into the same directory and takes the same lock.
    lock_path = Path(tempfile.gettempdir()) / "coatcheck-devidp-npm-install.lock"
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists():
            return
        _say(f"first run: npm install in {directory} (output in {log_path}) …")
        npm = shutil.which("npm") or "npm"
        with log_path.open("wb") as log:
            result = subprocess.run(  # noqa: S603 - npm from PATH, fixed arguments
                [npm, "install", "--no-audit", "--no-fund"],
                cwd=directory,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=NPM_INSTALL_SECONDS,
                check=False,
            )
        if result.returncode != 0 or not marker.exists():
            raise DevError(f"npm install in {directory} failed (exit code {result.returncode}); see {log_path}")


@dataclass(frozen=True)
class DevUrls:
    """Where the parts of the stack answer."""

    host: str
    port: int
    idp_port: int

    @property
    def public_url(self) -> str:
        return f"http://localhost:{self.port}"

    @property
    def mcp_url(self) -> str:
        return f"{self.public_url}/mcp"

    @property
    def issuer(self) -> str:
        return f"http://localhost:{self.idp_port}"


def _devidp_clients(urls: DevUrls, dev_secrets: dict[str, str]) -> list[dict[str, object]]:
    return [
        {
            "client_id": LOGIN_CLIENT_ID,
            "client_secret": dev_secrets["OIDC_CLIENT_SECRET"],
            "client_name": "Coatcheck sign-in (coatcheck dev)",
            "redirect_uris": [f"{urls.public_url}/oauth/login/callback"],
            "post_logout_redirect_uris": [f"{urls.public_url}/connect/signout"],
            "grant_types": ["authorization_code"],
            "scope": "openid",
        },
        {
            "client_id": DEMO_CLIENT_ID,
            "client_secret": dev_secrets["DEMO_CLIENT_SECRET"],
            "client_name": "Coatcheck (demo provider connection, coatcheck dev)",
            "redirect_uris": [f"{urls.public_url}/oauth/callback"],
            "grant_types": ["authorization_code", "refresh_token"],
            "scope": "openid profile email offline_access",
        },
    ]


def _stop_process(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def run_devidp(
    node: str, directory: Path, urls: DevUrls, data_dir: Path, dev_secrets: dict[str, str]
) -> Iterator[None]:
    """The dev IdP as a child process (its own session: a terminal's Ctrl-C reaches only us), until the end."""
    log_path = data_dir / "devidp.log"
    env = {key: value for key, value in os.environ.items() if not key.startswith("DEVIDP_")}
    env.update(
        DEVIDP_ISSUER=urls.issuer,
        DEVIDP_HOST=urls.host,
        DEVIDP_RESOURCES=urls.mcp_url,
        DEVIDP_JWKS_FILE=str(data_dir / "devidp-jwks.json"),
        DEVIDP_CLIENTS=json.dumps(_devidp_clients(urls, dev_secrets)),
    )
    with log_path.open("ab") as log:
        process = subprocess.Popen(  # noqa: S603 - the checked node binary and our own script
            [node, str(directory / "server.mjs")],
            cwd=directory,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + DEVIDP_STARTUP_SECONDS
        discovery = f"http://{urls.host}:{urls.idp_port}/.well-known/openid-configuration"
        while True:
            if process.poll() is not None:
                raise DevError(f"the dev IdP exited with code {process.returncode}; see {log_path}")
            try:
                if httpx2.get(discovery, timeout=1.0).status_code == 200:
                    break
            except httpx2.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise DevError(f"the dev IdP did not answer on port {urls.idp_port}; see {log_path}")
            time.sleep(0.1)
        yield
    finally:
        _stop_process(process)


def _prepare_database(database_url: str) -> int:
    from store.db import Database
    from store.demo import seed_demo_catalog
    from store.migrations import upgrade

    upgrade(database_url)

    async def seed() -> int:
        database = Database.connect(database_url)
        try:
            return await seed_demo_catalog(database)
        finally:
            await database.dispose()

    return asyncio.run(seed())


def _banner(urls: DevUrls, data_dir: Path, database: str) -> str:
    token_command = (
        f"TOKEN=$(curl -s -X POST {urls.issuer}/dev/token -H 'content-type: application/json' "
        f'-d \'{{"username":"alice","resource":"{urls.mcp_url}"}}\' '
        "| python3 -c 'import json,sys; print(json.load(sys.stdin)[\"access_token\"])')"
    )
    rule = "=" * 78
    return "\n".join(
        [
            rule,
            "  COATCHECK DEVELOPMENT STACK - DEVELOPMENT ONLY, NOT FOR PRODUCTION",
            "  Anyone can sign in as anyone at the dev IdP; the secrets are generated dev-only ones.",
            rule,
            f"  MCP endpoint   {urls.mcp_url}",
            f"  dev IdP        {urls.issuer}   (any username, no password; log: {data_dir / 'devidp.log'})",
            f"  database       {database}",
            f"  secrets        {data_dir / 'secrets.json'}   (generated, mode 0600)",
            "",
            "  Claude Code:",
            f"    claude mcp add --transport http coatcheck {urls.mcp_url}",
            "    claude mcp login coatcheck          # browser sign-in at the dev IdP, any username",
            "",
            "  A dev token for scripts (username alice):",
            f"    {token_command}",
            "",
            "  MCP Inspector (CLI, with that token; --protocol-era modern, or checkout and connect fail):",
            f"    npx -y @modelcontextprotocol/inspector@{INSPECTOR_VERSION} --cli {urls.mcp_url} "
            '--protocol-era modern --header "Authorization: Bearer $TOKEN" --method tools/list',
            "",
            "  Ctrl-C stops everything coatcheck dev started; the next run reuses the data.",
            rule,
        ]
    )


def _prune_dead_handles(pg_dir: Path) -> None:
    # pgserver stops its server only when the last registered process lets go; a crashed run
    # (kill -9) would otherwise keep the server alive for ever.
    import psutil  # type: ignore[import-untyped]

    handles = pg_dir / ".handle_pids.json"
    if handles.exists():
        alive = [pid for pid in json.loads(handles.read_text() or "[]") if psutil.pid_exists(pid)]
        handles.write_text(json.dumps(alive))


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run_dev(*, data_dir: Path, host: str, port: int, idp_port: int) -> None:
    """Run the development stack until SIGINT/SIGTERM (see the module docstring)."""
    from api.app import create_app
    from api.serving import run_http_server
    from api.settings import Settings

    # SIGTERM ends the stack like Ctrl-C: uvicorn shuts down cleanly and re-raises the signal it caught,
    # which must unwind through the clean-up below rather than kill the process and orphan its children.
    signal.signal(signal.SIGTERM, _interrupt)
    urls = DevUrls(host=host, port=port, idp_port=idp_port)
    node = check_node()
    devidp = devidp_directory()
    if not os.environ.get("DATABASE_URL"):
        try:
            require_embedded_postgres()  # before anything is started or written
        except EmbeddedPostgresError as exc:
            raise DevError(str(exc)) from None
    data_dir = data_dir.resolve()
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_data_dir(data_dir)
    dev_secrets, created = load_or_create_secrets(data_dir / "secrets.json")
    _say(("generated development secrets in " if created else "reusing the data and secrets in ") + str(data_dir))
    ensure_devidp_installed(devidp, data_dir / "npm-install.log")

    with contextlib.ExitStack() as stack:
        database_url = os.environ.get("DATABASE_URL")
        if database_url:
            database = "DATABASE_URL (left running on exit)"
        else:
            pg_dir = data_dir / "postgres"
            fresh = not (pg_dir / "PG_VERSION").exists()
            _prune_dead_handles(pg_dir)
            try:
                embedded = start_embedded_postgres(pg_dir)
            except EmbeddedPostgresError as exc:
                raise DevError(str(exc)) from None
            stack.callback(embedded.stop)
            database_url = embedded.ensure_database(DATABASE_NAME)
            database = f"embedded PostgreSQL 16 ({'new' if fresh else 'existing'} data in {pg_dir})"
            _say(f"started the embedded PostgreSQL ({'initialised' if fresh else 'reused'} {pg_dir})")
        stack.enter_context(run_devidp(node, devidp, urls, data_dir, dev_secrets))
        _say(f"started the dev IdP at {urls.issuer}")
        changed = _prepare_database(database_url)
        _say(f"migrated the database; demo catalog loaded ({changed} products added or changed)")

        os.environ["DEMO_CLIENT_SECRET"] = dev_secrets["DEMO_CLIENT_SECRET"]  # PROVIDERS names this variable
        providers = {
            "demo": {
                "display_name": "Demo provider (dev IdP)",
                "issuer": urls.issuer,
                "client_id": DEMO_CLIENT_ID,
                "client_secret_env": "DEMO_CLIENT_SECRET",
                "scopes": ["openid", "profile", "email"],
            }
        }
        settings = Settings.from_env(
            database_url=database_url,
            public_url=urls.public_url,
            oidc_issuer=urls.issuer,
            request_state_keys=dev_secrets["REQUEST_STATE_KEYS"],
            token_encryption_keys=dev_secrets["TOKEN_ENCRYPTION_KEYS"],
            oidc_client_id=LOGIN_CLIENT_ID,
            oidc_client_secret=dev_secrets["OIDC_CLIENT_SECRET"],
            providers=json.dumps(providers),
        )
        print(_banner(urls, data_dir, database), flush=True)
        _say(f"serving on {urls.public_url} (ready)")
        with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises the Ctrl-C after its clean shutdown
            run_http_server(create_app(settings), settings, host=host, port=port)
        _say("stopping the dev IdP" + ("" if os.environ.get("DATABASE_URL") else " and the embedded PostgreSQL"))
    _say("stopped")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``coatcheck dev``."""
    parser.add_argument(
        "--data-dir",
        default=DEFAULT_DATA_DIR,
        help=f"where the embedded PostgreSQL, the dev secrets and the dev IdP's keys live (default {DEFAULT_DATA_DIR})",
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address of the server and the dev IdP")
    parser.add_argument("--port", type=int, default=8000, help="Coatcheck's port (default 8000)")
    parser.add_argument("--idp-port", type=int, default=9400, help="the dev IdP's port (default 9400)")


def main(args: argparse.Namespace) -> None:
    """The ``coatcheck dev`` sub-command."""
    try:
        run_dev(data_dir=Path(args.data_dir), host=args.host, port=args.port, idp_port=args.idp_port)
    except DevError as exc:
        print(f"coatcheck dev: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        _say("interrupted; stopped")
