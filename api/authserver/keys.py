"""Coatcheck's own signing key ring for the access tokens it issues (ES256), and its JWKS.

``AS_SIGNING_KEYS`` is a ring of secrets like the other rings (>= 32 bytes each, checked at start-up).
Each secret yields one P-256 private key, deterministically (HKDF-SHA256 under a label of its own, reduced
into the curve's scalar range), so every replica derives the same keys from the same setting and nothing
else has to be distributed. ``keys[0]`` signs; every key verifies and is published in the JWKS, so a
rotation (``[new, old]`` everywhere, then ``[new]`` once the old tokens expired) needs no downtime. The
``kid`` is the key's RFC 7638 thumbprint.
"""

from collections.abc import Sequence
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import ECKey
from joserfc.jws import extract_compact

from store.crypto import derive_key

ALGORITHM = "ES256"
_INFO = b"coatcheck/as-signing/v1/p256"
# The order of the P-256 group; a private scalar is in [1, n - 1].
_P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551


def _private_key(secret: bytes) -> ECKey:
    # 384 bits of HKDF output reduced mod (n - 1): a bias of at most 2**-128, far below anything usable.
    wide = derive_key(secret, _INFO + b"/a") + derive_key(secret, _INFO + b"/b")[:16]
    scalar = int.from_bytes(wide, "big") % (_P256_ORDER - 1) + 1
    return ECKey.import_key(ec.derive_private_key(scalar, ec.SECP256R1()))


class SigningKeys:
    """The ring: :meth:`sign` with the newest key, :meth:`verify` with any, :meth:`jwks` to publish."""

    def __init__(self, secrets: Sequence[bytes]) -> None:
        if not secrets:
            raise ValueError("the signing key ring needs at least one key")
        self._keys = [_private_key(secret) for secret in secrets]
        self._by_kid = {key.thumbprint(): key for key in self._keys}
        self.current_kid = self._keys[0].thumbprint()

    def sign(self, claims: dict[str, Any]) -> str:
        """A compact JWS of ``claims`` (an RFC 9068 ``at+jwt``) under the newest key."""
        header = {"alg": ALGORITHM, "kid": self.current_kid, "typ": "at+jwt"}
        return jwt.encode(header, claims, self._by_kid[self.current_kid], algorithms=[ALGORITHM])

    def verify(self, token: str) -> dict[str, Any] | None:
        """The claims of ``token`` if one of the ring's keys signed it with ES256, else ``None``.

        Claims are not checked here (the verifier does that).
        """
        try:
            header = extract_compact(token.encode()).headers()
        except (JoseError, ValueError, TypeError):
            return None
        key = self._by_kid.get(str(header.get("kid")))
        if key is None or header.get("alg") != ALGORITHM or header.get("typ") != "at+jwt":
            return None
        try:
            return dict(jwt.decode(token, key, algorithms=[ALGORITHM]).claims)
        except (JoseError, ValueError, TypeError):
            return None

    def jwks(self) -> dict[str, list[dict[str, Any]]]:
        """The public keys, as served at ``/.well-known/jwks.json``."""
        return {
            "keys": [
                {**key.as_dict(private=False), "kid": key.thumbprint(), "use": "sig", "alg": ALGORITHM}
                for key in self._keys
            ]
        }
