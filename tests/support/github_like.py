"""A GitHub-shaped plain OAuth 2.0 server: a real HTTP server on 127.0.0.1 (a free port), no OpenID.

Shaped as GitHub's OAuth Apps document it: ``GET /login/oauth/authorize`` (a login form a person fills in,
with a Cancel link), ``POST /login/oauth/access_token`` answering **form-encoded unless the request's
``Accept`` is JSON** and answering its errors with HTTP 200 and an ``error`` member
(``bad_verification_code``, ``incorrect_client_credentials``, ``redirect_uri_mismatch``), PKCE S256 checked when
a challenge was sent, and ``GET /user`` (``Authorization: Bearer …`` or ``token …``) answering the user as
JSON with a numeric ``id``. No discovery, no ID token, no refresh tokens (an OAuth App's tokens do not expire).

Error modes, switched by the test: ``refuse_codes`` (every code is ``bad_verification_code``) and
``user_down`` (``/user`` answers 503). What it was sent is recorded for the test to check.
"""

import base64
import contextlib
import hashlib
import hmac
import json
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from html import escape
from urllib.parse import parse_qsl, urlencode, urlsplit

from tests.support.json_server import QuietHandler, serving
from tests.support.waiting import free_port

# The field a person fills in on this server's login page (GitHub's own is named ``login`` too).
GITHUB_LOGIN_FIELD = "form[action='/session'] input[name=login]"
CANCEL_LINK = "a#cancel"


@dataclass
class TokenRequest:
    """What one request to the token endpoint carried (no secret values)."""

    accept: str
    had_client_secret: bool
    had_basic_auth: bool
    had_code_verifier: bool


@dataclass
class AuthorizationRequest:
    """The query of one visit to the authorization endpoint."""

    params: dict[str, str]


@dataclass
class GithubLike:
    """The running server and its state. ``users`` maps a login to its numeric id (assigned at first sign-in)."""

    base_url: str
    client_id: str
    client_secret: str
    redirect_uri: str
    users: dict[str, int] = field(default_factory=dict)
    refuse_codes: bool = False
    user_down: bool = False
    authorization_requests: list[AuthorizationRequest] = field(default_factory=list)
    token_requests: list[TokenRequest] = field(default_factory=list)
    user_authorization_schemes: list[str] = field(default_factory=list)
    issued_codes: list[str] = field(default_factory=list)
    issued_tokens: list[str] = field(default_factory=list)
    _codes: dict[str, dict[str, str]] = field(default_factory=dict)
    _tokens: dict[str, str] = field(default_factory=dict)
    _next_id: int = field(default_factory=lambda: 10_000_000 + secrets.randbelow(10**9))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def authorization_url(self) -> str:
        return f"{self.base_url}/login/oauth/authorize"

    @property
    def token_url(self) -> str:
        return f"{self.base_url}/login/oauth/access_token"

    @property
    def userinfo_url(self) -> str:
        return f"{self.base_url}/user"

    def id_of(self, login: str) -> int:
        """The numeric id of ``login``, assigning the next one at first use (ids never change)."""
        with self._lock:
            if login not in self.users:
                self.users[login] = self._next_id
                self._next_id += 1
            return self.users[login]


def _s256(verifier: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()


@contextmanager
def serve_github_like(*, redirect_uri: str) -> Iterator[GithubLike]:
    """Run the server with one registered OAuth App whose callback URL is ``redirect_uri``."""
    port = free_port()
    hub = GithubLike(
        base_url=f"http://127.0.0.1:{port}",
        client_id="Iv1." + secrets.token_hex(8),
        client_secret=secrets.token_hex(20),
        redirect_uri=redirect_uri,
    )

    class Handler(QuietHandler):
        def _send(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(body)))
            self.send_header("cache-control", "no-store")
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            with contextlib.suppress(OSError):
                self.wfile.write(body)

        def _html(self, status: int, title: str, body: str) -> None:
            page = f"<!doctype html><html><head><title>{escape(title)}</title></head><body>{body}</body></html>"
            self._send(status, page.encode(), "text/html; charset=utf-8")

        def _redirect(self, location: str) -> None:
            self._send(302, b"", "text/plain", {"location": location})

        def _form(self) -> dict[str, str]:
            length = int(self.headers.get("content-length") or 0)
            return dict(parse_qsl(self.rfile.read(length).decode(), keep_blank_values=True))

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            query = dict(parse_qsl(parts.query, keep_blank_values=True))
            if parts.path == "/login/oauth/authorize":
                self._authorize(query)
            elif parts.path == "/login/oauth/cancel":
                self._cancel(query)
            elif parts.path == "/user":
                self._user()
            else:
                self._send(404, b'{"message":"Not Found"}', "application/json")

        def do_POST(self) -> None:
            path = urlsplit(self.path).path
            if path == "/session":
                self._session(self._form())
            elif path == "/login/oauth/access_token":
                self._access_token(self._form())
            else:
                self._send(404, b'{"message":"Not Found"}', "application/json")

        def _authorize(self, query: dict[str, str]) -> None:
            hub.authorization_requests.append(AuthorizationRequest(dict(query)))
            if query.get("client_id") != hub.client_id:
                self._html(404, "Not found", "<p>This OAuth application does not exist.</p>")
                return
            if query.get("redirect_uri", hub.redirect_uri) != hub.redirect_uri:
                self._html(
                    400, "Redirect URI mismatch", "<p>The redirect_uri is not associated with this application.</p>"
                )
                return
            hidden = "".join(
                f'<input type="hidden" name="{escape(key)}" value="{escape(value)}">' for key, value in query.items()
            )
            cancel = urlencode({"redirect_uri": hub.redirect_uri, "state": query.get("state", "")})
            self._html(
                200,
                "Sign in to GitHub-like",
                '<h1>Sign in to continue</h1><form method="post" action="/session">'
                f'<label>Username <input name="login" autocomplete="off"></label>{hidden}'
                '<button type="submit">Sign in and authorize</button></form>'
                f'<p><a id="cancel" href="/login/oauth/cancel?{escape(cancel)}">Cancel</a></p>',
            )

        def _cancel(self, query: dict[str, str]) -> None:
            # GitHub's answer when the user cancels: access_denied with a description and its error_uri.
            params = {
                "error": "access_denied",
                "error_description": "The user has denied your application access.",
                "error_uri": "https://docs.github.com/apps/troubleshooting-authorization-request-errors",
                "state": query.get("state", ""),
            }
            self._redirect(f"{hub.redirect_uri}?{urlencode(params)}")

        def _session(self, form: dict[str, str]) -> None:
            login = form.get("login", "").strip()
            if not login or form.get("client_id") != hub.client_id:
                self._html(400, "Sign-in failed", "<p>Enter a username.</p>")
                return
            hub.id_of(login)
            code = secrets.token_hex(10)
            with hub._lock:
                hub._codes[code] = {
                    "login": login,
                    "redirect_uri": form.get("redirect_uri", hub.redirect_uri),
                    "code_challenge": form.get("code_challenge", ""),
                    "code_challenge_method": form.get("code_challenge_method", ""),
                }
                hub.issued_codes.append(code)
            self._redirect(f"{hub.redirect_uri}?{urlencode({'code': code, 'state': form.get('state', '')})}")

        def _token_answer(self, answer: dict[str, str]) -> None:
            # GitHub answers form-encoded unless asked for JSON, and answers errors with 200 too.
            if "application/json" in (self.headers.get("accept") or ""):
                self._send(200, json.dumps(answer).encode(), "application/json; charset=utf-8")
            else:
                self._send(200, urlencode(answer).encode(), "application/x-www-form-urlencoded; charset=utf-8")

        def _access_token(self, form: dict[str, str]) -> None:
            basic = (self.headers.get("authorization") or "").startswith("Basic ")
            hub.token_requests.append(
                TokenRequest(
                    accept=self.headers.get("accept") or "",
                    had_client_secret="client_secret" in form,
                    had_basic_auth=basic,
                    had_code_verifier="code_verifier" in form,
                )
            )
            secret_ok = hmac.compare_digest(form.get("client_secret", "").encode(), hub.client_secret.encode())
            if form.get("client_id") != hub.client_id or not secret_ok:
                self._token_answer(
                    {
                        "error": "incorrect_client_credentials",
                        "error_description": "The client_id and/or client_secret passed are incorrect.",
                    }
                )
                return
            with hub._lock:
                grant = hub._codes.pop(form.get("code", ""), None)
            bad_code = {
                "error": "bad_verification_code",
                "error_description": "The code passed is incorrect or expired.",
            }
            if grant is None or hub.refuse_codes:
                self._token_answer(bad_code)
                return
            if form.get("redirect_uri", grant["redirect_uri"]) != grant["redirect_uri"]:
                self._token_answer(
                    {"error": "redirect_uri_mismatch", "error_description": "The redirect_uri MUST match."}
                )
                return
            if grant["code_challenge"] and (
                grant["code_challenge_method"] != "S256"
                or _s256(form.get("code_verifier", "")) != grant["code_challenge"]
            ):
                self._token_answer(bad_code)
                return
            token = "gho_" + secrets.token_hex(18)
            with hub._lock:
                hub._tokens[token] = grant["login"]
                hub.issued_tokens.append(token)
            self._token_answer({"access_token": token, "token_type": "bearer", "scope": ""})

        def _user(self) -> None:
            scheme, _, token = (self.headers.get("authorization") or "").partition(" ")
            hub.user_authorization_schemes.append(scheme)
            if hub.user_down:
                self._send(503, b'{"message":"Service Unavailable"}', "application/json")
                return
            login = hub._tokens.get(token) if scheme.lower() in ("bearer", "token") else None
            if login is None:
                self._send(401, b'{"message":"Bad credentials"}', "application/json")
                return
            user = {
                "login": login,
                "id": hub.id_of(login),
                "node_id": "U_" + login,
                "type": "User",
                "site_admin": False,
            }
            self._send(200, json.dumps(user).encode(), "application/json; charset=utf-8")

    with serving(Handler, port):
        yield hub
