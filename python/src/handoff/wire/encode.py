"""Encoding headers and messages in the canonical form of spec §2."""

from __future__ import annotations

from collections.abc import Iterable

import msgpack

from .framing import frame_header
from .headers import Header

__all__ = ["encode_header", "encode_message", "packer"]


def packer() -> msgpack.Packer:
    """A msgpack packer that writes the canonical form of §2 (bin for bytes, str8, float64)."""
    return msgpack.Packer(use_bin_type=True, use_single_float=False, autoreset=True, strict_types=False)


def encode_header(header: Header) -> bytes:
    """The header's msgpack bytes (without the length prefix), canonical."""
    return packer().pack(header.to_map())


def encode_message(header: Header, frames: Iterable[bytes] = ()) -> bytes:
    """A whole message in one byte string (for small messages and tests)."""
    return frame_header(encode_header(header)) + b"".join(bytes(f) for f in frames)
