"""Sealed, short-lived browser cookies: the signed-in subject, and a login in progress.

Both cookies are sealed (so they are signed and unreadable) by the token vault's primitive,
:class:`store.crypto.TokenCipher`, over the ``TOKEN_ENCRYPTION_KEYS`` ring under a purpose of their own
(HKDF info ``coatcheck/browser-cookie/v1/aes-256-gcm``): no extra secret to manage, and no key shared with
the vault. ``keys[0]`` seals; every ring key opens, so a rotation does not sign everybody out. The cookie
name is the associated data, and the name and an expiry are inside the sealed payload, so a login cookie
cannot be replayed as a session cookie and an old cookie stops working even if a browser keeps it. The
session cookie also names a random session id, whose record in PostgreSQL must be live for the cookie to
open a session (:mod:`api.oauth.browser_sessions`): sign-out deletes it, so copies of the cookie die too. (The
value reads ``v1.<kid>.<b64url>`` since the cookies moved onto that primitive; a cookie in the older bare
format no longer opens, which only means signing in again.)

Cookie attributes: ``HttpOnly``, ``SameSite=Lax`` (the IdP's redirect back to us is a top-level GET, which
Lax allows), ``Path=/``, a ``Max-Age`` equal to the payload's lifetime. On an https ``PUBLIC_URL`` they are
``Secure`` and named with the ``__Host-`` prefix (host-only, not settable by a sibling subdomain); browsers
refuse a ``__Host-`` cookie without ``Secure``, and ``Secure`` cookies are not stored over plain http, so on
an http ``PUBLIC_URL`` (local development) the unprefixed name and no ``Secure`` are used.
"""

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from litestar.datastructures import Cookie

from store.crypto import DecryptError, TokenCipher, derive_key
from store.principal import Principal

COOKIE_PURPOSE = "browser-cookie"
_SIGNOUT_INFO = b"coatcheck/browser-signout/v1/hmac-sha256"
SESSION = "session"
LOGIN = "login"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


@dataclass(frozen=True, slots=True)
class BrowserSession:
    """Who the browser proved to be at ``OIDC_ISSUER`` (the same pair as an MCP principal), and which sign-in.

    ``session_id`` is random and names the server-side record of this sign-in
    (:mod:`api.oauth.browser_sessions`): the cookie opens a session only while that record is live.
    """

    issuer: str
    subject: str
    session_id: str

    @property
    def principal(self) -> Principal:
        return Principal(issuer=self.issuer, subject=self.subject)


@dataclass(frozen=True, slots=True)
class LoginInProgress:
    """What the login callback must find again: the OIDC ``state``, ``nonce``, PKCE verifier and the flow."""

    state: str
    nonce: str
    code_verifier: str
    flow: str


class CookieJar:
    """Seals and opens Coatcheck's browser cookies."""

    def __init__(self, keys: Sequence[bytes], *, secure: bool, session_seconds: int, login_seconds: int) -> None:
        if not keys:
            raise ValueError("the cookie key ring needs at least one key")
        self._cipher = TokenCipher(keys, purpose=COOKIE_PURPOSE)
        self._signout_keys = [derive_key(k, _SIGNOUT_INFO) for k in keys]
        self.secure = secure
        self.session_seconds = session_seconds
        self.login_seconds = login_seconds

    def name(self, kind: str) -> str:
        return f"__Host-coatcheck-{kind}" if self.secure else f"coatcheck-{kind}"

    def _seal(self, kind: str, payload: dict[str, Any], lifetime: int) -> str:
        body = json.dumps({**payload, "k": kind, "exp": int(time.time()) + lifetime}, separators=(",", ":"))
        return self._cipher.encrypt(body, aad=self.name(kind).encode())

    def _open(self, kind: str, sealed: str | None) -> dict[str, Any] | None:
        if not sealed or len(sealed) > 4096:
            return None
        try:
            payload = json.loads(self._cipher.decrypt(sealed, aad=self.name(kind).encode()))
        except (DecryptError, ValueError):
            return None
        if not isinstance(payload, dict) or payload.get("k") != kind:
            return None
        expires = payload.get("exp")
        if not isinstance(expires, int) or expires < time.time():
            return None
        return payload

    def _cookie(self, kind: str, value: str, max_age: int) -> Cookie:
        return Cookie(
            key=self.name(kind),
            value=value,
            path="/",
            max_age=max_age,
            secure=self.secure,
            httponly=True,
            samesite="lax",
        )

    def session_cookie(self, session: BrowserSession) -> Cookie:
        payload = {"iss": session.issuer, "sub": session.subject, "sid": session.session_id}
        value = self._seal(SESSION, payload, self.session_seconds)
        return self._cookie(SESSION, value, self.session_seconds)

    def read_session(self, cookies: dict[str, str]) -> BrowserSession | None:
        payload = self._open(SESSION, cookies.get(self.name(SESSION)))
        if payload is None:
            return None
        values = [payload.get(key) for key in ("iss", "sub", "sid")]
        if not all(isinstance(value, str) and value for value in values):
            return None  # a cookie sealed before sessions had ids included: the browser signs in again
        issuer, subject, session_id = (str(value) for value in values)
        return BrowserSession(issuer=issuer, subject=subject, session_id=session_id)

    def login_cookie(self, login: LoginInProgress) -> Cookie:
        payload = {"s": login.state, "n": login.nonce, "v": login.code_verifier, "f": login.flow}
        return self._cookie(LOGIN, self._seal(LOGIN, payload, self.login_seconds), self.login_seconds)

    def read_login(self, cookies: dict[str, str]) -> LoginInProgress | None:
        payload = self._open(LOGIN, cookies.get(self.name(LOGIN)))
        if payload is None:
            return None
        values = [payload.get(key) for key in ("s", "n", "v", "f")]
        if not all(isinstance(value, str) and value for value in values):
            return None
        state, nonce, verifier, flow = (str(value) for value in values)
        return LoginInProgress(state=state, nonce=nonce, code_verifier=verifier, flow=flow)

    def signout_token(self, sealed_session: str) -> str:
        """The sign-out form's anti-CSRF token: a MAC of this browser's session cookie, so only a page
        served to that browser (same origin) can know it, and it dies with the session."""
        return _b64(hmac.new(self._signout_keys[0], sealed_session.encode(), hashlib.sha256).digest())

    def signout_token_matches(self, sealed_session: str, token: str) -> bool:
        """Whether ``token`` is :meth:`signout_token` of ``sealed_session`` under any ring key."""
        return any(
            hmac.compare_digest(
                _b64(hmac.new(key, sealed_session.encode(), hashlib.sha256).digest()).encode(),
                token.encode("utf-8", "replace"),
            )
            for key in self._signout_keys
        )

    def clear(self, kind: str) -> Cookie:
        return self._cookie(kind, "", 0)
