"""The canonical msgpack encoding of spec §2: the packer every encoder of the Python API uses."""

from __future__ import annotations

import msgpack

__all__ = ["packer"]


def packer() -> msgpack.Packer:
    """A msgpack packer that writes the canonical form of §2 (bin for bytes, str8, float64)."""
    return msgpack.Packer(use_bin_type=True, use_single_float=False, autoreset=True, strict_types=False)
