"""The cryptographic primitives of secure aggregation, each a thin call into a well-kept
library (no primitive is written here):

* key agreement: X25519 (``cryptography``), the shared secret stretched by HKDF-SHA256;
* authenticated encryption of the secret shares: AES-256-GCM (``cryptography``);
* the mask generator: the AES-256-CTR keystream under a 32-byte seed (``cryptography``),
  read as little-endian uint32 words;
* t-of-n secret sharing: Shamir's scheme over GF(2^128) (``pycryptodome``), a 32-byte
  secret split as two 16-byte blocks.

These are the choices of Bonawitz et al. 2017, "Practical Secure Aggregation for
Privacy-Preserving Machine Learning" (CCS), section 4: Diffie-Hellman key agreement,
authenticated encryption, a PRG and Shamir sharing.
"""
from __future__ import annotations

import os

import numpy as np

SEED_BYTES = 32
_BLOCK = 16  # pycryptodome's Shamir shares 16-byte secrets
_INFO = b"fedveil-secure-aggregation-v1"


def _libraries():
    try:
        from Crypto.Protocol.SecretSharing import Shamir
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import x25519
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    except ImportError:  # pragma: no cover - the flower extra brings both
        raise RuntimeError("secure aggregation needs 'cryptography' and 'pycryptodome': pip install 'fedveil[flower]'") from None
    return Shamir, hashes, serialization, x25519, Cipher, algorithms, modes, AESGCM, HKDF


def new_key_pair() -> tuple[bytes, bytes]:
    """A fresh X25519 key pair as (private, public) raw 32-byte strings."""
    _, _, serialization, x25519, *_ = _libraries()
    key = x25519.X25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    return private, key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def agree(private: bytes, peer_public: bytes) -> bytes:
    """The 32-byte key two parties share: X25519(private, peer_public) through HKDF-SHA256."""
    _, hashes, _, x25519, _, _, _, _, HKDF = _libraries()
    secret = x25519.X25519PrivateKey.from_private_bytes(private).exchange(x25519.X25519PublicKey.from_public_bytes(peer_public))
    return HKDF(algorithm=hashes.SHA256(), length=SEED_BYTES, salt=None, info=_INFO).derive(secret)


def encrypt(key: bytes, plaintext: bytes, associated: bytes) -> bytes:
    """AES-256-GCM under ``key``: a random 12-byte nonce, then the ciphertext and its tag."""
    AESGCM = _libraries()[7]
    nonce = os.urandom(12)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, associated)


def decrypt(key: bytes, sealed: bytes, associated: bytes) -> bytes:
    """The plaintext of :func:`encrypt`; ``cryptography``'s InvalidTag if anything was altered."""
    AESGCM = _libraries()[7]
    return AESGCM(key).decrypt(sealed[:12], sealed[12:], associated)


def mask(seed: bytes, size: int) -> np.ndarray:
    """``size`` pseudo-random uint32 words: the AES-256-CTR keystream under ``seed``."""
    _, _, _, _, Cipher, algorithms, modes, _, _ = _libraries()
    encryptor = Cipher(algorithms.AES(seed), modes.CTR(bytes(16))).encryptor()
    return np.frombuffer(encryptor.update(bytes(4 * size)), dtype="<u4").astype(np.uint32)


def split_secret(secret: bytes, threshold: int, count: int) -> list[bytes]:
    """Shamir shares 1..``count`` of a 32-byte ``secret``; any ``threshold`` of them rebuild it."""
    Shamir = _libraries()[0]
    if len(secret) != SEED_BYTES:
        raise ValueError(f"a shared secret is {SEED_BYTES} bytes")
    blocks = [Shamir.split(threshold, count, secret[i:i + _BLOCK], ssss=False) for i in range(0, SEED_BYTES, _BLOCK)]
    return [b"".join(block[j][1] for block in blocks) for j in range(count)]


def combine_secret(shares: dict[int, bytes]) -> bytes:
    """The secret of :func:`split_secret` from shares by their 1-based index (at least the threshold)."""
    Shamir = _libraries()[0]
    blocks = []
    for i in range(0, SEED_BYTES, _BLOCK):
        blocks.append(Shamir.combine([(index, share[i:i + _BLOCK]) for index, share in shares.items()], ssss=False))
    return b"".join(blocks)
