"""The authentication proof of the handshake (spec §5.3)."""

from __future__ import annotations

import hashlib
import hmac
import struct

from .errors import WireError

__all__ = ["AUTH_CONTEXT", "proof", "verify"]

AUTH_CONTEXT = b"handoff-v1-auth\x00"


def proof(secret: bytes, own_hello: bytes, peer_hello: bytes) -> bytes:
    """HMAC-SHA256(secret, context | len | own hello | len | peer hello): the 32-byte ``auth.mac``."""
    mac = hmac.new(bytes(secret), digestmod=hashlib.sha256)
    mac.update(AUTH_CONTEXT)
    mac.update(struct.pack(">I", len(own_hello)))
    mac.update(own_hello)
    mac.update(struct.pack(">I", len(peer_hello)))
    mac.update(peer_hello)
    return mac.digest()


def verify(secret: bytes, peer_mac: bytes, peer_hello: bytes, own_hello: bytes) -> None:
    """Checks the peer's proof in constant time; raises ``auth-failed``."""
    expected = proof(secret, peer_hello, own_hello)
    if not hmac.compare_digest(expected, bytes(peer_mac)):
        raise WireError(
            "auth-failed",
            "authentication failed: the peer's proof does not match our cluster secret (wrong secret?)",
        )
