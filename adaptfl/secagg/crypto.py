"""The cryptography of SecAgg+, all of it from Flower and `cryptography` (nothing home-made).

    key pairs        X25519 (`cryptography`), one pair to encrypt shares, one for masks; the
                     mask key is derived (HKDF) from a 15-byte seed, as the self-mask key is:
                     what Shamir shares is the seed, one 16-byte block (pycryptodome's
                     GF(2^128) arithmetic is pure Python, ~5 ms a block to rebuild; a 32-byte
                     key is 3 blocks, a P-384 key in DER 12), at 120 bits of security
    shared keys      X25519, then HKDF-SHA256 to 32 bytes, as Flower's `generate_shared_key`
                     does after its ECDH
    share transport  Flower's `encrypt`/`decrypt` (Fernet: AES-128-CBC + HMAC-SHA256), the
                     plaintext naming its sender and receiver (Flower's share_keys_plaintext_*)
    secret sharing   Flower's Shamir over GF(2^128) (`create_shares`/`combine_shares`)
    masks            the ChaCha20 keystream of a 32-byte key: a cryptographic PRG. Not Flower's
                     `pseudo_rand_gen`, whose NumPy generator is seeded with 32 bits (the key's
                     words XOR-ed together): 2^32 masks, which a curious server can search.
    blame            what lets the server name the node that sent garbage, never its victim:
                     a proof that a node holds each public key it signs up with (an HMAC under
                     X25519 with the round's server key: a copied key fails it), SHA-256 of every
                     share bound to its owner and holder (a share changed on the way back fails
                     its owner's hash), and one encryption key per pair of neighbours, so a node
                     that cannot open a ciphertext hands the server that pair's key alone to
                     check (it opens nothing else).
"""

from __future__ import annotations

import base64
import hmac

import numpy as np
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from flwr.common.secure_aggregation.crypto.shamir import combine_shares, create_shares
from flwr.common.secure_aggregation.crypto.symmetric_encryption import decrypt, encrypt
from flwr.common.secure_aggregation.secaggplus_utils import (
    share_keys_plaintext_concat,
    share_keys_plaintext_separate,
)

__all__ = ["combine_shares", "create_shares", "decrypt", "encrypt", "share_keys_plaintext_concat",
           "share_keys_plaintext_separate", "KeyPair", "mask", "public_key", "expand", "commitment",
           "SEED_BYTES", "self_mask_key", "share_digest", "possession", "holds"]

NONCE = b"adaptfl-secagg+\0"  # 16 bytes; every key masks once (fresh keys every round)
RAW = serialization.Encoding.Raw


SEED_BYTES = 15  # PKCS#7 pads 15 bytes to one 16-byte Shamir block


def expand(seed: bytes, purpose: bytes) -> bytes:
    """A 32-byte key from a secret seed, one per purpose (HKDF-SHA256)."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=purpose).derive(seed)


def commitment(seed: bytes) -> bytes:
    """What the server checks a rebuilt seed against (a spoiled share cannot pass)."""
    digest = hashes.Hash(hashes.SHA256())
    digest.update(b"adaptfl-secagg+/" + seed)
    return digest.finalize()


class KeyPair:
    """An X25519 key pair; `private` and `public` as their 32 raw bytes."""

    def __init__(self, private: bytes | None = None) -> None:
        if private is not None and len(private) != 32:
            raise ValueError(f"a private key has 32 bytes, not {len(private)}")
        self._key = X25519PrivateKey.generate() if private is None else \
            X25519PrivateKey.from_private_bytes(private)
        self.private = self._key.private_bytes(RAW, serialization.PrivateFormat.Raw,
                                               serialization.NoEncryption())
        self.public = self._key.public_key().public_bytes(RAW, serialization.PublicFormat.Raw)

    @classmethod
    def from_seed(cls, seed: bytes) -> KeyPair:
        return cls(expand(seed, b"adaptfl-secagg+/mask-key"))

    def agree(self, public: bytes, purpose: bytes | None = None) -> bytes:
        """The 32-byte key this pair shares with `public` (urlsafe base64, as Fernet takes it);
        `purpose` derives another, independent one."""
        secret = self._key.exchange(public_key(public))
        derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=purpose).derive(secret)
        return base64.urlsafe_b64encode(derived)


POSSESSION = b"adaptfl-secagg+/possession"


def possession(pair: KeyPair, server_public: bytes, label: bytes) -> bytes:
    """Proof that whoever signs up with `pair.public` under `label` (round, node, key name)
    holds its private key: only it and the server can derive the MAC's key."""
    return hmac.digest(pair.agree(server_public, POSSESSION), label + pair.public, "sha256")


def holds(server: KeyPair, public: bytes, label: bytes, proof: bytes) -> bool:
    """Whether `proof` is `possession` of `public` under `label` (ValueError: not a key)."""
    expected = hmac.digest(server.agree(public, POSSESSION), label + public, "sha256")
    return hmac.compare_digest(expected, proof)


def share_digest(owner: int, holder: int, kind: str, share: bytes) -> bytes:
    """SHA-256 of the share of `owner`'s secret (`kind` b or s) that `holder` keeps: published
    by the owner, so a share that comes back changed names the node that changed it. A share
    is 16 uniform bytes past its index: its hash gives nothing to search."""
    digest = hashes.Hash(hashes.SHA256())
    digest.update(f"adaptfl-secagg+/share/{owner}/{holder}/{kind}/".encode() + share)
    return digest.finalize()


def public_key(data: bytes) -> X25519PublicKey:
    """A peer's public key; ValueError for bytes that are no X25519 key."""
    if len(data) != 32:
        raise ValueError(f"a public key has 32 bytes, not {len(data)}")
    return X25519PublicKey.from_public_bytes(data)


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


def self_mask_key(seed: bytes) -> bytes:
    return expand(seed, b"adaptfl-secagg+/self-mask")
