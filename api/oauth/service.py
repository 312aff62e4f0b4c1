"""What the connection tools and the browser routes share: flows, tokens, refresh, profile, revocation.

Every method takes the principal (or, on the browser side, a flow the caller has already matched to the
signed-in subject). Token values only travel between the store, authlib and the provider; they are never
logged, audited, returned to a tool caller or rendered.

The unit of work: each method opens its own short transactions (or autocommit statements) on the pool and
passes the connection to the store; none is held across network I/O. Every provider call (code exchange,
refresh, userinfo, revocation) and every wait (for a flow to settle, for another instance's refresh)
happens with no connection checked out.
"""

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

import httpx2

from api.jose import JwtRejected
from api.oauth.client import (
    ClientCredentials,
    OAuthClient,
    OAuthFailure,
    TokenResponse,
    fetch_userinfo,
    new_code_verifier,
    new_secret,
)
from api.oauth.providers import ProviderRegistry
from api.oauth.refresh import RefreshTiming, TokenRefresher
from api.provider_config import ProviderConfig
from store.audit import AuditRepository, identity_digest
from store.crypto import TokenCipher
from store.db import Database
from store.errors import InvalidGrant, NotFound
from store.flows import ConsumedFlow, Flow, FlowRepository
from store.principal import Principal
from store.vault import TokenSet, VaultEntry, VaultRepository

logger = logging.getLogger(__name__)

CALLBACK_PATH = "/oauth/callback"
CONNECT_PATH = "/connect"

RevocationOutcome = Literal["revoked", "not_supported", "failed", "nothing_to_revoke"]


@dataclass(frozen=True, slots=True)
class Disconnected:
    """The outcome of a disconnect: whether there was a connection, and what happened upstream."""

    was_connected: bool
    revocation: RevocationOutcome


class Connections:
    """The connection service of one server instance (stateless: everything lives in PostgreSQL)."""

    def __init__(
        self,
        *,
        database: Database,
        cipher: TokenCipher,
        registry: ProviderRegistry,
        http: httpx2.AsyncClient,
        public_url: str,
        flow_ttl: timedelta,
        wait_seconds: float,
        refresh_skew: timedelta,
        refresh_timing: RefreshTiming | None = None,
        transport: httpx2.AsyncBaseTransport | None = None,
        record_refresh: Callable[[str], None] | None = None,
    ) -> None:
        self.database = database
        self.cipher = cipher
        self.registry = registry
        self.http = http
        self.public_url = public_url
        self.flow_ttl = flow_ttl
        self.wait_seconds = wait_seconds
        self.refresh_skew = refresh_skew
        self.refresher = TokenRefresher(database, cipher, skew=refresh_skew, timing=refresh_timing)
        self._transport = transport  # tests hold a provider's answers with it (a refresh racing a disconnect)
        self._record_refresh = record_refresh

    # -- shared -----------------------------------------------------------------------------------

    @property
    def callback_uri(self) -> str:
        return f"{self.public_url}{CALLBACK_PATH}"

    def connect_url(self, flow: Flow) -> str:
        return f"{self.public_url}{CONNECT_PATH}/{flow.handle}"

    def client(self, provider: ProviderConfig) -> OAuthClient:
        secret = provider.client_secret.get_secret_value() if provider.client_secret is not None else None
        credentials = ClientCredentials(
            client_id=provider.client_id, client_secret=secret, auth_method=provider.token_endpoint_auth_method
        )
        return OAuthClient(credentials, transport=self._transport)

    def _token_set(self, provider: ProviderConfig, response: TokenResponse, *, keep_scopes: bool) -> TokenSet:
        # An omitted scope means "as requested" on a code exchange and "unchanged" on a refresh.
        omitted: tuple[str, ...] = () if keep_scopes else provider.scopes
        scopes = tuple(response.scope.split()) if response.scope is not None else omitted
        return TokenSet(
            access_token=response.access_token,
            refresh_token=response.refresh_token,
            expires_at=response.expires_at,
            scopes=scopes,
            token_type=response.token_type if response.token_type.lower() != "bearer" else "Bearer",
        )

    # -- tool side --------------------------------------------------------------------------------

    async def list(self, principal: Principal) -> list[VaultEntry]:
        async with self.database.one_statement() as conn:
            return await VaultRepository(conn, self.cipher).list(principal)

    async def usable_tokens(self, principal: Principal, provider: ProviderConfig) -> TokenSet | None:
        """Tokens that are valid now, refreshed first when they expire within the skew (one refresher).

        Raises:
            ProviderUnavailable: endpoints could not be discovered.
            OAuthFailure: the refresh failed for another reason than ``invalid_grant``, or another
                instance's refresh did not finish in time (see :class:`~api.oauth.refresh.TokenRefresher`).
        """
        endpoints = await self.registry.endpoints(provider)
        client = self.client(provider)

        async def refresh(refresh_token: str) -> TokenSet:
            # The outcome is known only once the answer is parsed: a malformed answer is a failure, not "ok".
            try:
                response = await client.refresh(endpoints.token, refresh_token)
                tokens = self._token_set(provider, response, keep_scopes=True)
            except OAuthFailure as exc:
                self._count_refresh("invalid_grant" if exc.invalid_grant else "failed")
                if exc.invalid_grant:
                    raise InvalidGrant from None
                raise
            except BaseException:
                self._count_refresh("failed")
                raise
            self._count_refresh("ok")
            return tokens

        async def discard(tokens: TokenSet) -> str:
            return await self._revoke(provider, tokens)

        return await self.refresher.usable_tokens(principal, provider.name, refresh, discard)

    def _count_refresh(self, outcome: str) -> None:
        if self._record_refresh is not None:
            self._record_refresh(outcome)

    async def mark_needs_reauth(self, principal: Principal, provider: ProviderConfig, reason: str) -> None:
        async with self.database.transaction() as conn:
            await VaultRepository(conn, self.cipher).mark_needs_reauth(principal, provider.name)
            await AuditRepository(conn).record(principal, "profile", provider=provider.name, outcome=reason)

    async def profile(self, provider: ProviderConfig, tokens: TokenSet) -> dict[str, Any]:
        """The user's profile from the provider's userinfo endpoint, fetched with the stored token.

        Raises:
            Unauthorized: the provider rejected the token.
            OAuthFailure: the provider has no profile endpoint, or the request failed.
        """
        endpoints = await self.registry.endpoints(provider)
        if endpoints.userinfo is None:
            raise OAuthFailure("no_profile_endpoint")
        return await fetch_userinfo(self.http, endpoints.userinfo, tokens.access_token)

    async def flow_for(self, principal: Principal, provider: ProviderConfig) -> Flow:
        """The principal's open flow for ``provider``, or a new one (so a repeated call reuses the link)."""
        async with self.database.transaction() as conn:
            flows = FlowRepository(conn, self.cipher)
            flow = await flows.open_flow(principal, provider.name)
            if flow is None:
                flow = await flows.begin(principal, provider.name, ttl=self.flow_ttl)
                await AuditRepository(conn).record(principal, "connect", provider=provider.name, outcome="requested")
            return flow

    async def wait(self, principal: Principal, handle: str, seconds: float, *, interval: float = 0.1) -> Flow | None:
        """Wait up to ``seconds`` for this principal's flow to leave ``pending``; return its latest state.

        Polls every ``interval`` seconds, one autocommit read each, with no connection checked out in
        between. Returns at once for an unknown or foreign handle (``None``) or a flow that is already
        settled or expired; after ``seconds`` returns the flow as it is (still ``pending``, or ``expired``).
        """
        deadline = time.monotonic() + max(0.0, seconds)
        while True:
            async with self.database.one_statement() as conn:
                flow = await FlowRepository(conn, self.cipher).get(principal, handle)
            remaining = deadline - time.monotonic()
            if flow is None or flow.status != "pending" or remaining <= 0:
                return flow
            await asyncio.sleep(min(interval, remaining))

    async def cancel_flow(self, principal: Principal, handle: str) -> None:
        """The user declined in the client: settle the flow so its link stops working."""
        async with self.database.transaction() as conn:
            flow = await FlowRepository(conn, self.cipher).get(principal, handle)
            if flow is not None and await FlowRepository(conn, self.cipher).finish(handle, "failed", error="cancelled"):
                await AuditRepository(conn).record(principal, "connect", provider=flow.provider, outcome="cancelled")

    async def disconnect(
        self, principal: Principal, provider: ProviderConfig, *, by: str | None = None
    ) -> Disconnected:
        """Forget the tokens, then revoke them upstream (refresh token first, RFC 7009). Idempotent.

        No lock is taken: a refresh holds a lease, not a row lock (:mod:`store.token_refresh`). Deleting
        first means a refresh that starts afterwards finds nothing, and one already in flight has its
        lease-conditional write-back refused; it then finds the row gone, revokes the tokens it was just
        given and answers "not connected" (:class:`~api.oauth.refresh.TokenRefresher`). A revocation that
        fails is reported and audited, the local tokens are gone either way. ``by`` names who asked when
        it was not the user (``"operator"``), in the audit entries' detail.
        """
        async with self.database.transaction() as conn:
            tokens = await VaultRepository(conn, self.cipher).delete(principal, provider.name)
            if tokens is None:
                await AuditRepository(conn).record(
                    principal, "disconnect", provider=provider.name, outcome="not_connected", detail=by
                )
                return Disconnected(was_connected=False, revocation="nothing_to_revoke")
        revocation = await self._revoke(provider, tokens)
        async with self.database.one_statement() as conn:
            await AuditRepository(conn).record(
                principal, "disconnect", provider=provider.name, outcome=revocation, detail=by
            )
        return Disconnected(was_connected=True, revocation=revocation)

    async def _revoke(self, provider: ProviderConfig, tokens: TokenSet) -> RevocationOutcome:
        try:
            endpoints = await self.registry.endpoints(provider)
        except Exception:  # discovery failed: report, do not resurrect the tokens
            logger.warning("revocation for %s skipped: provider metadata unavailable", provider.name)
            return "failed"
        if endpoints.revocation is None:
            return "not_supported"
        client = self.client(provider)
        try:
            # Revoking the refresh token ends the whole grant at most providers; the access token too then.
            if tokens.refresh_token is not None:
                await client.revoke(endpoints.revocation, tokens.refresh_token, hint="refresh_token")
            await client.revoke(endpoints.revocation, tokens.access_token, hint="access_token")
        except OAuthFailure:
            return "failed"
        return "revoked"

    # -- browser side -----------------------------------------------------------------------------

    async def flow_for_browser(self, handle: str) -> Flow | None:
        """The flow behind a /connect link, whoever owns it: the caller compares subjects next."""
        async with self.database.one_statement() as conn:
            return await FlowRepository(conn, self.cipher).get_for_browser(handle)

    async def record_mismatch(self, flow: Flow, intruder: Principal, where: str) -> None:
        """Audit that a browser signed in as someone else opened (or finished) this principal's flow."""
        async with self.database.one_statement() as conn:
            await AuditRepository(conn).record(
                flow.principal,
                "subject_mismatch",
                provider=flow.provider,
                outcome="refused",
                detail=f"{where}; browser user {identity_digest(intruder)}",
            )

    async def authorization_redirect(self, flow: Flow, provider: ProviderConfig) -> str:
        """Attach a fresh ``state``, PKCE verifier (and OIDC nonce) to the flow; the provider URL to go to.

        Raises:
            NotFound: the flow stopped being pending meanwhile.
            ProviderUnavailable: the provider's endpoints are unknown.
        """
        endpoints = await self.registry.endpoints(provider)
        state, verifier = new_secret(), new_code_verifier()
        nonce = new_secret() if provider.wants_id_token else None
        async with self.database.transaction() as conn:
            await FlowRepository(conn, self.cipher).attach_provider_state(
                flow.handle, state=state, code_verifier=verifier, nonce=nonce
            )
            await AuditRepository(conn).record(flow.principal, "connect", provider=provider.name, outcome="redirected")
        return self.client(provider).authorization_url(
            endpoints.authorization,
            redirect_uri=self.callback_uri,
            scope=" ".join(provider.scopes),
            state=state,
            code_verifier=verifier,
            nonce=nonce,
            extra=provider.authorization_params,
        )

    async def flow_for_state(self, state: str) -> Flow | None:
        """The flow an unused provider ``state`` belongs to, leaving the state usable (the caller checks the user)."""
        async with self.database.one_statement() as conn:
            return await FlowRepository(conn, self.cipher).flow_for_state(state)

    async def consume(self, state: str) -> ConsumedFlow | None:
        async with self.database.transaction() as conn:
            return await FlowRepository(conn, self.cipher).consume_state(state)

    async def fail(self, flow: Flow, status: Literal["denied", "failed"], error: str) -> None:
        async with self.database.transaction() as conn:
            await FlowRepository(conn, self.cipher).finish(flow.handle, status, error=error)
            await AuditRepository(conn).record(
                flow.principal, "connect", provider=flow.provider, outcome=status, detail=error
            )

    async def complete(self, consumed: ConsumedFlow, provider: ProviderConfig, code: str) -> None:
        """Redeem the code with the flow's PKCE verifier, store the tokens and settle the flow.

        Raises:
            OAuthFailure: the exchange failed or the ID token does not belong to this request
                (the caller settles the flow as failed).
        """
        endpoints = await self.registry.endpoints(provider)
        response = await self.client(provider).exchange_code(
            endpoints.token, code=code, code_verifier=consumed.code_verifier, redirect_uri=self.callback_uri
        )
        if response.id_token is not None and consumed.nonce is not None:
            # Binds the provider's answer to this authorization request (nonce, audience, issuer, signature).
            try:
                await self.registry.verify_id_token(
                    provider, response.id_token, nonce=consumed.nonce, access_token=response.access_token
                )
            except JwtRejected as exc:
                logger.warning("provider %s returned an ID token that was refused: %s", provider.name, exc)
                raise OAuthFailure("id_token_mismatch" if exc.claim else "invalid_id_token") from None
        tokens = self._token_set(provider, response, keep_scopes=False)
        flow = consumed.flow
        async with self.database.transaction() as conn:
            await VaultRepository(conn, self.cipher).save(flow.principal, provider.name, tokens)
            await FlowRepository(conn, self.cipher).finish(flow.handle, "connected")
            await AuditRepository(conn).record(flow.principal, "connect", provider=provider.name, outcome="connected")


__all__ = ["CALLBACK_PATH", "CONNECT_PATH", "Connections", "Disconnected", "NotFound"]
