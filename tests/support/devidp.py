"""Run the development identity provider (``devidp/server.mjs``) as a real Node process for tests.

``start_devidp`` starts it on a port, waits until its discovery document answers and stops it afterwards.
The returned ``DevIdP`` mints access tokens through ``POST /dev/token``, reads the request counters and
injects token-endpoint faults.
"""

import contextlib
import json
import os
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx2

from tests.support.node import NodeToolsError, ensure_installed, system_node
from tests.support.processes import answers_ok, stop_process
from tests.support.waiting import wait_until

DEVIDP_DIR = Path(__file__).resolve().parents[2] / "devidp"
SERVER_SCRIPT = DEVIDP_DIR / "server.mjs"
STARTUP_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0


class DevIdPError(RuntimeError):
    """The dev IdP could not be installed or started, or refused a request."""


def ensure_devidp_installed() -> None:
    """Run ``npm install`` in ``devidp/`` unless its dependencies are already there (a clean clone has none)."""
    try:
        ensure_installed(DEVIDP_DIR, DEVIDP_DIR / "node_modules" / "oidc-provider" / "package.json")
    except NodeToolsError as exc:
        raise DevIdPError(str(exc)) from None


def _raise_for_dev_endpoint(response: httpx2.Response) -> None:
    if response.status_code != 200:
        raise DevIdPError(
            f"{response.request.method} {response.request.url.path} -> {response.status_code}: {response.text}"
        )


@dataclass(frozen=True)
class DevIdP:
    """A running dev IdP: its issuer (exactly as its tokens write it), the resources it serves and its output."""

    issuer: str
    resources: tuple[str, ...]
    log_path: Path
    process: subprocess.Popen[bytes]

    @property
    def base_url(self) -> str:
        """The issuer without a trailing slash: what endpoint paths are appended to."""
        return self.issuer.rstrip("/")

    def log_text(self) -> str:
        """Everything the process printed so far (stdout and stderr)."""
        return self.log_path.read_text(errors="replace")

    async def _request(self, method: str, path: str, body: Mapping[str, object] | None = None) -> httpx2.Response:
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(10.0)) as http:
            return await http.request(method, f"{self.base_url}{path}", json=body)

    async def token(
        self,
        username: str,
        *,
        resource: str,
        scope: str = "openid",
        alg: str = "RS256",
        expires_in: int | None = None,
        audience: str | None = None,
        not_before_in: int | None = None,
        client_id: str | None = None,
    ) -> str:
        """A JWT access token for ``username`` (``sub``) and ``resource`` (``aud``), like the token endpoint's.

        ``expires_in`` may be negative (already expired). ``audience`` replaces ``aud`` with any value, for
        tokens meant for someone else. ``not_before_in`` sets ``nbf`` that many seconds from now.
        """
        body: dict[str, object] = {"username": username, "resource": resource, "scope": scope, "alg": alg}
        if expires_in is not None:
            body["expires_in"] = expires_in
        if audience is not None:
            body["audience"] = audience
        if not_before_in is not None:
            body["not_before_in"] = not_before_in
        if client_id is not None:
            body["client_id"] = client_id
        response = await self._request("POST", "/dev/token", body)
        _raise_for_dev_endpoint(response)
        token = response.json()["access_token"]
        assert isinstance(token, str)
        return token

    async def stats(self) -> dict[str, int]:
        """Requests that reached the provider: ``token_requests``, ``refresh_requests``, ``revocations``, ..."""
        response = await self._request("GET", "/dev/stats")
        _raise_for_dev_endpoint(response)
        data = response.json()
        assert isinstance(data, dict)
        return {str(key): int(value) for key, value in data.items()}

    async def reset_stats(self) -> None:
        """Set every counter back to zero."""
        _raise_for_dev_endpoint(await self._request("DELETE", "/dev/stats"))

    async def set_fault(self, token_endpoint: str) -> None:
        """``"error"``: the token endpoint answers ``invalid_grant`` to code and refresh grants; ``"ok"``: normal.

        ``"unavailable"`` answers 503 ``temporarily_unavailable`` instead.
        """
        _raise_for_dev_endpoint(await self._request("POST", "/dev/faults", {"token_endpoint": token_endpoint}))

    async def set_token_delay(self, seconds: float) -> None:
        """Answer code and refresh grants at the token endpoint only after ``seconds`` (``0``: at once).

        The request is counted in :meth:`stats` when it arrives, before the delay.
        """
        body = {"token_endpoint_delay_ms": round(seconds * 1000)}
        _raise_for_dev_endpoint(await self._request("POST", "/dev/faults", body))

    async def set_introspection_fault(self, mode: str) -> None:
        """``"unavailable"``: ``POST /token/introspection`` answers 503; ``"ok"``: normal."""
        _raise_for_dev_endpoint(await self._request("POST", "/dev/faults", {"introspection_endpoint": mode}))

    async def set_authorization_fault(self, mode: str, *, client_id: str | None = None) -> None:
        """``"deny"``: ``GET /auth`` for ``client_id`` answers ``error=access_denied`` at once; ``"hold"``: it
        shows a page and never redirects; ``"ok"``: normal. Other clients are unaffected when ``client_id`` is set.
        """
        body: dict[str, object] = {"authorization_endpoint": mode, "client_id": client_id}
        _raise_for_dev_endpoint(await self._request("POST", "/dev/faults", body))


@contextlib.contextmanager
def start_devidp(
    *,
    port: int,
    resources: Sequence[str],
    clients: list[dict[str, object]] | None = None,
    env: Mapping[str, str] | None = None,
) -> Iterator[DevIdP]:
    """Start ``node devidp/server.mjs`` on ``127.0.0.1:port`` and stop it when the block ends.

    ``resources`` become ``DEVIDP_RESOURCES`` (the first is the default resource), ``clients`` the static
    clients in ``DEVIDP_CLIENTS``; ``env`` adds or overrides any other ``DEVIDP_*`` variable (a
    ``DEVIDP_ISSUER`` there, e.g. with a trailing slash, becomes the ``DevIdP``'s issuer).
    Raises ``DevIdPError`` with the process's output if it exits or does not answer in time.
    """
    ensure_devidp_installed()
    try:
        node = system_node()
    except NodeToolsError as exc:
        raise DevIdPError(str(exc)) from None
    issuer = (env or {}).get("DEVIDP_ISSUER") or f"http://127.0.0.1:{port}"
    inherited = {key: value for key, value in os.environ.items() if not key.startswith("DEVIDP_")}
    full_env = {
        **inherited,
        "DEVIDP_ISSUER": issuer,
        "DEVIDP_HOST": "127.0.0.1",
        "DEVIDP_RESOURCES": ",".join(resources),
        **({"DEVIDP_CLIENTS": json.dumps(clients)} if clients else {}),
        **(env or {}),
    }
    log = tempfile.NamedTemporaryFile(prefix="coatcheck-devidp-", suffix=".log", delete=False)  # noqa: SIM115
    process = subprocess.Popen(
        [str(node), str(SERVER_SCRIPT)],
        env=full_env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=DEVIDP_DIR,
    )
    idp = DevIdP(issuer=issuer, resources=tuple(resources), log_path=Path(log.name), process=process)
    try:
        try:
            wait_until(
                lambda: answers_ok(f"{idp.base_url}/.well-known/openid-configuration", process),
                timeout=STARTUP_TIMEOUT,
                what=f"the dev IdP at {issuer}",
            )
        except (RuntimeError, TimeoutError) as exc:
            stop_process(process, timeout=STOP_TIMEOUT)
            raise DevIdPError(f"{exc}\n--- devidp output ---\n{idp.log_text()}") from None
        yield idp
    finally:
        stop_process(process, timeout=STOP_TIMEOUT)
        log.close()


# The static clients Coatcheck registers at the dev IdP: the browser sign-in and the "demo" provider.
LOGIN_CLIENT_ID = "coatcheck-login"
DEMO_CLIENT_ID = "coatcheck-demo"


def devidp_clients(public_url: str, client_secrets: dict[str, str]) -> list[dict[str, object]]:
    """The static confidential clients Coatcheck needs at the dev IdP (DEVIDP_CLIENTS)."""
    return [
        {
            "client_id": LOGIN_CLIENT_ID,
            "client_secret": client_secrets[LOGIN_CLIENT_ID],
            "client_name": "Coatcheck sign-in",
            "redirect_uris": [f"{public_url}/oauth/login/callback"],
            "post_logout_redirect_uris": [f"{public_url}/connect/signout"],
            "grant_types": ["authorization_code"],
            "scope": "openid",
        },
        {
            "client_id": DEMO_CLIENT_ID,
            "client_secret": client_secrets[DEMO_CLIENT_ID],
            "client_name": "Coatcheck (demo provider connection)",
            "redirect_uris": [f"{public_url}/oauth/callback"],
            "grant_types": ["authorization_code", "refresh_token"],
            "scope": "openid profile email offline_access",
        },
    ]


def demo_provider_config(issuer: str) -> str:
    """PROVIDERS for the dev IdP playing the "demo" provider (endpoints by OIDC discovery)."""
    return json.dumps(
        {
            "demo": {
                "display_name": "Demo provider",
                "issuer": issuer,
                "client_id": DEMO_CLIENT_ID,
                "client_secret_env": "DEMO_CLIENT_SECRET",
                "scopes": ["openid", "profile", "email"],
            }
        }
    )


def server_environment(
    *,
    database_url: str,
    public_url: str,
    idp: DevIdP,
    client_secrets: dict[str, str],
    request_state_keys: str,
    token_encryption_keys: str,
) -> dict[str, str]:
    """The required settings of a server that logs browsers in at ``idp`` and offers it as the "demo" provider."""
    return {
        "DATABASE_URL": database_url,
        "PUBLIC_URL": public_url,
        "OIDC_ISSUER": idp.issuer,
        "REQUEST_STATE_KEYS": request_state_keys,
        "TOKEN_ENCRYPTION_KEYS": token_encryption_keys,
        "OIDC_CLIENT_ID": LOGIN_CLIENT_ID,
        "OIDC_CLIENT_SECRET": client_secrets[LOGIN_CLIENT_ID],
        "PROVIDERS": demo_provider_config(idp.issuer),
        "DEMO_CLIENT_SECRET": client_secrets[DEMO_CLIENT_ID],
    }
