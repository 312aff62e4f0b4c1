"""URL-mode connect flows: a server-side record binding an upstream OAuth ``state`` to a principal.

A tool call that needs a provider token starts (or reuses) a flow and sends the user to
``/connect/<handle>``. The browser route logs the user in, compares subjects, attaches a fresh
``state`` plus the PKCE verifier and nonce (:meth:`FlowRepository.attach_provider_state`), and
redirects upstream. The callback consumes the state exactly once
(:meth:`FlowRepository.consume_state`: one ``UPDATE … RETURNING``), exchanges the code and
finishes the flow. The retried tool call reads the outcome (:meth:`FlowRepository.get`, polled by the
service in ``api.oauth.service`` without holding a connection between reads).

Invariants:

* Only ``sha256(state)`` is stored (unique index); the PKCE verifier and nonce are sealed with
  associated data naming this table and the flow handle, and are cleared once consumed.
* A state is single use, works only while its flow is pending and unexpired, and only the
  latest one attached to a flow works.
* Every method that takes a principal scopes its SQL to it; unknown, malformed and foreign
  handles all read as ``None``. The one deliberate exception is the browser side
  (:meth:`~FlowRepository.get_for_browser`, :meth:`~FlowRepository.attach_provider_state`,
  :meth:`~FlowRepository.consume_state`, :meth:`~FlowRepository.finish`): the browser carries no
  MCP token, so those look a flow up by handle or state, and the caller must compare the
  logged-in subject with ``flow.principal`` before acting on it.
* ``expired`` is derived, never stored: a pending flow past ``expires_at`` (database clock).
"""

import hashlib
import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from sqlalchemy import Interval, RowMapping, and_, bindparam, case, func, insert, literal, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from store.crypto import TokenCipher, associated_data
from store.errors import DecryptError, NotFound
from store.handles import is_well_formed, new_handle
from store.models import OAuthFlow, table_of
from store.principal import Principal
from store.scoping import owned_by, principal_params

__all__ = [
    "FINISHED_STATUSES",
    "FLOW_PREFIX",
    "ConsumedFlow",
    "Flow",
    "FlowRepository",
    "flow_secrets_aad",
]

FLOW_PREFIX = "flow"
FINISHED_STATUSES = frozenset({"connected", "denied", "failed"})
_ERROR_CODE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_UNRECOGNISED_ERROR = "unrecognised_error"

_flow = table_of(OAuthFlow)

_STATUS = case(
    (and_(_flow.c.status == "pending", _flow.c.expires_at <= func.now()), literal("expired")),
    else_=_flow.c.status,
).label("status")
_COLUMNS = (
    _flow.c.handle,
    _flow.c.principal_iss,
    _flow.c.principal_sub,
    _flow.c.provider,
    _STATUS,
    _flow.c.created_at,
    _flow.c.expires_at,
    _flow.c.error,
)
_OPEN = and_(_flow.c.status == "pending", _flow.c.expires_at > func.now())
_OWNED = owned_by(_flow)

_BEGIN = (
    insert(_flow)
    .values(
        handle=bindparam("p_handle"),
        principal_iss=bindparam("p_iss"),
        principal_sub=bindparam("p_sub"),
        provider=bindparam("p_provider"),
        status="pending",
        expires_at=func.now() + bindparam("p_ttl", type_=Interval()),
    )
    .returning(*_COLUMNS)
)
_GET = select(*_COLUMNS).where(_flow.c.handle == bindparam("p_handle"), _OWNED)
_GET_FOR_BROWSER = select(*_COLUMNS).where(_flow.c.handle == bindparam("p_handle"))
_OPEN_FLOW = (
    select(*_COLUMNS)
    .where(_OWNED, _flow.c.provider == bindparam("p_provider"), _OPEN)
    .order_by(_flow.c.created_at.desc(), _flow.c.id.desc())
    .limit(1)
)
_ATTACH = (
    update(_flow)
    .where(_flow.c.handle == bindparam("p_handle"), _OPEN)
    .values(state_digest=bindparam("p_digest"), secrets_enc=bindparam("p_secrets"), state_consumed_at=None)
    .returning(_flow.c.id)
)
_PENDING_STATE = select(*_COLUMNS).where(
    _flow.c.state_digest == bindparam("p_digest"), _flow.c.state_consumed_at.is_(None), _OPEN
)
# The subquery locks the matching row; a concurrent consumer blocks on it, re-checks
# ``state_consumed_at IS NULL`` once the winner commits and finds nothing. The outer UPDATE
# clears the sealed secrets while RETURNING hands back their pre-update value.
_UNCONSUMED = (
    select(_flow.c.id, _flow.c.secrets_enc)
    .where(_flow.c.state_digest == bindparam("p_digest"), _flow.c.state_consumed_at.is_(None), _OPEN)
    .with_for_update()
    .subquery("unconsumed")
)
_CONSUME = (
    update(_flow)
    .where(_flow.c.id == _UNCONSUMED.c.id)
    .values(state_consumed_at=func.now(), secrets_enc=None)
    .returning(*_COLUMNS, _UNCONSUMED.c.secrets_enc.label("sealed_secrets"))
)
_FINISH = (
    update(_flow)
    .where(_flow.c.handle == bindparam("p_handle"), _flow.c.status == "pending")
    .values(status=bindparam("p_status"), error=bindparam("p_error"), finished_at=func.now(), secrets_enc=None)
    .returning(_flow.c.id)
)


FlowStatus = Literal["pending", "connected", "denied", "failed", "expired"]
"""``expired`` is never stored: it is how a pending flow past ``expires_at`` reads."""


@dataclass(frozen=True, slots=True)
class Flow:
    """A connect flow as callers see it. ``status`` is ``expired`` for a pending flow past ``expires_at``."""

    handle: str
    principal: Principal
    provider: str
    status: FlowStatus
    created_at: datetime
    expires_at: datetime
    error: str | None


@dataclass(frozen=True, slots=True)
class ConsumedFlow:
    """A flow whose ``state`` was just consumed, with the secrets of that authorization request."""

    flow: Flow
    code_verifier: str = field(repr=False)
    nonce: str | None = field(repr=False)


def _flow_of(row: RowMapping) -> Flow:
    return Flow(
        handle=row["handle"],
        principal=Principal(issuer=row["principal_iss"], subject=row["principal_sub"]),
        provider=row["provider"],
        status=row["status"],
        created_at=row["created_at"],
        expires_at=row["expires_at"],
        error=row["error"],
    )


async def _owned_flow(conn: AsyncConnection, principal: Principal, handle: str) -> Flow | None:
    if not is_well_formed(handle, FLOW_PREFIX):
        return None
    params = {"p_handle": handle, **principal_params(principal)}
    row = (await conn.execute(_GET, params)).mappings().one_or_none()
    return _flow_of(row) if row is not None else None


def _state_digest(state: str) -> bytes:
    return hashlib.sha256(state.encode()).digest()


def flow_secrets_aad(handle: str) -> bytes:
    """The associated data binding a flow's sealed PKCE verifier and nonce to the flow (for key rotation too)."""
    return associated_data("oauth_flow", handle, "secrets")


class FlowRepository:
    """Flow operations on one connection (inside the caller's transaction)."""

    def __init__(self, conn: AsyncConnection, cipher: TokenCipher) -> None:
        self._conn = conn
        self._cipher = cipher

    async def begin(self, principal: Principal, provider: str, *, ttl: timedelta) -> Flow:
        """Start a pending flow for ``provider`` that expires ``ttl`` from now (database clock). One statement.

        Raises:
            ValueError: ``ttl`` is not positive.
        """
        if ttl <= timedelta(0):
            raise ValueError("a flow's ttl must be positive")
        params = {
            "p_handle": new_handle(FLOW_PREFIX),
            "p_iss": principal.issuer,
            "p_sub": principal.subject,
            "p_provider": provider,
            "p_ttl": ttl,
        }
        return _flow_of((await self._conn.execute(_BEGIN, params)).mappings().one())

    async def open_flow(self, principal: Principal, provider: str) -> Flow | None:
        """The newest pending, unexpired flow of this principal for ``provider``, to reuse. One query."""
        params = {"p_iss": principal.issuer, "p_sub": principal.subject, "p_provider": provider}
        row = (await self._conn.execute(_OPEN_FLOW, params)).mappings().one_or_none()
        return _flow_of(row) if row is not None else None

    async def get(self, principal: Principal, handle: str) -> Flow | None:
        """This principal's flow behind ``handle``; ``None`` for malformed, unknown or foreign handles."""
        return await _owned_flow(self._conn, principal, handle)

    async def get_for_browser(self, handle: str) -> Flow | None:
        """The flow behind ``handle`` whoever owns it: for the ``/connect`` route only.

        This is the one lookup not scoped by principal, because the browser carries no MCP token.
        The caller must log the user in and compare their (issuer, subject) with
        ``flow.principal`` before doing anything else with the flow.
        """
        if not is_well_formed(handle, FLOW_PREFIX):
            return None
        row = (await self._conn.execute(_GET_FOR_BROWSER, {"p_handle": handle})).mappings().one_or_none()
        return _flow_of(row) if row is not None else None

    async def attach_provider_state(self, handle: str, *, state: str, code_verifier: str, nonce: str | None) -> None:
        """Record a new upstream authorization request for a pending flow. One statement.

        Stores ``sha256(state)`` and the sealed verifier and nonce, replacing any earlier attempt
        (whose state then no longer matches). Browser-side: call only after the subject check.

        Raises:
            NotFound: the flow is unknown, expired or no longer pending.
            ValueError: ``state`` or ``code_verifier`` is empty.
        """
        if not state or not code_verifier:
            raise ValueError("state and code_verifier must not be empty")
        if not is_well_formed(handle, FLOW_PREFIX):
            raise NotFound("flow", handle)
        sealed = self._cipher.encrypt(json.dumps({"v": code_verifier, "n": nonce}), aad=flow_secrets_aad(handle))
        params = {"p_handle": handle, "p_digest": _state_digest(state), "p_secrets": sealed}
        if (await self._conn.execute(_ATTACH, params)).scalar_one_or_none() is None:
            raise NotFound("flow", handle)

    async def flow_for_state(self, state: str) -> Flow | None:
        """The flow ``state`` would consume, without consuming it. One query, no lock.

        ``None`` in the same cases as :meth:`consume_state`. Browser-side: the callback compares
        the logged-in subject with ``flow.principal`` *before* it consumes the state, so a replay
        from another browser (or none) cannot use up the owner's state.
        """
        if not state:
            return None
        row = (await self._conn.execute(_PENDING_STATE, {"p_digest": _state_digest(state)})).mappings().one_or_none()
        return _flow_of(row) if row is not None else None

    async def consume_state(self, state: str) -> ConsumedFlow | None:
        """Use up ``state`` and return its flow with the PKCE verifier and nonce. One statement.

        ``None`` when the state is empty, unknown, already used, superseded by a newer attempt, or
        its flow is expired or finished. Browser-side: the caller must still compare the
        logged-in subject with ``flow.principal``.

        Raises:
            DecryptError: the sealed secrets do not open (key ring misconfigured).
        """
        if not state:
            return None
        row = (await self._conn.execute(_CONSUME, {"p_digest": _state_digest(state)})).mappings().one_or_none()
        if row is None:
            return None
        flow = _flow_of(row)
        sealed = row["sealed_secrets"]
        if sealed is None:
            raise DecryptError("malformed")
        secrets = json.loads(self._cipher.decrypt(sealed, aad=flow_secrets_aad(flow.handle)))
        return ConsumedFlow(flow=flow, code_verifier=secrets["v"], nonce=secrets["n"])

    async def finish(self, handle: str, status: str, *, error: str | None = None) -> bool:
        """Settle a pending flow as ``connected``, ``denied`` or ``failed``. One statement.

        ``error`` is a short code such as ``access_denied``; anything else is stored as
        ``unrecognised_error``. The first settlement wins: returns ``False`` when the flow is
        unknown or already settled. Works on a flow that expired after its state was consumed,
        so a slow code exchange still records its outcome.

        Raises:
            ValueError: ``status`` is not a final status.
        """
        if status not in FINISHED_STATUSES:
            raise ValueError(f"a flow finishes as one of {sorted(FINISHED_STATUSES)}")
        if not is_well_formed(handle, FLOW_PREFIX):
            return False
        if error is not None and not _ERROR_CODE.fullmatch(error):
            error = _UNRECOGNISED_ERROR
        params = {"p_handle": handle, "p_status": status, "p_error": error}
        return (await self._conn.execute(_FINISH, params)).scalar_one_or_none() is not None
