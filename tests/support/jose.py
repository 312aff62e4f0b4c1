"""JWTs in tests, with joserfc: the server's one JOSE library (api/jose.py), so the suite needs no second one.

Tests sign their own tokens with keys from :func:`signing_key`, check an issuer's tokens with
:func:`verify_jwt` against the key set it publishes, and build the one token joserfc refuses to sign
(``alg: none``) with :func:`unsigned_jwt`.
"""

import base64
import json
from collections.abc import Collection, Mapping
from typing import Any

from joserfc import jwt
from joserfc.jwk import ECKey, KeyParameters, KeySet, RSAKey
from joserfc.jwt import JWTClaimsRegistry, Token


def signing_key(kid: str, alg: str) -> RSAKey | ECKey:
    """A fresh private key for ``alg`` (RS256 or ES256) whose JWK carries ``kid``, ``alg`` and ``use: sig``."""
    parameters: KeyParameters = {"kid": kid, "alg": alg, "use": "sig"}
    if alg == "RS256":
        return RSAKey.generate_key(2048, parameters=parameters)
    if alg == "ES256":
        return ECKey.generate_key("P-256", parameters=parameters)
    raise ValueError(f"no test key type for {alg}")


def public_jwk(key: RSAKey | ECKey) -> dict[str, Any]:
    """The key as an issuer publishes it in its JWKS: public members only."""
    return dict(key.as_dict(private=False))


def sign_jwt(claims: Mapping[str, Any], key: RSAKey | ECKey, *, kid: str | None = None) -> str:
    """A compact JWT over ``claims``, signed with ``key`` under its own ``alg``; the header names ``kid``, by
    default the key's own (another lets a test present a key id the verifier does not know)."""
    alg, kid = key.alg, kid or key.kid
    if alg is None or kid is None:
        raise ValueError("a test signing key needs an alg and a kid (see signing_key)")
    return jwt.encode({"alg": alg, "kid": kid}, dict(claims), key, algorithms=[alg])


def unsigned_jwt(claims: Mapping[str, Any], **header: Any) -> str:
    """A JWT with ``alg: none`` and an empty signature (RFC 7519 section 6), which joserfc will not produce."""

    def segment(value: Mapping[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    return f"{segment({'alg': 'none', 'typ': 'JWT', **header})}.{segment(claims)}."


def verify_jwt(
    token: str,
    keys: KeySet,
    *,
    issuer: str,
    audience: str,
    algorithms: Collection[str] = ("RS256", "ES256"),
) -> Token:
    """Verify ``token`` the way a resource server does: signature by ``kid``, then iss, aud, exp, nbf and iat,
    of which all but nbf must be present, and a non-empty sub.

    Raises a :class:`joserfc.errors.JoseError` (``BadSignatureError``, ``InvalidKeyIdError``,
    ``ExpiredTokenError``, ``InvalidClaimError``, ``MissingClaimError``, …) when it does not verify.
    """
    verified = jwt.decode(token, keys, algorithms=list(algorithms))
    JWTClaimsRegistry(
        iss={"essential": True, "value": issuer},
        aud={"essential": True, "value": audience},
        sub={"essential": True},
        exp={"essential": True},
        iat={"essential": True},
    ).validate(verified.claims)
    return verified
