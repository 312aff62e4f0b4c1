"""The one sealing primitive: AES-256-GCM under a key ring, bound to associated data.

It seals third-party tokens at rest (bound to the row) and, under another purpose, the browser
cookies of ``/connect`` (:mod:`api.oauth.session`). Modelled on the ``mcp`` SDK's
``AESGCMRequestStateCodec``, with the differences a database needs:

* Each ring secret (>= 32 bytes) is stretched with HKDF-SHA256 under an info string naming the
  cipher's ``purpose`` (``coatcheck/<purpose>/v1/aes-256-gcm``), so the same secret used for the
  vault, the cookies or request-state sealing yields unrelated keys.
* A sealed value reads ``v1.<kid>.<b64url(nonce || ciphertext || tag)>``. ``kid`` is 4 bytes
  of ``sha256(label || key)`` in hex: it names the key without revealing it, lets decryption
  find the key at once, and lets SQL find rows under an old key (``NOT LIKE 'v1.<kid>.%'``).
* The format prefix and kid are part of the GCM associated data, followed by the caller's
  ``aad``. Repositories pass a canonical encoding of (table, row identity, principal, provider,
  column), so a value copied into another row, column or principal fails to open.

``keys[0]`` encrypts and every key decrypts. Rotation: deploy every instance with
``[new, old]``, run ``coatcheck keys rotate`` (re-encrypts every row under ``new``), then drop
``old``. :class:`~store.errors.DecryptError` carries a reason code only, never key or plaintext.
"""

import base64
import hashlib
import hmac
import json
import os
from collections.abc import Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from store.errors import DecryptError

__all__ = ["FORMAT_VERSION", "VAULT", "DecryptError", "TokenCipher", "associated_data", "derive_key"]

FORMAT_VERSION = "v1"
MIN_KEY_BYTES = 32
VAULT = "token-vault"
_KID_BYTES = 4
_NONCE_BYTES = 12
_TAG_BYTES = 16
_PREFIX = FORMAT_VERSION + "."


def associated_data(*parts: str | int) -> bytes:
    """Canonical, unambiguous associated data for a stored value (a JSON array of its parts)."""
    return json.dumps(list(parts), separators=(",", ":"), ensure_ascii=True).encode()


def derive_key(secret: bytes, info: bytes) -> bytes:
    """A 32-byte key for one use (``info`` names it) from a ring secret: HKDF-SHA256, no salt."""
    return HKDF(algorithm=SHA256(), length=32, salt=None, info=info).derive(bytes(secret))


def _b64u(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _b64u_decode(text: str) -> bytes:
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if _b64u(raw) != text:
        raise ValueError("non-canonical base64url")
    return raw


class TokenCipher:
    """AES-256-GCM over a key ring: ``keys[0]`` encrypts, every key decrypts.

    ``purpose`` is the key-derivation label: ciphers of different purposes over the same ring share
    no key, so a value sealed for one never opens in another.
    """

    __slots__ = ("_current_kid", "_ring")

    def __init__(self, keys: Sequence[bytes], *, purpose: str = VAULT) -> None:
        """Derive one AES-256 key and key id per ring secret, labelled with ``purpose``.

        Raises:
            TypeError: a key is not ``bytes`` (nothing is coerced).
            ValueError: the ring is empty, a key is shorter than 32 bytes, or two keys are the same.
        """
        if not keys:
            raise ValueError("the token key ring needs at least one key")
        self._ring: dict[str, AESGCM] = {}
        for position, secret in enumerate(keys):
            if not isinstance(secret, bytes | bytearray):
                raise TypeError(f"token keys must be bytes; keys[{position}] is {type(secret).__name__}")
            if len(secret) < MIN_KEY_BYTES:
                raise ValueError(f"token keys must be at least {MIN_KEY_BYTES} bytes; keys[{position}] is shorter")
            key = derive_key(secret, f"coatcheck/{purpose}/v1/aes-256-gcm".encode())
            kid = hashlib.sha256(f"coatcheck/{purpose}/v1/kid:".encode() + key).digest()[:_KID_BYTES].hex()
            if kid in self._ring:
                raise ValueError(f"keys[{position}] repeats an earlier key")
            self._ring[kid] = AESGCM(key)
        self._current_kid = next(iter(self._ring))

    def __repr__(self) -> str:
        return f"TokenCipher(current_kid={self._current_kid!r}, keys={len(self._ring)})"

    @property
    def current_prefix(self) -> str:
        """``v1.<kid>.``: every value sealed under ``keys[0]`` starts with it (for SQL filters)."""
        return f"{_PREFIX}{self._current_kid}."

    def encrypt(self, plaintext: str, *, aad: bytes) -> str:
        """Seal ``plaintext`` under ``keys[0]``, bound to ``aad``."""
        kid = self._current_kid
        nonce = os.urandom(_NONCE_BYTES)
        sealed = self._ring[kid].encrypt(nonce, plaintext.encode(), self._aad(kid, aad))
        return f"{_PREFIX}{kid}.{_b64u(nonce + sealed)}"

    def decrypt(self, sealed: str, *, aad: bytes) -> str:
        """Open a value sealed by :meth:`encrypt` under any ring key with the same ``aad``.

        Raises:
            DecryptError: malformed, sealed under a key not in the ring, tampered with, or bound
                to other associated data (moved from another row or column).
        """
        kid, body = self._split(sealed)
        aead = self._ring.get(kid)
        if aead is None:
            raise DecryptError("unknown key")
        try:
            raw = _b64u_decode(body)
        except ValueError:
            raise DecryptError("malformed") from None
        if len(raw) < _NONCE_BYTES + _TAG_BYTES:
            raise DecryptError("malformed")
        try:
            plaintext = aead.decrypt(raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], self._aad(kid, aad))
        except InvalidTag:
            raise DecryptError("authentication failed (tampered, or bound to another row)") from None
        try:
            return plaintext.decode()
        except UnicodeDecodeError:
            raise DecryptError("malformed") from None

    def is_current(self, sealed: str) -> bool:
        """Tell whether ``sealed`` was encrypted under ``keys[0]`` (no decryption is attempted)."""
        try:
            kid, _ = self._split(sealed)
        except DecryptError:
            return False
        return hmac.compare_digest(kid, self._current_kid)

    @staticmethod
    def _split(sealed: str) -> tuple[str, str]:
        version, _, rest = sealed.partition(".")
        kid, sep, body = rest.partition(".")
        if version != FORMAT_VERSION or not sep or len(kid) != 2 * _KID_BYTES:
            raise DecryptError("malformed")
        return kid, body

    @staticmethod
    def _aad(kid: str, aad: bytes) -> bytes:
        # Prefix and kid have fixed lengths, so the concatenation is unambiguous.
        return f"{_PREFIX}{kid}.".encode() + aad
