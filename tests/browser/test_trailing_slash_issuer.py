"""The /connect browser sign-in with an issuer written Auth0's way, ``https://tenant.auth0.com/``.

A real ``coatcheck serve`` with ``OIDC_ISSUER`` ending in a slash, the dev IdP writing its issuer the same way
(in discovery, in every token's ``iss`` and in the RFC 9207 ``iss`` of its redirects), and a person in
headless Chromium: the MCP token's principal and the browser's sign-in must compare as the same
(issuer, subject), slash included, for the connection to go through.
"""

import json
import uuid

import pytest

from tests.support.browser import BrowserUserFactory, LinkOpener
from tests.support.devidp import DEMO_CLIENT_ID, LOGIN_CLIENT_ID, demo_provider_config, devidp_clients, start_devidp
from tests.support.mcp_client import connect, text_of
from tests.support.server import run_server
from tests.support.waiting import free_port

pytestmark = pytest.mark.resource_server_only(reason="the upstream's trailing-slash issuer in its own tokens")


async def test_a_user_signs_in_at_a_trailing_slash_issuer_and_connects_as_the_same_principal(
    database_url: str,
    request_state_keys: str,
    token_encryption_keys: str,
    oauth_client_secrets: dict[str, str],
    browser_user: BrowserUserFactory,
) -> None:
    idp_port, app_port = free_port(), free_port()
    issuer = f"http://127.0.0.1:{idp_port}/"
    app_url = f"http://127.0.0.1:{app_port}"
    clients = devidp_clients(app_url, oauth_client_secrets)
    with (
        start_devidp(
            port=idp_port, resources=[f"{app_url}/mcp"], clients=clients, env={"DEVIDP_ISSUER": issuer}
        ) as idp,
        run_server(
            {
                "DATABASE_URL": database_url,
                "OIDC_ISSUER": issuer,
                "REQUEST_STATE_KEYS": request_state_keys,
                "TOKEN_ENCRYPTION_KEYS": token_encryption_keys,
                "OIDC_CLIENT_ID": LOGIN_CLIENT_ID,
                "OIDC_CLIENT_SECRET": oauth_client_secrets[LOGIN_CLIENT_ID],
                "PROVIDERS": demo_provider_config(issuer),
                "DEMO_CLIENT_SECRET": oauth_client_secrets[DEMO_CLIENT_ID],
            },
            port=app_port,
            public_url=app_url,
        ) as app,
    ):
        person = await browser_user(f"slash-{uuid.uuid4().hex[:8]}")
        opener = LinkOpener(person)
        token = await idp.token(person.username, resource=app.mcp_url)
        async with connect(app.mcp_url, token, elicitation_callback=opener) as client:
            result = await client.call_tool("connection_whoami", {"provider": "demo"})
        landing = await opener.landing()
        log = app.log_text()

    assert idp.issuer == issuer
    assert landing.status == 200, landing.text
    assert "Connected — return to your assistant" in landing.text
    assert person.sign_ins == 1  # signed in once at the IdP; the same-user check passed
    assert not result.is_error, text_of(result)
    assert result.structured_content is not None
    assert result.structured_content["profile"]["sub"] == person.username
    assert "names another issuer" not in log
    assert token not in log
    assert json.dumps(token) not in log
