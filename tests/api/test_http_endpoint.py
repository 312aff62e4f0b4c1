"""The /mcp endpoint at wire level: raw HTTP requests, below the SDK client on purpose.

Status codes, the WWW-Authenticate challenge, 405s, the Origin and Host checks and the absence of session
ids are exactly what a client library hides. They are all decided by the app, so those requests go to the
app built in-process by ``create_app`` (``app_http``). The two log tests read what a real ``coatcheck serve``
process writes (its logging set up by ``serve``, uvicorn's access log), so they run against that process.
"""

import base64
import json
import re
import uuid
from collections.abc import Iterator

import httpx2
import pytest

from tests.support.auth_mode import McpTokens
from tests.support.devidp import DevIdP
from tests.support.inprocess import InProcessApp
from tests.support.leaks import assert_no_secrets
from tests.support.server import RunningServer
from tests.support.waiting import wait_until
from tests.support.wire import PROTOCOL_VERSION, post, post_async, response_message


@pytest.fixture
def http() -> Iterator[httpx2.Client]:
    """A client over a real socket, for the tests that read the server process's log."""
    with httpx2.Client(timeout=15.0) as client:
        yield client


@pytest.fixture
async def token(mcp_token: McpTokens, app: InProcessApp) -> str:
    return await mcp_token("wire-user", resource=app.mcp_url, transport=app.transport())


def _expected_challenge(base_url: str) -> str:
    return f'resource_metadata="{base_url}/.well-known/oauth-protected-resource/mcp"'


async def test_a_request_without_a_token_gets_401_pointing_at_the_resource_metadata(
    app_http: httpx2.AsyncClient, app: InProcessApp
) -> None:
    response = await post_async(app_http, app.mcp_url, "tools/list")
    assert response.status_code == 401
    challenge = response.headers["www-authenticate"]
    assert challenge.startswith("Bearer ")
    assert _expected_challenge(app.base_url) in challenge


@pytest.mark.parametrize("authorization", [None, "Basic dXNlcjpwYXNz", "Bearer"])
async def test_a_request_without_bearer_credentials_gets_a_challenge_without_an_error_code(
    app_http: httpx2.AsyncClient, app: InProcessApp, authorization: str | None
) -> None:
    # RFC 6750 §3.1: when the request lacks any authentication information, no error code.
    extra = {"Authorization": authorization} if authorization is not None else None
    response = await post_async(app_http, app.mcp_url, "tools/list", extra_headers=extra)
    assert response.status_code == 401
    challenge = response.headers["www-authenticate"]
    assert challenge == f"Bearer {_expected_challenge(app.base_url)}"
    assert "error=" not in challenge


async def test_a_bad_token_is_challenged_with_invalid_token(
    app_http: httpx2.AsyncClient, app: InProcessApp, devidp: DevIdP
) -> None:
    expired = await devidp.token("wire-user", resource=app.mcp_url, expires_in=-3600)
    for bad in ("not-a-jwt", expired):
        response = await post_async(app_http, app.mcp_url, "tools/list", token=bad)
        assert response.status_code == 401
        assert 'error="invalid_token"' in response.headers["www-authenticate"]
        assert _expected_challenge(app.base_url) in response.headers["www-authenticate"]


@pytest.mark.resource_server_only(reason="the dev IdP's own tokens and metadata")
async def test_the_resource_metadata_lists_the_issuer_as_authorization_server(
    app_http: httpx2.AsyncClient, app: InProcessApp, devidp: DevIdP
) -> None:
    for path in ("/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"):
        document = (await app_http.get(path)).json()
        assert document["resource"] == app.mcp_url
        assert document["authorization_servers"] == [devidp.issuer]


# Tokens with hand-set claims come from the dev IdP's /dev/token: about the checks of resource-server mode.
_DEVIDP_CLAIMS = pytest.mark.resource_server_only(reason="a dev IdP token with hand-set claims")


@pytest.mark.parametrize(
    "variant",
    [
        "garbage",
        pytest.param("expired", marks=_DEVIDP_CLAIMS),
        pytest.param("other_audience", marks=_DEVIDP_CLAIMS),
        pytest.param("not_yet_valid", marks=_DEVIDP_CLAIMS),
        "tampered_signature",
        pytest.param("unsigned", marks=_DEVIDP_CLAIMS),
    ],
)
async def test_a_bad_token_gets_401(
    app_http: httpx2.AsyncClient, app: InProcessApp, devidp: DevIdP, mcp_token: McpTokens, variant: str
) -> None:
    if variant == "garbage":
        bad = "not-a-jwt"
    elif variant == "expired":
        bad = await devidp.token("wire-user", resource=app.mcp_url, expires_in=-3600)
    elif variant == "other_audience":
        bad = await devidp.token("wire-user", resource=app.mcp_url, audience="http://elsewhere.test/mcp")
    elif variant == "not_yet_valid":
        bad = await devidp.token("wire-user", resource=app.mcp_url, not_before_in=3600)
    elif variant == "tampered_signature":
        good = await mcp_token("wire-user", resource=app.mcp_url, transport=app.transport())
        head, payload, signature = good.split(".")
        bad = ".".join([head, payload, signature[:-4] + ("AAAA" if signature[-4:] != "AAAA" else "BBBB")])
    else:

        def b64(data: dict[str, object]) -> str:
            return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()

        claims = {"sub": "mallory", "iss": devidp.issuer, "aud": app.mcp_url, "exp": 9999999999}
        bad = f"{b64({'alg': 'none', 'typ': 'JWT'})}.{b64(claims)}."
    response = await post_async(app_http, app.mcp_url, "tools/list", token=bad)
    assert response.status_code == 401
    assert _expected_challenge(app.base_url) in response.headers["www-authenticate"]


@pytest.mark.resource_server_only(reason="the dev IdP's own tokens and metadata")
@pytest.mark.parametrize("alg", ["RS256", "ES256"])
async def test_rs256_and_es256_tokens_with_only_openid_scope_are_accepted(
    app_http: httpx2.AsyncClient, app: InProcessApp, devidp: DevIdP, alg: str
) -> None:
    good = await devidp.token("wire-user", resource=app.mcp_url, alg=alg, scope="openid")
    response = await post_async(app_http, app.mcp_url, "tools/list", token=good)
    assert response.status_code == 200
    names = {tool["name"] for tool in response_message(response)["result"]["tools"]}
    assert {"catalog_search", "cart_create", "cart_set_item", "cart_view", "cart_list", "cart_delete"} <= names


@pytest.mark.parametrize("method", ["GET", "DELETE"])
@pytest.mark.parametrize("protocol_version", [None, PROTOCOL_VERSION, "2025-11-25"])
@pytest.mark.parametrize("authenticated", [False, True])
async def test_get_and_delete_answer_405_for_every_client(
    app_http: httpx2.AsyncClient,
    app: InProcessApp,
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
    response = await app_http.request(method, app.mcp_url, headers=headers)
    assert response.status_code == 405
    assert response.headers["allow"] == "POST"


async def test_no_session_id_is_minted_or_honoured_and_no_initialize_is_needed(
    app_http: httpx2.AsyncClient, app: InProcessApp, token: str
) -> None:
    discovered = await post_async(app_http, app.mcp_url, "server/discover", token=token)
    assert discovered.status_code == 200
    assert PROTOCOL_VERSION in response_message(discovered)["result"]["supportedVersions"]
    assert "mcp-session-id" not in discovered.headers
    stale = await post_async(
        app_http, app.mcp_url, "tools/list", token=token, extra_headers={"Mcp-Session-Id": "session-from-2025"}
    )
    assert stale.status_code == 200
    assert "mcp-session-id" not in stale.headers


async def test_a_foreign_browser_origin_gets_403(app_http: httpx2.AsyncClient, app: InProcessApp, token: str) -> None:
    foreign = {"Origin": "https://evil.example"}
    response = await post_async(app_http, app.mcp_url, "tools/list", token=token, extra_headers=foreign)
    assert response.status_code == 403
    own = {"Origin": app.base_url}
    same_origin = await post_async(app_http, app.mcp_url, "tools/list", token=token, extra_headers=own)
    assert same_origin.status_code == 200


async def test_a_host_outside_the_allow_list_is_refused(
    app_http: httpx2.AsyncClient, app: InProcessApp, token: str
) -> None:
    foreign = {"Host": "evil.example:80"}
    response = await post_async(app_http, app.mcp_url, "tools/list", token=token, extra_headers=foreign)
    assert response.status_code in {400, 403, 421}
    # The same request under the Host the public URL names is served: the refusal is the Host's doing.
    own = await post_async(app_http, app.mcp_url, "tools/list", token=token)
    assert own.status_code == 200


async def test_a_well_formed_request_id_is_kept_and_any_other_is_replaced_on_mcp_and_litestar_routes(
    app_http: httpx2.AsyncClient, app: InProcessApp, token: str
) -> None:
    kept = f"lb-{uuid.uuid4().hex}"
    for sent, mcp in ((kept, False), (kept, True), ("not ok\tid", False), ("x" * 129, True), (None, True)):
        headers = {"X-Request-Id": sent} if sent is not None else {}
        if mcp:
            response = await post_async(app_http, app.mcp_url, "tools/list", token=token, extra_headers=headers)
        else:
            response = await app_http.get("/healthz", headers=headers)
        assert response.status_code == 200
        echoed = response.headers["x-request-id"]
        if sent == kept:
            assert echoed == kept
        else:
            assert re.fullmatch(r"[0-9a-f]{16}", echoed), echoed  # a fresh id instead


async def test_health_and_readiness(app_http: httpx2.AsyncClient) -> None:
    assert (await app_http.get("/healthz")).json() == {"status": "ok"}
    assert (await app_http.get("/readyz")).json() == {"status": "ready", "catalog_search": "indexed"}


async def test_bearer_tokens_and_secrets_never_reach_the_server_log(
    http: httpx2.Client, server: RunningServer, devidp: DevIdP, mcp_token: McpTokens, server_env: dict[str, str]
) -> None:
    good = await mcp_token("log-watcher", resource=server.mcp_url)
    expired = await devidp.token("log-watcher", resource=server.mcp_url, expires_in=-60)
    access_line = '"POST /mcp HTTP/1.1"'
    before = server.log_text_so_far().count(access_line)
    post(http, server.mcp_url, "tools/list", token=good)
    post(http, server.mcp_url, "tools/call", {"name": "cart_view", "arguments": {"cart_id": "nope"}}, token=good)
    post(http, server.mcp_url, "tools/list", token=expired)
    post(http, server.mcp_url, "tools/list", token=good, extra_headers={"Origin": "https://evil.example"})
    # The access log names each of the four requests, so its silence about their secrets means something.
    wait_until(lambda: server.log_text().count(access_line) >= before + 4, timeout=5, what="four access lines")
    log = server.log_text()
    secrets = [
        good,
        expired,
        *server_env["REQUEST_STATE_KEYS"].split(","),
        *server_env["TOKEN_ENCRYPTION_KEYS"].split(","),
    ]
    secrets.append(server_env["OIDC_CLIENT_SECRET"])
    assert_no_secrets(log, secrets)  # not even a fragment of a signature or key


async def test_a_token_sent_in_a_query_string_never_reaches_the_access_log(
    http: httpx2.Client, server: RunningServer, mcp_token: McpTokens
) -> None:
    token = await mcp_token("wire-user", resource=server.mcp_url)
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
    assert_no_secrets(log, [token])
    assert marker not in log  # the whole query string goes, not only the parameter named like a token
