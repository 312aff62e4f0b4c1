"""The pinned Node MCP clients (tests/support/node.py), installed on first use, and the sign-in sites their
OAuth flows run against."""

import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from store.principal import Principal
from tests.support.authserver import GITHUB_ISSUER, dev_idp_upstream_env, github_upstream_env
from tests.support.devidp import DEMO_CLIENT_ID, LOGIN_CLIENT_ID, DevIdP, devidp_clients, start_devidp
from tests.support.github_like import GithubLike, serve_github_like
from tests.support.node import NodeClients, node_clients
from tests.support.server import RunningServer, run_server
from tests.support.sign_in import (
    SignInSite,
    sign_in_at_github_like_and_allow,
    sign_in_at_the_dev_idp,
    sign_in_at_the_dev_idp_and_allow,
)
from tests.support.waiting import free_port


@pytest.fixture(scope="module")
def clients() -> NodeClients:
    """Claude Code, MCP Inspector and mcp-remote with a Node 22 to run them (skips if npm cannot install them)."""
    return node_clients()


def _idp_secrets() -> dict[str, str]:
    return {LOGIN_CLIENT_ID: secrets.token_urlsafe(32), DEMO_CLIENT_ID: secrets.token_urlsafe(32)}


# Claude Code names its client metadata document (https://claude.ai/oauth/claude-code-client-metadata) when
# the metadata advertises documents; CI cannot reach claude.ai, so the client tests' servers turn documents
# off and the clients register dynamically (RFC 7591). Documents are tested in tests/browser and tests/api.
NO_METADATA_DOCUMENTS = {"AS_CIMD_ENABLED": "false"}


@dataclass(frozen=True)
class DevIdPAuthorizationServer:
    """Coatcheck in authorization-server mode and the dev IdP it signs people in at."""

    server: RunningServer
    public_url: str
    upstream: DevIdP


@pytest.fixture(scope="session")
def dev_idp_authorization_server(database_url: str) -> Iterator[DevIdPAuthorizationServer]:
    """A real ``coatcheck serve`` in authorization-server mode (own PUBLIC_URL, same database) whose sign-in
    is the dev IdP, found by OpenID discovery."""
    port = free_port()
    public_url = f"http://127.0.0.1:{port}"
    idp_secrets = _idp_secrets()
    clients = devidp_clients(public_url, idp_secrets)
    with start_devidp(port=free_port(), resources=[f"{public_url}/mcp"], clients=clients) as upstream:
        env = dev_idp_upstream_env(
            database_url=database_url, public_url=public_url, upstream=upstream, upstream_secrets=idp_secrets
        )
        with run_server({**env, **NO_METADATA_DOCUMENTS}, port=port) as server:
            yield DevIdPAuthorizationServer(server, public_url, upstream)


@dataclass(frozen=True)
class GithubAuthorizationServer:
    """Coatcheck in authorization-server mode and the GitHub-shaped server it signs people in at."""

    server: RunningServer
    public_url: str
    github: GithubLike


@pytest.fixture(scope="session")
def github_authorization_server(database_url: str) -> Iterator[GithubAuthorizationServer]:
    """A real ``coatcheck serve`` in authorization-server mode whose sign-in is the GitHub-shaped plain OAuth
    2.0 server (``UPSTREAM_KIND=oauth2``); the dev IdP is there only as the "demo" connection provider."""
    port = free_port()
    public_url = f"http://127.0.0.1:{port}"
    idp_secrets = _idp_secrets()
    clients = devidp_clients(public_url, idp_secrets)
    with (
        serve_github_like(redirect_uri=f"{public_url}/oauth/login/callback") as github,
        start_devidp(port=free_port(), resources=[f"{public_url}/mcp"], clients=clients) as demo_idp,
    ):
        env = github_upstream_env(
            database_url=database_url,
            public_url=public_url,
            github=github,
            demo_idp=demo_idp,
            demo_secrets=idp_secrets,
        )
        with run_server({**env, **NO_METADATA_DOCUMENTS}, port=port) as server:
            yield GithubAuthorizationServer(server, public_url, github)


def _resource_server(request: pytest.FixtureRequest) -> SignInSite:
    """Today's default: the session's ``coatcheck serve`` accepts the dev IdP's tokens; clients register at the
    dev IdP dynamically and the person signs in on its login page."""
    server: RunningServer = request.getfixturevalue("server")
    devidp: DevIdP = request.getfixturevalue("devidp")
    return SignInSite(
        mode="resource-server",
        mcp_url=server.mcp_url,
        authorization_server=devidp.issuer,
        principal=lambda username: Principal(issuer=devidp.issuer, subject=username),
        sign_in=sign_in_at_the_dev_idp,
    )


def _authorization_server_dev_idp(request: pytest.FixtureRequest) -> SignInSite:
    """Coatcheck is the authorization server (clients register there and get its tokens); the person signs in
    at the dev IdP upstream and allows the client on Coatcheck's consent page. Whom Coatcheck serves is the
    upstream pair: (the dev IdP's issuer, the username)."""
    site: DevIdPAuthorizationServer = request.getfixturevalue("dev_idp_authorization_server")
    issuer = site.upstream.issuer
    return SignInSite(
        mode="authorization-server/dev-idp",
        mcp_url=site.server.mcp_url,
        authorization_server=site.public_url,  # the issuer its metadata and tokens carry
        principal=lambda username: Principal(issuer=issuer, subject=username),
        sign_in=sign_in_at_the_dev_idp_and_allow,
    )


def _authorization_server_github(request: pytest.FixtureRequest) -> SignInSite:
    """Coatcheck is the authorization server; the person signs in at the GitHub-shaped upstream's login form
    and allows the client. Whom Coatcheck serves: (the configured UPSTREAM_ISSUER, the numeric id the
    GitHub-shaped server gives that login, as a string)."""
    site: GithubAuthorizationServer = request.getfixturevalue("github_authorization_server")
    return SignInSite(
        mode="authorization-server/github",
        mcp_url=site.server.mcp_url,
        authorization_server=site.public_url,  # the issuer its metadata and tokens carry
        principal=lambda username: Principal(issuer=GITHUB_ISSUER, subject=str(site.github.id_of(username))),
        sign_in=sign_in_at_github_like_and_allow,
    )


# One entry per AUTH_MODE (and upstream): how to get a running Coatcheck in that mode and the person's part of
# its sign-in. Each builds only what its mode needs (request.getfixturevalue), so one mode's servers never
# start for another.
SIGN_IN_SITES: dict[str, Callable[[pytest.FixtureRequest], SignInSite]] = {
    "resource-server": _resource_server,
    "authorization-server/dev-idp": _authorization_server_dev_idp,
    "authorization-server/github": _authorization_server_github,
}


def _site_param(mode: str) -> object:
    """The resource-server site is the session's server, so it follows COATCHECK_TEST_AUTH_MODE and is that
    mode's alone; the authorization-server sites start their own servers in their own mode whatever the run's."""
    if mode == "resource-server":
        only_there = pytest.mark.resource_server_only(reason="the session server as a resource server")
        return pytest.param(mode, marks=only_there)
    return pytest.param(mode, marks=pytest.mark.sets_own_auth_mode)


@pytest.fixture(params=[_site_param(mode) for mode in sorted(SIGN_IN_SITES)])
def sign_in_site(request: pytest.FixtureRequest) -> SignInSite:
    """A running Coatcheck and how a person signs in at its authorization page in Chromium, per AUTH_MODE."""
    return SIGN_IN_SITES[request.param](request)
