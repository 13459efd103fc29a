"""The fixed limits of headers (spec §9), and the limits before a handshake completes
(§5.1), as the reference reads headers."""

from __future__ import annotations

from dataclasses import replace

from handoff.wire.limits import Limits

__all__ = [
    "HANDSHAKE_HEADER_BYTES",
    "HANDSHAKE_HEADER_VALUES",
    "MAX_HEADER_DEPTH",
    "MAX_HEADER_VALUES",
    "MAX_MAP_ENTRIES",
    "during_handshake",
]

#: The header limit before the handshake completes (§5.1, §9): 64 KiB.
HANDSHAKE_HEADER_BYTES = 64 << 10

#: msgpack values a header may hold before the handshake completes (§9): a valid hello holds
#: about 30; a peer that has proven nothing gets little work done for it.
HANDSHAKE_HEADER_VALUES = 1024

#: Nesting limit of a header (§9: every array, map and ext value is one level, the outermost included).
MAX_HEADER_DEPTH = 15

#: msgpack values in one header, counted as a reader meets them (§9): the header map, each key,
#: each value, each array element, each value nested in those (ignored ones included).
MAX_HEADER_VALUES = Limits().max_header_values

#: Entries of the header map or of one descriptor map (§6 rule 5, §9).
MAX_MAP_ENTRIES = 64


def during_handshake(limits: Limits) -> Limits:
    """``limits`` as they apply before the handshake completes (§5.1, §9): headers of at most
    64 KiB and 1024 values."""
    if limits.max_header_bytes <= HANDSHAKE_HEADER_BYTES and limits.max_header_values <= HANDSHAKE_HEADER_VALUES:
        return limits
    return replace(
        limits,
        max_header_bytes=min(limits.max_header_bytes, HANDSHAKE_HEADER_BYTES),
        max_header_values=min(limits.max_header_values, HANDSHAKE_HEADER_VALUES),
    )
