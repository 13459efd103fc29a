"""What a receiver accepts (spec §9): the configurable limits, and the nesting of a body.
The fixed limits of headers, which the engine applies, are ``handoff_pure.wire.limits``'s
in the reference."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_LIMITS", "MAX_BODY_DEPTH", "MAX_HASHED_KEYS", "Limits"]

#: Nesting limit of a body (§9: every array, map and ext value is one level, the outermost included).
MAX_BODY_DEPTH = 127

#: Map keys that are arrays or floats, at most, in one body (§9): Python reads an array key
#: as a tuple, and hashes tuples and floats without randomization, so a peer could choose
#: keys that all collide (60 000 of them took a reader 44 s); a body with more is
#: ``bad-body``, and a node does not send one.
MAX_HASHED_KEYS = 1024


@dataclass(frozen=True)
class Limits:
    """What a receiver accepts (spec §9); every limit is inclusive."""

    max_header_bytes: int = 16 << 20
    max_frames: int = 1024
    max_frame_bytes: int = 4 << 30
    max_message_bytes: int = 16 << 30
    #: msgpack values in one header (§9: 65 536; 1024 before the handshake completes).
    max_header_values: int = 65536


DEFAULT_LIMITS = Limits()
