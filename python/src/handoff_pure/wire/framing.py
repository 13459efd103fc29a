"""Message framing (spec §4): the header's 4-byte length prefix."""

from __future__ import annotations

import struct

from handoff.wire.errors import WireError
from handoff.wire.limits import DEFAULT_LIMITS, Limits

__all__ = ["LEN_PREFIX", "frame_header", "header_length", "header_length_at", "malformed"]

LEN_PREFIX = 4


def malformed(message: str) -> WireError:
    """A ``malformed-header`` error (spec §6 rules 1–5 and 7, §7, the fixed header limits of §9)."""
    return WireError("malformed-header", f"malformed header: {message}")


_LEN = struct.Struct(">I")


def header_length(prefix: bytes, limits: Limits = DEFAULT_LIMITS) -> int:
    """Checks a header's length prefix (§11.2 step 1): ``header-too-large``, then zero."""
    return header_length_at(bytes(prefix[:4]), 0, limits)


def header_length_at(buf, pos: int, limits: Limits = DEFAULT_LIMITS) -> int:
    """:func:`header_length` of the prefix at ``buf[pos:pos + 4]`` (read in place)."""
    (n,) = _LEN.unpack_from(buf, pos)
    if n > limits.max_header_bytes:
        raise WireError("header-too-large", f"header of {n} bytes exceeds the limit of {limits.max_header_bytes} bytes")
    if n == 0:
        raise malformed("header length is zero")
    return n


def frame_header(header_bytes: bytes) -> bytes:
    """``u32 BE length | header``: what goes on the stream before the inline frames."""
    return struct.pack(">I", len(header_bytes)) + header_bytes
