"""What a receiver accepts (spec §9): the configurable limits, and the nesting of a body.
The fixed limits of headers, which the engine applies, are ``handoff_pure.wire.limits``'s
in the reference."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_LIMITS", "MAX_BODY_DEPTH", "Limits"]

#: Nesting limit of a body (§9: every array, map and ext value is one level, the outermost included).
MAX_BODY_DEPTH = 127


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
