"""The configuration contract, read from environment variables (or a ``.env`` file).

Secrets have no defaults. A missing or weak secret stops start-up with a message
naming the variable; every other setting has a safe default or is derived.
"""

import ipaddress
import os
from typing import Annotated, Literal, Self
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from api.provider_config import ProviderConfig, load_providers
from api.secret_strength import MIN_SECRET_BITS, estimated_entropy_bits
from store.db import async_database_url

MIN_SECRET_BYTES = 32
_MIN_DISTINCT_CHARS = 10
_PLACEHOLDERS = ("change", "secret", "example", "xxxx", "0000", "password")
_GENERATE_HINT = "generate one with `python -c 'import secrets; print(secrets.token_urlsafe(32))'`"


def _split_csv(value: object) -> object:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def check_secret_strength(name: str, secret: str) -> None:
    """Refuse a secret a person could guess: placeholders, repeated or sequential patterns, words.

    Raises:
        ValueError: naming ``name`` (which may say which key of a ring) and why, never the value.
    """
    if len(set(secret)) < _MIN_DISTINCT_CHARS or any(word in secret.lower() for word in _PLACEHOLDERS):
        raise ValueError(f"{name} looks like a placeholder; {_GENERATE_HINT}")
    bits = estimated_entropy_bits(secret)
    if bits < MIN_SECRET_BITS:
        raise ValueError(
            f"{name} is too guessable (about {bits:.0f} bits of estimated entropy, {MIN_SECRET_BITS} needed; "
            f"repeats, sequences and words count for little); {_GENERATE_HINT}"
        )


def check_secret_ring(name: str, raw: str) -> list[bytes]:
    """Split a comma-separated key ring and refuse weak entries.

    Each key needs at least 32 bytes and about 128 bits of estimated entropy
    (:func:`api.secret_strength.estimated_entropy_bits`).

    Raises:
        ValueError: naming ``name`` and the position of the weak key (never its value).
    """
    keys = [part.strip() for part in raw.split(",") if part.strip()]
    if not keys:
        raise ValueError(f"{name} is empty: set it to one or more comma-separated secrets of >= 32 bytes")
    ring: list[bytes] = []
    for position, key in enumerate(keys, start=1):
        encoded = key.encode()
        if len(encoded) < MIN_SECRET_BYTES:
            raise ValueError(f"{name}: key #{position} is shorter than {MIN_SECRET_BYTES} bytes")
        check_secret_strength(f"{name}: key #{position}", key)
        ring.append(encoded)
    if len(set(ring)) != len(ring):
        raise ValueError(f"{name} lists the same key twice")
    return ring


def check_rings_disjoint(state_ring: list[bytes], token_ring: list[bytes]) -> None:
    """Refuse a key that is in both rings: a leak of one must not open the other.

    Raises:
        ValueError: naming both variables and the positions, never the key.
    """
    for position, key in enumerate(token_ring, start=1):
        if key in state_ring:
            raise ValueError(
                f"TOKEN_ENCRYPTION_KEYS: key #{position} is also REQUEST_STATE_KEYS key "
                f"#{state_ring.index(key) + 1}; each ring needs keys of its own"
            )


def _normalise_base_url(name: str, value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ValueError(f"{name} must be an absolute http(s) URL, e.g. https://coatcheck.example.com")
    if parts.query or parts.fragment:
        raise ValueError(f"{name} must not contain a query or fragment")
    return value.rstrip("/")


class KeyRing(SecretStr):
    """A comma-separated key ring, checked once when the settings load; :attr:`keys` is the ring, newest first."""

    def __init__(self, name: str, raw: str) -> None:
        super().__init__(raw)
        self.keys: tuple[bytes, ...] = tuple(check_secret_ring(name, raw))


class ProviderSource(str):
    """``PROVIDERS_FILE`` or ``PROVIDERS`` as written; :attr:`configs` is what was read from it at start-up."""

    configs: "tuple[ProviderConfig, ...]" = ()


def _ring(value: SecretStr) -> list[bytes]:
    # The validators below turn every ring field into a KeyRing; model_construct would skip them.
    if not isinstance(value, KeyRing):
        raise TypeError("settings were built without validation; use from_env()")
    return list(value.keys)


class DatabaseSettings(BaseSettings):
    """The database: all that ``coatcheck migrate``, ``seed-demo``, ``purge`` and ``audit`` need.

    The base of the settings family: an operator's shell that runs these need not hold the server's secrets.
    Construct with :meth:`from_env` to get readable errors.
    """

    model_config = SettingsConfigDict(env_file=".env", extra="ignore", case_sensitive=False)

    database_url: str = Field(description="PostgreSQL URL (postgresql:// or postgresql+asyncpg://).")
    db_pool_size: int = Field(
        default=10,
        gt=0,
        le=1000,
        description="Database connections per process, opened on demand and kept (see docs/database.md).",
    )
    db_max_overflow: int = Field(
        default=0,
        ge=0,
        le=1000,
        description="Extra connections beyond DB_POOL_SIZE, opened and closed per call: leave 0, raise DB_POOL_SIZE.",
    )
    db_pool_timeout_seconds: float = Field(
        default=5.0,
        gt=0,
        le=60,
        description="How long a call waits for a free pooled connection before it fails with a 'server is busy' "
        "tool error.",
    )
    db_statement_timeout_ms: int = Field(
        default=15000, gt=0, le=3_600_000, description="PostgreSQL statement_timeout for every application statement."
    )
    db_lock_timeout_ms: int = Field(
        default=5000,
        gt=0,
        le=3_600_000,
        description="PostgreSQL lock_timeout for every application statement; must be below DB_STATEMENT_TIMEOUT_MS.",
    )
    db_pooler_mode: Literal["none", "transaction"] = Field(
        default="none",
        description="none: direct PostgreSQL or PgBouncer >= 1.21 with max_prepared_statements (one round trip, "
        "statement caches on); transaction: transaction poolers without prepared-statement tracking, e.g. "
        "PgBouncer 1.18 (no statement caches, an explicit transaction around every statement).",
    )

    @field_validator("db_pooler_mode", mode="before")
    @classmethod
    def _lowercase_pooler_mode(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: str) -> str:
        try:
            return async_database_url(value)
        except Exception as exc:  # sqlalchemy's URL parser raises several types
            raise ValueError("DATABASE_URL must be a postgresql:// or postgresql+asyncpg:// URL") from exc

    @model_validator(mode="after")
    def _lock_wait_below_statement_timeout(self) -> Self:
        if self.db_lock_timeout_ms >= self.db_statement_timeout_ms:
            raise ValueError(
                f"DB_LOCK_TIMEOUT_MS ({self.db_lock_timeout_ms}) must be below DB_STATEMENT_TIMEOUT_MS "
                f"({self.db_statement_timeout_ms}), so a lock wait fails as a lock wait"
            )
        return self

    @classmethod
    def from_env(cls, **overrides: object) -> Self:
        """Load settings; on failure raise :class:`SettingsError` naming each bad variable."""
        try:
            return cls(**overrides)  # type: ignore[arg-type]
        except ValidationError as exc:
            raise SettingsError.from_validation(exc) from None


class RetentionSettings(DatabaseSettings):
    """What ``coatcheck purge`` reads besides the database: how long rows are kept."""

    request_state_ttl_seconds: int = Field(default=600, gt=0, le=86400)
    audit_retention_days: int = Field(
        default=90, ge=0, le=36500, description="`coatcheck purge` deletes audit entries older than this; 0 keeps them."
    )
    cart_retention_days: int = Field(
        default=30,
        ge=0,
        le=36500,
        description="`coatcheck purge` deletes carts (open or checked out) not written to for this long; 0 keeps "
        "them. Orders are never purged.",
    )


class VaultKeySettings(DatabaseSettings):
    """What ``coatcheck keys rotate`` reads besides the database: the token vault's key ring."""

    token_encryption_keys: SecretStr = Field(
        description="Comma-separated secrets (>= 32 bytes) for third-party tokens at rest; first encrypts, "
        "all decrypt. The browser-session cookie key is derived from the first."
    )

    @field_validator("token_encryption_keys")
    @classmethod
    def _token_keys(cls, value: SecretStr) -> SecretStr:
        return KeyRing("TOKEN_ENCRYPTION_KEYS", value.get_secret_value())

    @property
    def token_key_ring(self) -> list[bytes]:
        """The token-vault key ring, newest first."""
        return _ring(self.token_encryption_keys)


class Settings(RetentionSettings, VaultKeySettings):
    """Everything the server needs; construct with :meth:`from_env` to get readable start-up errors."""

    public_url: str = Field(description="Externally visible base URL; the MCP resource is <PUBLIC_URL>/mcp.")
    oidc_issuer: str = Field(
        default="",
        description="Authorization server that issues MCP access tokens (resource-server mode), or the OpenID "
        "provider users sign in at (authorization-server mode). Required unless UPSTREAM_KIND=oauth2.",
    )
    request_state_keys: SecretStr = Field(description="Comma-separated secrets (>= 32 bytes); first seals.")
    oidc_client_id: str = Field(
        min_length=1, description="Coatcheck's own OAuth client at OIDC_ISSUER, for the browser login at /connect."
    )
    oidc_client_secret: SecretStr = Field(description="The secret of OIDC_CLIENT_ID.")

    oidc_extra_audiences: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated further `aud` values an access token may carry instead of <PUBLIC_URL>/mcp, "
        "compared exactly (e.g. Entra v2's API client ID). Every resource that shares one accepts the same "
        "tokens (docs/identity.md).",
    )
    mcp_scopes: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["openid"],
        description="Comma-separated scopes the protected-resource metadata names (scopes_supported): what MCP "
        "clients ask the identity provider for. Entra and Okta need their API scope here (docs/identity.md).",
    )
    oidc_introspection_client_id: str | None = Field(
        default=None,
        description="Turns on RFC 7662 introspection for opaque (non-JWT) access tokens: Coatcheck's client at "
        "OIDC_ISSUER that may call its introspection endpoint (HTTP Basic). Needs OIDC_INTROSPECTION_CLIENT_SECRET.",
    )
    oidc_introspection_client_secret: SecretStr | None = Field(
        default=None, description="The secret of OIDC_INTROSPECTION_CLIENT_ID (no default)."
    )
    oidc_introspection_url: str | None = Field(
        default=None,
        description="The introspection endpoint; default: the introspection_endpoint of OIDC_ISSUER's metadata.",
    )
    oidc_introspection_cache_seconds: int = Field(
        default=60,
        ge=0,
        le=3600,
        description="How long an introspection answer is reused (never past the token's exp); 0: ask every time. "
        "A token revoked at the IdP keeps working here for up to this long.",
    )
    oidc_introspection_timeout_seconds: float = Field(
        default=5.0, gt=0, le=30, description="How long a request waits for the introspection endpoint (then 503)."
    )
    oidc_issuer_internal_url: str | None = Field(
        default=None,
        description="Fetch the issuer's metadata and keys through this base URL instead of OIDC_ISSUER "
        "(for containers that cannot reach the public issuer URL); tokens must still name OIDC_ISSUER.",
    )
    allowed_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    allowed_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    cors_allowed_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Browser origins (scheme://host[:port]) whose web pages may call /mcp cross-origin: they pass "
        "the Origin check and get CORS headers. No wildcard: list each origin.",
    )
    jwt_leeway_seconds: int = Field(default=30, ge=0, le=300)
    jwks_cache_seconds: int = Field(default=600, gt=0)
    max_cart_lines: int = Field(
        default=100,
        gt=0,
        le=10000,
        description="Most lines (distinct products) one cart may hold; cart_set_item refuses a new line beyond it.",
    )
    readyz_timeout_seconds: float = Field(default=2.0, gt=0)
    db_require_sync_standby: bool = Field(
        default=False,
        description="true: /readyz answers 503 unless the primary has a synchronous standby "
        "(synchronous_standby_names set and a sync or quorum standby in pg_stat_replication), so an acknowledged "
        "order survives a failover; for a replicated cluster (the role needs pg_monitor). Off for a single database.",
    )
    db_sync_standby_check_seconds: float = Field(
        default=5.0,
        gt=0,
        le=300,
        description="How often DB_REQUIRE_SYNC_STANDBY re-checks the primary's synchronous standbys.",
    )
    mcp_json_response: bool = False
    log_level: str = Field(default="INFO", description="Level of every logger (uvicorn, Litestar, mcp, httpx2, ours).")
    log_format: Literal["text", "json"] = Field(
        default="text",
        description="text: one readable line per record; json: one JSON object per line with request_id, "
        "tool, outcome, duration_ms and principal (a keyed digest, never the subject) where they apply.",
    )
    metrics_enabled: bool = Field(
        default=False, description="Serve Prometheus metrics at /metrics (no tokens or identities in labels)."
    )
    # OpenTelemetry's own variable names (api/tracing.py). The SDK still reads the rest of OTEL_* itself
    # (endpoint, headers, sampler, batching, resource attributes): those only tune an exporter chosen here.
    otel_traces_exporter: str = Field(
        default="none",
        description="Comma-separated span exporters: console, otlp (HTTP/protobuf) or an installed entry point; "
        "none (the default, unlike the specification's) means no tracing.",
    )
    otel_sdk_disabled: bool = Field(default=False, description="true turns tracing off whatever the exporter.")
    otel_service_name: str | None = Field(
        default=None, description="service.name of every span (else OTEL_RESOURCE_ATTRIBUTES', else coatcheck)."
    )
    otel_exporter_otlp_protocol: str = Field(
        default="http/protobuf", description="OTLP transport; only http/protobuf is supported."
    )
    otel_exporter_otlp_traces_protocol: str | None = Field(
        default=None, description="OTLP transport for traces; overrides OTEL_EXPORTER_OTLP_PROTOCOL."
    )
    legacy_clients: Literal["serve", "reject"] = Field(
        default="serve",
        description="serve: answer 2025-11-25 (initialize handshake) clients statelessly on /mcp; "
        "reject: refuse them with HTTP 400 naming the supported version.",
    )
    max_request_body_bytes: int = Field(
        default=1024 * 1024,
        gt=0,
        le=64 * 1024 * 1024,
        description="Largest /mcp request body accepted; larger ones get 413 before any parsing.",
    )
    providers_file: str | None = Field(
        default=None,
        description="A TOML or JSON file naming the third-party OAuth providers users may connect "
        "(see docs/connections.md); without it and PROVIDERS there are none.",
    )
    providers: str | None = Field(
        default=None, description="The same provider configuration as JSON, instead of PROVIDERS_FILE."
    )
    connect_wait_seconds: float = Field(
        default=8.0,
        ge=0,
        le=30,
        description="How long a retried call waits server-side for a pending connection to finish.",
    )
    connect_flow_ttl_seconds: int = Field(
        default=600, ge=60, le=3600, description="Lifetime of a connect link (and of its OAuth state)."
    )
    browser_session_seconds: int = Field(
        default=900, ge=60, le=86400, description="Lifetime of the signed browser-session cookie of /connect."
    )
    token_refresh_skew_seconds: int = Field(
        default=60, ge=0, le=3600, description="Refresh a stored access token this long before it expires."
    )
    max_open_carts: int = Field(
        default=100,
        ge=1,
        le=100_000,
        description="Open carts one user may have at once; cart_create beyond it is refused (say what to do).",
    )
    idempotency_key_ttl_seconds: int = Field(
        default=86400,
        ge=60,
        le=30 * 86400,
        description="How long a cart_create idempotency_key returns the cart it created; later it is a new key.",
    )
    shutdown_timeout_seconds: int = Field(
        default=10,
        gt=0,
        le=300,
        description="On SIGTERM, how long in-flight requests may run before they are cancelled.",
    )
    shutdown_drain_seconds: float = Field(
        default=0,
        ge=0,
        le=120,
        description="On SIGTERM, answer /readyz with 503 but keep serving for this long before shutting "
        "down, so a load balancer's health check takes the replica out first (set above its check interval).",
    )

    header_read_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description="A request's line and headers must arrive within this time (slow clients get 408).",
    )
    body_read_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        le=600,
        description="A request's body must arrive within this time after its headers (else 408).",
    )
    max_request_header_bytes: int = Field(
        default=64 * 1024, ge=4096, le=1024 * 1024, description="Largest request line plus headers (else 431)."
    )
    keep_alive_timeout_seconds: int = Field(
        default=5, gt=0, le=300, description="Close a kept-alive connection idle for this long."
    )
    max_connections: int = Field(
        default=1000,
        gt=0,
        description="Open connections plus requests in progress per process; requests beyond it get 503.",
    )
    forwarded_allow_ips: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Addresses or networks of the proxies whose X-Forwarded-For/-Proto are believed (or *); "
        "empty: forwarded headers are ignored and logs show the peer's address.",
    )

    # Authorization-server mode (api/authserver, docs/authorization-server.md). Off by default.
    auth_mode: Literal["resource-server", "authorization-server"] = Field(
        default="resource-server",
        description="resource-server: accept access tokens from OIDC_ISSUER; authorization-server: Coatcheck is "
        "the MCP clients' OAuth authorization server and signs users in upstream (OIDC_ISSUER, or the "
        "UPSTREAM_* URLs with UPSTREAM_KIND=oauth2).",
    )
    as_signing_keys: SecretStr | None = Field(
        default=None,
        description="Authorization-server mode only, and required there: comma-separated secrets (>= 32 bytes), "
        "each deriving one ES256 key; the first signs access tokens, all verify and are published in the JWKS.",
    )
    as_access_token_seconds: int = Field(
        default=300, ge=30, le=3600, description="Lifetime of the access tokens Coatcheck issues."
    )
    as_refresh_token_days: int = Field(
        default=30, ge=1, le=365, description="Lifetime of a refresh token (each use rotates it)."
    )
    as_clients: str | None = Field(
        default=None,
        description="Pre-registered clients, as a JSON list of {client_id, redirect_uris, client_name?, "
        "client_secret_env?}.",
    )
    as_registrations_per_minute: int = Field(
        default=20, ge=0, le=10000, description="Dynamic client registrations accepted per minute (0: none)."
    )
    as_cimd_enabled: bool = Field(
        default=True,
        description="Accept and advertise client metadata documents (CIMD); false where Coatcheck cannot reach "
        "the clients' https hosts, so clients register dynamically instead.",
    )
    as_cimd_timeout_seconds: float = Field(
        default=5.0, gt=0, le=30, description="How long fetching a client metadata document (CIMD) may take."
    )
    as_cimd_allow_loopback: bool = Field(
        default=False,
        description="DEVELOPMENT ONLY: also fetch client metadata documents from http URLs on loopback addresses.",
    )
    # The upstream sign-in of authorization-server mode: an OpenID provider (OIDC_ISSUER) or a plain OAuth 2.0
    # provider with a user-info endpoint (GitHub-shaped, api/oauth/userinfo_login.py).
    upstream_kind: Literal["oidc", "oauth2"] = Field(
        default="oidc",
        description="oidc: users sign in at the OpenID provider OIDC_ISSUER; oauth2 (authorization-server mode "
        "only): at a plain OAuth 2.0 provider, the subject read from UPSTREAM_USERINFO_URL.",
    )
    upstream_issuer: str | None = Field(
        default=None,
        description="UPSTREAM_KIND=oauth2: the issuer name of its principals (e.g. https://github.com); never fetched.",
    )
    upstream_authorization_url: str | None = Field(
        default=None, description="UPSTREAM_KIND=oauth2: its authorization endpoint."
    )
    upstream_token_url: str | None = Field(default=None, description="UPSTREAM_KIND=oauth2: its token endpoint.")
    upstream_userinfo_url: str | None = Field(
        default=None, description="UPSTREAM_KIND=oauth2: GET with the access token answers the user as JSON."
    )
    upstream_subject_claim: str = Field(
        default="id",
        min_length=1,
        max_length=64,
        description="UPSTREAM_KIND=oauth2: the user-info member that is the subject.",
    )
    upstream_scopes: str = Field(
        default="",
        max_length=512,
        description="UPSTREAM_KIND=oauth2: the scope to ask for (space-separated; may be empty).",
    )

    @field_validator(
        "allowed_hosts",
        "allowed_origins",
        "cors_allowed_origins",
        "forwarded_allow_ips",
        "oidc_extra_audiences",
        "mcp_scopes",
        mode="before",
    )
    @classmethod
    def _csv(cls, value: object) -> object:
        return _split_csv(value)

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _forwarded_allow_ips(cls, value: list[str]) -> list[str]:
        for entry in value:
            if entry != "*":
                try:
                    ipaddress.ip_network(entry, strict=False)
                except ValueError:
                    raise ValueError(
                        "FORWARDED_ALLOW_IPS must list IP addresses or networks (e.g. 10.0.0.0/8) or be *"
                    ) from None
        return value

    @field_validator("log_level")
    @classmethod
    def _log_level(cls, value: str) -> str:
        level = value.strip().upper()
        if level not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
            raise ValueError("LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL")
        return level

    @field_validator("cors_allowed_origins")
    @classmethod
    def _cors_origins(cls, value: list[str]) -> list[str]:
        origins = []
        for position, origin in enumerate(value, start=1):
            parts = urlsplit(origin)
            if (
                parts.scheme not in {"http", "https"}
                or not parts.hostname
                or parts.path not in {"", "/"}
                or parts.query
                or parts.fragment
                or parts.username is not None
                or "*" in parts.netloc
                or parts.port == {"http": 80, "https": 443}[parts.scheme]
            ):
                raise ValueError(
                    f"CORS_ALLOWED_ORIGINS: entry #{position} is not an origin: write scheme://host[:port] "
                    "(e.g. https://app.example.com), no path, no wildcard and no default port"
                )
            # Browsers send the origin in this serialisation: lower-case scheme and host, no trailing slash.
            origins.append(f"{parts.scheme.lower()}://{parts.netloc.lower()}")
        return origins

    @field_validator("legacy_clients", "log_format", mode="before")
    @classmethod
    def _lowercase_choice(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str) -> str:
        return _normalise_base_url("PUBLIC_URL", value)

    @field_validator("oidc_issuer")
    @classmethod
    def _issuer(cls, value: str) -> str:
        if value == "":
            return value  # absent: allowed only with UPSTREAM_KIND=oauth2 (_upstream)
        # Issuers compare as exact strings (RFC 8414 §3.3, OIDC Discovery §4.3): keep exactly what the operator
        # wrote, a trailing slash included (Auth0's issuer has one, Keycloak's and Entra's do not).
        _normalise_base_url("OIDC_ISSUER", value)
        if value != value.strip() or value.endswith("//"):
            raise ValueError("OIDC_ISSUER must be written exactly as the identity provider's `iss`, without spaces")
        return value

    @field_validator("oidc_extra_audiences")
    @classmethod
    def _extra_audiences(cls, value: list[str]) -> list[str]:
        for position, audience in enumerate(value, start=1):
            if any(char.isspace() for char in audience):
                raise ValueError(f"OIDC_EXTRA_AUDIENCES: entry #{position} contains whitespace")
        return value

    @field_validator("mcp_scopes")
    @classmethod
    def _mcp_scopes(cls, value: list[str]) -> list[str]:
        # RFC 6749 §3.3 scope tokens: printable ASCII without space, double quote or backslash.
        for position, scope in enumerate(value, start=1):
            if not all(0x21 <= ord(char) <= 0x7E and char not in '"\\' for char in scope):
                raise ValueError(f"MCP_SCOPES: entry #{position} is not a valid scope token")
        if not value:
            raise ValueError("MCP_SCOPES is empty: name at least one scope (e.g. openid)")
        return value

    @field_validator("oidc_introspection_url")
    @classmethod
    def _introspection_url(cls, value: str | None) -> str | None:
        if not value:
            return None
        parts = urlsplit(value)
        if parts.scheme not in {"http", "https"} or not parts.hostname or parts.fragment:
            raise ValueError("OIDC_INTROSPECTION_URL must be an absolute http(s) URL without a fragment")
        return value

    @field_validator("oidc_introspection_client_id")
    @classmethod
    def _introspection_client_id(cls, value: str | None) -> str | None:
        if value is None:
            return None
        return value.strip() or None

    @field_validator("oidc_introspection_client_secret")
    @classmethod
    def _introspection_secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        if not value.get_secret_value().strip():
            raise ValueError("OIDC_INTROSPECTION_CLIENT_SECRET is empty")
        # Issued by the identity provider, like OIDC_CLIENT_SECRET: no length rule, only how guessable it is.
        check_secret_strength("OIDC_INTROSPECTION_CLIENT_SECRET", value.get_secret_value().strip())
        return value

    @model_validator(mode="after")
    def _introspection_complete(self) -> Self:
        client_id, secret = self.oidc_introspection_client_id, self.oidc_introspection_client_secret
        if client_id is not None and secret is None:
            raise ValueError("OIDC_INTROSPECTION_CLIENT_ID is set but OIDC_INTROSPECTION_CLIENT_SECRET is not")
        if client_id is None and secret is not None:
            raise ValueError("OIDC_INTROSPECTION_CLIENT_SECRET is set but OIDC_INTROSPECTION_CLIENT_ID is not")
        if client_id is None and self.oidc_introspection_url is not None:
            raise ValueError(
                "OIDC_INTROSPECTION_URL is set but OIDC_INTROSPECTION_CLIENT_ID and "
                "OIDC_INTROSPECTION_CLIENT_SECRET are not: introspection needs client credentials"
            )
        return self

    @field_validator("oidc_issuer_internal_url")
    @classmethod
    def _issuer_internal(cls, value: str | None) -> str | None:
        return None if not value else _normalise_base_url("OIDC_ISSUER_INTERNAL_URL", value)

    @field_validator("request_state_keys")
    @classmethod
    def _state_keys(cls, value: SecretStr) -> SecretStr:
        return KeyRing("REQUEST_STATE_KEYS", value.get_secret_value())

    @model_validator(mode="after")
    def _rings_disjoint(self) -> Self:
        check_rings_disjoint(self.state_key_ring, self.token_key_ring)
        return self

    @field_validator("providers_file", "providers")
    @classmethod
    def _providers(cls, value: str | None, info: ValidationInfo) -> str | None:
        # Read once, here, each client secret from the environment variable the configuration names:
        # start-up fails naming the variable rather than a user's first connect.
        if not value:
            return None
        as_file = info.field_name == "providers_file"
        source = ProviderSource(value)
        source.configs = load_providers(
            providers_file=value if as_file else None, providers_json=None if as_file else value, environ=os.environ
        )
        return source

    @field_validator("auth_mode", mode="before")
    @classmethod
    def _lowercase_auth_mode(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("as_signing_keys")
    @classmethod
    def _signing_keys(cls, value: SecretStr | None) -> SecretStr | None:
        return None if value is None else KeyRing("AS_SIGNING_KEYS", value.get_secret_value())

    @field_validator("as_clients")
    @classmethod
    def _as_clients(cls, value: str | None) -> str | None:
        from api.authserver.clients import parse_static_clients

        if value:
            parse_static_clients(value)  # refuse a bad list at start-up; read again when the app is built
        return value or None

    @model_validator(mode="after")
    def _authorization_server_keys(self) -> Self:
        if self.auth_mode != "authorization-server":
            return self
        if self.as_signing_keys is None:
            raise ValueError(f"AS_SIGNING_KEYS is not set (AUTH_MODE=authorization-server needs it); {_GENERATE_HINT}")
        for key in self.signing_key_ring:
            if key in self.state_key_ring or key in self.token_key_ring:
                raise ValueError("AS_SIGNING_KEYS shares a key with another ring; each ring needs keys of its own")
        return self

    @field_validator("upstream_kind", mode="before")
    @classmethod
    def _lowercase_upstream_kind(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("upstream_authorization_url", "upstream_token_url", "upstream_userinfo_url")
    @classmethod
    def _upstream_url(cls, value: str | None, info: ValidationInfo) -> str | None:
        if not value:
            return None
        parts = urlsplit(value)
        if (
            parts.scheme not in {"http", "https"}
            or not parts.hostname
            or parts.fragment
            or parts.username is not None
            or value != value.strip()
        ):
            name = str(info.field_name).upper()
            raise ValueError(f"{name} must be an absolute http(s) URL without user info or a fragment")
        return value

    @field_validator("upstream_issuer")
    @classmethod
    def _upstream_issuer(cls, value: str | None) -> str | None:
        if not value:
            return None
        if value != value.strip() or any(char.isspace() for char in value):
            raise ValueError("UPSTREAM_ISSUER must not contain whitespace")
        _normalise_base_url("UPSTREAM_ISSUER", value)
        return value

    @field_validator("upstream_subject_claim", "upstream_scopes")
    @classmethod
    def _upstream_words(cls, value: str, info: ValidationInfo) -> str:
        # RFC 6749 §3.3 scope tokens (and a JSON member name), printable ASCII without quote or backslash.
        if info.field_name == "upstream_scopes" and not value:
            return value  # no scope: GitHub then grants read access to public information, enough for /user
        words = value.split(" ") if info.field_name == "upstream_scopes" else [value]
        for word in words:
            if not word or not all(0x21 <= ord(char) <= 0x7E and char not in '"\\' for char in word):
                raise ValueError(f"{str(info.field_name).upper()} must be printable words separated by one space")
        return value

    @model_validator(mode="after")
    def _upstream(self) -> Self:
        oauth2_only = {
            "UPSTREAM_ISSUER": self.upstream_issuer,
            "UPSTREAM_AUTHORIZATION_URL": self.upstream_authorization_url,
            "UPSTREAM_TOKEN_URL": self.upstream_token_url,
            "UPSTREAM_USERINFO_URL": self.upstream_userinfo_url,
        }
        if self.upstream_kind == "oidc":
            if not self.oidc_issuer:
                raise ValueError("OIDC_ISSUER is not set")
            named = sorted(name for name, value in oauth2_only.items() if value is not None)
            if named:
                raise ValueError(f"{', '.join(named)} set but UPSTREAM_KIND is oidc: they are for UPSTREAM_KIND=oauth2")
            return self
        if self.auth_mode != "authorization-server":
            raise ValueError(
                "UPSTREAM_KIND=oauth2 needs AUTH_MODE=authorization-server: in resource-server mode the MCP "
                "clients' tokens come from OIDC_ISSUER, and a plain OAuth 2.0 provider issues none for Coatcheck"
            )
        missing = sorted(name for name, value in oauth2_only.items() if value is None)
        if missing:
            raise ValueError(f"UPSTREAM_KIND=oauth2 needs {', '.join(missing)}")
        if self.oidc_issuer:
            raise ValueError(
                "OIDC_ISSUER is set but UPSTREAM_KIND=oauth2 signs users in at the UPSTREAM_* URLs: unset it "
                "(UPSTREAM_ISSUER names the principals' issuer)"
            )
        return self

    @model_validator(mode="after")
    def _one_provider_source(self) -> Self:
        if self.providers_file and self.providers:
            raise ValueError("set PROVIDERS_FILE or PROVIDERS, not both")
        return self

    @field_validator("oidc_client_secret")
    @classmethod
    def _client_secret(cls, value: SecretStr) -> SecretStr:
        if not value.get_secret_value().strip():
            raise ValueError("OIDC_CLIENT_SECRET is empty")
        # The identity provider issues this one, so no length rule; only how guessable it is.
        check_secret_strength("OIDC_CLIENT_SECRET", value.get_secret_value().strip())
        return value

    @property
    def provider_configs(self) -> "tuple[ProviderConfig, ...]":
        """The third-party OAuth providers users may connect, client secrets resolved (read at start-up)."""
        source = self.providers_file or self.providers
        if source is None:
            return ()
        if not isinstance(source, ProviderSource):
            raise TypeError("settings were built without validation; use from_env()")
        return source.configs

    @property
    def state_key_ring(self) -> list[bytes]:
        """The request-state key ring, newest first."""
        return _ring(self.request_state_keys)

    @property
    def introspection_enabled(self) -> bool:
        """Whether opaque access tokens are checked by RFC 7662 introspection."""
        return self.oidc_introspection_client_id is not None

    @property
    def signing_key_ring(self) -> list[bytes]:
        """The authorization server's signing ring, newest first (authorization-server mode only)."""
        if self.as_signing_keys is None:
            raise LookupError("AS_SIGNING_KEYS is not set")
        return _ring(self.as_signing_keys)

    @property
    def authorization_server_url(self) -> str:
        """The issuer MCP clients get their tokens from: Coatcheck itself in authorization-server mode."""
        return self.public_url if self.auth_mode == "authorization-server" else self.oidc_issuer

    @property
    def mcp_resource_url(self) -> str:
        """The canonical MCP resource identifier (RFC 8707 audience)."""
        return f"{self.public_url}/mcp"


class SettingsError(Exception):
    """Start-up configuration is missing or invalid; the message names every offending variable."""

    @classmethod
    def from_validation(cls, exc: ValidationError) -> "SettingsError":
        """Render pydantic's errors without echoing any submitted value."""
        lines = []
        for error in exc.errors():
            variable = str(error["loc"][0]).upper() if error["loc"] else ""
            if error["type"] == "missing":
                lines.append(f"{variable} is not set")
            else:
                message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
                # A check across several variables (no loc) names them in its own message.
                lines.append(message if not variable or message.startswith(variable) else f"{variable}: {message}")
        return cls("invalid configuration:\n  " + "\n  ".join(lines))
