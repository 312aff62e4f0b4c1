"""The configuration contract, read from environment variables (or a ``.env`` file).

Secrets have no defaults. A missing or weak secret stops start-up with a message
naming the variable; every other setting has a safe default or is derived.
"""

from functools import cached_property
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from store.db import async_database_url

MIN_SECRET_BYTES = 32
_MIN_DISTINCT_CHARS = 10
_PLACEHOLDERS = ("change", "secret", "example", "xxxx", "0000", "password")


def _split_csv(value: object) -> object:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def check_secret_ring(name: str, raw: str) -> list[bytes]:
    """Split a comma-separated key ring and refuse weak entries.

    Raises:
        ValueError: naming ``name`` and the position of the weak key (never its value).
    """
    keys = [part.strip() for part in raw.split(",") if part.strip()]
    if not keys:
        raise ValueError(f"{name} is empty: set it to one or more comma-separated secrets of >= 32 bytes")
    ring: list[bytes] = []
    for position, key in enumerate(keys, start=1):
        encoded = key.encode()
        lowered = key.lower()
        if len(encoded) < MIN_SECRET_BYTES:
            raise ValueError(f"{name}: key #{position} is shorter than {MIN_SECRET_BYTES} bytes")
        if len(set(key)) < _MIN_DISTINCT_CHARS or any(word in lowered for word in _PLACEHOLDERS):
            raise ValueError(
                f"{name}: key #{position} looks like a placeholder; generate one with "
                "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`"
            )
        ring.append(encoded)
    if len(set(ring)) != len(ring):
        raise ValueError(f"{name} lists the same key twice")
    return ring


def _normalise_base_url(name: str, value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ValueError(f"{name} must be an absolute http(s) URL, e.g. https://coatcheck.example.com")
    if parts.query or parts.fragment:
        raise ValueError(f"{name} must not contain a query or fragment")
    return value.rstrip("/")


class Settings(BaseSettings):
    """Everything the server needs; construct with :meth:`from_env` to get readable start-up errors."""

    model_config = SettingsConfigDict(env_file=".env", extra="ignore", case_sensitive=False)

    database_url: str = Field(description="PostgreSQL URL (postgresql:// or postgresql+asyncpg://).")
    public_url: str = Field(description="Externally visible base URL; the MCP resource is <PUBLIC_URL>/mcp.")
    oidc_issuer: str = Field(description="Authorization server that issues MCP access tokens.")
    request_state_keys: SecretStr = Field(description="Comma-separated secrets (>= 32 bytes); first seals.")

    oidc_issuer_internal_url: str | None = Field(
        default=None,
        description="Fetch the issuer's metadata and keys through this base URL instead of OIDC_ISSUER "
        "(for containers that cannot reach the public issuer URL); tokens must still name OIDC_ISSUER.",
    )
    request_state_ttl_seconds: int = Field(default=600, gt=0, le=86400)
    allowed_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    allowed_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    jwt_leeway_seconds: int = Field(default=30, ge=0, le=300)
    jwks_cache_seconds: int = Field(default=600, gt=0)
    db_pool_size: int = Field(default=10, gt=0)
    db_max_overflow: int = Field(default=10, ge=0)
    readyz_timeout_seconds: float = Field(default=2.0, gt=0)
    mcp_json_response: bool = False
    log_level: str = "INFO"

    @field_validator("allowed_hosts", "allowed_origins", mode="before")
    @classmethod
    def _csv(cls, value: object) -> object:
        return _split_csv(value)

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: str) -> str:
        try:
            return async_database_url(value)
        except Exception as exc:  # sqlalchemy's URL parser raises several types
            raise ValueError("DATABASE_URL must be a postgresql:// or postgresql+asyncpg:// URL") from exc

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str) -> str:
        return _normalise_base_url("PUBLIC_URL", value)

    @field_validator("oidc_issuer")
    @classmethod
    def _issuer(cls, value: str) -> str:
        # Issuers compare as exact strings (RFC 8414); keep what the operator wrote minus a trailing slash.
        _normalise_base_url("OIDC_ISSUER", value)
        return value.rstrip("/")

    @field_validator("oidc_issuer_internal_url")
    @classmethod
    def _issuer_internal(cls, value: str | None) -> str | None:
        return None if not value else _normalise_base_url("OIDC_ISSUER_INTERNAL_URL", value)

    @field_validator("request_state_keys")
    @classmethod
    def _state_keys(cls, value: SecretStr) -> SecretStr:
        check_secret_ring("REQUEST_STATE_KEYS", value.get_secret_value())
        return value

    @classmethod
    def from_env(cls, **overrides: object) -> "Settings":
        """Load settings; on failure raise :class:`SettingsError` naming each bad variable."""
        try:
            return cls(**overrides)  # type: ignore[arg-type]
        except ValidationError as exc:
            raise SettingsError.from_validation(exc) from None

    @property
    def mcp_resource_url(self) -> str:
        """The canonical MCP resource identifier (RFC 8707 audience)."""
        return f"{self.public_url}/mcp"

    @cached_property
    def state_key_ring(self) -> list[bytes]:
        """The request-state key ring, newest first."""
        return check_secret_ring("REQUEST_STATE_KEYS", self.request_state_keys.get_secret_value())


class SettingsError(Exception):
    """Start-up configuration is missing or invalid; the message names every offending variable."""

    @classmethod
    def from_validation(cls, exc: ValidationError) -> "SettingsError":
        """Render pydantic's errors without echoing any submitted value."""
        lines = []
        for error in exc.errors():
            variable = str(error["loc"][0]).upper() if error["loc"] else "?"
            if error["type"] == "missing":
                lines.append(f"{variable} is not set")
            else:
                message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
                lines.append(message if message.startswith(variable) else f"{variable}: {message}")
        return cls("invalid configuration:\n  " + "\n  ".join(lines))
