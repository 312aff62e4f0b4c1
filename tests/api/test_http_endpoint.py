"""The /mcp endpoint at wire level, over real HTTP against a running server.

These checks sit below the SDK client on purpose: status codes, the WWW-Authenticate
challenge, 405s and the absence of session ids are exactly what a client library hides.
"""

import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.support.devidp import DevIdP
from tests.support.server import RunningServer
from tests.support.waiting import wait_until
from tests.support.wire import PROTOCOL_VERSION, post, response_message


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=15.0) as client:
        yield client


@pytest.fixture
async def token(devidp: DevIdP, server: RunningServer) -> str:
    return await devidp.token("wire-user", resource=server.mcp_url)


def _expected_challenge(server: RunningServer) -> str:
    return f'resource_metadata="{server.base_url}/.well-known/oauth-protected-resource/mcp"'


def test_a_request_without_a_token_gets_401_pointing_at_the_resource_metadata(
    http: httpx.Client, server: RunningServer
) -> None:
    response = post(http, server.mcp_url, "tools/list")
    assert response.status_code == 401
    challenge = response.headers["www-authenticate"]
    assert challenge.startswith("Bearer ")
    assert _expected_challenge(server) in challenge


@pytest.mark.parametrize("authorization", [None, "Basic dXNlcjpwYXNz", "Bearer"])
def test_a_request_without_bearer_credentials_gets_a_challenge_without_an_error_code(
    http: httpx.Client, server: RunningServer, authorization: str | None
) -> None:
    # RFC 6750 §3.1: when the request lacks any authentication information, no error code.
    extra = {"Authorization": authorization} if authorization is not None else None
    response = post(http, server.mcp_url, "tools/list", extra_headers=extra)
    assert response.status_code == 401
    challenge = response.headers["www-authenticate"]
    assert challenge == f"Bearer {_expected_challenge(server)}"
    assert "error=" not in challenge


async def test_a_bad_token_is_challenged_with_invalid_token(
    http: httpx.Client, server: RunningServer, devidp: DevIdP
) -> None:
    expired = await devidp.token("wire-user", resource=server.mcp_url, expires_in=-3600)
    for bad in ("not-a-jwt", expired):
        response = post(http, server.mcp_url, "tools/list", token=bad)
        assert response.status_code == 401
        assert 'error="invalid_token"' in response.headers["www-authenticate"]
        assert _expected_challenge(server) in response.headers["www-authenticate"]


def test_the_resource_metadata_lists_the_issuer_as_authorization_server(
    http: httpx.Client, server: RunningServer, devidp: DevIdP
) -> None:
    for path in ("/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"):
        document = http.get(server.base_url + path).json()
        assert document["resource"] == server.mcp_url
        assert document["authorization_servers"] == [devidp.issuer]


@pytest.mark.parametrize(
    "variant",
    ["garbage", "expired", "other_audience", "not_yet_valid", "tampered_signature", "unsigned"],
)
async def test_a_bad_token_gets_401(http: httpx.Client, server: RunningServer, devidp: DevIdP, variant: str) -> None:
    if variant == "garbage":
        bad = "not-a-jwt"
    elif variant == "expired":
        bad = await devidp.token("wire-user", resource=server.mcp_url, expires_in=-3600)
    elif variant == "other_audience":
        bad = await devidp.token("wire-user", resource=server.mcp_url, audience="http://elsewhere.test/mcp")
    elif variant == "not_yet_valid":
        bad = await devidp.token("wire-user", resource=server.mcp_url, not_before_in=3600)
    elif variant == "tampered_signature":
        good = await devidp.token("wire-user", resource=server.mcp_url)
        head, payload, signature = good.split(".")
        bad = ".".join([head, payload, signature[:-4] + ("AAAA" if signature[-4:] != "AAAA" else "BBBB")])
    else:
        import base64
        import json

        def b64(data: dict[str, object]) -> str:
            return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()

        claims = {"sub": "mallory", "iss": devidp.issuer, "aud": server.mcp_url, "exp": 9999999999}
        bad = f"{b64({'alg': 'none', 'typ': 'JWT'})}.{b64(claims)}."
    response = post(http, server.mcp_url, "tools/list", token=bad)
    assert response.status_code == 401
    assert _expected_challenge(server) in response.headers["www-authenticate"]


@pytest.mark.parametrize("alg", ["RS256", "ES256"])
async def test_rs256_and_es256_tokens_with_only_openid_scope_are_accepted(
    http: httpx.Client, server: RunningServer, devidp: DevIdP, alg: str
) -> None:
    good = await devidp.token("wire-user", resource=server.mcp_url, alg=alg, scope="openid")
    response = post(http, server.mcp_url, "tools/list", token=good)
    assert response.status_code == 200
    names = {tool["name"] for tool in response_message(response)["result"]["tools"]}
    assert {"catalog_search", "cart_create", "cart_set_item", "cart_view", "cart_list", "cart_delete"} <= names


@pytest.mark.parametrize("method", ["GET", "DELETE"])
@pytest.mark.parametrize("protocol_version", [None, PROTOCOL_VERSION, "2025-11-25"])
@pytest.mark.parametrize("authenticated", [False, True])
def test_get_and_delete_answer_405_for_every_client(
    http: httpx.Client,
    server: RunningServer,
    token: str,
    method: str,
    protocol_version: str | None,
    authenticated: bool,
) -> None:
    headers = {"Accept": "text/event-stream, application/json"}
    if protocol_version:
        headers["MCP-Protocol-Version"] = protocol_version
    if authenticated:
        headers["Authorization"] = f"Bearer {token}"
    response = http.request(method, server.mcp_url, headers=headers)
    assert response.status_code == 405
    assert response.headers["allow"] == "POST"


def test_no_session_id_is_minted_or_honoured_and_no_initialize_is_needed(
    http: httpx.Client, server: RunningServer, token: str
) -> None:
    discovered = post(http, server.mcp_url, "server/discover", token=token)
    assert discovered.status_code == 200
    assert PROTOCOL_VERSION in response_message(discovered)["result"]["supportedVersions"]
    assert "mcp-session-id" not in discovered.headers
    stale = post(http, server.mcp_url, "tools/list", token=token, extra_headers={"Mcp-Session-Id": "session-from-2025"})
    assert stale.status_code == 200
    assert "mcp-session-id" not in stale.headers


def test_a_foreign_browser_origin_gets_403(http: httpx.Client, server: RunningServer, token: str) -> None:
    response = post(http, server.mcp_url, "tools/list", token=token, extra_headers={"Origin": "https://evil.example"})
    assert response.status_code == 403
    same_origin = post(http, server.mcp_url, "tools/list", token=token, extra_headers={"Origin": server.base_url})
    assert same_origin.status_code == 200


def test_a_host_outside_the_allow_list_is_refused(http: httpx.Client, server: RunningServer, token: str) -> None:
    response = post(http, server.mcp_url, "tools/list", token=token, extra_headers={"Host": "evil.example:80"})
    assert response.status_code in {400, 403, 421}


def test_health_and_readiness(http: httpx.Client, server: RunningServer) -> None:
    assert http.get(f"{server.base_url}/healthz").json() == {"status": "ok"}
    assert http.get(f"{server.base_url}/readyz").json() == {"status": "ready", "catalog_search": "indexed"}


async def test_bearer_tokens_and_secrets_never_reach_the_server_log(
    http: httpx.Client, server: RunningServer, devidp: DevIdP, server_env: dict[str, str]
) -> None:
    good = await devidp.token("log-watcher", resource=server.mcp_url)
    expired = await devidp.token("log-watcher", resource=server.mcp_url, expires_in=-60)
    post(http, server.mcp_url, "tools/list", token=good)
    post(http, server.mcp_url, "tools/call", {"name": "cart_view", "arguments": {"cart_id": "nope"}}, token=good)
    post(http, server.mcp_url, "tools/list", token=expired)
    post(http, server.mcp_url, "tools/list", token=good, extra_headers={"Origin": "https://evil.example"})
    log = server.log_text()
    assert '"POST /mcp HTTP/1.1" 200' in log  # the access log names the endpoint, so its silence means something
    secrets = [
        good,
        expired,
        *server_env["REQUEST_STATE_KEYS"].split(","),
        *server_env["TOKEN_ENCRYPTION_KEYS"].split(","),
    ]
    secrets.append(server_env["OIDC_CLIENT_SECRET"])
    for secret in secrets:
        assert secret not in log
        assert secret[-24:] not in log  # not even a fragment of a signature or key


def test_a_token_sent_in_a_query_string_never_reaches_the_access_log(
    http: httpx.Client, server: RunningServer, token: str
) -> None:
    marker = f"leak-{uuid.uuid4().hex[:8]}"
    http.get(f"{server.base_url}/healthz", params={"access_token": token, "m": marker})
    post(http, f"{server.mcp_url}?access_token={token}&m={marker}", "tools/list", token=token)
    http.get(f"{server.base_url}/connect/flow_x", params={"access_token": token}, follow_redirects=False)

    def logged() -> bool:
        log = server.log_text()
        requests = ("GET /healthz", "POST /mcp", "GET /connect/flow_x")
        return all(f'"{request}?[redacted] HTTP/1.1"' in log for request in requests)

    wait_until(logged, timeout=5, what="the three access lines, redacted")
    log = server.log_text()
    assert token not in log
    assert token[-24:] not in log
    assert marker not in log  # the whole query string goes, not only the parameter named like a token
