"""The SDK's ``OAuthAuthorizationServerProvider`` over PostgreSQL (:mod:`store.authserver`).

The SDK's handlers parse every request and answer with the RFCs' errors; this class decides. What it adds:

* ``authorize`` checks the RFC 8707 ``resource`` (Coatcheck's MCP URL or nothing, else ``invalid_target``),
  requires an explicit ``redirect_uri`` (compared exactly by the SDK), bounds ``state``, and sends the
  browser to the consent page with the request sealed (so it cannot be edited on the way).
* Codes are consumed atomically; a second redemption of a code revokes its grant (RFC 6749 §4.1.2).
* Refresh tokens rotate at every use; presenting a spent one revokes its grant, the whole family
  (OAuth 2.1 §4.3.1), and is audited.
* Dynamic registration is bounded in size (:mod:`api.authserver.clients`) and rate.
"""

import json
import logging
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode, urlsplit

from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    AuthorizeError,
    RefreshToken,
    RegistrationError,
    TokenError,
)
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

from api.auth import canonical_resource
from api.authserver.cimd import CimdFetcher, CimdRefused, is_metadata_url
from api.authserver.clients import DEFAULT_SCOPE, Client, metadata_problem
from api.authserver.keys import SigningKeys
from api.authserver.verifier import GRANT_CLAIM, UPSTREAM_ISSUER_CLAIM, AuthorizationServerTokenVerifier
from store import authserver as store
from store.audit import AuditRepository
from store.crypto import DecryptError, TokenCipher, associated_data
from store.db import Database
from store.principal import Principal

logger = logging.getLogger(__name__)

CONSENT_PATH = "/oauth/consent"
CODE_LIFETIME = timedelta(seconds=60)
REQUEST_LIFETIME_SECONDS = 600
MAX_STATE_LENGTH = 256  # the request rides sealed in the login cookie (4 KiB) during sign-in
REQUEST_PURPOSE = "as-authorization-request"
_SECRET_PURPOSE = "as-client-secret"  # noqa: S105 - a key-derivation label, not a secret


class StoredCode(AuthorizationCode):
    """An authorization code as loaded from the store, with its grant."""

    grant_id: str
    principal_iss: str


class StoredRefreshToken(RefreshToken):
    """A refresh token as loaded from the store, with its grant."""

    grant_id: str
    principal_iss: str


@dataclass(frozen=True, slots=True)
class PendingAuthorization:
    """A validated authorization request on its way through sign-in and consent (sealed in the URL)."""

    client_id: str
    redirect_uri: str
    code_challenge: str
    state: str | None
    scopes: list[str]
    resource: str


class PostgresProvider:
    """Clients, codes, tokens and grants for the SDK's authorization-server handlers."""

    def __init__(
        self,
        *,
        database: Database,
        keys: SigningKeys,
        verifier: AuthorizationServerTokenVerifier,
        cipher_keys: list[bytes],
        issuer: str,
        resource: str,
        static_clients: tuple[OAuthClientInformationFull, ...],
        access_token_lifetime: timedelta,
        refresh_token_lifetime: timedelta,
        registrations_per_minute: int,
        cimd: CimdFetcher,
    ) -> None:
        self._database = database
        self._keys = keys
        self._verifier = verifier
        self._secrets = TokenCipher(cipher_keys, purpose=_SECRET_PURPOSE)
        self._requests = TokenCipher(cipher_keys, purpose=REQUEST_PURPOSE)
        self.issuer = issuer
        self.resource = resource
        self._static = {client.client_id: client for client in static_clients}
        self._access_lifetime = access_token_lifetime
        self._refresh_lifetime = refresh_token_lifetime
        self._registrations_per_minute = registrations_per_minute
        self.cimd = cimd

    # --- clients ------------------------------------------------------------------------------------

    def identity_source(self, client: OAuthClientInformationFull) -> str:
        """Where a client's identity comes from, as the consent page says it."""
        if client.client_id in self._static:
            return "pre-registered by this server's operator"
        if is_metadata_url(client.client_id):
            return f"described by its metadata document at {urlsplit(client.client_id).netloc}"
        return "registered dynamically, unverified"

    async def get_client(self, client_id: str) -> Client | None:
        """The client ``client_id`` names, loopback redirect URIs matching at any port (RFC 8252 §7.3)."""
        client = await self._find_client(client_id)
        return None if client is None else Client.of(client)

    async def _find_client(self, client_id: str) -> OAuthClientInformationFull | None:
        static = self._static.get(client_id)
        if static is not None:
            return static
        if len(client_id) > 512:
            return None
        if is_metadata_url(client_id):
            try:
                return await self.cimd.client(client_id)
            except CimdRefused as exc:
                logger.info("client metadata document refused: %s", exc)
                return None
        async with self._database.one_statement() as conn:
            stored = await store.load_client(conn, client_id)
        if stored is None:
            return None
        secret = None
        if stored.secret_enc is not None:
            try:
                secret = self._secrets.decrypt(stored.secret_enc, aad=associated_data("as_client", client_id))
            except DecryptError:
                logger.error("a client secret did not open; check TOKEN_ENCRYPTION_KEYS")
                return None
        return OAuthClientInformationFull.model_validate({**stored.metadata, "client_secret": secret})

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        problem = metadata_problem(client_info)
        if problem is not None:
            raise RegistrationError(*problem)  # type: ignore[arg-type]  # the code is one of RFC 7591's
        metadata = client_info.model_dump(mode="json", exclude_none=True, exclude={"client_secret"})
        secret_enc = (
            self._secrets.encrypt(client_info.client_secret, aad=associated_data("as_client", client_info.client_id))
            if client_info.client_secret
            else None
        )
        # The SDK's errors are frozen dataclasses, which cannot leave a context manager (it sets their
        # traceback): decide inside, raise outside.
        async with self._database.transaction() as conn:
            flooded = await store.registrations_within(conn, timedelta(minutes=1)) >= self._registrations_per_minute
            if not flooded:
                await store.save_client(
                    conn, client_id=client_info.client_id, kind="dynamic", metadata=metadata, secret_enc=secret_enc
                )
                await AuditRepository(conn).record(
                    None, "as_register", provider=None, outcome="registered", detail=f"client {client_info.client_id}"
                )
        if flooded:
            logger.warning("dynamic client registration refused: the per-minute bound is reached")
            raise RegistrationError(
                "invalid_client_metadata", "too many clients registered in the last minute; try again in a minute"
            )

    # --- authorization --------------------------------------------------------------------------------

    async def authorize(self, client: OAuthClientInformationFull, params: AuthorizationParams) -> str:
        if params.resource is not None and canonical_resource(params.resource) != canonical_resource(self.resource):
            raise AuthorizeError("invalid_target", f"resource must be this server's MCP endpoint, {self.resource}")
        if not params.redirect_uri_provided_explicitly:
            raise AuthorizeError("invalid_request", "redirect_uri is required")
        if params.state is not None and len(params.state) > MAX_STATE_LENGTH:
            raise AuthorizeError("invalid_request", f"state is longer than {MAX_STATE_LENGTH} characters")
        if not 43 <= len(params.code_challenge) <= 128:
            raise AuthorizeError("invalid_request", "code_challenge must be an S256 challenge (43 to 128 characters)")
        # The SDK checked the asked-for scopes against the client's registration; whichever they were (mcp, or
        # the ignored openid/offline_access of clients.IGNORED_SCOPES), the grant is mcp, Coatcheck's one scope.
        scopes = [DEFAULT_SCOPE]
        pending = {
            "c": client.client_id,
            "r": str(params.redirect_uri),
            "p": params.code_challenge,
            "s": params.state,
            "o": scopes,
            "exp": int(time.time()) + REQUEST_LIFETIME_SECONDS,
        }
        sealed = self._requests.encrypt(json.dumps(pending, separators=(",", ":")), aad=b"authorization-request")
        return f"{self.issuer}{CONSENT_PATH}?{urlencode({'request': sealed})}"

    def open_request(self, sealed: str | None) -> PendingAuthorization | None:
        """The authorization request sealed by :meth:`authorize`, or ``None`` if it is forged or expired."""
        if not sealed or len(sealed) > 3000:
            return None
        try:
            data = json.loads(self._requests.decrypt(sealed, aad=b"authorization-request"))
        except (DecryptError, ValueError):
            return None
        if not isinstance(data, dict) or not isinstance(data.get("exp"), int) or data["exp"] < time.time():
            return None
        return PendingAuthorization(
            client_id=data["c"],
            redirect_uri=data["r"],
            code_challenge=data["p"],
            state=data["s"],
            scopes=list(data["o"]),
            resource=self.resource,
        )

    async def issue_code(self, principal: Principal, pending: PendingAuthorization, *, remember: bool) -> str:
        """After consent: a new grant and its code (and the consent remembered). One transaction."""
        code = store.new_secret()
        async with self._database.transaction() as conn:
            grant_id = await store.create_grant(
                conn, principal, client_id=pending.client_id, scopes=pending.scopes, resource=pending.resource
            )
            await store.store_code(
                conn,
                code,
                grant_id=grant_id,
                client_id=pending.client_id,
                redirect_uri=pending.redirect_uri,
                code_challenge=pending.code_challenge,
                lifetime=CODE_LIFETIME,
            )
            if remember:
                await store.remember_consent(conn, principal, pending.client_id, pending.scopes)
                await AuditRepository(conn).record(
                    principal, "as_consent", provider=None, outcome="granted", detail=f"client {pending.client_id}"
                )
        return code

    async def load_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: str
    ) -> StoredCode | None:
        if len(authorization_code) > 200:
            return None
        async with self._database.one_statement() as conn:
            record = await store.load_code(conn, authorization_code)
        if record is None or record.client_id != client.client_id or record.grant.revoked:
            return None
        return StoredCode(
            code=authorization_code,
            scopes=record.grant.scopes,
            expires_at=record.expires_at.timestamp(),
            client_id=record.client_id,
            code_challenge=record.code_challenge,
            redirect_uri=record.redirect_uri,  # type: ignore[arg-type]  # pydantic parses the str
            redirect_uri_provided_explicitly=True,
            resource=record.grant.resource,
            subject=record.grant.principal.subject,
            grant_id=record.grant.id,
            principal_iss=record.grant.principal.issuer,
        )

    async def exchange_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: StoredCode
    ) -> OAuthToken:
        principal = Principal(issuer=authorization_code.principal_iss, subject=authorization_code.subject or "")
        async with self._database.transaction() as conn:
            grant_id = await store.consume_code(conn, authorization_code.code)
            if grant_id is None:
                revoked = await store.revoke_grant(conn, authorization_code.grant_id, "code_replay")
                await AuditRepository(conn).record(
                    principal, "as_code_replay", provider=None, outcome="revoked", detail=f"client {client.client_id}"
                )
            else:
                tokens = await self._issue(conn, principal, client.client_id, grant_id, authorization_code.scopes)
        if grant_id is None:
            logger.warning("an authorization code was redeemed twice; its grant is revoked")
            raise TokenError(
                "invalid_grant",
                "authorization code was already used; the tokens issued for it are revoked"
                if revoked is not None
                else "authorization code was already used or has expired",
            )
        return tokens

    # --- refresh tokens -------------------------------------------------------------------------------

    async def load_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: str
    ) -> StoredRefreshToken | None:
        if len(refresh_token) > 200:
            return None
        async with self._database.one_statement() as conn:
            record = await store.load_refresh_token(conn, refresh_token)
        if record is None or record.client_id != client.client_id or record.grant.revoked:
            return None
        return StoredRefreshToken(
            token=refresh_token,
            client_id=record.client_id,
            scopes=record.grant.scopes,
            expires_at=int(record.expires_at.timestamp()),
            resource=record.grant.resource,
            subject=record.grant.principal.subject,
            grant_id=record.grant.id,
            principal_iss=record.grant.principal.issuer,
        )

    async def exchange_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: StoredRefreshToken, scopes: list[str]
    ) -> OAuthToken:
        principal = Principal(issuer=refresh_token.principal_iss, subject=refresh_token.subject or "")
        async with self._database.transaction() as conn:
            grant_id = await store.rotate_refresh_token(conn, refresh_token.token)
            if grant_id is None:
                await store.revoke_grant(conn, refresh_token.grant_id, "refresh_reuse")
                await AuditRepository(conn).record(
                    principal, "as_refresh_reuse", provider=None, outcome="revoked", detail=f"client {client.client_id}"
                )
            else:
                tokens = await self._issue(conn, principal, client.client_id, grant_id, scopes)
        if grant_id is None:
            logger.warning("a spent refresh token was presented again; its grant (the whole family) is revoked")
            raise TokenError(
                "invalid_grant", "refresh token was already used; every token of this grant is revoked, sign in again"
            )
        return tokens

    async def _issue(
        self, conn: Any, principal: Principal, client_id: str, grant_id: str, scopes: list[str]
    ) -> OAuthToken:
        refresh = store.new_secret()
        await store.store_refresh_token(
            conn, refresh, grant_id=grant_id, client_id=client_id, lifetime=self._refresh_lifetime
        )
        await AuditRepository(conn).record(
            principal, "as_token", provider=None, outcome="issued", detail=f"client {client_id}"
        )
        now = int(time.time())
        lifetime = int(self._access_lifetime.total_seconds())
        access = self._keys.sign(
            {
                "iss": self.issuer,
                "aud": self.resource,
                "sub": principal.subject,
                UPSTREAM_ISSUER_CLAIM: principal.issuer,
                "client_id": client_id,
                "scope": " ".join(scopes),
                GRANT_CLAIM: grant_id,
                "iat": now,
                "exp": now + lifetime,
                "jti": store.new_secret()[:22],
            }
        )
        return OAuthToken(access_token=access, expires_in=lifetime, scope=" ".join(scopes), refresh_token=refresh)

    # --- access tokens and revocation -----------------------------------------------------------------

    async def load_access_token(self, token: str) -> AccessToken | None:
        return await self._verifier.verify_token(token)

    async def revoke_token(self, token: AccessToken | StoredRefreshToken) -> None:
        grant_id = token.grant_id if isinstance(token, StoredRefreshToken) else (token.claims or {}).get(GRANT_CLAIM)
        if not isinstance(grant_id, str):
            return
        async with self._database.transaction() as conn:
            revoked = await store.revoke_grant(conn, grant_id, "client_revoked")
            if revoked is not None:
                await AuditRepository(conn).record(
                    revoked.principal,
                    "as_revoke",
                    provider=None,
                    outcome="revoked",
                    detail=f"client {revoked.client_id}",
                )

    async def exchange_identity_assertion(self, client: OAuthClientInformationFull, params: Any) -> OAuthToken:
        raise TokenError("unsupported_grant_type", "this authorization server does not accept identity assertions")
