"""Which RFC 7662 answers make an opaque token valid here, against a real HTTP introspection endpoint.

The dev IdP (tests/api/test_provider_shapes.py) gives the answers oidc-provider gives. Other providers answer
in other shapes (Okta names ``token_type``, some servers omit ``iss``, a sender-constrained token has ``cnf``);
this endpoint answers whatever the test scripts, so each rule of :class:`api.introspection.TokenIntrospection`
is seen to refuse what it must and accept what it may.
"""

import base64
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import httpx2
import pytest

from api.auth import Audiences
from api.introspection import TokenIntrospection
from api.jose import IssuerMetadata
from tests.support.json_server import QuietHandler, send_json, serving

ISSUER = "https://tenant.example.com/"
RESOURCE = "https://coatcheck.example.com/mcp"
CLIENT_ID = "coatcheck introspection"  # a space: RFC 6749 §2.3.1 form-encodes it into the Basic header
SECRET = "s3cr3t:with/odd+chars"


@dataclass
class Endpoint:
    """A scripted introspection endpoint: its URL, the next answer, and what it was sent."""

    url: str
    answer: dict[str, Any] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)


@contextmanager
def introspection_endpoint() -> Iterator[Endpoint]:
    endpoint = Endpoint(url="")

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", "0"))
            form = {key: values[0] for key, values in parse_qs(self.rfile.read(length).decode()).items()}
            endpoint.requests.append({"form": form, "authorization": self.headers.get("authorization", "")})
            send_json(self, 200, endpoint.answer)

    with serving(Handler) as base:
        endpoint.url = f"{base}/introspect"
        yield endpoint


def _active(**changes: Any) -> dict[str, Any]:
    now = int(time.time())
    answer: dict[str, Any] = {
        "active": True,
        "iss": ISSUER,
        "aud": RESOURCE,
        "sub": "user-1",
        "exp": now + 300,
        "iat": now,
        "scope": "openid mcp",
        "client_id": "some-mcp-client",
    }
    answer.update(changes)
    return {key: value for key, value in answer.items() if value is not None}


async def _verify(endpoint: Endpoint, answer: dict[str, Any], *, extra: tuple[str, ...] = ()) -> Any:
    endpoint.answer = answer
    async with httpx2.AsyncClient() as http:
        verifier = TokenIntrospection(
            issuer=IssuerMetadata(ISSUER, http),
            http=http,
            client_id=CLIENT_ID,
            client_secret=SECRET,
            audiences=Audiences(RESOURCE, extra),
            leeway=0,
            cache_seconds=60,
            timeout=5,
            endpoint=endpoint.url,
        )
        return await verifier.verify_token("opaque-token-value")


async def test_an_active_answer_for_this_server_is_the_principal_and_the_request_is_rfc_7662() -> None:
    with introspection_endpoint() as endpoint:
        token = await _verify(endpoint, _active())
    assert token is not None
    assert (token.claims, token.subject, token.scopes) == ({"iss": ISSUER}, "user-1", ["openid", "mcp"])
    (request,) = endpoint.requests
    assert request["form"] == {"token": "opaque-token-value", "token_type_hint": "access_token"}
    user, _, password = base64.b64decode(request["authorization"].removeprefix("Basic ")).decode().partition(":")
    assert (user, password) == ("coatcheck+introspection", "s3cr3t%3Awith%2Fodd%2Bchars")


async def test_an_answer_without_iss_is_taken_as_the_configured_issuers_own() -> None:
    with introspection_endpoint() as endpoint:
        token = await _verify(endpoint, _active(iss=None))
    assert token is not None
    assert token.claims == {"iss": ISSUER}


# Each answer is built when its test runs, not when the module is collected: an answer built at collection
# would have expired (its exp is now + 300) before a long run reaches it, and be refused for the wrong reason.
@pytest.mark.parametrize(
    ("why", "changes"),
    [
        ("inactive", {"active": False}),
        ("active as a string", {"active": "true"}),
        ("another issuer", {"iss": "https://tenant.example.com"}),
        ("no audience", {"aud": None}),
        ("another audience", {"aud": "https://other.example.com/mcp"}),
        ("an audience that is no URL", {"aud": ["http://[", 7]}),
        ("expired", {"exp": -5}),
        ("no exp", {"exp": None}),
        ("not yet valid", {"nbf": 120}),
        ("no sub", {"sub": None}),
        ("empty sub", {"sub": ""}),
        ("a refresh token", {"token_type": "refresh_token"}),
        ("sender-constrained", {"token_type": "DPoP", "cnf": {"jkt": "abc"}}),
        ("cnf without token_type", {"cnf": {"x5t#S256": "abc"}}),
    ],
)
async def test_an_answer_that_does_not_make_the_token_ours_is_refused(why: str, changes: dict[str, Any]) -> None:
    now = int(time.time())
    # exp and nbf are given relative to now.
    relative = {
        key: now + value if key in ("exp", "nbf") and isinstance(value, int) else value
        for key, value in changes.items()
    }
    answer = {"active": False} if changes == {"active": False} else _active(**relative)
    with introspection_endpoint() as endpoint:
        assert await _verify(endpoint, answer) is None, why


async def test_an_extra_audience_in_a_list_is_accepted_and_token_type_bearer_in_any_case() -> None:
    with introspection_endpoint() as endpoint:
        token = await _verify(
            endpoint, _active(aud=["api://other", "api-client-id"], token_type="bearer"), extra=("api-client-id",)
        )
    assert token is not None
