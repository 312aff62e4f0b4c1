"""Which third-party OAuth providers a user may connect, read from configuration (no code changes).

The configuration is a TOML or JSON document (``PROVIDERS_FILE``) or a JSON string (``PROVIDERS``):
a table per provider name.

.. code-block:: toml

    [demo]
    display_name = "Demo provider (dev IdP)"
    issuer = "http://localhost:9400"                       # OIDC discovery, unless every endpoint is given
    authorization_endpoint = "http://localhost:9400/auth"  # browser-facing
    token_endpoint = "http://idp:9400/token"               # server-facing
    userinfo_endpoint = "http://idp:9400/me"
    revocation_endpoint = "http://idp:9400/token/revocation"
    jwks_uri = "http://idp:9400/jwks"                      # server-facing; verifies the ID token's signature
    client_id = "coatcheck-demo"
    client_secret_env = "DEMO_CLIENT_SECRET"               # the secret itself stays in the environment
    scopes = ["openid", "profile", "email"]

Explicit endpoints (and ``jwks_uri``) win over discovered ones, which is how a container that reaches the provider under
another host name than the browser does (compose) is configured. Client secrets are never written in the
document: ``client_secret_env`` names the environment variable holding one.

A provider's ID token (scope ``openid``) is validated by :func:`api.jose.verify_id_token`; its signature is
checked whenever the provider's keys are known: ``jwks_uri`` is set, or discovery runs (an endpoint is left
to it) and the metadata names one. A provider given every endpoint and no ``jwks_uri`` gets the claim checks
only, the TLS connection to its token endpoint standing in for the signature (OIDC Core §3.1.3.7).
"""

import json
import logging
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx2
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from api.jose import IssuerMetadata, IssuerUnavailable, JwksCache, verify_id_token

logger = logging.getLogger(__name__)

PROVIDER_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
AuthMethod = Literal["client_secret_basic", "client_secret_post", "none"]


def _absolute_url(value: str | None, what: str) -> str | None:
    if value is None:
        return None
    parts = urlsplit(value)
    if parts.scheme not in {"http", "https"} or not parts.hostname or parts.fragment:
        raise ValueError(f"{what} must be an absolute http(s) URL without a fragment")
    return value


class ProviderConfig(BaseModel):
    """One provider as configured. ``client_secret`` is resolved from the environment at load time."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    display_name: str | None = None
    issuer: str | None = None
    authorization_endpoint: str | None = None
    token_endpoint: str | None = None
    userinfo_endpoint: str | None = None
    revocation_endpoint: str | None = None
    jwks_uri: str | None = None
    client_id: str = Field(min_length=1)
    client_secret_env: str | None = None
    client_secret: SecretStr | None = Field(default=None, exclude=True)
    token_endpoint_auth_method: AuthMethod = "client_secret_basic"  # noqa: S105 - a method name
    scopes: tuple[str, ...] = ()
    authorization_params: dict[str, str] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not PROVIDER_NAME.fullmatch(value):
            raise ValueError("a provider name is 1-32 characters: a-z first, then a-z, 0-9, '_' or '-'")
        return value

    @field_validator("issuer")
    @classmethod
    def _issuer(cls, value: str | None) -> str | None:
        return None if value is None else (_absolute_url(value, "issuer") or "").rstrip("/")

    @field_validator("authorization_endpoint", "token_endpoint", "userinfo_endpoint", "revocation_endpoint", "jwks_uri")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        return _absolute_url(value, "an endpoint")

    @field_validator("client_secret_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and not ENV_NAME.fullmatch(value):
            raise ValueError("client_secret_env must be an environment variable name")
        return value

    @field_validator("authorization_params")
    @classmethod
    def _authorization_params(cls, value: dict[str, str]) -> dict[str, str]:
        reserved = {"client_id", "redirect_uri", "state", "code_challenge", "code_challenge_method", "nonce"}
        clash = reserved & set(value)
        if clash:
            raise ValueError(f"authorization_params may not set {', '.join(sorted(clash))}")
        return value

    @property
    def label(self) -> str:
        """The name a person reads on a page."""
        return self.display_name or self.name

    @property
    def wants_id_token(self) -> bool:
        return "openid" in self.scopes


class ProviderConfigError(ValueError):
    """The provider configuration cannot be used; the message names the provider and field, never a secret."""


def _describe(exc: ValidationError, name: str) -> str:
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "?"
        message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        problems.append(f"provider {name!r}: {where}: {message}")
    return "; ".join(problems)


def parse_providers(document: Mapping[str, Any], environ: Mapping[str, str]) -> tuple[ProviderConfig, ...]:
    """Validate a ``{name: table}`` document and resolve each client secret from ``environ``.

    Raises:
        ProviderConfigError: naming what is wrong (never a secret's value).
    """
    providers: list[ProviderConfig] = []
    for name, table in document.items():
        if not isinstance(table, Mapping):
            raise ProviderConfigError(f"provider {name!r} must be a table of settings")
        if "client_secret" in table:
            raise ProviderConfigError(
                f"provider {name!r}: put the secret in an environment variable and name it in client_secret_env"
            )
        try:
            config = ProviderConfig(name=name, **dict(table))
        except ValidationError as exc:
            raise ProviderConfigError(_describe(exc, str(name))) from None
        if config.issuer is None and (config.authorization_endpoint is None or config.token_endpoint is None):
            raise ProviderConfigError(
                f"provider {name!r}: set issuer (OIDC discovery) or both authorization_endpoint and token_endpoint"
            )
        secret: SecretStr | None = None
        if config.token_endpoint_auth_method != "none":  # noqa: S105 - a method name
            if config.client_secret_env is None:
                raise ProviderConfigError(f"provider {name!r}: client_secret_env is not set")
            value = environ.get(config.client_secret_env, "")
            if not value.strip():
                raise ProviderConfigError(
                    f"provider {name!r}: environment variable {config.client_secret_env} (its client secret) is not set"
                )
            secret = SecretStr(value.strip())
        providers.append(config.model_copy(update={"client_secret": secret}))
    return tuple(sorted(providers, key=lambda p: p.name))


def read_document(*, providers_file: str | None, providers_json: str | None) -> dict[str, Any]:
    """The raw provider document from ``PROVIDERS_FILE`` (TOML or JSON by extension) or ``PROVIDERS`` (JSON).

    Raises:
        ProviderConfigError: both are set, the file is unreadable, or the text does not parse.
    """
    if providers_file and providers_json:
        raise ProviderConfigError("set PROVIDERS_FILE or PROVIDERS, not both")
    if providers_file:
        path = Path(providers_file)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ProviderConfigError(f"PROVIDERS_FILE {providers_file} cannot be read ({exc.strerror})") from None
        try:
            loaded: object = json.loads(text) if path.suffix.lower() == ".json" else tomllib.loads(text)
        except (ValueError, tomllib.TOMLDecodeError):
            raise ProviderConfigError(f"PROVIDERS_FILE {providers_file} is not valid TOML/JSON") from None
    elif providers_json and providers_json.strip():
        try:
            loaded = json.loads(providers_json)
        except ValueError:
            raise ProviderConfigError("PROVIDERS is not valid JSON") from None
    else:
        return {}
    if not isinstance(loaded, dict):
        raise ProviderConfigError("the provider configuration must map provider names to tables")
    return loaded


def load_providers(
    *, providers_file: str | None, providers_json: str | None, environ: Mapping[str, str]
) -> tuple[ProviderConfig, ...]:
    """Read and validate the provider configuration (empty when neither source is set)."""
    return parse_providers(read_document(providers_file=providers_file, providers_json=providers_json), environ)


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
