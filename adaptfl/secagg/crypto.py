"""The cryptography of SecAgg+, all of it from Flower and `cryptography` (nothing home-made).

    key pairs        ECDH on P-384 (`cryptography`), one pair to encrypt shares, one for masks
    shared keys      Flower's `generate_shared_key` (ECDH, then HKDF-SHA256 to 32 bytes)
    share transport  Flower's `encrypt`/`decrypt` (Fernet: AES-128-CBC + HMAC-SHA256), the
                     plaintext naming its sender and receiver (Flower's share_keys_plaintext_*)
    secret sharing   Flower's Shamir over GF(2^128) (`create_shares`/`combine_shares`)
    masks            the ChaCha20 keystream of a 32-byte key: a cryptographic PRG. Not Flower's
                     `pseudo_rand_gen`, whose NumPy generator is seeded with 32 bits (the key's
                     words XOR-ed together): 2^32 masks, which a curious server can search.
"""

from __future__ import annotations

import base64

import numpy as np
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from flwr.common.secure_aggregation.crypto.shamir import combine_shares, create_shares
from flwr.common.secure_aggregation.crypto.symmetric_encryption import decrypt, encrypt, generate_shared_key
from flwr.common.secure_aggregation.secaggplus_utils import (
    share_keys_plaintext_concat,
    share_keys_plaintext_separate,
)

__all__ = ["combine_shares", "create_shares", "decrypt", "encrypt", "share_keys_plaintext_concat",
           "share_keys_plaintext_separate", "KeyPair", "shared_key", "mask", "public_key"]

CURVE = ec.SECP384R1()
NONCE = b"adaptfl-secagg+\0"  # 16 bytes; every key masks once (fresh keys every round)


class KeyPair:
    """An ECDH key pair; `private` and `public` as bytes (DER / X9.62 compressed point)."""

    def __init__(self, private: bytes | None = None) -> None:
        if private is None:
            self._key = ec.generate_private_key(CURVE)
        else:
            loaded = serialization.load_der_private_key(private, password=None)
            if not isinstance(loaded, ec.EllipticCurvePrivateKey):
                raise ValueError("not an elliptic-curve private key")
            self._key = loaded
        self.private = self._key.private_bytes(serialization.Encoding.DER,
                                               serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption())
        self.public = self._key.public_key().public_bytes(serialization.Encoding.X962,
                                                          serialization.PublicFormat.CompressedPoint)

    def agree(self, public: bytes) -> bytes:
        """The 32-byte key this pair shares with `public` (urlsafe base64, as Fernet takes it)."""
        return generate_shared_key(self._key, public_key(public))


def public_key(data: bytes) -> ec.EllipticCurvePublicKey:
    """A peer's public key; ValueError for bytes that are no point on the curve."""
    return ec.EllipticCurvePublicKey.from_encoded_point(CURVE, data)


def shared_key(private: bytes, public: bytes) -> bytes:
    return KeyPair(private).agree(public)


def mask(key: bytes, length: int, bits: int) -> np.ndarray:
    """`length` uniform integers mod 2^bits (uint64) from the ChaCha20 keystream of `key`
    (32 raw bytes, or a Fernet key: its 44-character base64 form)."""
    raw = base64.urlsafe_b64decode(key) if len(key) == 44 else key
    if len(raw) != 32:
        raise ValueError(f"a mask key has 32 bytes, not {len(raw)}")
    width = 4 if bits <= 32 else 8  # half the keystream for the default 32-bit modulus
    stream = Cipher(algorithms.ChaCha20(raw, NONCE), mode=None).encryptor().update(bytes(width * length))
    out = np.frombuffer(stream, dtype=np.uint32 if width == 4 else np.uint64).astype(np.uint64)
    if bits < 64:
        out &= np.uint64((1 << bits) - 1)
    return out
