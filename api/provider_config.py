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

This module needs no OAuth client library: :mod:`api.settings` validates the configuration at start-up
with it, and every operator command loads settings. The providers at run time (discovery, ID tokens) are
:mod:`api.oauth.providers`.
"""

import json
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

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
