"""Which authentication mode the test run's servers use, and MCP access tokens honestly obtained in that mode.

``COATCHECK_TEST_AUTH_MODE`` (read once, by tests/conftest.py) is ``resource-server`` (the default) or
``authorization-server``. In the first, MCP clients present access tokens the dev IdP issued (its
``POST /dev/token``). In the second, the session server and the in-process apps run with
``AUTH_MODE=authorization-server`` (:func:`authorization_server_settings`), and an MCP access token is one
Coatcheck itself issued, obtained the way a client gets it: discovery from the protected-resource metadata,
``/authorize`` with PKCE for the suite's pre-registered public client, the person's sign-in at the dev IdP
(its login form, posted over plain HTTP), the consent page answered with its own form token and ``Origin``,
then ``/token``. The principal is therefore still (dev IdP issuer, username), as in resource-server mode.

Each (server, username) pair walks that flow once; the token is cached while it has more than a minute to
live (the tests' servers issue hour-long tokens, ``AS_ACCESS_TOKEN_SECONDS``' maximum), so the mode costs a
few HTTP round trips per user, not per test. Each username has its own cookie jar (one person's browser), so a
second server of the same deployment (same database and keys) finds the person signed in already.
"""

import html
import json
import os
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import parse_qs, urljoin, urlsplit

import httpx2

from tests.support.devidp import DevIdP
from tests.support.oauth import LOGIN_FORM, Pkce

MODE_VARIABLE = "COATCHECK_TEST_AUTH_MODE"
RESOURCE_SERVER = "resource-server"
AUTHORIZATION_SERVER = "authorization-server"
AuthMode = Literal["resource-server", "authorization-server"]

# The suite's pre-registered public client (AS_CLIENTS). Nothing listens at its redirect URI: the walk below
# reads the code off the redirect instead of following it.
TEST_CLIENT_ID = "coatcheck-test-suite"
TEST_REDIRECT_URI = "http://127.0.0.1:9/coatcheck-test-suite/callback"
TOKEN_SECONDS = 3600  # the maximum AS_ACCESS_TOKEN_SECONDS allows
_RENEW_BEFORE = 60.0  # seconds of life left below which a cached token is replaced
_MAX_HOPS = 12
_CONSENT_FORM = 'name="decision" value="allow"'


def auth_mode_from(environ: dict[str, str] | None = None) -> AuthMode:
    """The mode ``COATCHECK_TEST_AUTH_MODE`` names (unset or empty: resource-server).

    Raises:
        ValueError: for any other value, naming the two allowed ones.
    """
    raw = (os.environ if environ is None else environ).get(MODE_VARIABLE, "").strip().lower()
    if raw in ("", RESOURCE_SERVER):
        return "resource-server"
    if raw == AUTHORIZATION_SERVER:
        return "authorization-server"
    raise ValueError(f"{MODE_VARIABLE}={raw!r}: use {RESOURCE_SERVER!r} (the default) or {AUTHORIZATION_SERVER!r}")


def authorization_server_settings(signing_keys: str) -> dict[str, str]:
    """The settings that turn a test server's environment into authorization-server mode."""
    client = {"client_id": TEST_CLIENT_ID, "client_name": "Coatcheck test suite", "redirect_uris": [TEST_REDIRECT_URI]}
    return {
        "AUTH_MODE": AUTHORIZATION_SERVER,
        "AS_SIGNING_KEYS": signing_keys,
        "AS_ACCESS_TOKEN_SECONDS": str(TOKEN_SECONDS),
        "AS_CLIENTS": json.dumps([client]),
    }


class TokenFlowError(AssertionError):
    """Coatcheck's authorization flow did not end in a token; the message says where it stopped."""


@dataclass
class _Cached:
    token: str
    good_until: float  # time.monotonic()


@dataclass
class CoatcheckTokens:
    """Access tokens Coatcheck issues to the suite's client, per (MCP URL, username), walked for and cached."""

    idp: DevIdP
    home: str  # the session server's PUBLIC_URL, whose sign-in callback the dev IdP knows
    _tokens: dict[tuple[str, str], _Cached] = field(default_factory=dict)
    _cookies: dict[str, httpx2.Cookies] = field(default_factory=dict)

    async def token(self, username: str, *, resource: str, transport: httpx2.AsyncBaseTransport | None = None) -> str:
        """An access token for ``username`` at the MCP endpoint ``resource``.

        ``transport`` carries the requests to ``resource``'s origin (an in-process app); the dev IdP is always
        reached over the network.
        """
        key = (resource, username)
        cached = self._tokens.get(key)
        if cached is not None and cached.good_until - time.monotonic() > _RENEW_BEFORE:
            return cached.token
        started = time.monotonic()
        # An in-process app at the session server's own URL also takes the sign-in there: same settings.
        mounts: dict[str, httpx2.AsyncBaseTransport | None] = {}
        if transport is not None:
            mounts[f"{_origin(resource)}/"] = transport
        first_time = username not in self._cookies
        cookies = self._cookies.setdefault(username, httpx2.Cookies())
        async with httpx2.AsyncClient(
            timeout=httpx2.Timeout(15.0), follow_redirects=False, cookies=cookies, mounts=mounts or None
        ) as browser:
            if first_time:
                await self._sign_in_at_home(browser, username)
            access_token, lifetime = await self._walk(browser, username, resource)
            self._cookies[username] = browser.cookies
        self._tokens[key] = _Cached(access_token, started + lifetime)
        return access_token

    async def _sign_in_at_home(self, browser: httpx2.AsyncClient, username: str) -> None:
        """Sign the person in at the session server (its grants page asks for it), as they would once.

        The dev IdP knows only the session server's sign-in callback; other servers of the deployment (same
        database and keys, another port of the same host, so the browser sends the same cookie) then find
        the person signed in and go straight to consent.
        """
        response = await browser.get(f"{self.home}/oauth/grants")
        for _ in range(_MAX_HOPS):
            url = str(response.url)
            if response.status_code in (302, 303):
                response = await browser.get(urljoin(url, response.headers["location"]))
            elif response.status_code == 200 and (login := LOGIN_FORM.search(response.text)):
                response = await browser.post(urljoin(url, login["action"]), data={"username": username})
            elif response.status_code == 200 and url.startswith(self.home):
                return  # the grants page: signed in
            else:
                raise TokenFlowError(
                    f"signing in at {self.home}: {url} -> {response.status_code}: {response.text[:500]}"
                )
        raise TokenFlowError(f"signing in at {self.home} did not end within {_MAX_HOPS} steps")

    async def _walk(self, browser: httpx2.AsyncClient, username: str, resource: str) -> tuple[str, float]:
        metadata = await _discover(browser, self.idp, resource)
        pkce = Pkce.new()
        state = secrets.token_urlsafe(16)
        params = {
            "response_type": "code",
            "client_id": TEST_CLIENT_ID,
            "redirect_uri": TEST_REDIRECT_URI,
            "code_challenge": pkce.challenge,
            "code_challenge_method": "S256",
            "state": state,
            "resource": metadata.resource,
        }
        response = await browser.get(metadata.authorization_endpoint, params=params)
        for _ in range(_MAX_HOPS):
            url = str(response.url)
            if response.status_code in (302, 303):
                location = urljoin(url, response.headers["location"])
                if location.startswith(TEST_REDIRECT_URI):
                    return await self._redeem(browser, metadata, location, state, pkce)
                response = await browser.get(location)
            elif response.status_code == 200 and _CONSENT_FORM in response.text:
                response = await browser.post(
                    urljoin(url, _form_action(response.text)),
                    data={**_hidden_fields(response.text), "decision": "allow"},
                    headers={"Origin": _origin(url)},  # a browser's same-origin form post
                )
            elif response.status_code == 200 and (login := LOGIN_FORM.search(response.text)):
                # The dev IdP's sign-in page (checked after consent: its form looks alike): the person types a name.
                response = await browser.post(urljoin(url, login["action"]), data={"username": username})
            else:
                raise TokenFlowError(
                    f"{response.request.method} {url} -> {response.status_code}: {response.text[:500]}"
                )
        raise TokenFlowError(f"the authorization flow for {resource} did not end within {_MAX_HOPS} steps")

    async def _redeem(
        self, browser: httpx2.AsyncClient, metadata: "_Endpoints", location: str, state: str, pkce: Pkce
    ) -> tuple[str, float]:
        returned = {key: values[0] for key, values in parse_qs(urlsplit(location).query).items()}
        if returned.get("state") != state or "code" not in returned:
            raise TokenFlowError(f"the authorization server answered {returned}")
        response = await browser.post(
            metadata.token_endpoint,
            data={
                "grant_type": "authorization_code",
                "code": returned["code"],
                "redirect_uri": TEST_REDIRECT_URI,
                "client_id": TEST_CLIENT_ID,
                "code_verifier": pkce.verifier,
                "resource": metadata.resource,
            },
        )
        if response.status_code != 200:
            raise TokenFlowError(f"POST {metadata.token_endpoint} -> {response.status_code}: {response.text}")
        body = response.json()
        return str(body["access_token"]), float(body.get("expires_in") or 0)


@dataclass(frozen=True)
class _Endpoints:
    resource: str
    authorization_endpoint: str
    token_endpoint: str


async def _discover(browser: httpx2.AsyncClient, idp: DevIdP, resource: str) -> _Endpoints:
    """RFC 9728 then RFC 8414, as an MCP client finds its authorization server."""
    path = urlsplit(resource).path
    prm = await browser.get(f"{_origin(resource)}/.well-known/oauth-protected-resource{path}")
    if prm.status_code != 200:
        raise TokenFlowError(f"protected-resource metadata of {resource}: {prm.status_code} {prm.text[:300]}")
    issuer = str(prm.json()["authorization_servers"][0]).rstrip("/")
    if issuer == idp.base_url:
        raise TokenFlowError(
            f"{resource} names the dev IdP as its authorization server: it runs in resource-server mode, "
            f"but this run sets {MODE_VARIABLE}={AUTHORIZATION_SERVER}"
        )
    metadata_url = f"{issuer}/.well-known/oauth-authorization-server"
    answer = await browser.get(metadata_url)
    if answer.status_code != 200:
        raise TokenFlowError(f"{metadata_url}: {answer.status_code} {answer.text[:300]}")
    metadata = answer.json()
    return _Endpoints(
        resource=str(prm.json()["resource"]),
        authorization_endpoint=str(metadata["authorization_endpoint"]),
        token_endpoint=str(metadata["token_endpoint"]),
    )


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _form_action(page: str) -> str:
    start = page.index('<form method="post" action="') + len('<form method="post" action="')
    return page[start : page.index('"', start)]


def _hidden_fields(page: str) -> dict[str, str]:
    fields = re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', page)
    return {name: html.unescape(value) for name, value in fields}


@dataclass
class McpTokens:
    """``await mcp_token(username, resource=<MCP URL>)``: an access token that server accepts in this run's mode.

    Resource-server mode: the dev IdP's (``aud`` the MCP URL). Authorization-server mode: Coatcheck's own,
    through :class:`CoatcheckTokens`. ``transport`` reaches an in-process app at ``resource``'s origin.
    """

    idp: DevIdP
    issued: CoatcheckTokens | None = None

    @property
    def mode(self) -> AuthMode:
        return "resource-server" if self.issued is None else "authorization-server"

    async def __call__(
        self, username: str, *, resource: str, transport: httpx2.AsyncBaseTransport | None = None
    ) -> str:
        if self.issued is not None:
            return await self.issued.token(username, resource=resource, transport=transport)
        if resource in self.idp.resources:
            return await self.idp.token(username, resource=resource)
        return await self.idp.token(username, resource=self.idp.resources[0], audience=resource)
