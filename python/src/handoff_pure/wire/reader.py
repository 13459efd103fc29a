"""A strict msgpack cursor for headers (spec §6 rules 1–5, the type table, §9).

It reads one header's bytes in place: typed reads that accept every msgpack encoding of
their type and nothing else, map and array headers, and :meth:`Cursor.skip`, which steps
over one value of any shape without building it. Every error is ``malformed-header``.

Two fixed limits of §9 are enforced as the cursor goes:

- **values**: every msgpack value counts one — the header map, each key, each value,
  each array element and every value nested in those (a str, bin or ext counts one,
  whatever its length); more than :data:`MAX_HEADER_VALUES` is malformed. A map or
  array header counts its children as it is read (``2 n`` or ``n``), before any of them:
  a value read past the budget and a container that announces more than the budget
  holds fail alike, so the outcome is the same as counting one value at a time, and a
  hostile header fails at its first big container instead of after reading it.
- **nesting**: every array, map and ext value is one level, the header map is level 1;
  a value deeper than :data:`MAX_HEADER_DEPTH` levels is malformed.

A cursor owns no state but its position and its count; callers (``handoff_pure.wire.decode``)
say at which level each value sits.
"""

from __future__ import annotations

import struct

from handoff.wire.errors import WireError

from .framing import malformed
from .limits import MAX_HEADER_DEPTH, MAX_HEADER_VALUES, MAX_MAP_ENTRIES

__all__ = ["Cursor", "describe_marker"]

_U16 = struct.Struct(">H").unpack_from
_U32 = struct.Struct(">I").unpack_from
_U64 = struct.Struct(">Q").unpack_from
_I8 = struct.Struct(">b").unpack_from
_I16 = struct.Struct(">h").unpack_from
_I32 = struct.Struct(">i").unpack_from
_I64 = struct.Struct(">q").unpack_from

# Integer markers beyond the fixints: (unpack, size).
_INTS = {
    0xCC: (None, 1),
    0xCD: (_U16, 2),
    0xCE: (_U32, 4),
    0xCF: (_U64, 8),
    0xD0: (_I8, 1),
    0xD1: (_I16, 2),
    0xD2: (_I32, 4),
    0xD3: (_I64, 8),
}

# For skip: bytes after the marker of a value of fixed size (nil, bools, numbers, fixext).
_FIXED = {0xC0: 0, 0xC2: 0, 0xC3: 0, 0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}
_FIXED.update({0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8})
# str8/16/32, bin8/16/32: size of the length field.
_SIZED = {0xD9: 1, 0xDA: 2, 0xDB: 4, 0xC4: 1, 0xC5: 2, 0xC6: 4}
# fixext 1/2/4/8/16: type byte + payload; ext8/16/32: size of the length field.
_FIXEXT = {0xD4: 2, 0xD5: 3, 0xD6: 5, 0xD7: 9, 0xD8: 17}
_EXT = {0xC7: 1, 0xC8: 2, 0xC9: 4}


def describe_marker(m: int) -> str:
    """What a msgpack marker byte starts, for error messages."""
    if m <= 0x7F or m >= 0xE0 or 0xCC <= m <= 0xD3:
        return "an integer"
    if 0x80 <= m <= 0x8F or m in (0xDE, 0xDF):
        return "a map"
    if 0x90 <= m <= 0x9F or m in (0xDC, 0xDD):
        return "an array"
    if 0xA0 <= m <= 0xBF or 0xD9 <= m <= 0xDB:
        return "a str"
    if 0xC4 <= m <= 0xC6:
        return "a bin"
    if m == 0xC0:
        return "nil"
    if m in (0xC2, 0xC3):
        return "a bool"
    if m in (0xCA, 0xCB):
        return "a float"
    if m == 0xC1:
        return "the never-used marker 0xc1"
    return "an ext"


def _wrong(what: str, m: int, expected: str) -> WireError:
    return malformed(f"{what} must be {expected}, got {describe_marker(m)}")


class Cursor:
    """Reads msgpack values from ``buf[pos:]`` under the header rules; see the module doc."""

    __slots__ = ("buf", "end", "pos", "values", "max_values")

    def __init__(self, buf: bytes, pos: int = 0, max_values: int = MAX_HEADER_VALUES):
        self.buf = buf
        self.pos = pos
        self.end = len(buf)
        self.values = 0
        #: The value budget (§9): 65 536, or 1024 before the handshake completes.
        self.max_values = max_values

    # ------------------------------------------------------------------ bookkeeping

    def count(self, n: int) -> None:
        """Counts ``n`` more values against the budget of §9."""
        n += self.values
        if n > self.max_values:
            raise malformed(f"more than {self.max_values} msgpack values in one header")
        self.values = n

    def _cut(self, pos: int, n: int) -> WireError:
        return malformed(f"msgpack value cut short: needs {n} bytes at offset {pos}, {self.end - pos} left")

    def _length(self, pos: int, size: int) -> int:
        """The big-endian length field of ``size`` bytes at ``pos``."""
        if pos + size > self.end:
            raise self._cut(pos, size)
        if size == 1:
            return self.buf[pos]
        return (_U16 if size == 2 else _U32)(self.buf, pos)[0]

    def _marker(self) -> int:
        pos = self.pos
        if pos >= self.end:
            raise self._cut(pos, 1)
        return self.buf[pos]

    def at_end(self) -> bool:
        return self.pos == self.end

    # ------------------------------------------------------------------ containers

    def map_header(self, what: str, depth: int, max_entries: int = MAX_MAP_ENTRIES) -> int:
        """Reads a map's marker (a map at nesting level ``depth``); returns its entry count.

        At most ``max_entries`` entries (rule 5); counts its keys and values.
        """
        m = self._marker()
        pos = self.pos + 1
        if 0x80 <= m <= 0x8F:
            n = m & 0x0F
        elif m == 0xDE:
            n = self._length(pos, 2)
            pos += 2
        elif m == 0xDF:
            n = self._length(pos, 4)
            pos += 4
        else:
            raise _wrong(what, m, "a map")
        if depth > MAX_HEADER_DEPTH:
            raise malformed(f"nesting deeper than {MAX_HEADER_DEPTH} levels")
        if n > max_entries:
            raise malformed(f"{what} has {n} entries, more than {max_entries}")
        self.count(2 * n)
        if 2 * n > self.end - pos:
            raise malformed(f"{what}: a map of {n} entries cannot fit in the {self.end - pos} bytes left")
        self.pos = pos
        return n

    def array_header(self, what: str, depth: int) -> int | None:
        """Reads an array's marker (an array at level ``depth``); returns its length, or None for nil."""
        m = self._marker()
        pos = self.pos + 1
        if 0x90 <= m <= 0x9F:
            n = m & 0x0F
        elif m == 0xDC:
            n = self._length(pos, 2)
            pos += 2
        elif m == 0xDD:
            n = self._length(pos, 4)
            pos += 4
        elif m == 0xC0:
            self.pos = pos
            return None
        else:
            raise _wrong(what, m, "an array")
        if depth > MAX_HEADER_DEPTH:
            raise malformed(f"nesting deeper than {MAX_HEADER_DEPTH} levels")
        self.count(n)
        if n > self.end - pos:
            raise malformed(f"{what}: an array of {n} elements cannot fit in the {self.end - pos} bytes left")
        self.pos = pos
        return n

    # ------------------------------------------------------------------ scalars
    # Each returns None for nil (a known key whose value is nil counts as absent, rule 3);
    # the caller refuses None where nil is not allowed (inside arrays).

    def key(self, what: str) -> bytes:
        """A map key: a str (any str encoding), returned as its raw UTF-8 bytes, unchecked.

        The caller checks UTF-8 (:meth:`check_utf8`) unless the bytes are a key it knows.
        """
        buf = self.buf
        pos = self.pos
        if pos >= self.end:
            raise self._cut(pos, 1)
        m = buf[pos]
        if 0xA0 <= m <= 0xBF:
            n = m - 0xA0
            pos += 1
        elif 0xD9 <= m <= 0xDB:
            size = 1 << (m - 0xD9)
            n = self._length(pos + 1, size)
            pos += 1 + size
        else:
            raise malformed(f"{what} has a key that is {describe_marker(m)}, not a str")
        end = pos + n
        if end > self.end:
            raise self._cut(pos, n)
        self.pos = end
        return buf[pos:end]

    @staticmethod
    def check_utf8(raw: bytes, what: str) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise malformed(f"{what} has a key that is not valid UTF-8: {raw!r}") from None

    def str_(self, what: str) -> str | None:
        """A str (``a0``–``bf``, ``d9``–``db``) holding valid UTF-8."""
        buf = self.buf
        pos = self.pos
        if pos >= self.end:
            raise self._cut(pos, 1)
        m = buf[pos]
        if 0xA0 <= m <= 0xBF:
            n = m - 0xA0
            pos += 1
        elif 0xD9 <= m <= 0xDB:
            size = 1 << (m - 0xD9)
            n = self._length(pos + 1, size)
            pos += 1 + size
        elif m == 0xC0:
            self.pos = pos + 1
            return None
        else:
            raise _wrong(what, m, "a str")
        end = pos + n
        if end > self.end:
            raise self._cut(pos, n)
        try:
            s = buf[pos:end].decode("utf-8")
        except UnicodeDecodeError:
            raise malformed(f"{what} is a str that is not valid UTF-8") from None
        self.pos = end
        return s

    def bin_(self, what: str) -> bytes | None:
        """A bin (``c4``–``c6``)."""
        buf = self.buf
        pos = self.pos
        if pos >= self.end:
            raise self._cut(pos, 1)
        m = buf[pos]
        if 0xC4 <= m <= 0xC6:
            size = 1 << (m - 0xC4)
            n = self._length(pos + 1, size)
            pos += 1 + size
        elif m == 0xC0:
            self.pos = pos + 1
            return None
        else:
            raise _wrong(what, m, "a bin")
        end = pos + n
        if end > self.end:
            raise self._cut(pos, n)
        self.pos = end
        return buf[pos:end]

    def bin32_(self, what: str) -> bytes | None:
        """A bin of exactly 32 bytes (``nonce``, ``mac``, ``token``, ``digest``: the length is part of the type)."""
        value = self.bin_(what)
        if value is not None and len(value) != 32:
            raise malformed(f"{what} must be 32 bytes, got {len(value)}")
        return value

    def bin16_(self, what: str) -> bytes | None:
        """A bin of exactly 16 bytes (a ticket's ``xxh3``, §7.5; a ``cuda`` frame's ``device``, §7.10)."""
        value = self.bin_(what)
        if value is not None and len(value) != 16:
            raise malformed(f"{what} must be 16 bytes, got {len(value)}")
        return value

    def bin64_(self, what: str) -> bytes | None:
        """A bin of exactly 64 bytes (a ``cuda`` frame's ``ipc`` handle, §7.10)."""
        value = self.bin_(what)
        if value is not None and len(value) != 64:
            raise malformed(f"{what} must be 64 bytes, got {len(value)}")
        return value

    def uint(self, what: str, bits: int) -> int | None:
        """An integer in ``0 .. 2**bits``, in any msgpack integer encoding (signed ones included)."""
        buf = self.buf
        pos = self.pos
        if pos >= self.end:
            raise self._cut(pos, 1)
        m = buf[pos]
        if m <= 0x7F:
            self.pos = pos + 1
            return m
        spec = _INTS.get(m)
        if spec is None:
            if m == 0xC0:
                self.pos = pos + 1
                return None
            if m >= 0xE0:
                raise malformed(f"{what} must be a non-negative integer, got {m - 0x100}")
            raise _wrong(what, m, "an integer")
        unpack, size = spec
        pos += 1
        if pos + size > self.end:
            raise self._cut(pos, size)
        v = buf[pos] if unpack is None else unpack(buf, pos)[0]
        if v < 0:
            raise malformed(f"{what} must be a non-negative integer, got {v}")
        if v >> bits:
            raise malformed(f"{what} must be less than 2^{bits}, got {v}")
        self.pos = pos + size
        return v

    def u16(self, what: str) -> int | None:
        return self.uint(what, 16)

    def u32(self, what: str) -> int | None:
        return self.uint(what, 32)

    def u64(self, what: str) -> int | None:
        return self.uint(what, 64)

    def bool_(self, what: str) -> bool | None:
        """A bool (``c2``, ``c3``)."""
        m = self._marker()
        if m == 0xC3 or m == 0xC2 or m == 0xC0:
            self.pos += 1
            return None if m == 0xC0 else m == 0xC3
        raise _wrong(what, m, "a bool")

    # ------------------------------------------------------------------ skipping

    def skip(self, depth: int) -> None:
        """Steps over one value of any shape inside a container at level ``depth``, building nothing.

        Checks only that it is valid msgpack (no ``c1``, nothing cut short) within the nesting
        and value limits (rule 3); map keys of any type, duplicates and str bytes are not looked at.
        """
        buf = self.buf
        end = self.end
        pos = self.pos
        values = self.values
        todo = 1  # values left to step over in the innermost open container
        stack = []  # the outer containers' `todo`
        try:
            while True:
                while not todo:
                    if not stack:
                        if pos > end:
                            raise IndexError
                        self.pos = pos
                        self.values = values
                        return
                    todo = stack.pop()
                    depth -= 1
                todo -= 1
                m = buf[pos]
                pos += 1
                if m <= 0x7F or m >= 0xE0:
                    continue
                if m <= 0x9F:  # fixmap 80–8f, fixarray 90–9f
                    n = (m & 0x0F) << (m < 0x90)
                elif m <= 0xBF:  # fixstr
                    pos += m & 0x1F
                    continue
                elif m in _FIXED:
                    pos += _FIXED[m]
                    continue
                elif m in _SIZED:
                    size = _SIZED[m]
                    pos += size + int.from_bytes(buf[pos : pos + size], "big")
                    continue
                elif m in _FIXEXT or m in _EXT:
                    if depth + 1 > MAX_HEADER_DEPTH:
                        raise malformed(f"nesting deeper than {MAX_HEADER_DEPTH} levels")
                    if m in _FIXEXT:
                        pos += _FIXEXT[m]
                    else:
                        size = _EXT[m]
                        pos += size + 1 + int.from_bytes(buf[pos : pos + size], "big")
                    continue
                elif m == 0xDC or m == 0xDD:  # array16/32
                    size = 2 if m == 0xDC else 4
                    n = int.from_bytes(buf[pos : pos + size], "big")
                    pos += size
                elif m == 0xDE or m == 0xDF:  # map16/32
                    size = 2 if m == 0xDE else 4
                    n = 2 * int.from_bytes(buf[pos : pos + size], "big")
                    pos += size
                else:
                    raise malformed(f"invalid msgpack: the never-used marker 0x{m:02x} at offset {pos - 1}")
                # An array or map of n values (a map's n counts keys and values), one level deeper.
                if pos > end:
                    raise IndexError
                if depth >= MAX_HEADER_DEPTH:
                    raise malformed(f"nesting deeper than {MAX_HEADER_DEPTH} levels")
                if n:
                    values += n
                    if values > self.max_values:
                        raise malformed(f"more than {self.max_values} msgpack values in one header")
                    if n > end - pos:
                        raise malformed(f"a container of {n} values cannot fit in the {end - pos} bytes left")
                    stack.append(todo)
                    todo = n
                    depth += 1
        except IndexError:
            pass
        # Ran off the end: a marker, a length field or (checked below) a payload was cut short.
        raise malformed(f"msgpack value cut short by the end of the header (at offset {min(pos, end)})")
