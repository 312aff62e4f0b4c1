"""Pieces an OAuth client needs in tests: SDK token storage, PKCE, and the dev IdP's sign-in without a browser."""

import base64
import hashlib
import re
import secrets
from dataclasses import dataclass
from urllib.parse import parse_qs, urljoin, urlsplit

import httpx2
import pytest
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthToken

from tests.support.devidp import DEMO_CLIENT_ID, DevIdP

LOGIN_FORM = re.compile(r'<form method="post" action="(?P<action>[^"]+)">')


class MemoryTokenStorage:
    """The MCP SDK's ``TokenStorage``, in memory, for one client run."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client_info: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client_info = client_info


@dataclass(frozen=True)
class Pkce:
    """A PKCE verifier and its S256 challenge."""

    verifier: str
    challenge: str

    @classmethod
    def new(cls) -> "Pkce":
        verifier = secrets.token_urlsafe(48)
        digest = hashlib.sha256(verifier.encode("ascii")).digest()
        return cls(verifier, base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii"))


def sign_in(
    idp: DevIdP,
    browser: httpx2.Client,
    *,
    client_id: str,
    redirect_uri: str,
    username: str,
    scope: str,
    pkce: Pkce,
    resource: str | None,
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    """Walk authorize -> login form -> redirect URI; return the parameters the redirect URI would receive.

    ``resource`` is the RFC 8707 resource indicator (``None``: send none, as the "demo" provider client does).
    """
    state = secrets.token_urlsafe(16)
    params = {
        "response_type": "code",
        "client_id": client_id,
        "redirect_uri": redirect_uri,
        "scope": scope,
        "state": state,
        "code_challenge": pkce.challenge,
        "code_challenge_method": "S256",
    }
    if resource is not None:
        params["resource"] = resource
    params.update(extra or {})
    response = browser.get(f"{idp.base_url}/auth", params=params)
    assert response.status_code == 303, response.text
    login_page = browser.get(urljoin(idp.issuer, response.headers["location"]))
    assert login_page.status_code == 200, login_page.text
    assert "Development identity provider — not for production" in login_page.text
    form = LOGIN_FORM.search(login_page.text)
    assert form is not None, login_page.text
    response = browser.post(urljoin(idp.issuer, form["action"]), data={"username": username})
    for _ in range(5):
        assert response.status_code in (302, 303), response.text
        location = urljoin(idp.issuer, response.headers["location"])
        if location.startswith(redirect_uri):
            break
        response = browser.get(location)
    else:
        pytest.fail("the provider never redirected back to the client")
    assert urlsplit(location)._replace(query="").geturl() == redirect_uri
    returned = {key: values[0] for key, values in parse_qs(urlsplit(location).query).items()}
    assert returned["state"] == state
    assert returned["iss"] == idp.issuer  # RFC 9207
    return returned


def token_request(idp: DevIdP, data: dict[str, str], auth: tuple[str, str] | None = None) -> httpx2.Response:
    """``POST`` ``data`` to the dev IdP's token endpoint (``auth``: HTTP Basic client credentials)."""
    return httpx2.post(f"{idp.base_url}/token", data=data, auth=auth, timeout=10.0)


def demo_provider_tokens(devidp: DevIdP, public_url: str, client_secret: str, username: str) -> dict[str, str]:
    """Tokens the dev IdP issues to Coatcheck's "demo" provider client for ``username`` (the code flow, no browser)."""
    redirect_uri = f"{public_url}/oauth/callback"
    pkce = Pkce.new()
    with httpx2.Client(follow_redirects=False, timeout=10.0) as browser:
        returned = sign_in(
            devidp,
            browser,
            client_id=DEMO_CLIENT_ID,
            redirect_uri=redirect_uri,
            username=username,
            scope="openid profile email offline_access",
            pkce=pkce,
            resource=None,
        )
    data = {"grant_type": "authorization_code", "code": returned["code"], "redirect_uri": redirect_uri}
    response = token_request(devidp, {**data, "code_verifier": pkce.verifier}, auth=(DEMO_CLIENT_ID, client_secret))
    assert response.status_code == 200, response.text
    return dict(response.json())


REDIRECT_URI = "http://localhost:53682/callback"  # never listened on: the test reads the redirect itself


class FormFillingUser:
    """Plays the person at the browser: opens the authorization URL, types a username, submits."""

    def __init__(self, username: str) -> None:
        self.username = username
        self.authorization_url: str | None = None
        self.result: AuthorizationCodeResult | None = None

    async def open(self, authorization_url: str) -> None:
        self.authorization_url = authorization_url
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(10.0)) as browser:
            response = await browser.get(authorization_url)
            for _ in range(5):
                if response.status_code not in (302, 303):
                    break
                location = urljoin(authorization_url, response.headers["location"])
                # An IdP that refuses the request sends the browser straight back with an error.
                assert not location.startswith(REDIRECT_URI), f"the IdP refused the authorization request: {location}"
                response = await browser.get(location)
            form = LOGIN_FORM.search(response.text)
            assert form is not None, response.text
            response = await browser.post(urljoin(str(response.url), form["action"]), data={"username": self.username})
            for _ in range(5):
                assert response.status_code in (302, 303), response.text
                location = urljoin(authorization_url, response.headers["location"])
                if location.startswith(REDIRECT_URI):
                    query = parse_qs(urlsplit(location).query)
                    self.result = AuthorizationCodeResult(
                        code=query["code"][0], state=query["state"][0], iss=query.get("iss", [None])[0]
                    )
                    return
                response = await browser.get(location)
        raise AssertionError("the IdP never redirected back to the client")

    async def callback(self) -> AuthorizationCodeResult:
        assert self.result is not None
        return self.result
