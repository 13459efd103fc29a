"""The connection preamble (spec §3): 16 bytes each side sends first, and version negotiation.

This implementation speaks versions 1 and 2. By default it announces version 2 only
(:data:`OUR_PREAMBLE`), so that a peer that has not proven the secret never gets a v1
hello out of it; a node whose user accepts v1 peers announces 1..=2
(:data:`ACCEPTING_V1`), see :func:`our_preamble`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .errors import WireError

__all__ = [
    "ACCEPTING_V1",
    "MAGIC",
    "MAX_VERSION",
    "MIN_VERSION",
    "OUR_PREAMBLE",
    "PREAMBLE_LEN",
    "V1_ONLY",
    "Preamble",
    "our_preamble",
]

MAGIC = b"HANDOFF\x00"
PREAMBLE_LEN = 16
#: Lowest protocol version this implementation speaks (when its user accepts v1 peers).
MIN_VERSION = 1
#: Highest protocol version this implementation speaks.
MAX_VERSION = 2
_PREAMBLE = struct.Struct(">8sHHI")


@dataclass(frozen=True)
class Preamble:
    min_version: int = 2
    max_version: int = MAX_VERSION
    flags: int = 0

    def encode(self) -> bytes:
        return _PREAMBLE.pack(MAGIC, self.min_version, self.max_version, self.flags)

    @staticmethod
    def decode(data: bytes) -> Preamble:
        """Decodes 16 bytes: ``truncated``, ``bad-magic``, ``handshake`` (empty version range)."""
        if len(data) < PREAMBLE_LEN:
            raise WireError(
                "truncated", f"truncated input: preamble needs {PREAMBLE_LEN} bytes, only {len(data)} present"
            )
        magic, lo, hi, flags = _PREAMBLE.unpack_from(data, 0)
        if magic != MAGIC:
            raise WireError(
                "bad-magic",
                f"bad preamble: expected magic {MAGIC!r}, got {bytes(magic)!r} (is the peer a handoff node?)",
            )
        if lo == 0 or lo > hi:
            raise WireError("handshake", f"handshake failed: preamble announces an empty version range {lo}..={hi}")
        return Preamble(lo, hi, flags)

    def negotiate(self, peer: Preamble) -> int:
        """The highest version both speak, else ``unsupported-version``."""
        chosen = min(self.max_version, peer.max_version)
        if chosen < max(self.min_version, peer.min_version):
            raise WireError(
                "unsupported-version",
                f"no common protocol version: we speak {self.min_version}..={self.max_version}, "
                f"the peer speaks {peer.min_version}..={peer.max_version}",
            )
        return chosen


#: What this implementation sends by default: version 2 only.
OUR_PREAMBLE = Preamble(2, MAX_VERSION)
#: What a node that accepts version-1 peers sends: versions 1 and 2.
ACCEPTING_V1 = Preamble(MIN_VERSION, MAX_VERSION)
#: What an implementation of version 1 only sends (for tests and tools that play one).
V1_ONLY = Preamble(1, 1)


def our_preamble(accept_v1: bool = False) -> Preamble:
    """The preamble to send: :data:`ACCEPTING_V1` if the user accepts v1 peers, else :data:`OUR_PREAMBLE`."""
    return ACCEPTING_V1 if accept_v1 else OUR_PREAMBLE
