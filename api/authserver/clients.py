"""Which clients may ask for authorization: pre-registered in ``AS_CLIENTS``, or registered dynamically.

Redirect URIs are limited to ``https`` and loopback ``http`` (RFC 8252 §7.3: ``127.0.0.1``, ``[::1]``,
``localhost``), without fragments, and are compared exactly. Registration is bounded in size here and in
rate by :class:`api.authserver.provider.PostgresProvider`.
"""

import json
import os
from collections.abc import Mapping
from urllib.parse import urlsplit

from mcp.shared.auth import OAuthClientInformationFull
from pydantic import AnyUrl, ValidationError

DEFAULT_SCOPE = "mcp"
# Scopes a client may register and ask for besides ``mcp``: OpenID-minded clients ask for ``openid`` and
# ``offline_access`` out of habit. They mean nothing here (Coatcheck issues no ID token, and every grant gets
# a refresh token anyway), so they are accepted and ignored: what is granted is ``mcp`` alone, which the
# token response's ``scope`` says (RFC 6749 §3.3 lets a server grant less than was asked, saying so).
IGNORED_SCOPES = ("openid", "offline_access")
REQUESTABLE_SCOPES = (DEFAULT_SCOPE, *IGNORED_SCOPES)

MAX_REDIRECT_URIS = 10
MAX_URI_LENGTH = 512
MAX_NAME_LENGTH = 100
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "[::1]", "::1", "localhost"})


def same_but_for_a_loopback_port(requested: str, registered: str) -> bool:
    """Whether ``requested`` is the loopback redirect URI ``registered`` at another port (or none).

    RFC 8252 §7.3: a native client listens on a port the OS gives it at the time of the request, so the
    server "MUST allow any port to be specified" for loopback redirect URIs. Scheme (``http``), host (the
    same loopback name or address), path and query must still be exactly the registered ones.
    """
    asked, known = urlsplit(requested), urlsplit(registered)
    return (
        asked.scheme == known.scheme == "http"
        and asked.hostname is not None
        and asked.hostname in LOOPBACK_HOSTS
        and asked.hostname == known.hostname
        and asked.username is None
        and asked.path == known.path
        and asked.query == known.query
        and not asked.fragment
    )


class Client(OAuthClientInformationFull):
    """A client as Coatcheck's authorization server knows it: the SDK's model, except that a loopback
    redirect URI matches at any port (:func:`same_but_for_a_loopback_port`); every other redirect URI is
    compared exactly, as the SDK does."""

    @classmethod
    def of(cls, client: OAuthClientInformationFull) -> "Client":
        """``client`` (registered, pre-registered or from a metadata document) as a :class:`Client`."""
        return client if isinstance(client, Client) else cls.model_validate(client.model_dump())

    def validate_redirect_uri(self, redirect_uri: AnyUrl | None) -> AnyUrl:
        """The redirect URI to send the browser to, or the SDK's ``InvalidRedirectUriError``."""
        if redirect_uri is not None and any(
            same_but_for_a_loopback_port(str(redirect_uri), str(known)) for known in self.redirect_uris or []
        ):
            return redirect_uri
        return super().validate_redirect_uri(redirect_uri)


def redirect_uri_problem(uri: str) -> str | None:
    """Why ``uri`` cannot be a redirect URI here, or ``None`` when it can."""
    if len(uri) > MAX_URI_LENGTH:
        return f"a redirect URI is longer than {MAX_URI_LENGTH} characters"
    parts = urlsplit(uri)
    if parts.fragment or "#" in uri:
        return "a redirect URI must not contain a fragment"
    if parts.username is not None or parts.password is not None:
        return "a redirect URI must not contain user information"
    if parts.scheme == "https" and parts.hostname:
        return None
    if parts.scheme == "http" and parts.hostname in LOOPBACK_HOSTS:
        return None
    return f"redirect URI {uri!r} is neither https nor http on a loopback address (RFC 8252)"


def metadata_problem(client: OAuthClientInformationFull) -> tuple[str, str] | None:
    """Why a client's metadata is refused, as an RFC 7591 error code and description, or ``None``."""
    uris = [str(uri) for uri in client.redirect_uris or []]
    if not uris:
        return "invalid_redirect_uri", "redirect_uris must list at least one URI"
    if len(uris) > MAX_REDIRECT_URIS:
        return "invalid_client_metadata", f"redirect_uris may list at most {MAX_REDIRECT_URIS} URIs"
    for uri in uris:
        problem = redirect_uri_problem(uri)
        if problem is not None:
            return "invalid_redirect_uri", problem
    if client.client_name is not None and len(client.client_name) > MAX_NAME_LENGTH:
        return "invalid_client_metadata", f"client_name is longer than {MAX_NAME_LENGTH} characters"
    for field in ("client_uri", "logo_uri", "tos_uri", "policy_uri", "jwks_uri"):
        value = getattr(client, field)
        if value is not None and len(str(value)) > MAX_URI_LENGTH:
            return "invalid_client_metadata", f"{field} is longer than {MAX_URI_LENGTH} characters"
    if client.jwks is not None or (client.contacts is not None and len(json.dumps(client.contacts)) > 1000):
        return "invalid_client_metadata", "jwks and long contact lists are not accepted"
    return None


def parse_static_clients(raw: str, environ: Mapping[str, str] | None = None) -> tuple[OAuthClientInformationFull, ...]:
    """``AS_CLIENTS``: a JSON list of ``{"client_id", "redirect_uris", "client_name"?, "client_secret_env"?}``.

    A client with ``client_secret_env`` is confidential (``client_secret_basic`` or ``_post``; the secret is
    read from that variable now); without, it is public (PKCE only).

    Raises:
        ValueError: naming the entry and what is wrong (never a secret).
    """
    environ = os.environ if environ is None else environ
    try:
        entries = json.loads(raw)
    except ValueError:
        raise ValueError("AS_CLIENTS is not valid JSON") from None
    if not isinstance(entries, list):
        raise ValueError("AS_CLIENTS must be a JSON list of clients")
    clients: list[OAuthClientInformationFull] = []
    for position, entry in enumerate(entries, start=1):
        if not isinstance(entry, dict) or not isinstance(entry.get("client_id"), str) or not entry["client_id"]:
            raise ValueError(f"AS_CLIENTS: entry #{position} needs a client_id")
        unknown = set(entry) - {"client_id", "redirect_uris", "client_name", "client_secret_env", "scope"}
        if unknown:
            raise ValueError(f"AS_CLIENTS: entry #{position} has unknown keys: {', '.join(sorted(unknown))}")
        secret = None
        if "client_secret_env" in entry:
            secret = environ.get(str(entry["client_secret_env"]), "").strip()
            if not secret:
                raise ValueError(f"AS_CLIENTS: entry #{position}: {entry['client_secret_env']} is not set")
        try:
            client = OAuthClientInformationFull(
                client_id=entry["client_id"],
                client_name=entry.get("client_name"),
                redirect_uris=entry.get("redirect_uris"),
                scope=entry.get("scope", DEFAULT_SCOPE),
                grant_types=["authorization_code", "refresh_token"],
                response_types=["code"],
                token_endpoint_auth_method="client_secret_basic" if secret else "none",
                client_secret=secret,
            )
        except ValidationError:
            raise ValueError(f"AS_CLIENTS: entry #{position} has malformed redirect_uris") from None
        problem = metadata_problem(client)
        if problem is not None:
            raise ValueError(f"AS_CLIENTS: entry #{position}: {problem[1]}")
        if client.client_id.startswith("https://"):
            raise ValueError(f"AS_CLIENTS: entry #{position}: an https client_id is a metadata document URL")
        clients.append(client)
    if len({c.client_id for c in clients}) != len(clients):
        raise ValueError("AS_CLIENTS lists a client_id twice")
    return tuple(clients)
