"""Client ID Metadata Documents: a ``client_id`` that is an https URL names a JSON document the client
publishes about itself; Coatcheck fetches it, with SSRF guards, and caches it in PostgreSQL.

The guards, each refusal naming its reason (:class:`CimdRefused`):

* the URL is https with a host and a path, no user information, no fragment, at most 512 characters;
* the host is resolved once, and every address must be public: no private, loopback, link-local,
  multicast, reserved or unspecified address (IPv4-mapped IPv6 is checked as IPv4). The request then goes
  to the checked address itself (TLS still verifies the certificate for the host name, via SNI), so a DNS
  answer that changes between the check and the connection (rebinding) cannot redirect it;
* redirects are not followed (a redirect is refused, wherever it points);
* the answer must arrive within ``AS_CIMD_TIMEOUT`` seconds and be at most 64 KiB;
* the document must be a JSON object whose ``client_id`` equals the URL exactly, with acceptable redirect
  URIs (:func:`api.authserver.clients.metadata_problem`) and no client secret (``none`` authentication).

``AS_CIMD_ENABLED=false`` turns documents off (and the metadata stops advertising them), for a server that
cannot reach the clients' hosts: clients such as Claude Code then register dynamically instead of naming a
document Coatcheck would fail to fetch. ``AS_CIMD_ALLOW_LOOPBACK`` (development only) also admits ``http``
on loopback addresses, for a document served from the developer's machine. Documents are cached as HTTP
caching allows: ``no-store`` is not kept, ``max-age`` is honoured up to a day, otherwise five minutes.
"""

import asyncio
import ipaddress
import json
import re
import socket
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit, urlunsplit

import httpx2
from mcp.shared.auth import OAuthClientInformationFull
from pydantic import ValidationError

from api.authserver.clients import MAX_URI_LENGTH, REQUESTABLE_SCOPES, metadata_problem
from store import authserver as store
from store.db import Database

MAX_DOCUMENT_BYTES = 64 * 1024
DEFAULT_FRESHNESS = timedelta(minutes=5)
MAX_FRESHNESS = timedelta(days=1)
_MAX_AGE = re.compile(r"max-age=(\d+)")


class CimdRefused(Exception):  # noqa: N818 - a verdict
    """A client metadata document was not accepted; the message says why (for the client's developer)."""


def is_metadata_url(client_id: str) -> bool:
    """Whether ``client_id`` names a metadata document rather than a registered client."""
    return client_id.startswith(("https://", "http://"))


@dataclass(frozen=True, slots=True)
class _Target:
    url: str
    host: str
    address: str


def _public(address: str, *, allow_loopback: bool) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if allow_loopback and ip.is_loopback:
        return True
    return not (
        ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_multicast or ip.is_reserved or ip.is_unspecified
    )


class CimdFetcher:
    """Fetches, checks and caches client metadata documents (see the module docstring)."""

    def __init__(self, database: Database, *, timeout: float, allow_loopback: bool, enabled: bool = True) -> None:
        self._database = database
        self.enabled = enabled
        self._timeout = timeout
        self._allow_loopback = allow_loopback
        self._http = httpx2.AsyncClient(
            timeout=httpx2.Timeout(timeout),
            follow_redirects=False,
            trust_env=False,
            headers={"Accept": "application/json"},
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def client(self, client_id: str) -> OAuthClientInformationFull:
        """The client ``client_id`` names, from the cache while fresh, else fetched now.

        Raises:
            CimdRefused: saying which guard refused the URL or its document.
        """
        if not self.enabled:
            # Refused before the cache too: a document cached while CIMD was on is not a client now.
            raise CimdRefused(
                "this server does not accept client metadata documents (AS_CIMD_ENABLED=false); "
                "register the client dynamically or have the operator pre-register it"
            )
        async with self._database.one_statement() as conn:
            cached = await store.load_client(conn, client_id)
        if (
            cached is not None
            and cached.kind == "cimd"
            and cached.fresh_until
            and cached.fresh_until > datetime.now(UTC)
        ):
            return OAuthClientInformationFull.model_validate(cached.metadata)
        document, freshness = await self._fetch(client_id)
        client = self._checked(client_id, document)
        if freshness > timedelta(0):
            async with self._database.one_statement() as conn:
                await store.save_client(
                    conn,
                    client_id=client_id,
                    kind="cimd",
                    metadata=client.model_dump(mode="json", exclude_none=True),
                    fresh_until=datetime.now(UTC) + freshness,
                )
        return client

    async def _target(self, url: str) -> _Target:
        if len(url) > MAX_URI_LENGTH:
            raise CimdRefused(f"the client_id URL is longer than {MAX_URI_LENGTH} characters")
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            raise CimdRefused("the client_id URL has a malformed port") from None
        if parts.scheme not in ("https", "http") or not parts.hostname:
            raise CimdRefused("the client_id URL must be an https URL")
        if parts.scheme == "http" and not self._allow_loopback:
            raise CimdRefused("the client_id URL must be https")
        if parts.username is not None or parts.fragment or "#" in url:
            raise CimdRefused("the client_id URL must not contain user information or a fragment")
        if parts.path in ("", "/"):
            raise CimdRefused("the client_id URL must have a path")
        port = port or (443 if parts.scheme == "https" else 80)
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
        except OSError:
            raise CimdRefused(f"the host {parts.hostname} of the client_id URL does not resolve") from None
        addresses = sorted({str(info[4][0]) for info in infos})
        if not addresses:
            raise CimdRefused(f"the host {parts.hostname} of the client_id URL does not resolve")
        for address in addresses:
            if not _public(address, allow_loopback=self._allow_loopback):
                raise CimdRefused(
                    f"the host {parts.hostname} resolves to a private, loopback or link-local address; refused"
                )
        if parts.scheme == "http" and not all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses):
            raise CimdRefused("an http client_id URL is allowed only on loopback addresses")
        address = addresses[0]
        netloc_host = f"[{address}]" if ":" in address else address
        pinned = urlunsplit((parts.scheme, f"{netloc_host}:{port}", parts.path, parts.query, ""))
        return _Target(url=pinned, host=parts.netloc, address=address)

    async def _fetch(self, url: str) -> tuple[object, timedelta]:
        target = await self._target(url)
        hostname = urlsplit(url).hostname or ""
        try:
            async with asyncio.timeout(self._timeout):
                async with self._http.stream(
                    "GET", target.url, headers={"Host": target.host}, extensions={"sni_hostname": hostname}
                ) as response:
                    if 300 <= response.status_code < 400:
                        raise CimdRefused("fetching the client metadata document was redirected; redirects are refused")
                    if response.status_code != 200:
                        raise CimdRefused(f"the client metadata document answered HTTP {response.status_code}")
                    body = bytearray()
                    async for chunk in response.aiter_bytes():
                        body.extend(chunk)
                        if len(body) > MAX_DOCUMENT_BYTES:
                            raise CimdRefused(f"the client metadata document is larger than {MAX_DOCUMENT_BYTES} bytes")
                    cache_control = response.headers.get("cache-control", "").lower()
        except TimeoutError:
            raise CimdRefused(f"the client metadata document did not arrive within {self._timeout:g} s") from None
        except httpx2.HTTPError as exc:
            raise CimdRefused(f"the client metadata document could not be fetched ({type(exc).__name__})") from None
        try:
            document = json.loads(bytes(body))
        except ValueError:
            raise CimdRefused("the client metadata document is not JSON") from None
        return document, _freshness(cache_control)

    def _checked(self, url: str, document: object) -> OAuthClientInformationFull:
        if not isinstance(document, dict):
            raise CimdRefused("the client metadata document is not a JSON object")
        if document.get("client_id") != url:
            raise CimdRefused("the document's client_id is not exactly the URL it was fetched from")
        method = document.get("token_endpoint_auth_method", "none")
        if method != "none" or "client_secret" in document:
            raise CimdRefused("a client identified by a metadata document authenticates with none (PKCE only)")
        try:
            client = OAuthClientInformationFull.model_validate(
                {
                    **document,
                    "token_endpoint_auth_method": "none",
                    "scope": " ".join(REQUESTABLE_SCOPES),
                    "grant_types": ["authorization_code", "refresh_token"],
                    "response_types": ["code"],
                }
            )
        except ValidationError:
            raise CimdRefused("the client metadata document has malformed fields") from None
        problem = metadata_problem(client)
        if problem is not None:
            raise CimdRefused(f"the client metadata document: {problem[1]}")
        return client


def _freshness(cache_control: str) -> timedelta:
    if "no-store" in cache_control or "no-cache" in cache_control:
        return timedelta(0)
    match = _MAX_AGE.search(cache_control)
    if match:
        return min(timedelta(seconds=int(match.group(1))), MAX_FRESHNESS)
    return DEFAULT_FRESHNESS
