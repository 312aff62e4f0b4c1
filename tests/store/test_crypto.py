"""TokenCipher: AES-256-GCM over a key ring, each value naming its key and bound to its associated data."""

import base64
import hashlib
import secrets

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from store.crypto import DecryptError, TokenCipher, associated_data

OLD = b"old-token-key-" + b"o" * 18 + b"-0123456789"
NEW = b"new-token-key-" + b"n" * 18 + b"-abcdefghij"
AAD = associated_data("provider_connection", 7, "https://issuer.test", "alice", "demo", "access_token")


def test_a_sealed_value_opens_with_the_same_associated_data() -> None:
    cipher = TokenCipher([NEW])
    sealed = cipher.encrypt("tok-plain-ABC", aad=AAD)
    assert cipher.decrypt(sealed, aad=AAD) == "tok-plain-ABC"
    assert "tok-plain-ABC" not in sealed


def test_every_seal_uses_a_fresh_nonce() -> None:
    cipher = TokenCipher([NEW])
    assert cipher.encrypt("same", aad=AAD) != cipher.encrypt("same", aad=AAD)


def test_a_sealed_value_names_its_version_and_key_id() -> None:
    old, new = TokenCipher([OLD]), TokenCipher([NEW])
    sealed_old, sealed_new = old.encrypt("x", aad=AAD), new.encrypt("x", aad=AAD)
    version, kid, body = sealed_new.split(".")
    assert version == "v1"
    assert len(kid) == 8
    assert body
    assert sealed_new.startswith(new.current_prefix)
    assert sealed_old.split(".")[1] != kid
    assert new.is_current(sealed_new)
    assert not new.is_current(sealed_old)
    assert not new.is_current("garbage")


def test_a_key_ring_decrypts_under_every_key_and_encrypts_under_the_first() -> None:
    sealed_old = TokenCipher([OLD]).encrypt("old-secret", aad=AAD)
    ring = TokenCipher([NEW, OLD])
    assert ring.decrypt(sealed_old, aad=AAD) == "old-secret"
    assert not ring.is_current(sealed_old)
    assert ring.is_current(ring.encrypt("x", aad=AAD))
    with pytest.raises(DecryptError, match="unknown key"):
        TokenCipher([NEW]).decrypt(sealed_old, aad=AAD)


@pytest.mark.parametrize(
    "other_aad",
    [
        associated_data("provider_connection", 8, "https://issuer.test", "alice", "demo", "access_token"),
        associated_data("provider_connection", 7, "https://issuer.test", "bob", "demo", "access_token"),
        associated_data("provider_connection", 7, "https://issuer.test", "alice", "other", "access_token"),
        associated_data("provider_connection", 7, "https://issuer.test", "alice", "demo", "refresh_token"),
        b"",
    ],
)
def test_a_value_bound_to_other_associated_data_does_not_open_and_the_error_names_no_secret(
    other_aad: bytes,
) -> None:
    cipher = TokenCipher([NEW])
    sealed = cipher.encrypt("tok-plain-ABC", aad=AAD)
    with pytest.raises(DecryptError) as caught:
        cipher.decrypt(sealed, aad=other_aad)
    assert "tok-plain-ABC" not in str(caught.value)
    assert NEW.decode() not in str(caught.value)


def test_tampering_with_any_part_of_a_sealed_value_is_detected() -> None:
    cipher = TokenCipher([NEW, OLD])
    sealed = cipher.encrypt("tok-plain-ABC", aad=AAD)
    version, kid, body = sealed.split(".")
    flipped = body[:-3] + ("A" if body[-3] != "A" else "B") + body[-2:]
    other_kid = TokenCipher([OLD]).current_prefix.split(".")[1]
    for forged in (
        f"{version}.{kid}.{flipped}",
        f"v2.{kid}.{body}",
        f"{version}.{other_kid}.{body}",  # a real ring key that did not seal it
        f"{version}.{kid}.{body}=",
        f"{version}.{kid}",
        "",
        "v1..",
    ):
        with pytest.raises(DecryptError) as caught:
            cipher.decrypt(forged, aad=AAD)
        assert "tok-plain-ABC" not in str(caught.value)


def test_keys_shorter_than_32_bytes_duplicates_and_non_bytes_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 32 bytes"):
        TokenCipher([secrets.token_bytes(31)])
    with pytest.raises(ValueError, match="at least one key"):
        TokenCipher([])
    with pytest.raises(ValueError, match="repeats"):
        TokenCipher([NEW, NEW])
    with pytest.raises(TypeError, match="must be bytes"):
        TokenCipher([NEW.decode()])  # type: ignore[list-item]


def test_the_cipher_repr_shows_no_key_material() -> None:
    text = repr(TokenCipher([NEW, OLD]))
    assert NEW.decode() not in text
    assert OLD.decode() not in text
    assert "keys=2" in text


def test_ciphers_of_different_purposes_over_one_ring_share_no_key() -> None:
    vault, cookies = TokenCipher([NEW]), TokenCipher([NEW], purpose="browser-cookie")
    sealed = cookies.encrypt("x", aad=AAD)
    assert vault.current_prefix != cookies.current_prefix
    with pytest.raises(DecryptError, match="unknown key"):
        vault.decrypt(sealed, aad=AAD)
    with pytest.raises(DecryptError, match="unknown key"):
        cookies.decrypt(vault.encrypt("x", aad=AAD), aad=AAD)


def test_the_vault_key_derivation_is_unchanged_so_stored_tokens_still_open() -> None:
    # The vault's label before ciphers took a purpose: a row sealed then must open now.
    key = HKDF(algorithm=SHA256(), length=32, salt=None, info=b"coatcheck/token-vault/v1/aes-256-gcm").derive(NEW)
    kid = hashlib.sha256(b"coatcheck/token-vault/v1/kid:" + key).digest()[:4].hex()
    nonce = secrets.token_bytes(12)
    body = AESGCM(key).encrypt(nonce, b"stored-before", f"v1.{kid}.".encode() + AAD)
    sealed = f"v1.{kid}." + base64.urlsafe_b64encode(nonce + body).decode().rstrip("=")
    assert TokenCipher([NEW]).decrypt(sealed, aad=AAD) == "stored-before"
