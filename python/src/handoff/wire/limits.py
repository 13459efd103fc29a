"""What a receiver accepts (spec §9): the configurable limits and the fixed ones."""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = [
    "DEFAULT_LIMITS",
    "HANDSHAKE_HEADER_BYTES",
    "HANDSHAKE_HEADER_VALUES",
    "MAX_BODY_DEPTH",
    "MAX_HEADER_DEPTH",
    "MAX_HEADER_VALUES",
    "MAX_MAP_ENTRIES",
    "Limits",
]

#: The header limit before the handshake completes (§5.1, §9): 64 KiB.
HANDSHAKE_HEADER_BYTES = 64 << 10

#: msgpack values a header may hold before the handshake completes (§9): a valid hello holds
#: about 30; a peer that has proven nothing gets little work done for it.
HANDSHAKE_HEADER_VALUES = 1024

#: Nesting limits of §9 (every array, map and ext value is one level, the outermost included).
MAX_HEADER_DEPTH = 15
MAX_BODY_DEPTH = 127

#: msgpack values in one header, counted as a reader meets them (§9): the header map, each key,
#: each value, each array element, each value nested in those (ignored ones included).
MAX_HEADER_VALUES = 65536

#: Entries of the header map or of one descriptor map (§6 rule 5, §9).
MAX_MAP_ENTRIES = 64


@dataclass(frozen=True)
class Limits:
    """What a receiver accepts (spec §9); every limit is inclusive."""

    max_header_bytes: int = 16 << 20
    max_frames: int = 1024
    max_frame_bytes: int = 4 << 30
    max_message_bytes: int = 16 << 30
    #: msgpack values in one header (§9: 65 536; 1024 before the handshake completes).
    max_header_values: int = MAX_HEADER_VALUES

    def during_handshake(self) -> Limits:
        """These limits as they apply before the handshake completes (§5.1, §9): headers of
        at most 64 KiB and 1024 values."""
        if self.max_header_bytes <= HANDSHAKE_HEADER_BYTES and self.max_header_values <= HANDSHAKE_HEADER_VALUES:
            return self
        return replace(
            self,
            max_header_bytes=min(self.max_header_bytes, HANDSHAKE_HEADER_BYTES),
            max_header_values=min(self.max_header_values, HANDSHAKE_HEADER_VALUES),
        )


DEFAULT_LIMITS = Limits()
