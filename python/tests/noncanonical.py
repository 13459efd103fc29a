"""A msgpack writer that can choose any valid encoding of a value, for tests of the decoder.

spec/WIRE.md §6: "A decoder MUST accept every valid encoding of these types, canonical or
not". :func:`pack` writes a value with the encodings a ``choose`` function picks among all
that fit: wider integer formats, signed formats for non-negative values, str8/16/32 for a
short text, bin16/32, map16/32 and array16/32 for short ones, and keys in any order.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["Pairs", "Raw", "canonical", "pack", "randomly", "widest"]


class Raw(bytes):
    """Bytes written as they are (a value already encoded, or a deliberately broken one)."""


class Pairs(list):
    """A map given as its ``(key, value)`` entries, written in this order (duplicates allowed)."""


Choose = Callable[[Sequence[Any]], Any]


def canonical(options: Sequence[Any]) -> Any:
    return options[0]


def widest(options: Sequence[Any]) -> Any:
    return options[-1]


def randomly(rng: random.Random) -> Choose:
    return lambda options: options[rng.randrange(len(options))]


def _int_options(v: int) -> list[bytes]:
    out = []
    if v >= 0:
        if v < 128:
            out.append(bytes([v]))
        for marker, fmt, hi in (
            (0xCC, ">B", 1 << 8),
            (0xCD, ">H", 1 << 16),
            (0xCE, ">I", 1 << 32),
            (0xCF, ">Q", 1 << 64),
        ):
            if v < hi:
                out.append(bytes([marker]) + struct.pack(fmt, v))
    elif v >= -32:
        out.append(struct.pack(">b", v))
    for marker, fmt, bits in ((0xD0, ">b", 8), (0xD1, ">h", 16), (0xD2, ">i", 32), (0xD3, ">q", 64)):
        if -(1 << (bits - 1)) <= v < (1 << (bits - 1)):
            out.append(bytes([marker]) + struct.pack(fmt, v))
    return out


def _sized(n: int, fix: tuple[int, int] | None, markers: Sequence[tuple[int, str, int]]) -> list[bytes]:
    """The headers that can announce length ``n``: a fix form (base, limit) and the sized markers."""
    out = []
    if fix is not None and n < fix[1]:
        out.append(bytes([fix[0] | n]))
    for marker, fmt, hi in markers:
        if n < hi:
            out.append(bytes([marker]) + struct.pack(fmt, n))
    return out


_STR = ((0xD9, ">B", 1 << 8), (0xDA, ">H", 1 << 16), (0xDB, ">I", 1 << 32))
_BIN = ((0xC4, ">B", 1 << 8), (0xC5, ">H", 1 << 16), (0xC6, ">I", 1 << 32))
_ARRAY = ((0xDC, ">H", 1 << 16), (0xDD, ">I", 1 << 32))
_MAP = ((0xDE, ">H", 1 << 16), (0xDF, ">I", 1 << 32))


def pack(value: Any, choose: Choose = canonical, shuffle: bool = False) -> bytes:
    """``value`` as msgpack, each header chosen by ``choose`` (canonical first, widest last).

    dict entries are written in a chosen order when ``shuffle`` (a :class:`Pairs` keeps its order).
    """
    if isinstance(value, Raw):
        return bytes(value)
    if value is None:
        return b"\xc0"
    if value is True:
        return b"\xc3"
    if value is False:
        return b"\xc2"
    if isinstance(value, int):
        return choose(_int_options(value))
    if isinstance(value, float):
        return b"\xcb" + struct.pack(">d", value)
    if isinstance(value, str):
        data = value.encode()
        return choose(_sized(len(data), (0xA0, 32), _STR)) + data
    if isinstance(value, (bytes, bytearray)):
        return choose(_sized(len(value), None, _BIN)) + bytes(value)
    if isinstance(value, (dict, Pairs)):
        items = list(value.items()) if isinstance(value, dict) else list(value)
        if shuffle and isinstance(value, dict):
            order = []
            rest = list(range(len(items)))
            while rest:
                order.append(rest.pop(choose(range(len(rest)))))
            items = [items[i] for i in order]
        head = choose(_sized(len(items), (0x80, 16), _MAP))
        return head + b"".join(pack(k, choose, shuffle) + pack(v, choose, shuffle) for k, v in items)
    if isinstance(value, (list, tuple)):
        head = choose(_sized(len(value), (0x90, 16), _ARRAY))
        return head + b"".join(pack(v, choose, shuffle) for v in value)
    raise TypeError(type(value))
