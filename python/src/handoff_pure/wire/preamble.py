"""The connection preamble (spec §3): 16 bytes each side sends first, and version negotiation.

This implementation speaks versions 1, 2 and 3. By default it announces version 3 only
(:data:`OUR_PREAMBLE`): versions 1 and 2 let a peer without the cluster secret
authenticate by reflecting a node's own proofs (§5.6), and version 1 also tells anyone
who connects who the node is (§5.4). A node whose user accepts version-2 peers announces
2..=3 (:data:`ACCEPTING_V2`); one that accepts version-1 peers announces 1..=3
(:data:`ACCEPTING_V1`), which accepts version 2 as well, since a range has no holes. See
:func:`our_preamble`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from handoff.wire.errors import WireError

__all__ = [
    "ACCEPTING_V1",
    "ACCEPTING_V2",
    "MAGIC",
    "MAX_VERSION",
    "MIN_VERSION",
    "OUR_PREAMBLE",
    "PREAMBLE_LEN",
    "V1_ONLY",
    "V2_DEFAULT",
    "V2_ACCEPTING_V1",
    "Preamble",
    "our_preamble",
]

MAGIC = b"HANDOFF\x00"
PREAMBLE_LEN = 16
#: Lowest protocol version this implementation speaks (when its user accepts v1 peers).
MIN_VERSION = 1
#: Highest protocol version this implementation speaks.
MAX_VERSION = 3
_PREAMBLE = struct.Struct(">8sHHI")


@dataclass(frozen=True)
class Preamble:
    """A version range and the reserved flags (§3); the default is this implementation's own."""

    min_version: int = MAX_VERSION
    max_version: int = MAX_VERSION
    flags: int = 0

    def encode(self) -> bytes:
        """The 16 bytes on the wire."""
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


#: What this implementation sends by default: version 3 only (vector ``preamble-v3``).
OUR_PREAMBLE = Preamble(MAX_VERSION, MAX_VERSION)
#: What a node that accepts version-2 peers sends: versions 2 and 3 (vector ``preamble-accept-v2``).
ACCEPTING_V2 = Preamble(2, MAX_VERSION)
#: What a node that accepts version-1 peers sends: versions 1 to 3 (v2 included: a range has no holes).
ACCEPTING_V1 = Preamble(MIN_VERSION, MAX_VERSION)
#: What a version-2 implementation sends by default, 2..=2 (vector ``preamble-v2``): for tests
#: and tools that play one.
V2_DEFAULT = Preamble(2, 2)
#: What a version-2 implementation that accepts v1 peers sends, 1..=2 (vector ``preamble-accept-v1``).
V2_ACCEPTING_V1 = Preamble(1, 2)
#: What an implementation of version 1 only sends (for tests and tools that play one).
V1_ONLY = Preamble(1, 1)


def our_preamble(accept_v1: bool = False, accept_v2: bool = False) -> Preamble:
    """The preamble to send: :data:`ACCEPTING_V1` if the user accepts v1 peers (which
    accepts v2 peers too), else :data:`ACCEPTING_V2` if it accepts v2 peers, else
    :data:`OUR_PREAMBLE` (version 3 only)."""
    if accept_v1:
        return ACCEPTING_V1
    return ACCEPTING_V2 if accept_v2 else OUR_PREAMBLE
