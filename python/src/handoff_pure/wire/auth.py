"""The authentication proofs of the handshake: version 1 (spec §5.3), version 2 (§5.5)
and version 3 (§5.7).

Version 1 covers both hellos; version 2 covers both preambles and both challenges, under
another context string, so that a proof of one version never verifies in the other and a
preamble changed in flight fails the proof. Neither says which side wrote it, so a peer
without the secret can make a node write the proof it expects on another connection
(§5.6). Version 3 labels each proof with the prover's role (dialer or acceptor) and
computes it over the whole transcript, laid out by role; the acceptor's proof also covers
the dialer's, which it answers.
"""

from __future__ import annotations

import hashlib
import hmac
import struct

from handoff.wire.errors import WireError

__all__ = [
    "AUTH_CONTEXT",
    "AUTH_CONTEXT_V2",
    "V3_ACCEPTOR_LABEL",
    "V3_DIALER_LABEL",
    "acceptor_proof",
    "dialer_proof",
    "proof",
    "proof_v2",
    "transcript_v3",
    "verify",
    "verify_acceptor_proof",
    "verify_dialer_proof",
    "verify_v2",
]

AUTH_CONTEXT = b"handoff-v1-auth\x00"
AUTH_CONTEXT_V2 = b"handoff-v2-auth\x00"
#: The label of a version-3 dialer's proof (24 bytes, §5.7).
V3_DIALER_LABEL = b"handoff-v3-dialer-proof\x00"
#: The label of a version-3 acceptor's proof (26 bytes, §5.7).
V3_ACCEPTOR_LABEL = b"handoff-v3-acceptor-proof\x00"


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


# --------------------------------------------------------------------------- version 3 (§5.7)


def transcript_v3(
    dialer_preamble: bytes, acceptor_preamble: bytes, dialer_challenge: bytes, acceptor_challenge: bytes
) -> bytes:
    """The transcript both sides of a version-3 handshake build alike, ordered by role:
    ``dialer preamble | acceptor preamble | u32 len | dialer challenge | u32 len | acceptor challenge``.

    The preambles are the 16 bytes as each side sent them; the challenges their header
    bytes without the length prefix, as sent and as received (never a re-encoding)."""
    if len(dialer_preamble) != 16 or len(acceptor_preamble) != 16:
        raise ValueError("a preamble is 16 bytes")
    return b"".join(
        (
            bytes(dialer_preamble),
            bytes(acceptor_preamble),
            struct.pack(">I", len(dialer_challenge)),
            bytes(dialer_challenge),
            struct.pack(">I", len(acceptor_challenge)),
            bytes(acceptor_challenge),
        )
    )


def dialer_proof(secret: bytes, transcript: bytes) -> bytes:
    """v3: HMAC-SHA256(secret, dialer label | transcript), the dialer's 32-byte ``auth.mac``."""
    mac = hmac.new(bytes(secret), digestmod=hashlib.sha256)
    mac.update(V3_DIALER_LABEL)
    mac.update(bytes(transcript))
    return mac.digest()


def acceptor_proof(secret: bytes, transcript: bytes, dialer_mac: bytes) -> bytes:
    """v3: HMAC-SHA256(secret, acceptor label | transcript | dialer proof): the acceptor's
    ``auth.mac``, which answers exactly the dialer proof it verified."""
    mac = hmac.new(bytes(secret), digestmod=hashlib.sha256)
    mac.update(V3_ACCEPTOR_LABEL)
    mac.update(bytes(transcript))
    mac.update(bytes(dialer_mac))
    return mac.digest()


def verify_dialer_proof(secret: bytes, peer_mac: bytes, transcript: bytes) -> None:
    """The acceptor's check of the dialer's v3 proof, in constant time; raises ``auth-failed``."""
    if not hmac.compare_digest(dialer_proof(secret, transcript), bytes(peer_mac)):
        raise _failed()


def verify_acceptor_proof(secret: bytes, peer_mac: bytes, transcript: bytes, dialer_mac: bytes) -> None:
    """The dialer's check of the acceptor's v3 proof (over the dialer proof it sent), in
    constant time; raises ``auth-failed``."""
    if not hmac.compare_digest(acceptor_proof(secret, transcript, dialer_mac), bytes(peer_mac)):
        raise _failed()
