"""The pinned Node MCP clients (tests/support/node.py), installed on first use, and the sign-in sites their
OAuth flows run against."""

from collections.abc import Callable

import pytest

from store.principal import Principal
from tests.support.devidp import DevIdP
from tests.support.node import NodeClients, node_clients
from tests.support.server import RunningServer
from tests.support.sign_in import SignInSite, sign_in_at_the_dev_idp


@pytest.fixture(scope="module")
def clients() -> NodeClients:
    """Claude Code, MCP Inspector and mcp-remote with a Node 22 to run them (skips if npm cannot install them)."""
    return node_clients()


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


# One entry per AUTH_MODE: how to get a running Coatcheck in that mode and the person's part of its sign-in.
# Each builds only what its mode needs (request.getfixturevalue), so one mode's servers never start for another.
SIGN_IN_SITES: dict[str, Callable[[pytest.FixtureRequest], SignInSite]] = {
    "resource-server": _resource_server,
}


@pytest.fixture(params=sorted(SIGN_IN_SITES))
def sign_in_site(request: pytest.FixtureRequest) -> SignInSite:
    """A running Coatcheck and how a person signs in at its authorization page in Chromium, per AUTH_MODE."""
    return SIGN_IN_SITES[request.param](request)
