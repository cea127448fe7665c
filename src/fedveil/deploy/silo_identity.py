"""A silo's identity is a key, not the ``client_id`` its folder claims.

``fedveil deploy prepare`` makes one Ed25519 key pair per silo: the private key goes into
that silo's folder only (``silo_identity.key``, 0600), the public keys into
``federation.json`` (``silo_keys``). When the server looks for its silos it sends every
node a fresh random nonce; a node answers with the silo id it serves and a signature of
(nonce, silo id, its own node id) made with that silo's key. The server maps silo k to a
node only when the signature verifies under k's registered public key and the node id is
the replying node's, so a node with a copied or forged folder but without k's private key
gets none of silo k's requests, and a replayed answer fails on the nonce (Ed25519: Bernstein
et al. 2012, "High-speed high-security signatures", through the ``cryptography`` package).
"""
from __future__ import annotations

import os
import secrets
from pathlib import Path

from .private_files import write_private_bytes

KEY_FILE = "silo_identity.key"
DOMAIN = b"fedveil-silo-identity-v1"


def _ed25519():
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:  # pragma: no cover - the flower extra brings it
        raise RuntimeError("silo keys need the 'cryptography' package: pip install 'fedveil[flower]'") from None
    return ed25519


def make_silo_key(folder: str | os.PathLike) -> str:
    """Create silo ``folder``'s private key (0600) and return its public key as hex."""
    from cryptography.hazmat.primitives import serialization

    key = _ed25519().Ed25519PrivateKey.generate()
    raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    write_private_bytes(Path(folder) / KEY_FILE, raw)
    return public_hex(key)


def public_hex(key) -> str:
    """The raw Ed25519 public key of private ``key``, as hex."""
    from cryptography.hazmat.primitives import serialization

    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def load_silo_key(folder: str | os.PathLike):
    """The silo's private key from its folder, or None for a folder prepared without one."""
    path = Path(folder) / KEY_FILE
    if not path.is_file():
        return None
    return _ed25519().Ed25519PrivateKey.from_private_bytes(path.read_bytes())


def new_nonce() -> str:
    """A fresh random 128-bit nonce, as hex."""
    return secrets.token_hex(16)


def _payload(nonce: str, silo: int, node: int) -> bytes:
    return b"|".join([DOMAIN, nonce.encode(), str(int(silo)).encode(), str(int(node)).encode()])


def sign_claim(key, nonce: str, silo: int, node: int) -> str:
    """The silo's answer to the server's ``nonce``: a hex signature binding silo and node."""
    return key.sign(_payload(nonce, silo, node)).hex()


def verify_claim(public: str, signature: str, nonce: str, silo: int, node: int) -> bool:
    """Whether ``signature`` is silo ``silo``'s key's signature of (nonce, silo, node)."""
    return verify(public, signature, _payload(nonce, silo, node))


def verify(public: str, signature: str, payload: bytes) -> bool:
    """Whether ``signature`` (hex) is the Ed25519 signature of ``payload`` under ``public`` (hex)."""
    ed25519 = _ed25519()
    try:
        ed25519.Ed25519PublicKey.from_public_bytes(bytes.fromhex(public)).verify(bytes.fromhex(signature), payload)
    except Exception:  # InvalidSignature, malformed hex or key: not this silo
        return False
    return True
