"""What a receiver accepts (spec §9): the configurable limits and the fixed ones."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "DEFAULT_LIMITS",
    "MAX_BODY_DEPTH",
    "MAX_HEADER_DEPTH",
    "Limits",
]

#: Nesting limits of §9 (every array, map and ext value is one level, the outermost included).
MAX_HEADER_DEPTH = 15
MAX_BODY_DEPTH = 127


@dataclass(frozen=True)
class Limits:
    """What a receiver accepts (spec §9); every limit is inclusive."""

    max_header_bytes: int = 16 << 20
    max_frames: int = 1024
    max_frame_bytes: int = 4 << 30
    max_message_bytes: int = 16 << 30


DEFAULT_LIMITS = Limits()
