"""The reference's msgpack reader, with the checks the wire format needs for bodies.

(Headers have their own strict cursor, :mod:`handoff_pure.wire.reader`, which builds nothing
it does not need; this reader builds the whole value, and serves bodies
(:mod:`handoff_pure.body`) and views of headers.)

The ``msgpack`` package writes every header and body (its packer already produces
the canonical encodings of spec §2). Reading needs more control than it offers:
nesting limits counted as the spec counts them (§9: every array, map and ext value
is one level, the outermost included), str and bin kept apart, map entries in
order with duplicates visible (§6 rule 3), and frame references (§8.2) resolved in
document order. So reading is done here, in pure Python.
"""

from __future__ import annotations

import struct
from typing import Any, Callable, Optional

from handoff.msgpack_values import BadStr, Ext

__all__ = ["MsgpackError", "DepthError", "too_deep", "Pairs", "Ext", "BadStr", "unpack_one"]


class MsgpackError(ValueError):
    """The bytes are not valid msgpack (or end too early)."""


class DepthError(MsgpackError):
    """The value nests deeper than allowed."""


def too_deep(max_depth: int) -> DepthError:
    """The error for a value nested deeper than ``max_depth`` levels."""
    return DepthError(f"nesting deeper than {max_depth} levels")


class Pairs(list):
    """A msgpack map read as its ``(key, value)`` entries, in order (duplicates kept)."""

    __slots__ = ()


_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_F32 = struct.Struct(">f")
_F64 = struct.Struct(">d")

_FIXEXT = {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}


def _hashable(key: Any) -> Any:
    if isinstance(key, list):
        return tuple(_hashable(k) for k in key)
    if isinstance(key, (dict, Pairs)):
        raise MsgpackError("a map used as a map key")
    if isinstance(key, (bytearray, memoryview)):
        return bytes(key)
    return key


def unpack_one(
    data: Any,
    *,
    max_depth: int,
    pairs: bool = False,
    ext_hook: Optional[Callable[[int, bytes], Any]] = None,
    start: int = 0,
    lenient_str: bool = False,
    max_hashed_keys: Optional[int] = None,
) -> tuple[Any, int]:
    """Reads the first msgpack value of ``data`` (from ``start``); returns it and the end offset.

    - str → ``str`` (invalid UTF-8 is an error), bin → ``bytes``, ext → ``ext_hook(type, data)``
      or ``Ext``; integers → ``int``; float32/64 → ``float``.
    - Maps become ``Pairs`` when ``pairs`` is true (keys kept in order, duplicates kept),
      else ``dict`` (later duplicates win; array keys become tuples).
    - Nesting deeper than ``max_depth`` raises ``DepthError`` when it is reached.
    - Trailing bytes after the value are not looked at (the caller decides).
    - A str that is not UTF-8 is an error, or with ``lenient_str`` a ``BadStr``.
    - More than ``max_hashed_keys`` map keys that are arrays or floats (``dict`` maps only:
      Python hashes tuples and floats without randomization, so a peer could choose keys
      that all collide) is an error.
    """
    buf = memoryview(data).cast("B") if not isinstance(data, (bytes, bytearray)) else data
    end = len(buf)
    hashed = [0]  # map keys read that are arrays or floats

    def need(pos: int, n: int) -> None:
        if n > end - pos:
            raise MsgpackError(f"msgpack value truncated: needs {n} bytes at offset {pos}, {end - pos} left")

    def read(pos: int, depth: int) -> tuple[Any, int]:
        need(pos, 1)
        m = buf[pos]
        pos += 1
        if m <= 0x7F:
            return m, pos
        if m >= 0xE0:
            return m - 0x100, pos
        if 0xA0 <= m <= 0xBF:
            return text(pos, m & 0x1F)
        if 0x90 <= m <= 0x9F:
            return array(pos, m & 0x0F, depth)
        if 0x80 <= m <= 0x8F:
            return mapping(pos, m & 0x0F, depth)
        if m == 0xC0:
            return None, pos
        if m == 0xC2:
            return False, pos
        if m == 0xC3:
            return True, pos
        if m == 0xC4 or m == 0xC5 or m == 0xC6:
            st = (_U8, _U16, _U32)[m - 0xC4]
            need(pos, st.size)
            (n,) = st.unpack_from(buf, pos)
            pos += st.size
            need(pos, n)
            return bytes(buf[pos : pos + n]), pos + n
        if m == 0xD9 or m == 0xDA or m == 0xDB:
            st = (_U8, _U16, _U32)[m - 0xD9]
            need(pos, st.size)
            (n,) = st.unpack_from(buf, pos)
            return text(pos + st.size, n)
        if 0xCC <= m <= 0xCF:
            st = (_U8, _U16, _U32, _U64)[m - 0xCC]
            need(pos, st.size)
            return st.unpack_from(buf, pos)[0], pos + st.size
        if 0xD0 <= m <= 0xD3:
            st = (_I8, _I16, _I32, _I64)[m - 0xD0]
            need(pos, st.size)
            return st.unpack_from(buf, pos)[0], pos + st.size
        if m == 0xCA:
            need(pos, 4)
            return _F32.unpack_from(buf, pos)[0], pos + 4
        if m == 0xCB:
            need(pos, 8)
            return _F64.unpack_from(buf, pos)[0], pos + 8
        if m == 0xDC or m == 0xDD:
            st = _U16 if m == 0xDC else _U32
            need(pos, st.size)
            (n,) = st.unpack_from(buf, pos)
            return array(pos + st.size, n, depth)
        if m == 0xDE or m == 0xDF:
            st = _U16 if m == 0xDE else _U32
            need(pos, st.size)
            (n,) = st.unpack_from(buf, pos)
            return mapping(pos + st.size, n, depth)
        if m in _FIXEXT:
            return ext(pos, _FIXEXT[m], depth)
        if m == 0xC7 or m == 0xC8 or m == 0xC9:
            st = (_U8, _U16, _U32)[m - 0xC7]
            need(pos, st.size)
            (n,) = st.unpack_from(buf, pos)
            return ext(pos + st.size, n, depth)
        raise MsgpackError(f"invalid msgpack marker 0x{m:02x} at offset {pos - 1}")

    def text(pos: int, n: int) -> tuple[str, int]:
        need(pos, n)
        try:
            return str(buf[pos : pos + n], "utf-8"), pos + n
        except UnicodeDecodeError as e:
            if lenient_str:
                return BadStr(buf[pos : pos + n]), pos + n
            raise MsgpackError(f"str at offset {pos} is not UTF-8: {e}") from None

    def enter(depth: int) -> int:
        depth += 1
        if depth > max_depth:
            raise too_deep(max_depth)
        return depth

    def array(pos: int, n: int, depth: int) -> tuple[list, int]:
        depth = enter(depth)
        if n > end - pos:  # every element takes at least one byte
            raise MsgpackError(f"array of {n} elements cannot fit in {end - pos} bytes")
        out = []
        append = out.append
        for _ in range(n):
            v, pos = read(pos, depth)
            append(v)
        return out, pos

    def mapping(pos: int, n: int, depth: int) -> tuple[Any, int]:
        depth = enter(depth)
        if 2 * n > end - pos:
            raise MsgpackError(f"map of {n} entries cannot fit in {end - pos} bytes")
        if pairs:
            out = Pairs()
            for _ in range(n):
                k, pos = read(pos, depth)
                v, pos = read(pos, depth)
                out.append((k, v))
            return out, pos
        d: dict = {}
        for _ in range(n):
            k, pos = read(pos, depth)
            if max_hashed_keys is not None and type(k) in (list, float):
                hashed[0] += 1
                if hashed[0] > max_hashed_keys:
                    raise MsgpackError(
                        f"more than {max_hashed_keys} map keys are arrays or floats (keys whose hashes are not "
                        "randomized)"
                    )
            v, pos = read(pos, depth)
            try:
                d[k] = v
            except (TypeError, ValueError):  # unhashable (a writable buffer: ValueError)
                d[_hashable(k)] = v
        return d, pos

    def ext(pos: int, n: int, depth: int) -> tuple[Any, int]:
        enter(depth)
        need(pos, 1 + n)
        (code,) = _I8.unpack_from(buf, pos)
        payload = bytes(buf[pos + 1 : pos + 1 + n])
        pos += 1 + n
        if ext_hook is not None:
            return ext_hook(code, payload), pos
        return Ext(code, payload), pos

    try:
        return read(start, 0)
    finally:
        # The readers refer to each other: empty their cells, or every call would leave a
        # reference cycle holding ``buf`` and ``ext_hook`` (and so the received frames)
        # until the cyclic collector runs, which cannot clear a memoryview still exported.
        need = read = text = enter = array = mapping = ext = None  # noqa: F841
