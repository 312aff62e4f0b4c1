"""The configured third-party OAuth providers at run time: endpoints discovered and cached, ID tokens checked.

The configuration they come from is read and validated by :mod:`api.provider_config`.

A provider's ID token (scope ``openid``) is validated by :func:`api.jose.verify_id_token`; its signature is
checked whenever the provider's keys are known: ``jwks_uri`` is set, or discovery runs (an endpoint is left
to it) and the metadata names one. A provider given every endpoint and no ``jwks_uri`` gets the claim checks
only, the TLS connection to its token endpoint standing in for the signature (OIDC Core §3.1.3.7).
"""

import logging
from dataclasses import dataclass, field
from typing import Any

import httpx2

from api.jose import IssuerMetadata, IssuerUnavailable, JwksCache, verify_id_token
from api.provider_config import ProviderConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ProviderEndpoints:
    """Where to send the browser (authorization) and where the server talks to the provider."""

    authorization: str
    token: str
    userinfo: str | None
    revocation: str | None
    issuer: str | None
    jwks: JwksCache | None = field(default=None, compare=False)


class ProviderUnavailable(Exception):  # noqa: N818 - a verdict
    """The provider's metadata could not be fetched; the message is safe to show."""


@dataclass
class ProviderRegistry:
    """The configured providers, with their endpoints discovered lazily and cached for the process.

    ``leeway`` is the clock skew allowed on a provider's ID token; ``jwks_ttl`` how long its keys are cached.
    """

    providers: tuple[ProviderConfig, ...]
    http: httpx2.AsyncClient
    leeway: int = 60
    jwks_ttl: float = 3600.0
    _endpoints: dict[str, ProviderEndpoints] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.providers]

    def get(self, name: str) -> ProviderConfig | None:
        return next((p for p in self.providers if p.name == name), None)

    def unknown_text(self, name: str) -> str:
        """The tool error for a provider name that is not configured."""
        shown = name if len(name) <= 40 else name[:40] + "…"
        if not self.providers:
            return f"Unknown provider {shown!r}: this server has no providers configured."
        return f"Unknown provider {shown!r}; the configured providers are: {', '.join(self.names)}."

    async def endpoints(self, provider: ProviderConfig) -> ProviderEndpoints:
        """Explicit endpoints, completed from the issuer's metadata when some are missing.

        Raises:
            ProviderUnavailable: discovery was needed and failed.
        """
        cached = self._endpoints.get(provider.name)
        if cached is not None:
            return cached
        metadata: dict[str, Any] = {}
        explicit = (provider.authorization_endpoint, provider.token_endpoint, provider.userinfo_endpoint)
        # Provider configuration drops a trailing slash (and accepts either in `iss`), so its metadata may too.
        issuer = (
            IssuerMetadata(provider.issuer, self.http, slash_insensitive=True) if provider.issuer is not None else None
        )
        if issuer is not None and any(value is None for value in explicit):
            try:
                metadata = await issuer.document()
            except IssuerUnavailable as exc:
                logger.warning("discovery for provider %s failed: %s", provider.name, exc)
                if exc.unreachable:
                    raise ProviderUnavailable(f"{provider.label} cannot be reached right now") from None
                raise ProviderUnavailable(f"{provider.label} publishes no usable OAuth metadata") from None
        authorization = provider.authorization_endpoint or metadata.get("authorization_endpoint")
        token = provider.token_endpoint or metadata.get("token_endpoint")
        if not isinstance(authorization, str) or not isinstance(token, str):
            raise ProviderUnavailable(f"{provider.label} publishes no authorization or token endpoint")
        userinfo = provider.userinfo_endpoint or metadata.get("userinfo_endpoint")
        revocation = provider.revocation_endpoint or metadata.get("revocation_endpoint")
        jwks_uri = provider.jwks_uri or metadata.get("jwks_uri")
        jwks = JwksCache(issuer, self.http, ttl=self.jwks_ttl, jwks_uri=jwks_uri) if isinstance(jwks_uri, str) else None
        endpoints = ProviderEndpoints(
            authorization=authorization,
            token=token,
            userinfo=userinfo if isinstance(userinfo, str) else None,
            revocation=revocation if isinstance(revocation, str) else None,
            issuer=provider.issuer,
            jwks=jwks,
        )
        self._endpoints[provider.name] = endpoints
        return endpoints

    async def verify_id_token(
        self, provider: ProviderConfig, id_token: str, *, nonce: str, access_token: str | None
    ) -> dict[str, Any]:
        """The claims of the provider's ID token for this authorization request (see the module docstring).

        Raises:
            JwtRejected: naming the check that failed.
            ProviderUnavailable: discovery was needed and failed.
        """
        endpoints = await self.endpoints(provider)
        # Configuration drops an issuer's trailing slash; the token's ``iss`` is the provider's exact string.
        issuers = None if provider.issuer is None else [provider.issuer, provider.issuer + "/"]
        return await verify_id_token(
            id_token,
            jwks=endpoints.jwks,
            issuers=issuers,
            client_id=provider.client_id,
            nonce=nonce,
            leeway=self.leeway,
            access_token=access_token,
        )
