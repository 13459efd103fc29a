"""The connection preamble (spec §3): 16 bytes each side sends first, and version negotiation."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .errors import WireError

__all__ = ["MAGIC", "MAX_VERSION", "MIN_VERSION", "OUR_PREAMBLE", "PREAMBLE_LEN", "Preamble"]

MAGIC = b"HANDOFF\x00"
PREAMBLE_LEN = 16
MIN_VERSION = 1
MAX_VERSION = 1
_PREAMBLE = struct.Struct(">8sHHI")


@dataclass(frozen=True)
class Preamble:
    min_version: int = MIN_VERSION
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


OUR_PREAMBLE = Preamble()
