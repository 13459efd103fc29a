"""Message framing (spec §4): the header's 4-byte length prefix."""

from __future__ import annotations

import struct

from .errors import WireError, malformed
from .limits import DEFAULT_LIMITS, Limits

__all__ = ["LEN_PREFIX", "frame_header", "header_length"]

LEN_PREFIX = 4


def header_length(prefix: bytes, limits: Limits = DEFAULT_LIMITS) -> int:
    """Checks a header's length prefix (§11.2 step 1): ``header-too-large``, then zero."""
    (n,) = struct.unpack(">I", bytes(prefix[:4]))
    if n > limits.max_header_bytes:
        raise WireError("header-too-large", f"header of {n} bytes exceeds the limit of {limits.max_header_bytes} bytes")
    if n == 0:
        raise malformed("header length is zero")
    return n


def frame_header(header_bytes: bytes) -> bytes:
    """``u32 BE length | header``: what goes on the stream before the inline frames."""
    return struct.pack(">I", len(header_bytes)) + header_bytes
