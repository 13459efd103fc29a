"""The authentication proofs of the handshake: version 1 (spec §5.3) and version 2 (§5.5).

Version 1 covers both hellos; version 2 covers both preambles and both challenges, under
another context string, so that a proof of one version never verifies in the other and a
preamble changed in flight fails the proof.
"""

from __future__ import annotations

import hashlib
import hmac
import struct

from .errors import WireError

__all__ = ["AUTH_CONTEXT", "AUTH_CONTEXT_V2", "proof", "proof_v2", "verify", "verify_v2"]

AUTH_CONTEXT = b"handoff-v1-auth\x00"
AUTH_CONTEXT_V2 = b"handoff-v2-auth\x00"


def _with_len(mac, data: bytes) -> None:
    mac.update(struct.pack(">I", len(data)))
    mac.update(data)


def proof(secret: bytes, own_hello: bytes, peer_hello: bytes) -> bytes:
    """v1: HMAC-SHA256(secret, context | len | own hello | len | peer hello): the 32-byte ``auth.mac``."""
    mac = hmac.new(bytes(secret), digestmod=hashlib.sha256)
    mac.update(AUTH_CONTEXT)
    _with_len(mac, own_hello)
    _with_len(mac, peer_hello)
    return mac.digest()


def proof_v2(
    secret: bytes, own_preamble: bytes, peer_preamble: bytes, own_challenge: bytes, peer_challenge: bytes
) -> bytes:
    """v2: HMAC-SHA256(secret, context | own preamble | peer preamble | len | own challenge | len | peer challenge).

    The preambles are the 16 bytes as sent and received; the challenges the header bytes
    without their length prefix.
    """
    if len(own_preamble) != 16 or len(peer_preamble) != 16:
        raise ValueError("a preamble is 16 bytes")
    mac = hmac.new(bytes(secret), digestmod=hashlib.sha256)
    mac.update(AUTH_CONTEXT_V2)
    mac.update(bytes(own_preamble))
    mac.update(bytes(peer_preamble))
    _with_len(mac, own_challenge)
    _with_len(mac, peer_challenge)
    return mac.digest()


def _failed() -> WireError:
    return WireError(
        "auth-failed",
        "authentication failed: the peer's proof does not match our cluster secret (wrong secret?)",
    )


def verify(secret: bytes, peer_mac: bytes, peer_hello: bytes, own_hello: bytes) -> None:
    """Checks the peer's v1 proof in constant time; raises ``auth-failed``."""
    if not hmac.compare_digest(proof(secret, peer_hello, own_hello), bytes(peer_mac)):
        raise _failed()


def verify_v2(
    secret: bytes,
    peer_mac: bytes,
    peer_preamble: bytes,
    own_preamble: bytes,
    peer_challenge: bytes,
    own_challenge: bytes,
) -> None:
    """Checks the peer's v2 proof in constant time (the peer is the prover); raises ``auth-failed``."""
    expected = proof_v2(secret, peer_preamble, own_preamble, peer_challenge, own_challenge)
    if not hmac.compare_digest(expected, bytes(peer_mac)):
        raise _failed()
